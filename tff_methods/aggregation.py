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
  default) or `UNIFORM`.

`build_model_aggregator` makes TFF's four aggregator families by name, for
the binaries' `--aggregator` flag.
"""

import collections
from typing import Any, Callable, Optional, Union

import tensorflow as tf
import tensorflow_federated as tff

ModelAggregator = Union[
  tff.aggregators.WeightedAggregationFactory,
  tff.aggregators.UnweightedAggregationFactory,
]
MetricsAggregator = Callable[..., tff.Computation]

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
    client_weighting, tff.learning.ClientWeighting
  ):
    raise TypeError(
      f'client_weighting must be a tff.learning.ClientWeighting (UNIFORM '
      f'or NUM_EXAMPLES), got {client_weighting!r}.'
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
      (`tff.learning.dp_aggregator`), a number for a fixed clip
      (`tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed`).

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
    # TFF's adaptive clip spends part of the budget on counting clipped
    # clients, with noise 0.05 * clients_per_round; it needs more than
    # half the noise multiplier (Andrew et al., 2021), or TFF refuses.
    if 0 < noise_multiplier >= 2 * (0.05 * clients_per_round):
      raise ValueError(
        f'adaptive clipping at noise multiplier {noise_multiplier} needs '
        f'more than {int(10 * noise_multiplier)} clients per round, got '
        f'{clients_per_round} (TFF counts clipped clients with noise '
        '0.05 x clients per round, which must exceed half the noise '
        'multiplier): raise clients_per_round, lower noise_multiplier '
        f'below {0.1 * clients_per_round:g}, or fix the clip (clip=...).'
      )
    return tff.learning.dp_aggregator(
      float(noise_multiplier), clients_per_round
    )
  if not isinstance(clip, (int, float)) or clip <= 0:
    raise ValueError(
      f'The DP clipping norm must be a number > 0, got ' f'{clip!r}.'
    )
  return tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed(
    float(noise_multiplier), clients_per_round, float(clip)
  )
