"""FedCKA (Son et al., 2022): contrastive regularization of the first layers.

Paper: Son, Kim and Chung, "Comparisons Where It Matters: Using Layer-Wise
Regularization to Improve Federated Learning on Heterogeneous Data",
Applied Sciences 12(19):9943, 2022. https://doi.org/10.3390/app12199943

Local objective, with `a_n`, `a_glob_n`, `a_prev_n` the activations of the
n-th regularized layer (the first M layers, nearest the input) of the local
model, the round's global model and the client's previous local model on
the same batch, each flattened to B x D:

  l_cka = (1/M) sum_n -log( e^{s(a_n, a_glob_n)}
                            / (e^{s(a_n, a_glob_n)} + e^{s(a_n, a_prev_n)}) ),
  loss = CE + mu * l_cka,

with `s` linear CKA by default (no temperature). Only the first M layers of
the global and previous models are computed, never their full forward pass
(the paper's efficiency claim, Table 4). In a client's first round there is
no previous model, so the term is 0 (as in MOON). Needs per-client state.

Server rule: FedAvg's example-weighted mean of the updates.
"""

import dataclasses
from typing import Any, Callable, Optional, Sequence

import tensorflow as tf
import tensorflow_federated as tff

from tff_methods import aggregation
from tff_methods import local_training
from tff_methods import method_spec
from tff_methods import model_lib
from tff_methods import processes
from tff_methods import regularizers
from tff_methods import similarity as similarity_lib
from tff_methods import stateful

# The strength the project uses when none is given (the paper tunes 3, 5
# and 10 per data set).
DEFAULT_MU = 3.0


def cka_contrastive_loss(
  activations: Sequence[tf.Tensor],
  activations_global: Sequence[tf.Tensor],
  activations_prev: Sequence[tf.Tensor],
  similarity_to_each: similarity_lib.SimilarityToEach = (
    similarity_lib.linear_cka_to_each
  ),
) -> tf.Tensor:
  """FedCKA's loss averaged over the M regularized layers (no strength)."""
  losses = []
  for a, a_global, a_prev in zip(
    activations, activations_global, activations_prev
  ):
    logits = tf.stack(similarity_to_each(a, [a_global, a_prev]))
    losses.append(tf.reduce_logsumexp(logits) - logits[0])
  return tf.add_n(losses) / len(losses)


class CKAContrastiveTerm(regularizers.Regularizer):
  """`mu * l_cka` on layers `layer_1`..`layer_M`; 0 without a previous model."""

  name = 'fedcka'
  display_name = 'FedCKA'

  def __init__(
    self, mu: float, num_layers: int = 2, similarity: str = 'linear_cka'
  ):
    self.mu = regularizers.check_strength('FedCKA mu', mu)
    if not isinstance(num_layers, int) or num_layers < 1:
      raise ValueError(f'FedCKA cka_layers must be >= 1, got {num_layers!r}.')
    self.similarity = similarity
    self.similarity_to_each = similarity_lib.get_similarity_to_each(similarity)
    self.layers = tuple(f'layer_{n + 1}' for n in range(num_layers))
    self.outputs = self.layers
    self.global_outputs = self.layers
    self.previous_outputs = self.layers

  def __call__(self, step: regularizers.LocalStep) -> tf.Tensor:
    term = cka_contrastive_loss(
      [step.outputs[k] for k in self.layers],
      [step.global_outputs[k] for k in self.layers],
      [step.previous_outputs[k] for k in self.layers],
      self.similarity_to_each,
    )
    return self.mu * tf.cast(step.has_previous, tf.float32) * term


def build_fedcka(
  keras_model_fn: model_lib.KerasModelFn,
  element_spec: Any,
  *,
  dataset_computation: tff.Computation,
  client_optimizer_fn: tff.learning.optimizers.Optimizer,
  mu: float = DEFAULT_MU,
  num_layers: int = 2,
  similarity: str = 'linear_cka',
  server_optimizer_fn: Optional[tff.learning.optimizers.Optimizer] = None,
  client_state_dir: Optional[str] = None,
  base_regularizers: Sequence[regularizers.Regularizer] = (),
  model_aggregator: Optional[aggregation.ModelAggregator] = None,
  metrics_aggregator: Optional[aggregation.MetricsAggregator] = None,
  client_weighting: Optional[aggregation.ClientWeighting] = None,
  loss_fn: Optional[local_training.LossFn] = None,
  client_learning_rate_fn: Optional[Callable[[Any], Any]] = None,
) -> stateful.StatefulClientsLearningProcess:
  """Builds FedCKA as a stateful-client learning process.

  Args:
    keras_model_fn: Builds a Keras model: one of `tff_methods_tasks.models`, a
      user's single-output model (taken as the logits), or one whose layers
      `model_lib.named_outputs` names; its `layer_1` .. `layer_M` outputs are
      regularized (for a ResNet: the stem and the first stage).
    element_spec: The spec of one batch of client data.
    dataset_computation: A client's `[client id, round]` key -> its
      batches (`tff_methods_tasks.datasets.round_dataset_computation`), or TFF's
      client-id form: a batched `ClientData` or its `dataset_computation`
      (`client_data.key_dataset_computation`).
    client_optimizer_fn: The client optimizer.
    mu: The strength, >= 0; 0 is FedAvg (paper: 3, 5 or 10).
    num_layers: M, the number of layers regularized (default 2).
    similarity: A name in `similarity.SIMILARITIES`: 'linear_cka'
      (default), 'kernel_cka', or the paper's Table 3 forms as
      similarities, per element: 'frobenius' (-||a1 - a2||_F^2 / (B D)) and
      'cosine' (<vec a1, vec a2> / (B D)).
    server_optimizer_fn: SGD with learning rate 1 by default.
    client_state_dir: Where the clients' state files live; a temporary
      directory by default, which a resumed program can't use (`next`
      refuses to start past round 1 with it).
    base_regularizers: Other methods' terms to add (a combination).
    model_aggregator: TFF's model aggregator, weighted or unweighted
      (`tff.learning.robust_aggregator()`, `dp_aggregator(...)`, ...;
      `tff_methods.aggregation`); the weighted mean by default.
    metrics_aggregator: TFF's metrics aggregator;
      `tff.learning.metrics.sum_then_finalize` by default.
    client_weighting: `tff.learning.ClientWeighting` or
      `aggregation.NumTokens()`; NUM_EXAMPLES by default, UNIFORM with an
      unweighted `model_aggregator`.
    loss_fn: The data term, `(labels, model outputs) -> scalar`;
      cross-entropy on `logits` by default.
    client_learning_rate_fn: Round number (from 0) -> the client learning
      rate, as TFF's `build_weighted_fed_avg_with_optimizer_schedule`; None
      for the client optimizer's own, which `get_hparams`/`set_hparams`
      read and set.
  """
  return processes.build_local_training_process(
    keras_model_fn,
    element_spec,
    client_optimizer_fn,
    server_optimizer_fn,
    list(base_regularizers) + [CKAContrastiveTerm(mu, num_layers, similarity)],
    dataset_computation=dataset_computation,
    client_state_dir=client_state_dir,
    model_aggregator=model_aggregator,
    metrics_aggregator=metrics_aggregator,
    client_weighting=client_weighting,
    loss_fn=loss_fn,
    client_learning_rate_fn=client_learning_rate_fn,
  )


@dataclasses.dataclass(frozen=True)
class Settings:
  """FedCKA's settings (flags `--fedcka_<name>`)."""

  mu: float = method_spec.setting(
    DEFAULT_MU, 'The contrastive strength.', minimum=0.0
  )
  layers: int = method_spec.setting(
    2,
    "M: the first M layers regularized (at most the model's: 7 on the "
    'FedCKA CNN).',
    minimum=1,
  )
  similarity: str = method_spec.setting(
    'linear_cka',
    "How two layers' activations are compared: linear_cka, kernel_cka, "
    'frobenius (-||a1 - a2||^2), cosine (the inner product), '
    'normalized_cosine or normalized_frobenius.',
    choices=tuple(similarity_lib.SIMILARITIES),
  )


METHOD = method_spec.MethodSpec(
  name='fedcka',
  display_name='FedCKA',
  settings=Settings,
  term=lambda settings: CKAContrastiveTerm(
    settings.mu, settings.layers, settings.similarity
  ),
)
