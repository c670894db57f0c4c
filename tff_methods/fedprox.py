"""FedProx (Li et al., 2020): a proximal term towards the global model.

Paper: Li et al., "Federated Optimization in Heterogeneous Networks",
MLSys 2020. https://arxiv.org/abs/1812.06127

Local objective, with `w_g` the global weights the round started from:

  loss = CE(w) + (mu / 2) * sum over trainable tensors of ||w - w_g||^2,

whose gradient adds `mu * (w - w_g)`: the pull is towards `w_g`. (TFF 0.87's
`build_weighted_fed_prox` adds `mu * (w_g - w)` instead and diverges as mu
grows; this module does not use it.)

Server rule: FedAvg's example-weighted mean of the client updates, through
the chosen server optimizer (SGD with learning rate 1 by default).
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

# The strength the project uses when none is given (NIID-Bench's grid for
# CIFAR-10 picks 0.01).
DEFAULT_MU = 0.01


class ProximalTerm(regularizers.Regularizer):
  """`(mu / 2) * ||w - w_g||^2` over all trainable tensors."""

  name = 'proximal'
  display_name = 'FedProx'

  def __init__(self, mu: float):
    self.mu = regularizers.check_strength('FedProx mu', mu)

  def __call__(self, step: regularizers.LocalStep) -> tf.Tensor:
    squared_distance = tf.add_n(
      [
        tf.reduce_sum(tf.square(w - wg))
        for w, wg in zip(step.weights, step.global_weights)
      ]
    )
    return 0.5 * self.mu * squared_distance


def build_fedprox(
  keras_model_fn: model_lib.KerasModelFn,
  element_spec: Any,
  *,
  client_optimizer_fn: tff.learning.optimizers.Optimizer,
  mu: float = DEFAULT_MU,
  server_optimizer_fn: Optional[tff.learning.optimizers.Optimizer] = None,
  base_regularizers: Sequence[regularizers.Regularizer] = (),
  dataset_computation: Optional[tff.Computation] = None,
  model_aggregator: Optional[aggregation.ModelAggregator] = None,
  metrics_aggregator: Optional[aggregation.MetricsAggregator] = None,
  client_weighting: Optional[aggregation.ClientWeighting] = None,
  loss_fn: Optional[local_training.LossFn] = None,
  client_learning_rate_fn: Optional[Callable[[Any], Any]] = None,
) -> tff.learning.templates.LearningProcess:
  """Builds FedProx as a `tff.learning.templates.LearningProcess`.

  Args:
    keras_model_fn: Builds a Keras model: one of `tff_methods_tasks.models`, a
      user's single-output model (taken as the logits), or one whose layers
      `model_lib.named_outputs` names.
    element_spec: The spec of one batch of client data.
    client_optimizer_fn: The client optimizer.
    mu: The proximal strength, >= 0; 0 is FedAvg.
    server_optimizer_fn: SGD with learning rate 1 (plain averaging) by default;
      another server rule for a combination such as FedAvgM + FedProx.
    base_regularizers: Other methods' terms to add (a combination).
    dataset_computation: A client's key -> its batches
      (`tff_methods_tasks.datasets.round_dataset_computation`); when given,
      `next` takes the clients' keys and each client makes its batches in its
      own computation.
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
    regularizers=list(base_regularizers) + [ProximalTerm(mu)],
    dataset_computation=dataset_computation,
    model_aggregator=model_aggregator,
    metrics_aggregator=metrics_aggregator,
    client_weighting=client_weighting,
    loss_fn=loss_fn,
    client_learning_rate_fn=client_learning_rate_fn,
  )


@dataclasses.dataclass(frozen=True)
class Settings:
  """FedProx's settings (flags `--fedprox_<name>`)."""

  mu: float = method_spec.setting(
    DEFAULT_MU,
    'The proximal strength (0 is FedAvg).',
    minimum=0.0,
  )


METHOD = method_spec.MethodSpec(
  name='fedprox',
  display_name='FedProx',
  settings=Settings,
  term=lambda settings: ProximalTerm(settings.mu),
)
