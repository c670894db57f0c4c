"""A method of a user's own: `mu/2 ||w - w_g||^2` on the local objective.

Its declaration and one registry line are all it takes: importing this
module (`--method_module=mypkg.pull`) gives the binaries `--method=pull`
and `--pull_mu`.
"""

import dataclasses

import tensorflow as tf

from tff_methods.algorithms import method_spec
from tff_methods.algorithms import methods
from tff_methods.templates import regularizers


class Pull(regularizers.Regularizer):
  """The pull of the local weights towards the round's global ones."""

  name = 'pull'
  display_name = 'Pull'

  def __init__(self, mu: float):
    self.mu = regularizers.check_strength('Pull mu', mu)

  def __call__(self, step):
    return (
      0.5
      * self.mu
      * tf.add_n(
        [
          tf.reduce_sum(tf.square(w - g))
          for w, g in zip(step.weights, step.global_weights)
        ]
      )
    )


@dataclasses.dataclass(frozen=True)
class Settings:
  mu: float = method_spec.setting(0.0, 'The pull towards w_g.', minimum=0.0)


METHOD = methods.register(
  method_spec.MethodSpec(
    name='pull',
    display_name='Pull',
    settings=Settings,
    term=Pull,
  )
)
