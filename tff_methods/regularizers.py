"""Pluggable regularizers for the shared local-training loop.

Most methods here are "cross-entropy plus a regularizer". The local loop
(`tff_methods.local_training`) computes, at every local step,

  objective = cross_entropy(y, logits) + sum(r(step) for r in regularizers)

where each regularizer reads what it needs from a `LocalStep`: the current
and the round's global weights, and the model's named outputs on the batch.
A regularizer returns its term already scaled by its strength, so
combinations such as FedProx + FedCos are just a longer list.
"""

import abc
import dataclasses
from typing import Any, Mapping, Sequence

import tensorflow as tf


@dataclasses.dataclass(frozen=True)
class LocalStep:
  """What a regularizer may read at one local training step.

  Attributes:
    weights: The model's trainable variables (being trained).
    global_weights: The trainable weights the round started from (`w_g`),
      in the same order.
    outputs: The model's named outputs on the batch (`layer_k`, `features`,
      `z`, `logits`), computed with `training=True` and on the gradient tape.
    batch: The batch, an `OrderedDict(x, y)`.
  """
  weights: Sequence[tf.Variable]
  global_weights: Sequence[tf.Tensor]
  outputs: Mapping[str, tf.Tensor]
  batch: Any


class Regularizer(abc.ABC):
  """A term added to the local objective.

  Subclasses set `name` and implement `__call__`, returning a scalar that is
  already multiplied by the regularizer's strength.
  """

  name: str = 'regularizer'

  @abc.abstractmethod
  def __call__(self, step: LocalStep) -> tf.Tensor:
    ...


def check_strength(name: str, value: float) -> float:
  """Rejects a negative (or non-numeric) regularization strength."""
  if not isinstance(value, (int, float)) or value < 0:
    raise ValueError(f'{name} must be a number >= 0, got {value!r}.')
  return float(value)
