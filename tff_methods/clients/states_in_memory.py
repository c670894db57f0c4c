"""Each client's state versions as arrays in this Python process, for a
process the in-process execution context runs
(`client_states.ClientStateFiles(in_memory=True)`).

The clients' TensorFlow reads and writes them through `tf.numpy_function`:
a read hands TensorFlow the stored arrays, a write keeps a copy of the new
ones. A round in this process then neither serializes a state nor touches a
file: as files, even in shared memory, SCAFFOLD's reads and writes took
about half as long again as the training of a 20-example client. A TFF
worker is another process and can't reach them: the worker's contexts
refuse a computation that reads them
(`tff_methods.execution.worker_compilation.python_function_ops`).

The arrays held in memory are bounded (`budget_bytes`: by default half the
memory the machine has available when the store is made); versions beyond
it go to files of the store's own in the temporary directory, so a large
population of large states slows down instead of running out of memory.
"""

import os
import shutil
import tempfile
import threading
from typing import Optional, Sequence, Union
import weakref

import numpy as np
import tensorflow as tf
from tensorflow.python.ops import (
  script_ops,  # pylint: disable=g-direct-tensorflow-import
)

from tff_methods.clients import state_files


class UnreadableStateError(ValueError):
  """A client's state version that did not parse when loaded from disk."""


class _Spilled:
  """A version kept in a file of the store's (`np.savez`)."""

  def __init__(self, path: str):
    self.path = path

  def arrays(self) -> list[np.ndarray]:
    with np.load(self.path) as saved:
      return [saved[f'arr_{i}'] for i in range(len(saved.files))]


_Held = Union[list, _Spilled, None]


def available_memory_bytes() -> Optional[int]:
  """The memory this machine has available now (Linux's MemAvailable, which
  counts the page cache it can reclaim; else the free pages); None where
  unknown."""
  try:
    with open('/proc/meminfo') as f:
      for line in f:
        if line.startswith('MemAvailable:'):
          return int(line.split()[1]) * 1024
  except (OSError, ValueError, IndexError):
    pass
  try:
    return os.sysconf('SC_AVPHYS_PAGES') * os.sysconf('SC_PAGE_SIZE')
  except (ValueError, OSError, AttributeError):
    return None


class StatesInMemory:
  """Each client's state versions, by client name and version.

  A version is a flat list of arrays shaped as `template`'s, or None for a
  file that did not parse when it was loaded (`load`): reading it fails,
  and `client_states.ClientStateFiles.unreadable_files` names it first.

  Args:
    template: The arrays of the shared initial state, read by a client with
      no usable version.
    budget_bytes: At most this many bytes of versions in memory; the rest
      in files of the store's own. By default half of
      `available_memory_bytes()` (no bound where that is unknown).
  """

  def __init__(
    self, template: Sequence[np.ndarray], budget_bytes: Optional[int] = None
  ):
    self._template = [np.asarray(a) for a in template]
    if budget_bytes is None:
      available = available_memory_bytes()
      budget_bytes = available // 2 if available is not None else None
    self.budget_bytes = budget_bytes
    self._held_bytes = 0
    self._spill_directory = None
    self._spill_files_made = 0
    self._states: dict[str, dict[int, _Held]] = {}
    # Versions written here since `saved` was last called.
    self._unsaved: dict[str, set[int]] = {}
    self._lock = threading.Lock()
    # What TensorFlow's registry of numpy functions calls, by the name a
    # graph holds: the registry holds them weakly, and the graph that held
    # them strongly (TFF's, while tracing) is gone when they are called.
    self._callbacks = []

  # -- In TensorFlow, in the client computation.

  def read(
    self, name: tf.Tensor, round_num: tf.Tensor
  ) -> tuple[list[tf.Tensor], tf.Tensor]:
    """(The arrays of the newest usable version before `round_num`, or the
    template's; the version read, `state_files.INITIAL_VERSION` for the
    template's)."""
    *flat, version = self._keep(
      tf.numpy_function(
        self._read,
        [name, tf.cast(round_num, tf.int64)],
        [tf.as_dtype(a.dtype) for a in self._template] + [tf.int64],
        stateful=True,
      )
    )
    flat = [tf.ensure_shape(t, a.shape) for t, a in zip(flat, self._template)]
    return flat, tf.reshape(version, [])

  def write(
    self, name: tf.Tensor, round_num: tf.Tensor, flat: Sequence[tf.Tensor]
  ) -> tf.Tensor:
    """Keeps `flat` as the client's version `round_num`; returns 1."""
    written = self._keep(
      tf.numpy_function(
        self._write,
        [name, tf.cast(round_num, tf.int64), *flat],
        tf.int32,
        stateful=True,
      )
    )
    return tf.reshape(written, [])

  def _keep(self, results):
    """`results`; the callback their op names is kept with this store."""
    if tf.executing_eagerly():
      return results
    op = tf.nest.flatten(results)[0].op
    if op.type in ('PyFunc', 'PyFuncStateless'):
      token = op.get_attr('token')
      token = token.decode() if isinstance(token, bytes) else token
      self._callbacks.append(script_ops._py_funcs.get(token))  # pylint: disable=protected-access
    return results

  def _read(self, name, round_num) -> list[np.ndarray]:
    name = _as_str(name)
    version = state_files.readable_version(self.versions(name), int(round_num))
    arrays = self.get(name, version)
    if arrays is None:
      raise UnreadableStateError(
        f'The state version {version} of client {name} did not parse when '
        'it was loaded.'
      )
    return [*arrays, np.int64(version)]

  def _write(self, name, round_num, *arrays) -> np.int32:
    # A copy: TensorFlow's buffers are its own.
    self.put(_as_str(name), int(round_num), [np.array(a) for a in arrays])
    return np.int32(1)

  # -- In Python, between rounds.

  def names(self) -> list[str]:
    """The clients that have held a version (some may hold none now)."""
    with self._lock:
      return list(self._states)

  def versions(self, name: str) -> list[int]:
    with self._lock:
      return sorted(self._states.get(name, ()))

  def get(self, name: str, version: int) -> Optional[list[np.ndarray]]:
    """The arrays of a version (the template's for `INITIAL_VERSION`); None
    for one that did not parse when loaded."""
    if version == state_files.INITIAL_VERSION:
      return list(self._template)
    with self._lock:
      held = self._states[name][version]
    return held.arrays() if isinstance(held, _Spilled) else held

  def unreadable(self, name: str, version: int) -> bool:
    """Whether a version did not parse when loaded (without reading one
    kept in a file)."""
    if version == state_files.INITIAL_VERSION:
      return False
    with self._lock:
      return self._states[name][version] is None

  def put(self, name: str, version: int, arrays: list[np.ndarray]) -> None:
    """Keeps a version written in this store (`unsaved` until `saved`)."""
    with self._lock:
      self._replace(name, version, arrays)
      self._unsaved.setdefault(name, set()).add(version)

  def load(
    self, name: str, version: int, arrays: Optional[list[np.ndarray]]
  ) -> None:
    """Keeps a version read from disk (None: its file did not parse)."""
    with self._lock:
      self._replace(name, version, arrays)

  def remove(self, name: str, version: int) -> None:
    with self._lock:
      self._release(self._states.get(name, {}).pop(version, None))
      self._unsaved.get(name, set()).discard(version)

  @property
  def spilled(self) -> int:
    """How many versions are in files, beyond `budget_bytes`."""
    with self._lock:
      return sum(
        isinstance(held, _Spilled)
        for versions in self._states.values()
        for held in versions.values()
      )

  def _replace(
    self, name: str, version: int, arrays: Optional[list[np.ndarray]]
  ) -> None:
    """A version's arrays in place of any it held (under the lock)."""
    self._release(self._states.get(name, {}).pop(version, None))
    self._states.setdefault(name, {})[version] = self._hold(arrays)

  def _hold(self, arrays: Optional[list[np.ndarray]]) -> _Held:
    """`arrays` in memory, or in a file if they would exceed the budget
    (under the lock)."""
    if arrays is None:
      return None
    size = sum(a.nbytes for a in arrays)
    if (
      self.budget_bytes is None or self._held_bytes + size <= self.budget_bytes
    ):
      self._held_bytes += size
      return arrays
    if self._spill_directory is None:
      self._spill_directory = tempfile.mkdtemp(prefix='tff_methods_states_')
      weakref.finalize(
        self, shutil.rmtree, self._spill_directory, ignore_errors=True
      )
    self._spill_files_made += 1
    path = os.path.join(self._spill_directory, f'{self._spill_files_made}.npz')
    np.savez(path, *arrays)
    return _Spilled(path)

  def _release(self, held: _Held) -> None:
    if isinstance(held, _Spilled):
      os.remove(held.path)
    elif held is not None:
      self._held_bytes -= sum(a.nbytes for a in held)

  def prune(self, name: str, checkpoint_round: int) -> None:
    """`state_files.prune_directory`'s rule, on a client's versions."""
    for version in state_files.versions_to_prune(
      self.versions(name), checkpoint_round
    ):
      self.remove(name, version)

  def unsaved(self, name: str) -> set[int]:
    """The client's versions written here since `saved`."""
    with self._lock:
      return set(self._unsaved.get(name, ()))

  def saved(self) -> None:
    """Marks every version as on disk."""
    with self._lock:
      self._unsaved.clear()


def _as_str(name) -> str:
  # A string tensor reaches a numpy function as bytes, or in a
  # `tf.function` run eagerly as a 0-d array of them.
  return np.asarray(name).item().decode()
