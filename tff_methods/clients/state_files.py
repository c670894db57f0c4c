"""A client's state as one file, the file operations on a store's
directory, and where a store kept in memory lives, for `client_states`.

The file operations go through TensorFlow's file systems (`tf.io.gfile`),
as the clients' own reads and writes do.
"""

import os
import re
import shutil
import tempfile
from typing import Any
import uuid

import numpy as np
import tensorflow as tf

# Where a store kept in memory lives: the machine's shared memory (a tmpfs),
# when it has room for this many versions of a client's state; else the
# local temporary directory (whose recent writes the OS keeps in memory).
# Not TensorFlow's `ram://` file system: it searches every file it holds for
# each lookup, under one lock for all threads, and a write to an existing
# file appends to it (a round run again would corrupt the state).
SHARED_MEMORY = '/dev/shm'
ROOM_IN_VERSIONS = 1000
# A store's directory there: `<prefix><pid>.<unique>`, so that a process
# that did not end cleanly leaves nothing behind for long (`working_directory`).
_WORKING_PREFIX = 'tff_methods_states.'


def working_directory(
  state_bytes: int, shared_memory: str = SHARED_MEMORY
) -> str:
  """A new directory for a store kept in memory, for a state of
  `state_bytes`: in `shared_memory` when it has room for `ROOM_IN_VERSIONS`
  versions, else in the temporary directory. Directories left there by
  processes that have ended are removed first."""
  root = tempfile.gettempdir()
  try:
    stats = os.statvfs(shared_memory)
    room = stats.f_bavail * stats.f_frsize
    if room >= ROOM_IN_VERSIONS * state_bytes and os.access(
      shared_memory, os.W_OK
    ):
      root = shared_memory
  except OSError:  # No such file system.
    pass
  remove_orphans(root)
  name = f'{_WORKING_PREFIX}{os.getpid()}.{uuid.uuid4().hex}'
  path = os.path.join(root, name)
  os.makedirs(path)
  return path


def remove_orphans(root: str) -> None:
  """Removes the store directories in `root` of processes that have ended."""
  try:
    names = os.listdir(root)
  except OSError:
    return
  for name in names:
    if not name.startswith(_WORKING_PREFIX):
      continue
    pid = name[len(_WORKING_PREFIX) :].split('.')[0]
    if not pid.isdigit():
      continue
    try:
      os.kill(int(pid), 0)
    except ProcessLookupError:
      shutil.rmtree(os.path.join(root, name), ignore_errors=True)
    except OSError:  # Alive, another user's.
      pass


def serialize_state(state: Any) -> tf.Tensor:
  """A nested structure of tensors as one string tensor (graph or eager)."""
  return tf.io.serialize_tensor(
    tf.stack([tf.io.serialize_tensor(t) for t in tf.nest.flatten(state)])
  )


def parse_state(serialized: tf.Tensor, template: Any) -> Any:
  """The inverse of `serialize_state`; `template` gives dtypes and shapes."""
  parts = tf.io.parse_tensor(serialized, tf.string)
  flat = [
    tf.ensure_shape(
      tf.io.parse_tensor(parts[i], tf.as_dtype(a.dtype)), np.shape(a)
    )
    for i, a in enumerate(tf.nest.flatten(template))
  ]
  return tf.nest.pack_sequence_as(template, flat)


def versions(client_dir: str) -> list[int]:
  """The versions in a client's directory, sorted."""
  try:
    names = tf.io.gfile.listdir(client_dir)
  except tf.errors.NotFoundError:
    return []
  # (A write's temporary file is no version.)
  return sorted(
    int(n[: -len('.state')])
    for n in names
    if n.endswith('.state') and n[: -len('.state')].isdigit()
  )


def client_dirs(root: str) -> list[str]:
  """The names of the client directories under `root`."""
  try:
    names = tf.io.gfile.listdir(root)
  except tf.errors.NotFoundError:
    return []
  return [n.rstrip('/') for n in names if tf.io.gfile.isdir(f'{root}/{n}')]


def prune_directory(
  client_dir: str, checkpoint_round: int, own_initial_version: int
) -> None:
  """Removes a client's versions older than its newest up to
  `checkpoint_round` (keeping its own initial state, `own_initial_version`)."""
  older = [
    v
    for v in versions(client_dir)
    if own_initial_version < v <= checkpoint_round
  ]
  for version in older[:-1]:
    remove(f'{client_dir}/{version}.state')


def escape_glob(path: str) -> str:
  """`path` with glob's special characters escaped (`\\[`, `\\*`, ...)."""
  return re.sub(r'([\[\]*?\\])', r'\\\1', path)


def remove(path: str) -> None:
  try:
    tf.io.gfile.remove(path)
  except tf.errors.NotFoundError:
    pass


def remove_tree(path: str) -> None:
  # shutil, not tf.io.gfile: this also runs as the interpreter exits.
  shutil.rmtree(path, ignore_errors=True)


def read_bytes(path: str) -> bytes:
  with tf.io.gfile.GFile(path, 'rb') as f:
    return f.read()


def write_bytes(path: str, data: bytes) -> None:
  """Writes `path` whole: a reader finds the old file or the new one."""
  tmp = f'{path}.tmp'
  with tf.io.gfile.GFile(tmp, 'wb') as f:
    f.write(data)
  tf.io.gfile.rename(tmp, path, overwrite=True)
