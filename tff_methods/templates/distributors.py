"""The distributor of the shared loop, and the recorders that teach its
state from the round (as TFF's `learning/templates/distributors.py`).

The distributor broadcasts the global weights and, when a term keeps
server state (`regularizers.ServerState`, such as FedCos's last global
move or SCAFFOLD's `c`), that state's values with them; a recorder runs
after aggregation and updates that state from the round's mean update or
the clients' reports.
"""

import collections
from typing import Any, Callable, Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_methods.templates import regularizers as regularizers_lib


def build_distributor(
  weights_type: tff.Type,
  regularizers: Sequence[regularizers_lib.Regularizer],
  trainable_zeros: Sequence[np.ndarray],
) -> tff.learning.templates.DistributionProcess:
  """Broadcasts the global weights, and the regularizers' server values.

  Without regularizers that keep server state this is TFF's
  `build_broadcast_process`. Otherwise its state holds each such
  regularizer's server state; every round it runs their `ServerState.broadcast`
  on the global weights and broadcasts `OrderedDict(model=weights,
  broadcast=values by regularizer name)`.
  """
  if not regularizers_lib.keeps_server_state(regularizers):
    return tff.learning.templates.build_broadcast_process(weights_type)
  initial_states = regularizers_lib.with_server_state(
    regularizers, trainable_zeros
  )
  stateful_regularizers = [r for r in regularizers if r.name in initial_states]

  @tff.tensorflow.computation
  def initial_state_fn():
    return collections.OrderedDict(
      (name, tf.nest.map_structure(tf.constant, state))
      for name, state in initial_states.items()
    )

  state_type = initial_state_fn.type_signature.result

  @tff.tensorflow.computation(state_type, weights_type)
  def server_update(state, weights):
    new_states, values = collections.OrderedDict(), collections.OrderedDict()
    for r in stateful_regularizers:
      new_states[r.name], values[r.name] = r.server_state.broadcast(
        state[r.name], list(weights.trainable)
      )
    return new_states, values

  @tff.federated_computation
  def init_fn():
    return tff.federated_eval(initial_state_fn, tff.SERVER)

  @tff.federated_computation(
    init_fn.type_signature.result, tff.FederatedType(weights_type, tff.SERVER)
  )
  def next_fn(state, weights):
    updated = tff.federated_map(server_update, (state, weights))
    new_state, values = updated[0], updated[1]
    received = tff.federated_broadcast(
      tff.federated_zip(
        collections.OrderedDict(model=weights, broadcast=values)
      )
    )
    return tff.templates.MeasuredProcessOutput(
      new_state, received, tff.federated_value((), tff.SERVER)
    )

  return tff.learning.templates.DistributionProcess(init_fn, next_fn)


def split_received(received, has_broadcast: bool):
  """(model weights, broadcast values) from what the distributor sent."""
  if has_broadcast:
    return received['model'], received['broadcast']
  return received, None


def build_mean_update_recorder(
  distributor: tff.learning.templates.DistributionProcess,
  regularizers: Sequence[regularizers_lib.Regularizer],
  trainable_type: tff.Type,
) -> Optional[tff.Computation]:
  """(distributor state, mean update) -> the state that has learnt it.

  None when no regularizer's server state reads the mean update
  (`ServerState.record_mean_update`).
  """
  if not regularizers_lib.reads_mean_update(regularizers):
    return None
  state_type = distributor.initialize.type_signature.result.member

  @tff.tensorflow.computation(state_type, trainable_type)
  def record_mean_update(state, mean_update):
    new_state = collections.OrderedDict()
    for name in state:
      record = next(
        r.server_state.record_mean_update
        for r in regularizers
        if r.name == name
      )
      new_state[name] = (
        record(state[name], list(mean_update))
        if record
        else tf.nest.map_structure(tf.identity, state[name])
      )
    return new_state

  return record_mean_update


# A step after aggregation that lets the distributor's state learn from the
# round: `(distributor state@SERVER, mean update@SERVER, the client work's
# result@CLIENTS) -> distributor state@SERVER`, traced in the round.
Recorder = Callable[[Any, Any, Any], Any]


def mean_update_recording(record_mean_update: tff.Computation) -> Recorder:
  """The recorder of `build_mean_update_recorder`'s computation."""

  def record(distributor_state, mean_update, client_results):
    del client_results
    return tff.federated_map(
      record_mean_update, (distributor_state, mean_update)
    )

  return record


def build_report_recorder(distributor, reporters, report_sum_type):
  """(distributor state, the clients' summed reports and their number) ->
  the state that has learnt their mean; None without reporting
  regularizers."""
  if not reporters:
    return None
  state_type = distributor.initialize.type_signature.result.member

  @tff.tensorflow.computation(state_type, report_sum_type)
  def record_client_reports(state, report_sum):
    num_reports = report_sum['reported']
    # TFF's weighted mean: the sum over the weights (reports of weight 0
    # are zeros); no reports leave it zero.
    mean_reports = tf.nest.map_structure(
      lambda s: tf.math.divide_no_nan(s, num_reports), report_sum['reports']
    )
    new_state = collections.OrderedDict(
      (name, tf.nest.map_structure(tf.identity, value))
      for name, value in state.items()
    )
    for r in reporters:
      new_state[r.name] = r.server_state.record_client_reports(
        state[r.name], mean_reports[r.name], num_reports
      )
    return new_state

  return record_client_reports
