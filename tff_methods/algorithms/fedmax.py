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

import tensorflow as tf

from tff_methods.algorithms import method_spec
from tff_methods.templates import regularizers

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
  term=ActivationEntropyTerm,
)

# The public builder: TFF's builder arguments and the settings its term
# takes; what the registry and the binaries build.
build_fedmax = method_spec.builder(METHOD)
