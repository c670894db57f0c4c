"""Learning processes whose clients keep state between rounds.

A `tff.learning.templates.LearningProcess` carries no per-client state, yet
MOON and FedCKA need each client's previous local model (and SCAFFOLD its
control variate). Here the TFF computation of a round takes, for each
sampled client, the file its state is read from and the file its new state
is written to; the client's TensorFlow reads and writes them itself:

  next(server_state, state_files@CLIENTS, client_ids@CLIENTS)
      -> (server_state, written@CLIENTS, metrics)

so a client's state never passes through Python, TFF's value serialization
or the worker's gRPC channel (for ResNet-18, 11M floats in and out per
client and round: that transfer cost as much as the training, see the
README's benchmark). `StatefulLearningProcess` keeps the index of which
file holds each client's latest state in a `ClientStateStore`. User code
drives it like a tff.learning process: `initialize()`, `next(state,
client_ids)` (the ids select both the data and the states),
`get_model_weights(state)`, `set_model_weights`.

A client taking part for the first time reads the process's initial client
state (or, after the first round, `late_client_state_fn`'s). The files live under a given directory, or a temporary one removed
at exit; either way the store is saved with the program state at each
checkpoint, so a resumed run continues exactly. TFF workers on other
machines must see the directory at the same path (as they see the data).
"""

import atexit
import collections
import glob
import json
import os
import shutil
import tempfile
from typing import Any, Callable, Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_methods import local_training
from tff_methods import model_lib
from tff_methods import regularizers as regularizers_lib

# The CLIENTS-placed argument of a round: where each client's state is read
# from and where its new state goes.
STATE_FILES_TYPE = tff.StructWithPythonType(
    [('read', tff.TensorType(np.str_)), ('write', tff.TensorType(np.str_))],
    collections.OrderedDict)


def serialize_state(state: Any) -> tf.Tensor:
  """A nested structure of tensors as one string tensor (graph or eager)."""
  return tf.io.serialize_tensor(tf.stack(
      [tf.io.serialize_tensor(t) for t in tf.nest.flatten(state)]))


def parse_state(serialized: tf.Tensor, template: Any) -> Any:
  """The inverse of `serialize_state`; `template` gives dtypes and shapes."""
  parts = tf.io.parse_tensor(serialized, tf.string)
  flat = [tf.ensure_shape(tf.io.parse_tensor(parts[i], tf.as_dtype(a.dtype)),
                          np.shape(a))
          for i, a in enumerate(tf.nest.flatten(template))]
  return tf.nest.pack_sequence_as(template, flat)


def read_client_state(files: Any, template: Any) -> Any:
  """In a client computation: the state in `files.read`."""
  return parse_state(tf.io.read_file(files['read']), template)


def write_client_state(files: Any, state: Any) -> tf.Tensor:
  """In a client computation: writes `state` to `files.write`.

  Returns:
    The number of bytes written; return it from the computation, so that
    the write runs before the round ends.
  """
  serialized = serialize_state(state)
  with tf.control_dependencies([tf.io.write_file(files['write'],
                                                 serialized)]):
    return tf.strings.length(serialized)


class ClientStateStore:
  """Which file holds each client's latest state, by client id and round.

  Each state is one file, `<directory>/<client id>/<round>.state`, written
  by the client's own computation (or by `put`). A new version makes the
  older one unused unless a kept checkpoint refers to it.

  Args:
    initial_state: The state of a client that has not taken part yet (a
      nested structure of arrays); also the template for stored states.
    directory: Where the state files live. By default a temporary
      directory, removed at exit; checkpoints then hold copies of the
      states. A given directory is kept, and checkpoints refer to its files.
  """

  def __init__(self, initial_state: Any, directory: Optional[str] = None):
    self._initial = tf.nest.map_structure(np.asarray, initial_state)
    self._temporary = directory is None
    if self._temporary:
      directory = tempfile.mkdtemp(prefix='tff_methods_client_states_')
      atexit.register(shutil.rmtree, directory, ignore_errors=True)
    self._directory = os.path.abspath(directory)
    os.makedirs(self._directory, exist_ok=True)
    self._latest_round: dict[str, int] = {}
    # The versions the last round replaced (None: the client had none),
    # kept until the round is accepted (`commit`) or rejected (`rollback`).
    self._replaced: dict[str, Optional[int]] = {}
    # (client id, round) of the versions the kept checkpoints refer to.
    self._pinned: set[tuple[str, int]] = set()
    self._initial_file = os.path.join(self._directory, 'initial.state')
    self._write(self._initial_file, self._initial)

  @property
  def initial_state(self):
    return self._initial

  @property
  def directory(self) -> str:
    return self._directory

  def __contains__(self, client_id: str) -> bool:
    return client_id in self._latest_round

  def __len__(self) -> int:
    return len(self._latest_round)

  def _file(self, client_id: str, round_num: int) -> str:
    return os.path.join(self._directory, client_id, f'{round_num}.state')

  def _write(self, path: str, state: Any) -> None:
    tmp = f'{path}.tmp'
    with open(tmp, 'wb') as f:
      f.write(serialize_state(state).numpy())
    os.replace(tmp, path)

  def read_file(self, client_id: str) -> str:
    """The file of the client's latest state (the initial one if none)."""
    if client_id not in self._latest_round:
      return self._initial_file
    return self._file(client_id, self._latest_round[client_id])

  def write_file(self, client_id: str, round_num: int) -> str:
    """Where the client's state as of the end of `round_num` goes."""
    os.makedirs(os.path.join(self._directory, client_id), exist_ok=True)
    return self._file(client_id, round_num)

  def written(self, client_id: str, round_num: int) -> None:
    """Records that `write_file(client_id, round_num)` holds its state.

    The version it replaces is kept until `commit` (or `rollback`).
    """
    old = self._latest_round.get(client_id)
    self._latest_round[client_id] = round_num
    if old != round_num:
      self._replaced.setdefault(client_id, old)

  def commit(self) -> None:
    """Accepts the states written since the last commit or rollback."""
    for client_id, old in self._replaced.items():
      if old is not None and (client_id, old) not in self._pinned:
        _remove(self._file(client_id, old))
    self._replaced = {}

  def rollback(self) -> None:
    """Restores every client's state as of the last commit."""
    for client_id, old in self._replaced.items():
      new = self._latest_round[client_id]
      if (client_id, new) not in self._pinned:
        _remove(self._file(client_id, new))
      if old is None:
        del self._latest_round[client_id]
      else:
        self._latest_round[client_id] = old
    self._replaced = {}

  def get(self, client_id: str):
    """The client's latest state, or the initial state if it has none."""
    with open(self.read_file(client_id), 'rb') as f:
      state = parse_state(tf.constant(f.read()), self._initial)
    return tf.nest.map_structure(lambda t: t.numpy(), state)

  def put(self, client_id: str, state: Any, round_num: int) -> None:
    """Stores the client's state as of the end of `round_num` (committed)."""
    flat = [np.asarray(a) for a in tf.nest.flatten(state)]
    template = tf.nest.flatten(self._initial)
    if len(flat) != len(template):
      raise ValueError(f'State of client {client_id!r} has {len(flat)} '
                       f'tensors; the store holds states of {len(template)}.')
    flat = [a.astype(t.dtype) for a, t in zip(flat, template)]
    self._write(self.write_file(client_id, round_num), flat)
    self.written(client_id, round_num)
    self.commit()

  def save(self, checkpoint_dir: str, round_num: int, keep: int = 2) -> None:
    """Commits, and saves the store as of `round_num` beside the program state."""
    self.commit()
    os.makedirs(checkpoint_dir, exist_ok=True)
    path = os.path.join(checkpoint_dir, f'client_states_{round_num}')
    if self._temporary:
      # The temporary directory ends with the process: copy the states.
      arrays = {}
      for client_id in self._latest_round:
        for i, a in enumerate(tf.nest.flatten(self.get(client_id))):
          arrays[f'{client_id}/{i}'] = a
      arrays['__rounds__'] = np.array(
          json.dumps(self._latest_round).encode())
      _atomic_savez(path + '.npz', arrays)
    else:
      with open(path + '.json.tmp', 'w') as f:
        json.dump(self._latest_round, f)
      os.replace(path + '.json.tmp', path + '.json')
    self._remove_old_checkpoints(checkpoint_dir, keep)

  def _remove_old_checkpoints(self, checkpoint_dir, keep):
    saved = sorted(self._checkpoint_rounds(checkpoint_dir))
    for old in saved[:-keep]:
      for path in glob.glob(os.path.join(checkpoint_dir,
                                         f'client_states_{old}.*')):
        os.remove(path)
    if self._temporary:
      return
    # Keep the versions the kept checkpoints and the store refer to.
    self._pinned = {(client_id, r) for kept in saved[-keep:]
                    for client_id, r in self._load_index(checkpoint_dir,
                                                         kept).items()}
    needed = self._pinned | set(self._latest_round.items())
    for path in glob.glob(os.path.join(self._directory, '*', '*.state')):
      client_id = os.path.basename(os.path.dirname(path))
      stem = os.path.basename(path)[:-len('.state')]
      if stem.isdigit() and (client_id, int(stem)) not in needed:
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
    self._replaced = {}
    if not self._temporary:
      self._latest_round = self._load_index(checkpoint_dir, round_num)
      self._pinned |= set(self._latest_round.items())
      return
    path = os.path.join(checkpoint_dir, f'client_states_{round_num}.npz')
    with np.load(path) as f:
      rounds = {k: int(v) for k, v in json.loads(bytes(f['__rounds__'])
                                                 ).items()}
      count = len(tf.nest.flatten(self._initial))
      states = {client_id: [f[f'{client_id}/{i}'] for i in range(count)]
                for client_id in rounds}
    for client_id in list(self._latest_round):
      _remove(self.read_file(client_id))
    self._latest_round = {}
    for client_id, flat in states.items():
      self.put(client_id, tf.nest.pack_sequence_as(self._initial, flat),
               rounds[client_id])


def _atomic_savez(path: str, arrays: dict) -> None:
  tmp = f'{path}.tmp.npz'
  np.savez(tmp, **arrays)
  os.replace(tmp, path)


def _remove(path: str) -> None:
  try:
    os.remove(path)
  except FileNotFoundError:
    pass


class StatefulLearningProcess:
  """A learning process with per-client state, driven like tff.learning's.

  Attributes:
    client_states: The `ClientStateStore`.
  """

  def __init__(self, initialize_fn: tff.Computation,
               next_fn: tff.Computation,
               get_model_weights_fn: tff.Computation,
               set_model_weights_fn: tff.Computation,
               client_states: ClientStateStore,
               late_client_state_fn: Optional[Callable[[str], Any]] = None):
    self._initialize_fn = initialize_fn
    self._next_fn = next_fn
    self._get_model_weights_fn = get_model_weights_fn
    self._set_model_weights_fn = set_model_weights_fn
    self.client_states = client_states
    self._late_client_state_fn = late_client_state_fn
    self._round = 0

  @property
  def next_computation(self) -> tff.Computation:
    """The TFF computation of one round (states in, states out)."""
    return self._next_fn

  def initialize(self):
    return self._initialize_fn()

  def next(self, state, client_keys: Sequence[Any]
           ) -> tff.learning.templates.LearningProcessOutput:
    """Runs one round for the clients, reading and writing their states.

    Args:
      state: The server state.
      client_keys: What the dataset computation takes for each client: its
        id, or a mapping with its `client_id` (and e.g. the round).
    """
    client_keys = list(client_keys)
    client_ids = [_client_id(k) for k in client_keys]
    store = self.client_states
    # Not rejected (`reject_round`): the last round's states stand.
    store.commit()
    if self._late_client_state_fn is not None and self._round > 0:
      for client_id in client_ids:
        if client_id not in store:
          store.put(client_id, self._late_client_state_fn(client_id),
                    self._round)
    files = [collections.OrderedDict(
        read=store.read_file(c), write=store.write_file(c, self._round + 1))
             for c in client_ids]
    new_state, written, metrics = self._next_fn(state, files, client_keys)
    self._round += 1
    for client_id, num_bytes in zip(client_ids, written):
      if num_bytes <= 0:
        raise RuntimeError(f'The state of client {client_id!r} was not '
                           f'written to {store.write_file(client_id, self._round)}.')
      store.written(client_id, self._round)
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

  def reject_round(self) -> None:
    """Undoes the last round's client states (its server state is dropped)."""
    self.client_states.rollback()

  def set_round(self, round_num: int) -> None:
    """The round the next call to `next` follows (for versioning states)."""
    self._round = round_num


def _client_id(key: Any) -> str:
  if isinstance(key, (str, bytes)):
    return key.decode() if isinstance(key, bytes) else key
  return str(key['client_id'])


def from_computations(initialize_fn: tff.Computation,
                      next_fn: tff.Computation,
                      dataset_computation: tff.Computation,
                      store: ClientStateStore,
                      late_client_state_fn: Optional[Callable[[str], Any]] = (
                          None)) -> StatefulLearningProcess:
  """A `StatefulLearningProcess` from a round's TFF computations.

  Args:
    initialize_fn: Returns the SERVER-placed `LearningAlgorithmState`.
    next_fn: `(state, state_files@CLIENTS, client_data@CLIENTS) ->
      (state, written@CLIENTS, metrics)`: each client reads its state from
      `state_files.read` and writes its new one to `state_files.write`
      (`read_client_state`, `write_client_state`), returning the bytes
      written.
    dataset_computation: Client id -> that client's dataset; composed with
      `next_fn` so that the process takes client ids.
    store: Holds the client states.
    late_client_state_fn: client id -> the state of a client that first
      takes part after the first round (by default the store's initial
      state, as for every new client).
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
                                 store, late_client_state_fn)


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
    late_client_state_fn: Optional[Callable[[str], Any]] = None,
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
    client_state_dir: Where the clients' state files live (default: a
      temporary directory).
    client_weighting: How client updates are weighted.
    late_client_state_fn: client id -> the state of a client first taking
      part after the first round (e.g. `moon.own_initial_model_state_fn`);
      by default it has no previous model.
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
  recorder = local_training.build_mean_update_recorder(
      distributor, regularizers, weights_type.trainable)
  has_broadcast = regularizers_lib.keeps_server_state(regularizers)
  initial_model_weights_fn = model_lib.initial_weights_computation(
      keras_model_fn)

  initial_client_state = previous_model_client_state(zero_weights)

  @tff.tensorflow.computation(received_type, STATE_FILES_TYPE, data_type)
  def client_update_computation(received, state_files, dataset):
    client_state = read_client_state(state_files, initial_client_state)
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
    return result, sums, write_client_state(state_files, new_state)

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
                             tff.FederatedType(STATE_FILES_TYPE, tff.CLIENTS),
                             tff.FederatedType(data_type, tff.CLIENTS))
  def next_fn(state, state_files, client_data):
    distributed = distributor.next(state.distributor,
                                   state.global_model_weights)
    client_result, sums, written = tff.federated_map(
        client_update_computation, (distributed.result, state_files,
                                    client_data))
    aggregated = aggregator.next(state.aggregator, client_result.update,
                                 client_result.update_weight)
    finalized = finalizer.next(state.finalizer, state.global_model_weights,
                               aggregated.result)
    distributor_state = distributed.state
    if recorder is not None:
      distributor_state = tff.federated_map(
          recorder, (distributor_state, aggregated.result))
    new_state = tff.federated_zip(tff.learning.templates.LearningAlgorithmState(
        finalized.result, distributor_state, state.client_work,
        aggregated.state, finalized.state))
    metrics = tff.federated_zip(collections.OrderedDict(
        distributor=distributed.measurements,
        client_work=local_training.sum_train_metrics(sums),
        aggregator=aggregated.measurements,
        finalizer=finalized.measurements))
    return new_state, written, metrics

  return from_computations(
      initialize_fn, next_fn, dataset_computation,
      ClientStateStore(initial_client_state, client_state_dir),
      late_client_state_fn)
