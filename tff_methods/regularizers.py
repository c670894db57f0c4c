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
    broadcast: What regularizers with server state broadcast this round,
      by regularizer name (e.g. FedCos's last global move under 'fedcos').
    client_state: In stateful processes, the client's own state of each
      regularizer that keeps one (`keeps_client_state`), by regularizer
      name (e.g. SCAFFOLD's control variate under 'scaffold'); else None.
    learning_rate: The client optimizer's learning rate this round (its
      `learning_rate` hyperparameter, scheduled or set by `set_hparams`);
      None for an optimizer without one.
  """

  weights: Sequence[tf.Variable]
  global_weights: Sequence[tf.Tensor]
  outputs: Mapping[str, tf.Tensor]
  batch: Any
  global_outputs: Optional[Mapping[str, tf.Tensor]] = None
  previous_outputs: Optional[Mapping[str, tf.Tensor]] = None
  has_previous: Any = False
  broadcast: Optional[Mapping[str, Any]] = None
  client_state: Any = None
  learning_rate: Any = None


class Regularizer(abc.ABC):
  """A term added to the local objective.

  Subclasses set `name` and implement `__call__`, returning a scalar that is
  already multiplied by the regularizer's strength. They declare the
  reference-model outputs they read; a regularizer that reads the previous
  model, or keeps state of its own on each client (`keeps_client_state`),
  makes its method keep per-client state (`tff_methods.stateful`).

  Server and client state, for the terms that need them (FedCos, SCAFFOLD):
  the server state lives in the process's distributor, which runs
  `server_broadcast` each round and sends its value to every client
  (`LocalStep.broadcast`); after the round it may learn the mean client
  update (`record_mean_update`) and the mean of what clients report
  (`record_client_reports`). A client's own state is read before its
  training (`LocalStep.client_state`) and replaced after it by
  `next_client_state`, which also returns the client's report.
  """

  name: str = 'regularizer'
  # The method's name in messages.
  display_name: str = 'A regularizer'
  # Output names read from the model being trained (the model's contract,
  # `model_lib`; checked when a process is built)...
  outputs: tuple[str, ...] = ()
  # ... from the global model...
  global_outputs: tuple[str, ...] = ()
  # ... and from the client's previous local model.
  previous_outputs: tuple[str, ...] = ()
  # Whether it keeps server state broadcast every round (see below).
  keeps_server_state: bool = False
  # Whether that state also learns the round's mean client update
  # (`record_mean_update`), after aggregation and before the server
  # optimizer.
  reads_mean_update: bool = False
  # Whether each client keeps state of its own for this term.
  keeps_client_state: bool = False
  # Whether the server state learns the mean of the clients' reports
  # (`record_client_reports`).
  reads_client_reports: bool = False
  # Whether it moves the weights after each optimizer step, outside the
  # optimizer (`weight_correction`), as SCAFFOLD's reference code does.
  corrects_weights: bool = False

  def initial_server_state(self, trainable_zeros: Sequence[Any]) -> Any:
    """Server state this regularizer keeps across rounds, or None.

    A regularizer with server state has it updated from the global model
    and broadcast to clients every round (`server_broadcast`), by the
    distributor of its process; it is saved with the program state.

    Args:
      trainable_zeros: Zeros shaped like the trainable weights.
    """
    del trainable_zeros
    return None

  def server_broadcast(
    self, server_state: Any, global_weights: Sequence[tf.Tensor]
  ):
    """(new server state, value broadcast to clients) for this round.

    Runs at the server in TensorFlow, with the round's global weights.
    """
    raise NotImplementedError(f'{self.name} keeps no server state.')

  def record_mean_update(
    self, server_state: Any, mean_update: Sequence[tf.Tensor]
  ) -> Any:
    """The server state after the round's mean client update (w_g - w).

    Runs at the server in TensorFlow, when `reads_mean_update`.
    """
    raise NotImplementedError(f'{self.name} does not read the mean update.')

  def initial_client_state(self, trainable_zeros: Sequence[Any]) -> Any:
    """The state of a client that has not taken part yet (arrays)."""
    raise NotImplementedError(f'{self.name} keeps no client state.')

  def next_client_state(
    self,
    client_state: Any,
    *,
    update: Sequence[tf.Tensor],
    num_steps: tf.Tensor,
    broadcast: Any,
    learning_rate: Any = None,
  ) -> tuple[Any, Any]:
    """(the client's new state, its report) after its local training.

    Runs on the client in TensorFlow, when `keeps_client_state`; the
    report is None unless `reads_client_reports`. A client whose update
    is not finite keeps its old state and reports nothing.

    Args:
      client_state: The state the client trained with.
      update: Its update `w_g - w`, by trainable weight.
      num_steps: The local steps it took (float scalar).
      broadcast: This regularizer's broadcast value of the round.
      learning_rate: The client optimizer's learning rate of the round
        (`LocalStep.learning_rate`).
    """
    raise NotImplementedError(f'{self.name} keeps no client state.')

  def record_client_reports(
    self, server_state: Any, mean_report: Any, num_reports: tf.Tensor
  ) -> Any:
    """The server state after the mean of `num_reports` clients' reports.

    Runs at the server in TensorFlow, when `reads_client_reports`.
    """
    raise NotImplementedError(f'{self.name} reads no client reports.')

  def weight_correction(self, step: LocalStep) -> Sequence[tf.Tensor]:
    """What to subtract from each trainable weight after the optimizer's
    step (when `corrects_weights`): a move that no optimizer state (such
    as momentum) sees."""
    raise NotImplementedError(f'{self.name} does not correct the weights.')

  @abc.abstractmethod
  def __call__(self, step: LocalStep) -> tf.Tensor: ...


def check_strength(name: str, value: float) -> float:
  """Rejects a negative (or non-numeric) regularization strength."""
  if not isinstance(value, (int, float)) or value < 0:
    raise ValueError(f'{name} must be a number >= 0, got {value!r}.')
  return float(value)


def needs_previous_model(regularizers: Sequence[Regularizer]) -> bool:
  """Whether any regularizer reads the client's previous local model."""
  return any(r.previous_outputs for r in regularizers)


def needs_client_state(regularizers: Sequence[Regularizer]) -> bool:
  """Whether the regularizers make each client keep state between rounds:
  its previous model, or state of their own."""
  return needs_previous_model(regularizers) or any(
    r.keeps_client_state for r in regularizers
  )


def with_server_state(
  regularizers: Sequence[Regularizer], trainable_zeros: Sequence[Any]
) -> dict[str, Any]:
  """The initial server state of each regularizer that keeps one, by name."""
  states = {}
  for r in regularizers:
    if r.keeps_server_state:
      state = r.initial_server_state(trainable_zeros)
      if r.name in states:
        raise ValueError(
          f'Two regularizers named {r.name!r} keep server '
          'state; names must be unique.'
        )
      states[r.name] = state
  return states


def keeps_server_state(regularizers: Sequence[Regularizer]) -> bool:
  """Whether any regularizer keeps server state to broadcast."""
  return any(r.keeps_server_state for r in regularizers)


def reads_mean_update(regularizers: Sequence[Regularizer]) -> bool:
  """Whether any regularizer's server state learns the mean update."""
  return any(r.reads_mean_update for r in regularizers)
