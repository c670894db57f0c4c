"""A client's state as one file, which version a client reads, and the
file operations on a store's directory, for `client_states`.

The file operations go through TensorFlow's file systems (`tf.io.gfile`),
as the clients' own reads and writes do.
"""

import os
import re
from typing import Any, Sequence

import numpy as np
import tensorflow as tf

# A client's own initial state (MOON's `initial_model`): version 0, read
# from the second round on.
OWN_INITIAL_VERSION = 0
# The version number of the shared initial state (`initial.state`).
INITIAL_VERSION = -1


def readable_version(versions: Sequence[int], round_num: int) -> int:
  """The version a client reads in `round_num`: its newest written before
  the round (its own initial state from the second round on), else
  `INITIAL_VERSION`."""
  usable = [
    v
    for v in versions
    if v < round_num and (v != OWN_INITIAL_VERSION or round_num > 1)
  ]
  return max(usable) if usable else INITIAL_VERSION


def versions_to_prune(versions: Sequence[int], checkpoint_round: int) -> list:
  """The versions no resumption from `checkpoint_round` or later reads:
  those up to it but its newest (and the client's own initial state)."""
  older = sorted(
    v for v in versions if OWN_INITIAL_VERSION < v <= checkpoint_round
  )
  return older[:-1]


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


def prune_directory(client_dir: str, checkpoint_round: int) -> None:
  """Removes a client's versions no resumption from `checkpoint_round` or
  later reads (`versions_to_prune`)."""
  for version in versions_to_prune(versions(client_dir), checkpoint_round):
    remove(f'{client_dir}/{version}.state')


def escape_glob(path: str) -> str:
  """`path` with glob's special characters escaped (`\\[`, `\\*`, ...)."""
  return re.sub(r'([\[\]*?\\])', r'\\\1', path)


def remove(path: str) -> None:
  try:
    tf.io.gfile.remove(path)
  except tf.errors.NotFoundError:
    pass


def read_bytes(path: str) -> bytes:
  with tf.io.gfile.GFile(path, 'rb') as f:
    return f.read()


def write_bytes(path: str, data: bytes) -> None:
  """Writes `path` whole: a reader finds the old file or the new one."""
  tmp = f'{path}.tmp'
  with tf.io.gfile.GFile(tmp, 'wb') as f:
    f.write(data)
  tf.io.gfile.rename(tmp, path, overwrite=True)


def has_client_states(directory: str) -> bool:
  """Whether any client has a stored state version under `directory`."""
  try:
    names = os.listdir(directory)
  except FileNotFoundError:
    return False
  return any(
    n.endswith('.state')
    for name in names
    if os.path.isdir(os.path.join(directory, name))
    for n in os.listdir(os.path.join(directory, name))
  )


# The file that names the run a state directory belongs to.
OWNER_FILE = 'owner.txt'


def claim_directory(directory: str, owner: str) -> None:
  """Marks `directory` as `owner`'s state directory, or refuses another's.

  Runs that share a state directory would read each other's states (MOON's
  and FedCKA's files have the same layout): a program claims its directory
  before it trains, naming itself (e.g. its output directory).

  Raises:
    ValueError: `directory` holds another owner's states.
  """
  os.makedirs(directory, exist_ok=True)
  path = os.path.join(directory, OWNER_FILE)
  try:
    with open(path) as f:
      current = f.read().strip()
  except FileNotFoundError:
    current = ''
  if not current:  # Unclaimed, or an owner file left empty by a crash.
    with open(path, 'w') as f:
      f.write(owner + '\n')
    return
  if current != owner:
    moved = (
      f' If this run was moved from {current}, write {owner} into {path} '
      'to keep its states.'
      if not os.path.exists(current)
      else ''
    )
    raise ValueError(
      f'The client state directory {directory} holds the states of '
      f'another run ({current}); each run keeps its own.{moved} Otherwise '
      'give this run another client_state_dir, or remove that directory '
      'to start over.'
    )
