"""Learning processes whose clients keep state between rounds.

A `tff.learning.templates.LearningProcess` carries no per-client state, yet
MOON and FedCKA need each client's previous local model (and SCAFFOLD its
control variate). Here the TFF computation of a round takes the sampled
clients' states as a CLIENTS-placed argument and returns their new states:

  next(server_state, client_states@CLIENTS, client_ids@CLIENTS)
      -> (server_state, new_client_states@CLIENTS, metrics)

and `StatefulLearningProcess` keeps the states on the Python side in a
`ClientStateStore`, by client id. User code drives it like a tff.learning
process: `initialize()`, `next(state, client_ids)` (the ids select both the
data and the states), `get_model_weights(state)`, `set_model_weights`.

A client taking part for the first time gets the process's initial client
state. The store lives in memory, or on disk (one file per client and
version) for many clients with large models; either way it is saved with
the program state at each checkpoint, so a resumed run continues exactly.
"""

import collections
import glob
import json
import os
from typing import Any, Callable, Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_methods import local_training
from tff_methods import model_lib
from tff_methods import regularizers as regularizers_lib


def _atomic_savez(path: str, arrays: dict) -> None:
  tmp = f'{path}.tmp.npz'
  np.savez(tmp, **arrays)
  os.replace(tmp, path)


class ClientStateStore:
  """Client states by client id, in memory or on disk, versioned by round.

  Args:
    initial_state: The state of a client that has not taken part yet (a
      nested structure of arrays); also the template for stored states.
    directory: If given, states live on disk under it (one file per client
      and round), and only an index is kept in memory.
  """

  def __init__(self, initial_state: Any, directory: Optional[str] = None):
    self._initial = tf.nest.map_structure(np.asarray, initial_state)
    self._directory = directory
    self._memory: dict[str, list[np.ndarray]] = {}
    self._latest_round: dict[str, int] = {}
    if directory:
      os.makedirs(directory, exist_ok=True)

  @property
  def initial_state(self):
    return self._initial

  def __contains__(self, client_id: str) -> bool:
    return client_id in self._latest_round

  def __len__(self) -> int:
    return len(self._latest_round)

  def _file(self, client_id: str, round_num: int) -> str:
    return os.path.join(self._directory, client_id, f'{round_num}.npz')

  def get(self, client_id: str):
    """The client's latest state, or the initial state if it has none."""
    if client_id not in self._latest_round:
      return self._initial
    if self._directory:
      with np.load(self._file(client_id, self._latest_round[client_id])) as f:
        flat = [f[f'a{i}'] for i in range(len(f.files))]
    else:
      flat = self._memory[client_id]
    return tf.nest.pack_sequence_as(self._initial, flat)

  def put(self, client_id: str, state: Any, round_num: int) -> None:
    """Stores the client's state as of the end of `round_num`."""
    flat = [np.asarray(a) for a in tf.nest.flatten(state)]
    template = tf.nest.flatten(self._initial)
    if len(flat) != len(template):
      raise ValueError(f'State of client {client_id!r} has {len(flat)} '
                       f'tensors; the store holds states of {len(template)}.')
    if self._directory:
      os.makedirs(os.path.join(self._directory, client_id), exist_ok=True)
      _atomic_savez(self._file(client_id, round_num),
                    {f'a{i}': a for i, a in enumerate(flat)})
    else:
      self._memory[client_id] = flat
    self._latest_round[client_id] = round_num

  def save(self, checkpoint_dir: str, round_num: int, keep: int = 2) -> None:
    """Saves the store as of `round_num` beside the program state."""
    os.makedirs(checkpoint_dir, exist_ok=True)
    path = os.path.join(checkpoint_dir, f'client_states_{round_num}')
    if self._directory:
      with open(path + '.json.tmp', 'w') as f:
        json.dump(self._latest_round, f)
      os.replace(path + '.json.tmp', path + '.json')
    else:
      arrays = {}
      for client_id, flat in self._memory.items():
        for i, a in enumerate(flat):
          arrays[f'{client_id}/{i}'] = a
      arrays['__rounds__'] = np.array(
          json.dumps(self._latest_round).encode())
      _atomic_savez(path + '.npz', arrays)
    self._remove_old_checkpoints(checkpoint_dir, keep)

  def _remove_old_checkpoints(self, checkpoint_dir, keep):
    saved = sorted(self._checkpoint_rounds(checkpoint_dir))
    for old in saved[:-keep]:
      for path in glob.glob(os.path.join(checkpoint_dir,
                                         f'client_states_{old}.*')):
        os.remove(path)
    if self._directory and saved:
      # Client versions older than the oldest kept checkpoint are unused.
      oldest = self._load_index(checkpoint_dir, saved[-keep:][0])
      for client_id, kept_round in oldest.items():
        for path in glob.glob(os.path.join(self._directory, client_id,
                                           '*.npz')):
          if int(os.path.basename(path)[:-4]) < kept_round:
            os.remove(path)

  @staticmethod
  def _checkpoint_rounds(checkpoint_dir):
    rounds = []
    for path in glob.glob(os.path.join(checkpoint_dir, 'client_states_*')):
      stem = os.path.basename(path)[len('client_states_'):].split('.')[0]
      if stem.isdigit():
        rounds.append(int(stem))
    return rounds

  @staticmethod
  def _load_index(checkpoint_dir, round_num):
    with open(os.path.join(checkpoint_dir,
                           f'client_states_{round_num}.json')) as f:
      return {k: int(v) for k, v in json.load(f).items()}

  def restore(self, checkpoint_dir: str, round_num: int) -> None:
    """Restores the store as saved at `round_num`.

    Raises:
      FileNotFoundError: if no client states were saved for that round.
    """
    if self._directory:
      self._latest_round = self._load_index(checkpoint_dir, round_num)
      return
    path = os.path.join(checkpoint_dir, f'client_states_{round_num}.npz')
    with np.load(path) as f:
      self._latest_round = {
          k: int(v) for k, v in json.loads(bytes(f['__rounds__'])).items()}
      count = len(tf.nest.flatten(self._initial))
      self._memory = {
          client_id: [f[f'{client_id}/{i}'] for i in range(count)]
          for client_id in self._latest_round}


class StatefulLearningProcess:
  """A learning process with per-client state, driven like tff.learning's.

  Attributes:
    client_states: The `ClientStateStore`.
  """

  def __init__(self, initialize_fn: tff.Computation,
               next_fn: tff.Computation,
               get_model_weights_fn: tff.Computation,
               set_model_weights_fn: tff.Computation,
               client_states: ClientStateStore):
    self._initialize_fn = initialize_fn
    self._next_fn = next_fn
    self._get_model_weights_fn = get_model_weights_fn
    self._set_model_weights_fn = set_model_weights_fn
    self.client_states = client_states
    self._round = 0

  @property
  def next_computation(self) -> tff.Computation:
    """The TFF computation of one round (states in, states out)."""
    return self._next_fn

  def initialize(self):
    return self._initialize_fn()

  def next(self, state, client_ids: Sequence[str]
           ) -> tff.learning.templates.LearningProcessOutput:
    """Runs one round for `client_ids`, reading and writing their states."""
    client_ids = list(client_ids)
    states = [self.client_states.get(c) for c in client_ids]
    new_state, new_client_states, metrics = self._next_fn(state, states,
                                                          client_ids)
    self._round += 1
    for client_id, client_state in zip(client_ids, new_client_states):
      self.client_states.put(client_id, client_state, self._round)
    return tff.learning.templates.LearningProcessOutput(new_state, metrics)

  def get_model_weights(self, state):
    return self._get_model_weights_fn(state)

  def set_model_weights(self, state, weights):
    return self._set_model_weights_fn(state, weights)

  # Hooks for tff_methods.training_loop: the store is checkpointed with the
  # program state.
  def save_client_states(self, checkpoint_dir: str, round_num: int) -> None:
    self.client_states.save(checkpoint_dir, round_num)

  def restore_client_states(self, checkpoint_dir: str, round_num: int
                            ) -> None:
    self.client_states.restore(checkpoint_dir, round_num)
    self._round = round_num

  def set_round(self, round_num: int) -> None:
    """The round the next call to `next` follows (for versioning states)."""
    self._round = round_num


def from_computations(initialize_fn: tff.Computation,
                      next_fn: tff.Computation,
                      dataset_computation: tff.Computation,
                      store: ClientStateStore) -> StatefulLearningProcess:
  """A `StatefulLearningProcess` from a round's TFF computations.

  Args:
    initialize_fn: Returns the SERVER-placed `LearningAlgorithmState`.
    next_fn: `(state, client_states@CLIENTS, client_data@CLIENTS) ->
      (state, new_client_states@CLIENTS, metrics)`.
    dataset_computation: Client id -> that client's dataset; composed with
      `next_fn` so that the process takes client ids.
    store: Holds the client states.
  """
  next_by_id = tff.simulation.compose_dataset_computation_with_computation(
      dataset_computation, next_fn)
  state_type = initialize_fn.type_signature.result.member

  @tff.tensorflow.computation(state_type)
  def get_model_weights_fn(state):
    return state.global_model_weights

  @tff.tensorflow.computation(state_type, state_type.global_model_weights)
  def set_model_weights_fn(state, weights):
    return tff.learning.templates.LearningAlgorithmState(
        weights, state.distributor, state.client_work, state.aggregator,
        state.finalizer)

  return StatefulLearningProcess(initialize_fn, next_by_id,
                                 get_model_weights_fn, set_model_weights_fn,
                                 store)


def previous_model_client_state(weights: tff.learning.models.ModelWeights):
  """The initial state of a client that keeps its previous model."""
  return collections.OrderedDict(
      has_previous=np.int32(0),
      model=tf.nest.map_structure(np.zeros_like, weights))


def build_stateful_local_training_process(
    keras_model_fn: model_lib.KerasModelFn,
    element_spec: Any,
    dataset_computation: tff.Computation,
    client_optimizer: tff.learning.optimizers.Optimizer,
    server_optimizer: Optional[tff.learning.optimizers.Optimizer] = None,
    regularizers: Sequence[regularizers_lib.Regularizer] = (),
    client_state_dir: Optional[str] = None,
    client_weighting: tff.learning.ClientWeighting = (
        tff.learning.ClientWeighting.NUM_EXAMPLES),
) -> StatefulLearningProcess:
  """Local training whose regularizers read each client's previous model.

  Each client's state is `OrderedDict(has_previous, model)`: its local model
  at the end of the last round it took part in. The round is the shared
  local-training loop (`local_training.build_client_update_fn`), TFF's
  broadcast, a weighted mean and TFF's server-optimizer finalizer, as in
  `local_training.build_local_training_process`. A client whose update is
  not finite keeps its old state.

  Args:
    keras_model_fn: Builds one of the project's multi-output Keras models.
    element_spec: The spec of one batch of client data.
    dataset_computation: Client id -> that client's (preprocessed) dataset,
      e.g. `ClientData.dataset_computation`.
    client_optimizer: The client optimizer.
    server_optimizer: SGD with learning rate 1 by default.
    regularizers: Terms added to every client's local objective.
    client_state_dir: Keep client states on disk here instead of in memory.
    client_weighting: How client updates are weighted.
  """
  regularizers = tuple(regularizers)
  server_optimizer = server_optimizer or tff.learning.optimizers.build_sgdm(
      1.0)
  weights_type = model_lib.weights_type(keras_model_fn, element_spec)
  data_type = tff.SequenceType(tff.types.tensorflow_to_type(element_spec))
  zero_weights = model_lib.zero_weights(keras_model_fn)
  distributor = local_training.build_distributor(weights_type, regularizers,
                                                 zero_weights.trainable)
  received_type = distributor.next.type_signature.result.result.member
  has_broadcast = regularizers_lib.keeps_server_state(regularizers)
  client_state_type = tff.StructWithPythonType(
      [('has_previous', tff.TensorType(np.int32)), ('model', weights_type)],
      collections.OrderedDict)

  initial_model_weights_fn = model_lib.initial_weights_computation(
      keras_model_fn)

  @tff.tensorflow.computation(received_type, client_state_type, data_type)
  def client_update_computation(received, client_state, dataset):
    initial_weights, broadcast = local_training.split_received(
        received, has_broadcast)
    client_update = local_training.build_client_update_fn(
        keras_model_fn, client_optimizer, regularizers, client_weighting)
    result, sums, final_weights = client_update(
        initial_weights, dataset, client_state['model'],
        client_state['has_previous'] > 0, broadcast)
    trained = collections.OrderedDict(has_previous=tf.constant(1),
                                      model=final_weights)
    # A diverged client (weight 0) keeps its old state.
    new_state = tf.cond(result.update_weight > 0, lambda: trained,
                        lambda: client_state)
    return result, sums, new_state

  aggregator = tff.aggregators.MeanFactory().create(
      weights_type.trainable, tff.TensorType(np.float32))
  finalizer = tff.learning.templates.build_apply_optimizer_finalizer(
      server_optimizer, weights_type)

  @tff.federated_computation
  def initialize_fn():
    return tff.federated_zip(tff.learning.templates.LearningAlgorithmState(
        tff.federated_eval(initial_model_weights_fn, tff.SERVER),
        distributor.initialize(), tff.federated_value((), tff.SERVER),
        aggregator.initialize(), finalizer.initialize()))

  state_type = initialize_fn.type_signature.result

  @tff.federated_computation(state_type,
                             tff.FederatedType(client_state_type,
                                               tff.CLIENTS),
                             tff.FederatedType(data_type, tff.CLIENTS))
  def next_fn(state, client_states, client_data):
    distributed = distributor.next(state.distributor,
                                   state.global_model_weights)
    client_result, sums, new_client_states = tff.federated_map(
        client_update_computation, (distributed.result, client_states,
                                    client_data))
    aggregated = aggregator.next(state.aggregator, client_result.update,
                                 client_result.update_weight)
    finalized = finalizer.next(state.finalizer, state.global_model_weights,
                               aggregated.result)
    new_state = tff.federated_zip(tff.learning.templates.LearningAlgorithmState(
        finalized.result, distributed.state, state.client_work,
        aggregated.state, finalized.state))
    metrics = tff.federated_zip(collections.OrderedDict(
        distributor=distributed.measurements,
        client_work=local_training.sum_train_metrics(sums),
        aggregator=aggregated.measurements,
        finalizer=finalized.measurements))
    return new_state, new_client_states, metrics

  return from_computations(
      initialize_fn, next_fn, dataset_computation,
      ClientStateStore(previous_model_client_state(zero_weights),
                       client_state_dir))
