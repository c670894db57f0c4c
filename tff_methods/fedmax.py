"""FedMAX (Chen et al., ECML-PKDD 2020): a maximum-entropy prior on activations.

Paper: Chen, Bhardwaj and Marculescu, "FedMAX: Mitigating Activation
Divergence for Accurate and Communication-Efficient Federated Learning",
ECML PKDD 2020. https://arxiv.org/abs/2004.03657

Local objective, with `act` the activation vector (the input of the last
dense layer, the model's `features` output, D wide):

  loss = CE + beta * KL(U || softmax(act)),

U uniform over the D dimensions, at the reference code's scale
(`nn.KLDivLoss()(log_softmax(act), softmax(zeros))`): the mean over all
B * D elements of `(1/D) * (log(1/D) - log_softmax(act))`, so the paper's
beta values carry over (1000 for CIFAR). Stateless.

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

# The paper's strength for CIFAR.
DEFAULT_BETA = 1000.0


def activation_entropy_loss(activations: tf.Tensor) -> tf.Tensor:
  """KL(U || softmax(act)) as the element-wise mean over the batch (no beta)."""
  activations = tf.cast(activations, tf.float32)
  width = tf.cast(tf.shape(activations)[-1], tf.float32)
  log_probabilities = tf.nn.log_softmax(activations, axis=-1)
  return tf.reduce_mean(
    (1.0 / width) * (-tf.math.log(width) - log_probabilities)
  )


class ActivationEntropyTerm(regularizers.Regularizer):
  """`beta * KL(U || softmax(features))`."""

  name = 'fedmax'
  display_name = 'FedMAX'
  outputs = ('features',)

  def __init__(self, beta: float):
    self.beta = regularizers.check_strength('FedMAX beta', beta)

  def __call__(self, step: regularizers.LocalStep) -> tf.Tensor:
    return self.beta * activation_entropy_loss(step.outputs['features'])


def build_fedmax(
  keras_model_fn: model_lib.KerasModelFn,
  element_spec: Any,
  *,
  client_optimizer_fn: tff.learning.optimizers.Optimizer,
  beta: float = DEFAULT_BETA,
  server_optimizer_fn: Optional[tff.learning.optimizers.Optimizer] = None,
  base_regularizers: Sequence[regularizers.Regularizer] = (),
  dataset_computation: Optional[tff.Computation] = None,
  model_aggregator: Optional[aggregation.ModelAggregator] = None,
  metrics_aggregator: Optional[aggregation.MetricsAggregator] = None,
  client_weighting: Optional[aggregation.ClientWeighting] = None,
  loss_fn: Optional[local_training.LossFn] = None,
  client_learning_rate_fn: Optional[Callable[[Any], Any]] = None,
) -> tff.learning.templates.LearningProcess:
  """Builds FedMAX as a `tff.learning.templates.LearningProcess`.

  Args:
    keras_model_fn: Builds a Keras model: one of `tff_methods_tasks.models`, a
      user's single-output model (taken as the logits), or one whose layers
      `model_lib.named_outputs` names; FedMAX reads its `features` output.
    element_spec: The spec of one batch of client data.
    client_optimizer_fn: The client optimizer.
    beta: The prior's strength, >= 0; 0 is FedAvg (paper: 1000 on CIFAR).
    server_optimizer_fn: SGD with learning rate 1 by default.
    base_regularizers: Other methods' terms to add (a combination).
    dataset_computation: A client's key -> its batches
      (`tff_methods_tasks.datasets.round_dataset_computation`), or a batched TFF
      `ClientData`; when given, `next` takes the clients' keys (ids for a
      `ClientData`) and each client makes its batches in its own computation.
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
    regularizers=list(base_regularizers) + [ActivationEntropyTerm(beta)],
    dataset_computation=dataset_computation,
    model_aggregator=model_aggregator,
    metrics_aggregator=metrics_aggregator,
    client_weighting=client_weighting,
    loss_fn=loss_fn,
    client_learning_rate_fn=client_learning_rate_fn,
  )


@dataclasses.dataclass(frozen=True)
class Settings:
  """FedMAX's settings (flags `--fedmax_<name>`)."""

  beta: float = method_spec.setting(
    DEFAULT_BETA,
    "The maximum-entropy prior's strength (the paper's CIFAR value).",
    minimum=0.0,
  )


METHOD = method_spec.MethodSpec(
  name='fedmax',
  display_name='FedMAX',
  settings=Settings,
  term=lambda settings: ActivationEntropyTerm(settings.beta),
)
