"""Each client's state in files, named by client and round.

MOON and FedCKA need the layers they read of each client's previous local
model (`reference_outputs.kept_previous_weights`), SCAFFOLD each client's
control variate. `ClientStateFiles` keeps them in files that the client's
own TensorFlow reads and writes, named by the client and the round:

  <directory>/<client>/<round>.state

A client reads the newest version written before the round (the initial
state if there is none) and writes this round's. So a client's state never
passes through Python, TFF's value serialization or the worker's gRPC
channel, and a round that is run again (resumed, or retried) reads what it
read the first time and overwrites what it wrote. Python's part is
housekeeping between rounds: `discard` the versions of a rejected round,
`prune` versions no checkpoint needs (`PruningProgramStateManager` does it
under TFF's program logic), and `claim_directory` for a run.

In memory (`in_memory=True`, for the in-process execution context): the
versions are arrays in this Python process
(`states_in_memory.StatesInMemory`), which the clients' TensorFlow reads
and writes without serializing them, so a round writes no file.
`write_to_disk` writes the new versions to the directory before each
checkpoint is saved, and a new store starts from what the directory holds,
so a run resumes exactly. Processes built for a TFF worker (possibly on
another host) keep their files in the directory.
"""

import asyncio
import atexit
import os
import shutil
import tempfile
from typing import Any, Optional, Sequence
import weakref

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_methods.clients import state_files
from tff_methods.clients import states_in_memory

OWN_INITIAL_VERSION = state_files.OWN_INITIAL_VERSION
INITIAL_VERSION = state_files.INITIAL_VERSION


class ClientStateFiles:
  """Each client's state, one file per version, written by round.

  In a client computation (TensorFlow): `read(client_id, round_num)`, the
  newest version written before `round_num` (or the initial state), and
  `write(client_id, round_num, state)`. In Python: `get`, `put`, `discard`,
  `prune`.

  Args:
    initial_state: The state of a client that has not taken part yet (a
      nested structure of arrays); also the template for stored states.
    directory: Where the files live. By default a temporary directory,
      removed at exit (a run in another process can't resume from it).
    in_memory: Keep the versions in this Python process
      (`states_in_memory`), and write `directory` only from `write_to_disk`
      (for computations that run in this process:
      `tff_methods.execution.in_process`; a TFF worker can't reach them).
  """

  def __init__(
    self,
    initial_state: Any,
    directory: Optional[str] = None,
    in_memory: bool = False,
  ):
    self._initial = tf.nest.map_structure(np.asarray, initial_state)
    self.temporary = directory is None
    if directory is None:
      directory = tempfile.mkdtemp(prefix='tff_methods_client_states_')
      atexit.register(shutil.rmtree, directory, ignore_errors=True)
    self._directory = os.path.abspath(directory)
    os.makedirs(self._directory, exist_ok=True)
    self.in_memory = in_memory
    # The directory as a literal in `tf.io.matching_files`' patterns: a
    # `[`, `*` or `?` in it would otherwise match other paths, or none.
    self._pattern_directory = state_files.escape_glob(self._directory)
    self._initial_file = os.path.join(self._directory, 'initial.state')
    self._client_names: dict[str, str] = {}
    self._memory = None
    if in_memory:
      self._memory = states_in_memory.StatesInMemory(
        tf.nest.flatten(self._initial)
      )
      self._load_from_disk()
    else:
      self._write_file(self._initial_file, self._initial)

  @property
  def initial_state(self):
    return self._initial

  @property
  def directory(self) -> str:
    """The directory on disk (in memory: what `write_to_disk` writes)."""
    return self._directory

  # -- In TensorFlow, in the client computation.

  def _client_name_tf(self, client_id: tf.Tensor) -> tf.Tensor:
    """The name of the client's directory: letters, digits, `_`, `-` and
    a fingerprint of its id after a `.`."""
    safe = tf.strings.regex_replace(client_id, _UNSAFE, '_')
    fingerprint = tf.strings.as_string(
      tf.strings.to_hash_bucket_fast(client_id, _BUCKETS)
    )
    return tf.strings.join([safe, '.', fingerprint])

  def _client_dir_tf(
    self, client_id: tf.Tensor, as_pattern: bool = False
  ) -> tf.Tensor:
    """The client's directory; `as_pattern`: escaped for a glob pattern."""
    directory = self._pattern_directory if as_pattern else self._directory
    return tf.strings.join([directory, '/', self._client_name_tf(client_id)])

  def read_path(self, client_id: tf.Tensor, round_num: tf.Tensor) -> tf.Tensor:
    """The file of the newest version written before `round_num`."""
    round_num = tf.cast(round_num, tf.int64)
    # A client that trained in the last round reads that round's version: a
    # check for one file, cheaper than listing its versions.
    last_round = tf.io.matching_files(
      self.write_path(client_id, round_num - 1, as_pattern=True)
    )
    return tf.cond(
      tf.logical_and(round_num > 1, tf.size(last_round) > 0),
      lambda: last_round[0],
      lambda: self._newest_path(client_id, round_num),
    )

  def _newest_path(
    self, client_id: tf.Tensor, round_num: tf.Tensor
  ) -> tf.Tensor:
    files = tf.io.matching_files(
      tf.strings.join(
        [self._client_dir_tf(client_id, as_pattern=True), '/*.state']
      )
    )
    files = tf.boolean_mask(
      files, tf.strings.regex_full_match(files, r'.*/[0-9]+\.state')
    )
    versions = tf.strings.to_number(
      tf.strings.regex_replace(files, r'^.*/([0-9]+)\.state$', r'\1'), tf.int64
    )
    usable = tf.logical_and(
      versions < round_num,
      # tf.not_equal: `!=` is Python's in TFF's graph mode.
      tf.logical_or(tf.not_equal(versions, OWN_INITIAL_VERSION), round_num > 1),
    )
    versions = tf.where(usable, versions, -1)
    return tf.cond(
      tf.reduce_any(usable),
      lambda: tf.gather(files, tf.argmax(versions)),
      lambda: tf.constant(self._initial_file),
    )

  def write_path(
    self, client_id: tf.Tensor, round_num: tf.Tensor, as_pattern: bool = False
  ) -> tf.Tensor:
    return tf.strings.join(
      [
        self._client_dir_tf(client_id, as_pattern),
        '/',
        tf.strings.as_string(round_num),
        '.state',
      ]
    )

  def read(self, client_id: tf.Tensor, round_num: tf.Tensor) -> Any:
    """The client's state as of the start of `round_num`."""
    return self.read_with_version(client_id, round_num)[0]

  def read_with_version(
    self, client_id: tf.Tensor, round_num: tf.Tensor
  ) -> tuple[Any, tf.Tensor]:
    """(The state `read` returns, the version it read: the round its file
    was written in, or `INITIAL_VERSION` for the shared initial state)."""
    if self._memory is not None:
      flat, version = self._memory.read(
        self._client_name_tf(client_id), round_num
      )
      return tf.nest.pack_sequence_as(self._initial, flat), version
    path = self.read_path(client_id, round_num)
    version = tf.cond(
      tf.equal(path, self._initial_file),
      lambda: tf.constant(INITIAL_VERSION, tf.int64),
      lambda: tf.strings.to_number(
        tf.strings.regex_replace(path, r'^.*/([0-9]+)\.state$', r'\1'), tf.int64
      ),
    )
    return state_files.parse_state(
      tf.io.read_file(path), self._initial
    ), version

  def unreadable_files(
    self, client_ids: Sequence[str], round_num: int
  ) -> list[str]:
    """The state files the clients would read in `round_num` that do not
    parse (truncated by a full disk, a crash mid-write, ...)."""
    bad = []
    for client_id in client_ids:
      version = self.expected_read_version(client_id, round_num)
      path = self._file(client_id, version)
      if self._memory is not None:  # Parsed when loaded.
        if self._memory.unreadable(self.client_name(client_id), version):
          bad.append(path)
        continue
      try:
        self._parse_file(path)
      except (OSError, tf.errors.OpError, ValueError):
        bad.append(path)
    return bad

  def expected_read_version(self, client_id: str, round_num: int) -> int:
    """The version a client reads in `round_num`, from Python's listing:
    what `read_with_version` should report."""
    return state_files.readable_version(self.versions(client_id), round_num)

  def write(
    self, client_id: tf.Tensor, round_num: tf.Tensor, state: Any
  ) -> tf.Tensor:
    """Writes the client's state as of the end of `round_num`.

    Returns:
      1 once written: return it from the computation, so that the write
      runs before the round ends.
    """
    if self._memory is not None:
      return self._memory.write(
        self._client_name_tf(client_id), round_num, tf.nest.flatten(state)
      )
    serialized = state_files.serialize_state(state)
    with tf.control_dependencies(
      [tf.io.write_file(self.write_path(client_id, round_num), serialized)]
    ):
      return tf.cast(tf.strings.length(serialized) > 0, tf.int32)

  # -- In Python, between rounds.

  def client_name(self, client_id: str) -> str:
    # The TF op that names it, run once per client (prune and get ask often).
    if client_id not in self._client_names:
      self._client_names[client_id] = (
        self._client_name_tf(tf.constant(client_id)).numpy().decode()
      )
    return self._client_names[client_id]

  def client_dir(self, client_id: str) -> str:
    """The client's directory on disk."""
    return os.path.join(self._directory, self.client_name(client_id))

  def versions(self, client_id: str) -> list[int]:
    """The rounds the client's stored versions were written in, sorted."""
    if self._memory is not None:
      return self._memory.versions(self.client_name(client_id))
    return state_files.versions(self.client_dir(client_id))

  def __contains__(self, client_id: str) -> bool:
    return bool(self.versions(client_id))

  def _file(self, client_id: str, version: int) -> str:
    """A version's file (the shared initial state's for `INITIAL_VERSION`)."""
    if version == INITIAL_VERSION:
      return self._initial_file
    return os.path.join(self.client_dir(client_id), f'{version}.state')

  def _write_file(self, path: str, state: Any) -> None:
    state_files.write_bytes(path, state_files.serialize_state(state).numpy())

  def _parse_file(self, path: str) -> list[np.ndarray]:
    state = state_files.parse_state(
      tf.constant(state_files.read_bytes(path)), self._initial
    )
    return [t.numpy() for t in tf.nest.flatten(state)]

  # -- In memory: the copy on disk.

  def _load_from_disk(self) -> None:
    """The store starts as the directory on disk is (a resumed run); a
    file that does not parse is kept as unreadable (`unreadable_files`)."""
    for name in state_files.client_dirs(self._directory):
      for version in state_files.versions(f'{self._directory}/{name}'):
        try:
          arrays = self._parse_file(f'{self._directory}/{name}/{version}.state')
        except (OSError, tf.errors.OpError, ValueError):
          arrays = None
        self._memory.load(name, version, arrays)

  def write_to_disk(self) -> None:
    """Makes the directory on disk hold the versions the store in memory
    holds: call it before a checkpoint is saved, so that every checkpoint
    finds its clients' states there. A no-op for a store on disk."""
    if self._memory is None:
      return
    for name in self._memory.names():
      disk_dir = os.path.join(self._directory, name)
      os.makedirs(disk_dir, exist_ok=True)
      on_disk = set(state_files.versions(disk_dir))
      in_memory = self._memory.versions(name)
      unsaved = self._memory.unsaved(name)
      for version in in_memory:
        # Written since the last copy (a round run again: anew).
        if version in unsaved or version not in on_disk:
          self._write_file(
            os.path.join(disk_dir, f'{version}.state'),
            self._memory.get(name, version),
          )
      for version in on_disk.difference(in_memory):  # Pruned or discarded.
        state_files.remove(os.path.join(disk_dir, f'{version}.state'))
    self._memory.saved()

  def get(self, client_id: str, before_round: Optional[int] = None):
    """The newest version written before `before_round` (default: any)."""
    versions = [
      v
      for v in self.versions(client_id)
      if before_round is None or v < before_round
    ]
    version = versions[-1] if versions else INITIAL_VERSION
    if self._memory is not None:
      arrays = self._memory.get(self.client_name(client_id), version)
      if arrays is None:
        raise states_in_memory.UnreadableStateError(
          f'{self._file(client_id, version)} did not parse.'
        )
      return tf.nest.pack_sequence_as(
        self._initial, [np.array(a) for a in arrays]
      )
    return tf.nest.pack_sequence_as(
      self._initial, self._parse_file(self._file(client_id, version))
    )

  def put(self, client_id: str, state: Any, round_num: int) -> None:
    """Stores the client's state as of the end of `round_num`."""
    flat = [np.asarray(a) for a in tf.nest.flatten(state)]
    template = tf.nest.flatten(self._initial)
    if len(flat) != len(template):
      raise ValueError(
        f'State of client {client_id!r} has {len(flat)} '
        f'tensors; the files hold states of {len(template)}.'
      )
    for a, t in zip(flat, template):
      if a.shape != t.shape:
        raise ValueError(
          f'State of client {client_id!r} has a tensor of shape {a.shape} '
          f'where the files hold {t.shape}.'
        )
    flat = [a.astype(t.dtype) for a, t in zip(flat, template)]
    if self._memory is not None:
      self._memory.put(self.client_name(client_id), round_num, flat)
      return
    tf.io.gfile.makedirs(self.client_dir(client_id))
    self._write_file(self._file(client_id, round_num), flat)

  def discard(self, client_ids: Sequence[str], round_num: int) -> None:
    """Removes the versions the clients wrote in `round_num` (rejected)."""
    for client_id in client_ids:
      if self._memory is not None:
        self._memory.remove(self.client_name(client_id), round_num)
      state_files.remove(self._file(client_id, round_num))

  def prune(self, client_ids: Sequence[str], checkpoint_round: int) -> None:
    """Keeps what a resumption from `checkpoint_round` or later can read.

    For each client: the versions written after `checkpoint_round`, and the
    newest one written up to it (and its own initial state).
    """
    for client_id in client_ids:
      if self._memory is not None:
        self._memory.prune(self.client_name(client_id), checkpoint_round)
      state_files.prune_directory(self.client_dir(client_id), checkpoint_round)

  def prune_all(self, checkpoint_round: int) -> None:
    """`prune` for every client that has a directory or versions here."""
    if self._memory is not None:
      for name in self._memory.names():
        self._memory.prune(name, checkpoint_round)
    for name in state_files.client_dirs(self._directory):
      state_files.prune_directory(f'{self._directory}/{name}', checkpoint_round)


def summed_counts(state_counts):
  """How many clients wrote their state this round, and the sum of the
  versions they read (SERVER): a program checks both against its store
  (`ClientStateFiles.expected_read_version`), so that a
  stale read (a shared file system's cached listing) does not go
  unnoticed.

  `state_counts` is each client's `OrderedDict(written, read_version_sum)`:
  one sum of both, as a TFF worker reduces every sum client by client (two
  sums cost twice one, about 75 us a client each).
  """
  return tff.federated_sum(state_counts)


class PruningProgramStateManager(tff.program.ProgramStateManager):
  """A program state manager that prunes the client states it saves past.

  For `tff.learning.programs.train_model` (and any TFF program): after each
  `save(program_state, version)` of the wrapped manager, every client keeps
  only the state versions a program resumed from that version can read
  (`ClientStateFiles.prune_all`), so the directory stays bounded (about one
  version per client) instead of growing by a version per client and round.

      manager = client_states.PruningProgramStateManager(
          tff.program.FileProgramStateManager(root), process.client_states)

  Args:
    program_state_manager: The manager that saves and loads.
    client_states: The process's client states (`process.client_states`).
  """

  def __init__(
    self,
    program_state_manager: tff.program.ProgramStateManager,
    client_states: ClientStateFiles,
  ):
    self._manager = program_state_manager
    self._client_states = client_states
    # One save at a time, per event loop (each program runs in its own).
    self._save_locks = weakref.WeakKeyDictionary()

  async def get_versions(self) -> Optional[list[int]]:
    return await self._manager.get_versions()

  async def load(self, version: int, structure: Any) -> Any:
    return await self._manager.load(version, structure)

  async def save(self, program_state: Any, version: int) -> None:
    # `train_model` saves in background tasks, so two saves can overlap,
    # and TFF's `FileProgramStateManager` then removes the same old
    # version twice (a NotFoundError): saves here run one after the other.
    loop = asyncio.get_running_loop()
    lock = self._save_locks.setdefault(loop, asyncio.Lock())
    async with lock:
      # The clients' states first: a saved checkpoint finds its own.
      self._client_states.write_to_disk()
      await self._manager.save(program_state, version)
      self._client_states.prune_all(version)


# Characters kept in a client's directory name (a fingerprint of the id
# follows, so distinct ids never share a directory).
_UNSAFE = r'[^A-Za-z0-9_-]'
_BUCKETS = 2**62
