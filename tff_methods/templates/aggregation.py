"""TFF's aggregation arguments, as every method's builder takes them.

Each builder takes what `tff.learning.algorithms.build_weighted_fed_avg`
takes, by TFF's names and with TFF's meanings:

- `model_aggregator`: a `tff.aggregators.WeightedAggregationFactory`
  (`MeanFactory()` by default; `tff.learning.robust_aggregator()`,
  `compression_aggregator()`, `secure_aggregator()`), or an
  `UnweightedAggregationFactory` (`tff.learning.dp_aggregator(...)`), which
  the process runs as TFF's `build_unweighted_fed_avg` does: uniform client
  weighting, the factory wrapped by `tff.aggregators.as_weighted_aggregator`.
- `metrics_aggregator`: `(metric finalizers, unfinalized metrics type) ->
  federated computation`, `tff.learning.metrics.sum_then_finalize` by
  default (`secure_sum_then_finalize` also fits). The clients report their
  training metrics unfinalized, as a TFF model does
  (`TRAIN_METRIC_FINALIZERS` names them).
- `client_weighting`: `tff.learning.ClientWeighting.NUM_EXAMPLES` (the
  default) or `UNIFORM`; or `NumTokens()`, the labels that are not padding
  (for next-token tasks, as Reddi et al. weight Shakespeare and Stack
  Overflow clients; `fedavg.build_tff_fedavg` gives it to TFF's builder
  through the model, `tff_models.TokensAsExamples`).

`build_model_aggregator` makes TFF's four aggregator families by name, for
the binaries' `--aggregator` flag.
"""

import collections
import dataclasses
from typing import Any, Callable, Optional, Union

import tensorflow as tf
import tensorflow_federated as tff

ModelAggregator = Union[
  tff.aggregators.WeightedAggregationFactory,
  tff.aggregators.UnweightedAggregationFactory,
]
MetricsAggregator = Callable[..., tff.Computation]


@dataclasses.dataclass(frozen=True)
class NumTokens:
  """Client weighting by the tokens a client trained on: its labels other
  than `pad_token`, over every batch of the round (as the examples are
  counted for `NUM_EXAMPLES`).

  The weighting of Reddi et al.'s text tasks (google-research/federated
  weights Shakespeare and Stack Overflow clients by `num_tokens`, TFF's
  `NumTokensCounter` with the padding masked).
  """

  pad_token: int = 0

  def count(self, labels: tf.Tensor) -> tf.Tensor:
    """How many of `labels` are tokens, as a float32 scalar."""
    return tf.reduce_sum(
      tf.cast(
        tf.not_equal(labels, tf.cast(self.pad_token, labels.dtype)), tf.float32
      )
    )


ClientWeighting = Union[tff.learning.ClientWeighting, NumTokens]

# The client weightings by name, for the binaries' `--client_weighting`.
CLIENT_WEIGHTINGS = {
  'num_examples': tff.learning.ClientWeighting.NUM_EXAMPLES,
  'uniform': tff.learning.ClientWeighting.UNIFORM,
  'num_tokens': NumTokens(),
}

# The names `build_model_aggregator` takes: TFF's weighted mean and its
# four aggregator families.
AGGREGATORS = ('mean', 'robust', 'dp', 'compression', 'secure')


def model_aggregation(
  model_aggregator: Optional[ModelAggregator],
  client_weighting: Optional[tff.learning.ClientWeighting],
  default_weighting: tff.learning.ClientWeighting = (
    tff.learning.ClientWeighting.NUM_EXAMPLES
  ),
) -> tuple[
  tff.aggregators.WeightedAggregationFactory, tff.learning.ClientWeighting
]:
  """The weighted factory and client weighting a process runs with.

  Args:
    model_aggregator: A weighted or unweighted factory, or None for
      `tff.aggregators.MeanFactory()`.
    client_weighting: The weighting asked for, or None for the method's
      default (`default_weighting`; UNIFORM with an unweighted factory).
    default_weighting: The method's own default.

  Raises:
    TypeError: `model_aggregator` is not an aggregation factory, or
      `client_weighting` not a `tff.learning.ClientWeighting`.
    ValueError: an unweighted factory with NUM_EXAMPLES weighting.
  """
  if client_weighting is not None and not isinstance(
    client_weighting, (tff.learning.ClientWeighting, NumTokens)
  ):
    raise TypeError(
      f'client_weighting must be a tff.learning.ClientWeighting (UNIFORM '
      f'or NUM_EXAMPLES) or aggregation.NumTokens(), got '
      f'{client_weighting!r}.'
    )
  if model_aggregator is None:
    return (
      tff.aggregators.MeanFactory(),
      client_weighting or default_weighting,
    )
  if isinstance(model_aggregator, tff.aggregators.UnweightedAggregationFactory):
    if client_weighting not in (None, tff.learning.ClientWeighting.UNIFORM):
      raise ValueError(
        f'model_aggregator {type(model_aggregator).__name__} is an '
        'unweighted factory (e.g. tff.learning.dp_aggregator): it averages '
        'clients uniformly, so client_weighting must be UNIFORM or None, '
        f'not {client_weighting}.'
      )
    return (
      tff.aggregators.as_weighted_aggregator(model_aggregator),
      tff.learning.ClientWeighting.UNIFORM,
    )
  if isinstance(model_aggregator, tff.aggregators.WeightedAggregationFactory):
    return model_aggregator, client_weighting or default_weighting
  raise TypeError(
    'model_aggregator must be a tff.aggregators.WeightedAggregationFactory '
    'or UnweightedAggregationFactory (e.g. tff.learning.robust_aggregator()'
    f', tff.learning.dp_aggregator(...)), got {model_aggregator!r}.'
  )


def _ratio(values):
  # NaN when no client trained (every one was dropped as non-finite): no
  # made-up loss or accuracy.
  return tf.where(
    values[1] > 0,
    values[0] / tf.maximum(values[1], 1.0),
    tf.constant(float('nan')),
  )


def _count(dtype):
  return lambda values: tf.cast(values[0], dtype)


# A client's training metrics, unfinalized as a TFF model reports them
# (sums, each finalized after the sum over clients).
TRAIN_METRIC_FINALIZERS = collections.OrderedDict(
  sparse_categorical_accuracy=_ratio,
  loss=_ratio,
  objective=_ratio,
  num_examples=_count(tf.int64),
  num_batches=_count(tf.int64),
  num_non_finite_clients=_count(tf.int32),
)


def unfinalized_train_metrics(
  sums: dict[str, tf.Tensor],
) -> collections.OrderedDict:
  """A client's training sums as `TRAIN_METRIC_FINALIZERS`' inputs."""
  return collections.OrderedDict(
    sparse_categorical_accuracy=[sums['correct'], sums['num_labels']],
    loss=[sums['loss_sum'], sums['num_examples']],
    objective=[sums['objective_sum'], sums['num_examples']],
    num_examples=[sums['num_examples']],
    num_batches=[sums['num_batches']],
    num_non_finite_clients=[sums['num_non_finite_clients']],
  )


def build_metrics_aggregation(
  metrics_aggregator: Optional[MetricsAggregator], unfinalized_type: tff.Type
) -> Callable[[Any], Any]:
  """CLIENTS-placed unfinalized metrics -> SERVER `OrderedDict(train=...)`.

  Call the result while tracing a federated computation, as TFF's client
  works do.
  """
  aggregator = metrics_aggregator or tff.learning.metrics.sum_then_finalize
  if not callable(aggregator):
    raise TypeError(
      'metrics_aggregator must be a function (metric finalizers, '
      'unfinalized metrics type) -> federated computation, such as '
      f'tff.learning.metrics.sum_then_finalize; got {aggregator!r}.'
    )
  aggregate = aggregator(TRAIN_METRIC_FINALIZERS, unfinalized_type)

  def aggregate_train_metrics(unfinalized, **more):
    """`OrderedDict(train=..., **more)` at SERVER; `more` is SERVER-placed."""
    return tff.federated_zip(
      collections.OrderedDict(train=aggregate(unfinalized), **more)
    )

  return aggregate_train_metrics


def build_model_aggregator(
  name: str,
  *,
  noise_multiplier: float = 0.0,
  clients_per_round: Optional[int] = None,
  clip: Optional[float] = None,
  clipped_count_stddev: Optional[float] = None,
  target_unclipped_quantile: float = 0.5,
) -> Optional[ModelAggregator]:
  """One of TFF's aggregator families by name (None for 'mean').

  Args:
    name: 'mean' (None: the builders' `MeanFactory`), 'robust'
      (`tff.learning.robust_aggregator()`: adaptive zeroing and L2
      clipping), 'dp' (differentially private: Gaussian noise on clipped
      updates, an unweighted factory), 'compression'
      (`tff.learning.compression_aggregator()`) or 'secure'
      (`tff.learning.secure_aggregator()`).
    noise_multiplier: DP's noise standard deviation over the clip.
    clients_per_round: DP's expected clients per round.
    clip: DP's L2 clipping norm; None for TFF's adaptive clipping
      (`tff.aggregators.DifferentiallyPrivateFactory.gaussian_adaptive`,
      what `tff.learning.dp_aggregator` runs), a number for a fixed clip
      (`gaussian_fixed`). Either behind a fixed zeroing of updates whose
      norm is not finite (`ZeroingNonFiniteNorms`).
    clipped_count_stddev: The adaptive clip's noise on its count of clipped
      clients; None for TFF's 0.05 x clients_per_round. It must exceed half
      the noise multiplier (`privacy.value_noise_multiplier`).
    target_unclipped_quantile: The share of clients the adaptive clip aims
      to leave unclipped (TFF's 0.5 by default).

  Raises:
    ValueError: naming the bad value and what is allowed.
  """
  if name not in AGGREGATORS:
    raise ValueError(
      f'Unknown aggregator {name!r}; choose one of '
      f'{", ".join(AGGREGATORS)}.'
    )
  if name == 'mean':
    return None
  if name == 'robust':
    return tff.learning.robust_aggregator()
  if name == 'compression':
    return tff.learning.compression_aggregator()
  if name == 'secure':
    return tff.learning.secure_aggregator()
  if not isinstance(noise_multiplier, (int, float)) or noise_multiplier < 0:
    raise ValueError(
      f'The DP noise multiplier must be a number >= 0, got '
      f'{noise_multiplier!r}.'
    )
  if not isinstance(clients_per_round, int) or clients_per_round < 1:
    raise ValueError(
      f'DP needs the clients per round, an integer >= 1, got '
      f'{clients_per_round!r}.'
    )
  if clip is None:
    return _adaptive_dp(
      noise_multiplier,
      clients_per_round,
      clipped_count_stddev,
      target_unclipped_quantile,
    )
  if not isinstance(clip, (int, float)) or clip <= 0:
    raise ValueError(
      f'The DP clipping norm must be a number > 0, got ' f'{clip!r}.'
    )
  return ZeroingNonFiniteNorms(
    tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed(
      float(noise_multiplier), clients_per_round, float(clip)
    )
  )


def _adaptive_dp(
  noise_multiplier, clients_per_round, clipped_count_stddev, target_quantile
):
  """TFF's DP factory with the adaptive clip, after the checks TFF would
  make later, named with the arguments' names."""
  if not 0 < target_quantile < 1:
    raise ValueError(
      "the adaptive clip's target unclipped quantile must be in (0, 1), "
      f'got {target_quantile!r}.'
    )
  if clipped_count_stddev is not None and not clipped_count_stddev > 0:
    raise ValueError(
      f'the clipped-count noise must be > 0, got {clipped_count_stddev!r}.'
    )
  # TFF's adaptive clip spends part of the budget on counting clipped
  # clients (Andrew et al., 2021); the count's noise must exceed half the
  # noise multiplier, or TFF refuses.
  default_count = clipped_count_stddev is None
  count_stddev = (
    0.05 * clients_per_round if default_count else clipped_count_stddev
  )
  if 0 < noise_multiplier >= 2 * count_stddev:
    raise ValueError(
      f'adaptive clipping at noise multiplier {noise_multiplier} needs a '
      f'clipped-count noise above {noise_multiplier / 2:g}, got '
      f'{count_stddev:g}'
      + (
        f' (0.05 x {clients_per_round} clients per round)'
        if default_count
        else ''
      )
      + ': raise clients_per_round'
      + (f' above {int(10 * noise_multiplier)}' if default_count else '')
      + f' or clipped_count_stddev above {noise_multiplier / 2:g}, lower '
      f'noise_multiplier below {2 * count_stddev:g}, or fix the clip '
      '(clip=...).'
    )
  return ZeroingNonFiniteNorms(
    tff.aggregators.DifferentiallyPrivateFactory.gaussian_adaptive(
      float(noise_multiplier),
      clients_per_round,
      target_unclipped_quantile=float(target_quantile),
      clipped_count_stddev=None if default_count else float(count_stddev),
    )
  )


class ZeroingNonFiniteNorms(tff.aggregators.UnweightedAggregationFactory):
  """`inner`, after each client's value whose l2 norm is not finite is
  replaced by zeros.

  A DP clip scales a value by clip / norm: a value whose entries are
  finite but whose norm overflows (an entry above about 1.8e19) becomes
  NaN, and so the noised sum: one client would decide whether the round is
  released. Zeroed first by a fixed, data-free rule, every client's
  contribution stays within the clip. (TFF's `zeroing_factory` compares
  the norm with a threshold; in TFF's worker the overflowing norm passes
  it.) TFF's `dp_aggregator` also zeroes by an adaptive norm estimated
  without noise from the clients' norms, which the guarantee does not
  cover: `build_model_aggregator('dp', ...)` uses this instead.
  """

  def __init__(self, inner: tff.aggregators.UnweightedAggregationFactory):
    self._inner = inner

  def create(self, value_type) -> tff.templates.AggregationProcess:
    inner_process = self._inner.create(value_type)

    @tff.tensorflow.computation(value_type)
    def zero_unless_norm_is_finite(value):
      values = tf.nest.flatten(value)
      finite = tf.math.is_finite(tf.linalg.global_norm(values))
      kept = tf.cond(
        finite,
        lambda: [tf.identity(v) for v in values],
        lambda: [tf.zeros_like(v) for v in values],
      )
      return tf.nest.pack_sequence_as(value, kept)

    @tff.federated_computation(
      inner_process.initialize.type_signature.result,
      tff.FederatedType(value_type, tff.CLIENTS),
    )
    def next_fn(state, value):
      return inner_process.next(
        state, tff.federated_map(zero_unless_norm_is_finite, value)
      )

    return tff.templates.AggregationProcess(inner_process.initialize, next_fn)
