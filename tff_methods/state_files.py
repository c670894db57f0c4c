"""A client's state as one file, and the file operations on a store's
directory, on disk or in TensorFlow's RAM file system (`ram://`), for
`client_states`.

Everything here goes through TensorFlow's file systems (`tf.io.gfile`), so
the same code serves a store on disk and one in memory.
"""

import re
from typing import Any

import numpy as np
import tensorflow as tf

# TensorFlow's RAM file system: a store in memory lives under it.
RAM = 'ram://'


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
  """The versions in a client's directory (on disk or in RAM), sorted."""
  try:
    names = tf.io.gfile.listdir(client_dir)
  except tf.errors.NotFoundError:
    return []
  # (RAM's listing may add other names, which are no versions.)
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
  try:
    tf.io.gfile.rmtree(path)
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
