"""Pluggable regularizers for the shared local-training loop.

Most methods here are "cross-entropy plus a regularizer". The local loop
(`tff_methods.local_training`) computes, at every local step,

  objective = cross_entropy(y, logits) + sum(r(step) for r in regularizers)

where each regularizer reads what it needs from a `LocalStep`: the current
and the round's global weights, the model's named outputs on the batch and,
where it declares them, outputs of the round's global model and of the
client's previous local model on the same batch (MOON, FedCKA). The loop
computes only the declared outputs, by running truncated copies of those
models (inference mode, no gradient) up to the layers they come from.
A regularizer returns its term already scaled by its strength, so
combinations such as FedProx + FedCos are just a longer list.
"""

import abc
import dataclasses
from typing import Any, Mapping, Optional, Sequence

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
    global_outputs: The global model's outputs that the regularizers
      declared (`Regularizer.global_outputs`), without gradient.
    previous_outputs: The same for the client's previous local model.
    has_previous: A boolean scalar: whether the client has a previous model
      (False in the first round it takes part in).
  """
  weights: Sequence[tf.Variable]
  global_weights: Sequence[tf.Tensor]
  outputs: Mapping[str, tf.Tensor]
  batch: Any
  global_outputs: Optional[Mapping[str, tf.Tensor]] = None
  previous_outputs: Optional[Mapping[str, tf.Tensor]] = None
  has_previous: Any = False


class Regularizer(abc.ABC):
  """A term added to the local objective.

  Subclasses set `name` and implement `__call__`, returning a scalar that is
  already multiplied by the regularizer's strength. They declare the
  reference-model outputs they read; a regularizer that reads the previous
  model makes its method keep per-client state (`tff_methods.stateful`).
  """

  name: str = 'regularizer'
  # Output names (`layer_k`, `z`, ...) read from the global model...
  global_outputs: tuple[str, ...] = ()
  # ... and from the client's previous local model.
  previous_outputs: tuple[str, ...] = ()

  @abc.abstractmethod
  def __call__(self, step: LocalStep) -> tf.Tensor:
    ...


def check_strength(name: str, value: float) -> float:
  """Rejects a negative (or non-numeric) regularization strength."""
  if not isinstance(value, (int, float)) or value < 0:
    raise ValueError(f'{name} must be a number >= 0, got {value!r}.')
  return float(value)


def needs_previous_model(regularizers: Sequence[Regularizer]) -> bool:
  """Whether any regularizer reads the client's previous local model."""
  return any(r.previous_outputs for r in regularizers)
