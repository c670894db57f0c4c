"""Pluggable regularizers for the shared local-training loop.

Most methods here are "cross-entropy plus a regularizer". The local loop
(`tff_methods.templates.local_training`) computes, at every local step,

  objective = cross_entropy(y, logits) + sum(r(step) for r in regularizers)

where each regularizer reads what it needs from a `LocalStep`: the current
and the round's global weights, the model's named outputs on the batch and,
where it declares them, outputs of the round's global model and of the
client's previous local model on the same batch (MOON, FedCKA). The loop
computes only the declared outputs, by running truncated copies of those
models (inference mode, no gradient) up to the layers they come from.
A regularizer returns its term already scaled by its strength, so
combinations such as FedProx + FedCos are just a longer list. A term may
also supply state at the server (`ServerState`), state on each client
(`ClientState`) and a move of the weights after each step
(`Regularizer.weight_correction`); supplying one is what declares it.
"""

import dataclasses
from typing import Any, Callable, Mapping, Optional, Sequence

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
      regularizer that keeps one (`Regularizer.client_state`), by regularizer
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


@dataclasses.dataclass(frozen=True)
class ServerState:
  """State a term keeps at the server across rounds, broadcast every round.

  The process's distributor keeps it (`distributors.build_distributor`) and
  saves it with the program state. The optional functions say what else it
  learns from the round; a term supplies those it needs.

  Attributes:
    initial: `trainable_zeros` (zeros shaped like the trainable weights) ->
      the state before the first round (arrays).
    broadcast: `(state, global_weights)` -> `(new state, value)`, at the
      server in TensorFlow each round; every client reads the value as
      `LocalStep.broadcast[term.name]`.
    record_mean_update: `(state, mean_update)` -> the state after the
      round's mean client update (w_g - w), after aggregation and before the
      server optimizer; None if the state does not learn it.
    record_client_reports: `(state, mean_report, num_reports)` -> the state
      after the mean of what the clients reported (`ClientState.update`);
      None if it reads no reports.
  """

  initial: Callable[[Sequence[Any]], Any]
  broadcast: Callable[[Any, Sequence[tf.Tensor]], tuple[Any, Any]]
  record_mean_update: Optional[Callable[[Any, Sequence[tf.Tensor]], Any]] = None
  record_client_reports: Optional[Callable[[Any, Any, tf.Tensor], Any]] = None


@dataclasses.dataclass(frozen=True)
class ClientState:
  """State a term keeps on each client between the rounds it takes part in.

  Read before the client trains (`LocalStep.client_state[term.name]`) and
  replaced after (`tff_methods.templates.stateful`); a client whose update is
  not finite keeps its old state and reports nothing.

  Attributes:
    initial: `trainable_zeros` -> the state of a client that has not taken
      part yet (arrays).
    update: `(state, *, update, num_steps, broadcast, learning_rate)` ->
      `(the client's new state, its report)`, on the client in TensorFlow
      after its local training: `update` is w_g - w by trainable weight,
      `num_steps` the local steps taken (float scalar), `broadcast` the
      term's broadcast value of the round (None without server state),
      `learning_rate` the client optimizer's of the round
      (`LocalStep.learning_rate`). The report is what the term's
      `ServerState.record_client_reports` reads, or None.
  """

  initial: Callable[[Sequence[Any]], Any]
  update: Callable[..., tuple[Any, Any]]


class Regularizer:
  """A term of the local training: what it adds to the objective, and what
  else it supplies.

  Subclasses set `name` and supply what the term does; what a term
  supplies is what it declares (there are no flags to keep in step):

  - `__call__(step)`: a scalar added to the local objective, already
    multiplied by the term's strength. A term without one (SCAFFOLD's
    correction) adds nothing.
  - `outputs`, `global_outputs`, `previous_outputs`: the named outputs it
    reads of the model being trained, of the round's global model and of
    the client's previous local model. Reading the previous model makes
    its method keep per-client state (`tff_methods.templates.stateful`).
  - `server_state` (a `ServerState`): state at the server, broadcast to
    every client each round (FedCos's direction, SCAFFOLD's `c`).
  - `client_state` (a `ClientState`): state on each client (SCAFFOLD's
    `c_i`); it too makes the method keep per-client state.
  - `weight_correction(step)`: what to subtract from each trainable weight
    after the optimizer's step, a move that no optimizer state (such as
    momentum) sees, as SCAFFOLD's reference code does.
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
  server_state: Optional[ServerState] = None
  client_state: Optional[ClientState] = None
  weight_correction: Optional[Callable[[LocalStep], Sequence[tf.Tensor]]] = None

  def __call__(self, step: LocalStep) -> Optional[tf.Tensor]:
    """The term added to the objective at `step`; None adds nothing."""
    del step
    return None


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
    r.client_state is not None for r in regularizers
  )


def with_server_state(
  regularizers: Sequence[Regularizer], trainable_zeros: Sequence[Any]
) -> dict[str, Any]:
  """The initial server state of each regularizer that keeps one, by name."""
  states = {}
  for r in regularizers:
    if r.server_state is not None:
      state = r.server_state.initial(trainable_zeros)
      if r.name in states:
        raise ValueError(
          f'Two regularizers named {r.name!r} keep server '
          'state; names must be unique.'
        )
      states[r.name] = state
  return states


def keeps_server_state(regularizers: Sequence[Regularizer]) -> bool:
  """Whether any regularizer keeps server state to broadcast."""
  return any(r.server_state is not None for r in regularizers)


def reads_client_reports(regularizers: Sequence[Regularizer]) -> bool:
  """Whether any regularizer's server state learns the clients' own
  reports, which reach the server summed, outside the model aggregator."""
  return any(
    r.server_state is not None and r.server_state.record_client_reports
    for r in regularizers
  )


def reads_mean_update(regularizers: Sequence[Regularizer]) -> bool:
  """Whether any regularizer's server state learns the mean update."""
  return any(
    r.server_state is not None and r.server_state.record_mean_update
    for r in regularizers
  )
