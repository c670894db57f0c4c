"""Clients' arrays written once as one TFRecord file per client, and served
as TFF client data (`TFRecordClientData`, a `FilePerUserClientData`), under a
cache directory keyed by the data set, partition and seed. A TFF worker reads a
client's data by its id: no arrays are shipped into computations.
`tff_methods_tasks.datasets` re-exports these names.
"""

import collections
import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
from typing import Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_methods_tasks import partition as partition_lib


@dataclasses.dataclass
class FederatedData:
  """Clients' training data and a central test split.

  Attributes:
    name: The task name.
    client_data: Each client's training examples, `OrderedDict(x, y)`.
    test_x: Central test inputs, float32 (int32 ids for text).
    test_y: Central test labels, int32.
    num_classes: Number of classes (vocabulary size for text).
    input_shape: Shape of one input.
    train_labels: Labels of every training example, by client, for reports;
      None where labels are not single classes (text).
  """

  name: str
  client_data: tff.simulation.datasets.ClientData
  test_x: np.ndarray
  test_y: np.ndarray
  num_classes: int
  input_shape: tuple
  train_labels: Optional[list[np.ndarray]] = None

  def class_counts(self) -> np.ndarray:
    """(num_clients, num_classes) counts of training examples."""
    if self.train_labels is None:
      raise ValueError(f'Task {self.name!r} has no per-example class labels.')
    return np.stack(
      [np.bincount(y, minlength=self.num_classes) for y in self.train_labels]
    )


def _serialize(x: np.ndarray, y) -> bytes:
  feature = {
    'x': tf.train.Feature(
      bytes_list=tf.train.BytesList(value=[np.ascontiguousarray(x).tobytes()])
    ),
    'y': tf.train.Feature(
      bytes_list=tf.train.BytesList(value=[np.ascontiguousarray(y).tobytes()])
    ),
  }
  return tf.train.Example(
    features=tf.train.Features(feature=feature)
  ).SerializeToString()


def _client_id(i: int) -> str:
  return f'client_{i:05d}'


def write_client_files(
  directory: str,
  clients: Sequence[tuple[np.ndarray, np.ndarray]],
) -> dict[str, str]:
  """Writes each client's (x, y) to `directory/<client id>.tfrecord`.

  The directory is written to a temporary sibling and renamed into place, so
  an interrupted write never leaves a half-filled cache behind.
  """
  if not os.path.isdir(directory):
    parent = os.path.dirname(os.path.abspath(directory))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=parent, prefix='.writing_')
    try:
      for i, (x, y) in enumerate(clients):
        with tf.io.TFRecordWriter(
          os.path.join(tmp, _client_id(i) + '.tfrecord')
        ) as writer:
          for xi, yi in zip(x, y):
            writer.write(_serialize(xi, yi))
      os.rename(tmp, directory)
    except OSError:
      shutil.rmtree(tmp, ignore_errors=True)
      # Another run (compare's --jobs) wrote the same clients first: the
      # directory is named by what it holds, so its files are these.
      if not os.path.isdir(directory):
        raise
    except BaseException:
      shutil.rmtree(tmp, ignore_errors=True)
      raise
  return {
    _client_id(i): os.path.join(directory, _client_id(i) + '.tfrecord')
    for i in range(len(clients))
  }


def read_records(path, record_bytes: int) -> tf.Tensor:
  """The records of a TFRecord file whose records are all `record_bytes`
  long, as a string vector, cut from the file's bytes.

  A TFRecord is its length (8 bytes), the length's checksum (4), the data
  and the data's checksum (4). A file of equal records needs no reader:
  TensorFlow's (`TFRecordDataset`, batched whole) took about 0.3 ms more a
  client of 20 examples than the read and the cuts. The checksums are not
  checked (TensorFlow has no op for them); the file's size and every
  record's length are (a truncated file, or one of other records, fails
  naming its path).
  """
  framed = record_bytes + 16
  contents = tf.io.read_file(path)
  size = tf.strings.length(contents)
  starts = tf.range(size // framed) * framed
  lengths = tf.io.decode_raw(
    tf.strings.substr(contents, starts, tf.fill(tf.shape(starts), 8)),
    tf.int64,
  )
  check = tf.debugging.Assert(
    tf.logical_and(
      tf.equal(size % framed, 0),
      tf.reduce_all(tf.equal(lengths, record_bytes)),
    ),
    [path, 'is not a TFRecord file of records of', record_bytes, 'bytes'],
  )
  with tf.control_dependencies([check]):
    return tf.strings.substr(
      contents, starts + 12, tf.fill(tf.shape(starts), record_bytes)
    )


def _records_parser(x_shape, x_dtype, y_shape, y_dtype, mean=None, std=None):
  """A tf function: a vector of serialized examples -> OrderedDict(x, y),
  normalized, one row per example."""

  def parse(records):
    parsed = tf.io.parse_example(
      records,
      {
        'x': tf.io.FixedLenFeature([], tf.string),
        'y': tf.io.FixedLenFeature([], tf.string),
      },
    )
    x = tf.reshape(tf.io.decode_raw(parsed['x'], x_dtype), [-1] + list(x_shape))
    y = tf.reshape(tf.io.decode_raw(parsed['y'], y_dtype), [-1] + list(y_shape))
    if mean is not None:
      x = (x - tf.constant(mean, x.dtype)) / tf.constant(std, x.dtype)
    return collections.OrderedDict(x=x, y=y)

  return parse


class TFRecordClientData(tff.simulation.datasets.FilePerUserClientData):
  """Clients' examples in `directory/<client id>.tfrecord` (as
  `write_client_files` writes them), each file read whole.

  TFF's `FilePerUserClientData` finds a client's file through a lookup table
  of every client's path, built on every call of its
  `serializable_dataset_fn` (3,400 entries for EMNIST's writers), and a
  per-record parse would be a tf.data `map`, whose function the TFF worker
  instantiates on every call. Here the path is joined from the id, and a
  client's records are cut from the file's bytes and parsed together
  (`read_records`): no tf.data data set or function, and the same examples
  in the same order.
  """

  def __init__(
    self,
    directory: str,
    client_ids: Sequence[str],
    x_shape,
    x_dtype,
    y_shape=(),
    y_dtype=tf.int32,
    mean=None,
    std=None,
  ):
    self._directory = directory
    self._parse = _records_parser(x_shape, x_dtype, y_shape, y_dtype, mean, std)
    # Every example has the same shapes, so every record the same length.
    self._record_bytes = len(
      _serialize(
        np.zeros(x_shape, tf.as_dtype(x_dtype).as_numpy_dtype),
        np.zeros(y_shape, tf.as_dtype(y_dtype).as_numpy_dtype),
      )
    )
    super().__init__(
      {i: self.path(i) for i in client_ids}, self._dataset_of_file
    )

  def _examples_of_file(self, path):
    return self._parse(read_records(path, self._record_bytes))

  def _dataset_of_file(self, path):
    return tf.data.Dataset.from_tensor_slices(self._examples_of_file(path))

  def path(self, client_id):
    """The file of `client_id` (a string, or a string tensor)."""
    if isinstance(client_id, str):
      return os.path.join(self._directory, client_id + '.tfrecord')
    return tf.strings.join([self._directory, os.sep, client_id, '.tfrecord'])

  @property
  def serializable_dataset_fn(self):
    return lambda client_id: self._dataset_of_file(self.path(client_id))

  @property
  def serializable_examples_fn(self):
    """`serializable_dataset_fn`'s examples, stacked (`read_all` of its data
    set), without the data set: what `round_dataset_computation` batches."""
    return lambda client_id: self._examples_of_file(self.path(client_id))


def cache_key(**parts) -> str:
  text = json.dumps(parts, sort_keys=True, default=str)
  return hashlib.sha1(text.encode()).hexdigest()[:16]


def default_cache_dir() -> str:
  return os.path.join(os.path.expanduser('~'), '.cache', 'tff_methods')


def partition_arrays(
  labels: np.ndarray,
  scheme: str,
  num_clients: int,
  seed: int,
  alpha: float = 0.5,
  min_size: int = 10,
  classes_per_client: int = 2,
  shards_per_client: int = 2,
  non_iid_fraction: float = 1.0,
) -> list[np.ndarray]:
  """Applies the partitioner `scheme` with the parameters it takes."""
  if scheme == 'iid':
    return partition_lib.iid(labels, num_clients, seed)
  if scheme == 'dirichlet':
    return partition_lib.dirichlet(labels, num_clients, alpha, min_size, seed)
  if scheme == 'pathological':
    return partition_lib.pathological(
      labels, num_clients, classes_per_client, seed
    )
  if scheme == 'shards':
    return partition_lib.shards(labels, num_clients, shards_per_client, seed)
  if scheme == 'mixed':
    return partition_lib.mixed(labels, num_clients, non_iid_fraction, seed)
  raise ValueError(
    f'Unknown partition {scheme!r}; choose one of '
    f'{partition_lib.PARTITIONERS}.'
  )


def from_arrays(
  name: str,
  x_train: np.ndarray,
  y_train: np.ndarray,
  x_test: np.ndarray,
  y_test: np.ndarray,
  parts: Sequence[np.ndarray],
  cache_dir: str,
  num_classes: Optional[int] = None,
  mean=None,
  std=None,
) -> FederatedData:
  """A `FederatedData` from centralized arrays and a partition of them.

  Args:
    name: The data set's name (part of the cache key).
    x_train, y_train: Centralized training arrays.
    x_test, y_test: The central test split.
    parts: One index array into the training arrays per client.
    cache_dir: Where the clients' TFRecord files are written.
    num_classes: Defaults to max(label) + 1.
    mean, std: Per-channel normalization applied when reading.
  """
  for i, p in enumerate(parts):
    if len(p) == 0:
      raise ValueError(
        f'The partition left client {i} with no data; use '
        'fewer clients or a less skewed partition.'
      )
  x_train = np.asarray(x_train)
  y_train = np.asarray(y_train, np.int32)
  num_classes = num_classes or int(max(y_train.max(), y_test.max())) + 1
  # Labels are one class per example, or a sequence of them (text).
  is_sequence = y_train.ndim > 1
  digest = hashlib.sha1()
  for p in parts:
    digest.update(np.asarray(p, np.int64).tobytes())
  digest.update(np.ascontiguousarray(x_train[:64]).tobytes())
  key = cache_key(
    name=name,
    n=len(y_train),
    shape=x_train.shape,
    dtype=str(x_train.dtype),
    parts=digest.hexdigest(),
  )
  directory = os.path.join(cache_dir, name, key)
  files = write_client_files(
    directory, [(x_train[p], y_train[p]) for p in parts]
  )
  client_data = TFRecordClientData(
    directory,
    list(files),
    x_train.shape[1:],
    tf.as_dtype(x_train.dtype),
    y_train.shape[1:],
    tf.int32,
    mean,
    std,
  )
  test_x = np.asarray(x_test)
  if mean is not None:
    test_x = (
      (test_x - np.asarray(mean, test_x.dtype)) / np.asarray(std, test_x.dtype)
    ).astype(test_x.dtype)
  return FederatedData(
    name,
    client_data,
    test_x,
    np.asarray(y_test, np.int32),
    num_classes,
    tuple(x_train.shape[1:]),
    None if is_sequence else [y_train[p] for p in parts],
  )
