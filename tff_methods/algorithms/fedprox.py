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

import tensorflow as tf

from tff_methods.algorithms import method_spec
from tff_methods.templates import regularizers

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
  term=ProximalTerm,
)

# The public builder: TFF's builder arguments and the settings its term
# takes; what the registry and the binaries build.
build_fedprox = method_spec.builder(METHOD)
