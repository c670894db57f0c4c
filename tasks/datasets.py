"""Federated data sets as `tff.simulation.datasets.ClientData`.

A `FederatedData` holds the clients' training data as a `ClientData` and a
central test split as arrays. Two kinds of source:

- Centralized arrays split by a partitioner (`tasks.partition`): scikit-
  learn's digits (embedded, offline), CIFAR-10/100, Fashion-MNIST and MNIST
  through tensorflow_datasets, the FedProx synthetic(alpha, beta) set
  generated in code, and image folders. Each client's examples are written
  once to a TFRecord file under a cache directory keyed by the data set,
  partition and seed, and served by `TFRecordClientData` (a TFF
  `FilePerUserClientData`). The TFF worker then reads a client's data by its
  id (the `dataset_computation` of the `ClientData`): no arrays are shipped
  into computations, and data sets of any size work.
- Natural splits from `tff.simulation.datasets`: EMNIST/FEMNIST and
  Shakespeare.

Every element is an `OrderedDict(x=..., y=...)`. `LocalBatches` says what a
client trains on in a round (fresh permutations per pass, as the reference
code's data loaders); `round_dataset_computation` serves it to the TFF
worker by (client id, round).
"""

import collections
import dataclasses
import hashlib
import json
import os
import shutil
import socket
import tempfile
from typing import Any, Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tasks import partition as partition_lib
from tff_methods import client_keys

TASK_NAMES = (
  'digits',
  'cifar10',
  'cifar100',
  'fmnist',
  'mnist',
  'emnist',
  'shakespeare',
  'synthetic',
  'image_folder',
)
# Tasks whose clients come from the data itself; partition flags are unused.
NATURAL_TASKS = ('emnist', 'shakespeare', 'synthetic')
# One input's shape and the number of classes of each task (vocabulary size
# for text), for data generated in its place (`generated_like`). An image
# folder's images are `image_size` square RGB, and it has as many classes as
# sub-directories.
TASK_SHAPES = {
  'digits': ((8, 8, 1), 10),
  'cifar10': ((32, 32, 3), 10),
  'cifar100': ((32, 32, 3), 100),
  'fmnist': ((28, 28, 1), 10),
  'mnist': ((28, 28, 1), 10),
  'emnist': ((28, 28, 1), 62),
  'shakespeare': ((80,), 90),
  'synthetic': ((60,), 10),
  'image_folder': (None, None),
}

_TFDS_NAMES = {
  'cifar10': 'cifar10',
  'cifar100': 'cifar100',
  'fmnist': 'fashion_mnist',
  'mnist': 'mnist',
}
# Where tensorflow_datasets downloads these data sets from.
_TFDS_DOWNLOAD_HOST = 'storage.googleapis.com'
# Per-channel mean and std after scaling to [0, 1].
_NORMALIZATION = {
  'cifar10': ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
  'cifar100': ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
  'fmnist': ((0.2860,), (0.3530,)),
  'mnist': ((0.1307,), (0.3081,)),
}


class DataUnavailableError(RuntimeError):
  """A data set could not be loaded (e.g. no network to download it)."""


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


# ---------------------------------------------------------------------------
# Centralized sources as arrays: (x_train, y_train, x_test, y_test).
# Images are float32 in [0, 1] before normalization.


def load_digits_arrays(seed: int = 0, test_fraction: float = 0.2):
  """scikit-learn's 8x8 digits (1797 examples, 10 classes), split in code."""
  from sklearn import datasets as sk_datasets

  digits = sk_datasets.load_digits()
  x = (digits.images / 16.0).astype(np.float32)[..., None]
  y = digits.target.astype(np.int32)
  order = np.random.default_rng(seed).permutation(len(y))
  num_test = int(round(test_fraction * len(y)))
  test, train = order[:num_test], order[num_test:]
  return x[train], y[train], x[test], y[test]


def _can_reach(host: str, port: int = 443, timeout: float = 5.0) -> bool:
  try:
    socket.create_connection((host, port), timeout=timeout).close()
    return True
  except OSError:
    return False


def load_tfds_arrays(name: str, data_dir: Optional[str] = None):
  """CIFAR-10/100, Fashion-MNIST or MNIST through tensorflow_datasets.

  Downloads and prepares the data set on first use. Without a network,
  tensorflow_datasets would retry each download for minutes, so an
  unprepared data set and an unreachable download host fail at once.
  """
  import tensorflow_datasets as tfds

  try:
    builder = tfds.builder(_TFDS_NAMES[name], data_dir=data_dir)
    if not builder.is_prepared():
      if not _can_reach(_TFDS_DOWNLOAD_HOST):
        raise OSError(f'{_TFDS_DOWNLOAD_HOST} is unreachable')
      builder.download_and_prepare()
    (x_tr, y_tr), (x_te, y_te) = tfds.as_numpy(
      builder.as_dataset(
        split=['train', 'test'], batch_size=-1, as_supervised=True
      )
    )
  except Exception as e:
    raise DataUnavailableError(
      f'Could not load {name!r} through tensorflow_datasets ({e!r:.300}). '
      'It downloads on first use and needs a network then; or copy a '
      'prepared tensorflow_datasets directory to --data_dir.'
    ) from e
  scale = lambda a: (a.astype(np.float32) / 255.0)
  return scale(x_tr), y_tr.astype(np.int32), scale(x_te), y_te.astype(np.int32)


def load_image_folder_arrays(
  directory: str,
  image_size: int = 32,
  test_fraction: float = 0.2,
  seed: int = 0,
):
  """Images in one sub-directory per class (Tiny ImageNet, APTOS, Chest X-ray).

  If `directory` holds `train/` and `test/` (or `val/`), each is read as a
  split; otherwise a seeded `test_fraction` of the images is held out. Images
  are resized to `image_size` x `image_size` RGB. Hidden files (`.DS_Store`)
  are skipped.

  Raises:
    ValueError: naming the folder or file: a class folder of the training
      data with no images (it would be trained as a class with no
      examples), or a file that is not an image TensorFlow can read.
  """
  if not directory or not os.path.isdir(directory):
    raise ValueError(
      f'--data_dir={directory!r} is not a directory; '
      'image_folder needs one sub-directory per class.'
    )

  def read(split_dir, classes=None):
    training = classes is None
    classes = classes or sorted(
      d
      for d in os.listdir(split_dir)
      if os.path.isdir(os.path.join(split_dir, d)) and not d.startswith('.')
    )
    if not classes:
      raise ValueError(f'{split_dir!r} has no class sub-directories.')
    xs, ys = [], []
    for label, cls in enumerate(classes):
      cls_dir = os.path.join(split_dir, cls)
      if not os.path.isdir(cls_dir):
        continue
      names = sorted(n for n in os.listdir(cls_dir) if not n.startswith('.'))
      if training and not names:
        raise ValueError(
          f'The class folder {cls_dir} has no images: it would be trained '
          'as a class with no examples. Add images, or remove the folder.'
        )
      for fname in names:
        path = os.path.join(cls_dir, fname)
        if os.path.isdir(path):
          raise ValueError(
            f'{path} is a folder inside the class folder {cls_dir}: images '
            'are read one level deep. Move its images up, or remove it.'
          )
        try:
          image = tf.io.decode_image(
            tf.io.read_file(path), channels=3, expand_animations=False
          )
        except (tf.errors.InvalidArgumentError, tf.errors.UnknownError) as e:
          reason = (e.message or '').splitlines()[0]
          raise ValueError(
            f'{path} is not an image TensorFlow can read ({reason}); '
            'remove it from the image folder.'
          ) from None
        image = tf.image.resize(image, (image_size, image_size))
        xs.append(image.numpy() / 255.0)
        ys.append(label)
    return np.asarray(xs, np.float32), np.asarray(ys, np.int32), classes

  train_dir = os.path.join(directory, 'train')
  test_dir = next(
    (
      os.path.join(directory, d)
      for d in ('test', 'val')
      if os.path.isdir(os.path.join(directory, d))
    ),
    None,
  )
  if os.path.isdir(train_dir) and test_dir:
    x_tr, y_tr, classes = read(train_dir)
    unseen = sorted(
      d
      for d in os.listdir(test_dir)
      if os.path.isdir(os.path.join(test_dir, d))
      and not d.startswith('.')
      and d not in classes
    )
    if unseen:
      raise ValueError(
        f'{test_dir} holds classes {", ".join(unseen)} that {train_dir} '
        'does not: their images could never be predicted. Add them to the '
        'training folder, or remove them.'
      )
    x_te, y_te, _ = read(test_dir, classes)
    return x_tr, y_tr, x_te, y_te
  x, y, _ = read(directory)
  order = np.random.default_rng(seed).permutation(len(y))
  num_test = int(round(test_fraction * len(y)))
  return (
    x[order[num_test:]],
    y[order[num_test:]],
    x[order[:num_test]],
    y[order[:num_test]],
  )


def generate_synthetic(
  alpha: float,
  beta: float,
  num_clients: int = 30,
  dimension: int = 60,
  num_classes: int = 10,
  seed: int = 0,
):
  """FedProx's synthetic(alpha, beta) data: one distribution per client.

  Client k: u_k ~ N(0, alpha), B_k ~ N(0, beta); W_k, b_k ~ N(u_k, 1);
  v_k ~ N(B_k, 1) per dimension; x ~ N(v_k, diag(j^-1.2)); y = argmax(W_k x +
  b_k). Client sizes follow a log-normal law as in FedProx's generator.

  Returns:
    A list of (x, y) per client.
  """
  rng = np.random.default_rng(seed)
  sizes = (rng.lognormal(4, 2, num_clients).astype(int) + 50).clip(max=2000)
  cov = np.diag(np.arange(1, dimension + 1, dtype=np.float64) ** -1.2)
  clients = []
  for k in range(num_clients):
    u = rng.normal(0, np.sqrt(alpha))
    b_mean = rng.normal(0, np.sqrt(beta))
    w = rng.normal(u, 1, (dimension, num_classes))
    b = rng.normal(u, 1, num_classes)
    v = rng.normal(b_mean, 1, dimension)
    x = rng.multivariate_normal(v, cov, sizes[k])
    y = np.argmax(x @ w + b, axis=1)
    clients.append((x.astype(np.float32), y.astype(np.int32)))
  return clients


# ---------------------------------------------------------------------------
# Writing clients' arrays as TFRecord files.


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
    except BaseException:
      shutil.rmtree(tmp, ignore_errors=True)
      raise
  return {
    _client_id(i): os.path.join(directory, _client_id(i) + '.tfrecord')
    for i in range(len(clients))
  }


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
  client's records are read in one batch and parsed together: no tf.data
  function, and the same examples in the same order.
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
    super().__init__(
      {i: self.path(i) for i in client_ids}, self._dataset_of_file
    )

  def _examples_of_file(self, path):
    records = (
      tf.data.TFRecordDataset(path)
      .with_options(PLAIN_OPTIONS)
      .batch(_ALL)
      .get_single_element()
    )
    return self._parse(records)

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


def _cache_key(**parts) -> str:
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
  key = _cache_key(
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


def generated_like(
  task: str,
  num_clients: int,
  examples_per_client: int,
  cache_dir: str,
  seed: int = 0,
  image_size: int = 32,
  num_classes: Optional[int] = None,
  num_test: int = 64,
  max_examples_per_client: Optional[int] = None,
) -> FederatedData:
  """Random data of task `task`'s shape, in place of the real data set.

  For tests and benchmarks that need a task's input shape and classes but
  not its content (the real sets need a download): standard-normal inputs
  (integer ids for text) and uniform labels, `examples_per_client` for each
  of `num_clients` clients (or between `examples_per_client` and
  `max_examples_per_client`, uniformly, as a natural split's clients
  differ), written and served as `from_arrays` does.

  Args:
    task: One of `TASK_NAMES`.
    num_clients: Clients to generate.
    examples_per_client: Training examples of each client.
    cache_dir: Where the clients' files are written.
    seed: Fixes the data.
    image_size: The side of `image_folder` images.
    num_classes: Classes (default: the task's; `image_folder` needs it).
    num_test: Central test examples.
    max_examples_per_client: When set, each client's size is drawn from
      [examples_per_client, max_examples_per_client].
  """
  if task not in TASK_SHAPES:
    raise ValueError(f'Unknown task {task!r}; choose one of {TASK_NAMES}.')
  input_shape, default_classes = TASK_SHAPES[task]
  if task == 'image_folder':
    input_shape = (image_size, image_size, 3)
  num_classes = num_classes or default_classes
  if not num_classes:
    raise ValueError(f'Task {task!r} needs num_classes to be generated.')
  if (
    max_examples_per_client is not None
    and max_examples_per_client < examples_per_client
  ):
    raise ValueError(
      f'max_examples_per_client={max_examples_per_client} is below '
      f'examples_per_client={examples_per_client}.'
    )
  rng = np.random.default_rng(seed)
  sizes = (
    np.full(num_clients, examples_per_client)
    if max_examples_per_client is None
    else rng.integers(
      examples_per_client, max_examples_per_client + 1, num_clients
    )
  )
  total = int(sizes.sum()) + num_test
  if task == 'shakespeare':
    ids = rng.integers(
      0, num_classes, (total, input_shape[0] + 1), dtype=np.int32
    )
    x, y = ids[:, :-1], ids[:, 1:]
  else:
    x = rng.standard_normal((total,) + tuple(input_shape)).astype(np.float32)
    y = rng.integers(0, num_classes, total, dtype=np.int32)
  n = total - num_test
  parts = np.split(np.arange(n), np.cumsum(sizes)[:-1])
  return from_arrays(
    f'generated_{task}',
    x[:n],
    y[:n],
    x[n:],
    y[n:],
    parts,
    cache_dir,
    num_classes=num_classes,
  )


# ---------------------------------------------------------------------------
# Natural splits.


def load_emnist(
  only_digits: bool = False, cache_dir: Optional[str] = None
) -> FederatedData:
  """EMNIST / FEMNIST by writer, through `tff.simulation.datasets.emnist`."""
  try:
    train, test = tff.simulation.datasets.emnist.load_data(
      only_digits=only_digits, cache_dir=cache_dir
    )
  except Exception as e:
    raise DataUnavailableError(
      f'Could not load EMNIST through tff.simulation.datasets ({e!r:.300});'
      ' it downloads on first use and needs a network then.'
    ) from e

  def to_xy(element):
    return collections.OrderedDict(
      x=tf.expand_dims(element['pixels'], -1),
      y=tf.cast(element['label'], tf.int32),
    )

  client_data = train.preprocess(lambda ds: ds.map(to_xy))
  test_ds = test.create_tf_dataset_from_all_clients().map(to_xy)
  test_x, test_y = _to_arrays(test_ds)
  return FederatedData(
    'emnist',
    client_data,
    test_x,
    test_y,
    10 if only_digits else 62,
    (28, 28, 1),
  )


def shakespeare_sequences(
  dataset: tf.data.Dataset, seq_length: int = 80
) -> tf.data.Dataset:
  """Shakespeare snippets -> OrderedDict(x, y) next-character id sequences.

  Uses TFF's character vocabulary (ids 4.., with 0 pad, 1 out-of-vocabulary,
  2 beginning and 3 end of snippet); each snippet is cut into sequences of
  `seq_length` + 1 ids, the last one padded with 0.
  """
  vocab = list(
    'dhlptx@DHLPTX $(,048cgkoswCGKOSW[_#\'/37;?bfjnrvzBFJNRVZ"&*.26:\n'
    'aeimquyAEIMQUY]!%)-159\r'
  )
  table = tf.lookup.StaticHashTable(
    tf.lookup.KeyValueTensorInitializer(
      vocab, tf.constant(list(range(4, len(vocab) + 4)), tf.int64)
    ),
    1,
  )

  def to_ids(element):
    ids = tf.cast(
      table.lookup(tf.strings.bytes_split(element['snippets'])), tf.int32
    )
    return tf.concat([[2], ids, [3]], 0)

  def split(chunk):
    chunk = tf.pad(chunk, [[0, seq_length + 1 - tf.shape(chunk)[0]]])
    chunk = tf.reshape(chunk, [seq_length + 1])
    return collections.OrderedDict(x=chunk[:-1], y=chunk[1:])

  return dataset.map(to_ids).unbatch().batch(seq_length + 1).map(split)


def load_shakespeare(
  cache_dir: Optional[str] = None, seq_length: int = 80
) -> FederatedData:
  """Shakespeare by speaking role, through `tff.simulation.datasets`."""
  try:
    train, test = tff.simulation.datasets.shakespeare.load_data(
      cache_dir=cache_dir
    )
  except Exception as e:
    raise DataUnavailableError(
      'Could not load Shakespeare through tff.simulation.datasets '
      f'({e!r:.300}); it downloads on first use and needs a network '
      'then.'
    ) from e
  client_data = train.preprocess(
    lambda ds: shakespeare_sequences(ds, seq_length)
  )
  test_x, test_y = _to_arrays(
    shakespeare_sequences(test.create_tf_dataset_from_all_clients(), seq_length)
  )
  from tasks import models

  return FederatedData(
    'shakespeare',
    client_data,
    test_x,
    test_y,
    models.SHAKESPEARE_VOCAB_SIZE,
    (seq_length,),
  )


def load_synthetic(
  alpha: float,
  beta: float,
  num_clients: int,
  seed: int,
  cache_dir: str,
  test_fraction: float = 0.2,
) -> FederatedData:
  """FedProx's synthetic(alpha, beta); each client holds out a test slice."""
  clients = generate_synthetic(alpha, beta, num_clients, seed=seed)
  rng = np.random.default_rng(seed)
  train, test_x, test_y = [], [], []
  for x, y in clients:
    order = rng.permutation(len(y))
    num_test = max(1, int(round(test_fraction * len(y))))
    train.append((x[order[num_test:]], y[order[num_test:]]))
    test_x.append(x[order[:num_test]])
    test_y.append(y[order[:num_test]])
  key = _cache_key(alpha=alpha, beta=beta, n=num_clients, seed=seed)
  directory = os.path.join(cache_dir, 'synthetic', key)
  files = write_client_files(directory, train)
  client_data = TFRecordClientData(
    directory, list(files), (60,), tf.float32, (), tf.int32
  )
  return FederatedData(
    'synthetic',
    client_data,
    np.concatenate(test_x),
    np.concatenate(test_y),
    10,
    (60,),
    [y for _, y in train],
  )


def _to_arrays(dataset: tf.data.Dataset):
  xs, ys = [], []
  for batch in dataset.batch(4096):
    xs.append(batch['x'].numpy())
    ys.append(batch['y'].numpy())
  return np.concatenate(xs), np.concatenate(ys)


# ---------------------------------------------------------------------------


def load_task(
  name: str,
  num_clients: int = 10,
  partition: str = 'dirichlet',
  seed: int = 0,
  data_dir: Optional[str] = None,
  cache_dir: Optional[str] = None,
  validation_fraction: float = 0.0,
  **partition_kwargs,
) -> FederatedData:
  """Loads task `name` and splits it into clients.

  Args:
    name: One of `TASK_NAMES`.
    num_clients: Clients to split into (array tasks and `synthetic`).
    partition: A `tasks.partition` scheme name (array tasks only).
    seed: Fixes the partition (and the digits / image folder test split).
    data_dir: tensorflow_datasets' data directory, or the image folder.
    cache_dir: Where client files are written; `~/.cache/tff_methods`.
    validation_fraction: If > 0 (array tasks), this seeded share of the
      training examples is held out before partitioning and takes the test
      split's place: for tuning settings without looking at the test set.
    **partition_kwargs: The scheme's parameters (`alpha`, `min_size`,
      `classes_per_client`, `shards_per_client`, `non_iid_fraction`), and
      `synthetic_alpha`, `synthetic_beta`, `image_size`.

  Raises:
    ValueError: for an unknown name or bad partition parameters.
    DataUnavailableError: when a data set can't be loaded or downloaded.
  """
  cache_dir = cache_dir or default_cache_dir()
  if not 0.0 <= validation_fraction < 1.0:
    raise ValueError(
      f'validation_fraction must be in [0, 1), got ' f'{validation_fraction!r}.'
    )
  if validation_fraction and name in NATURAL_TASKS:
    raise ValueError(
      f'validation_fraction is for tasks split from arrays, ' f'not {name!r}.'
    )
  image_size = partition_kwargs.pop('image_size', 32)
  syn_alpha = partition_kwargs.pop('synthetic_alpha', 1.0)
  syn_beta = partition_kwargs.pop('synthetic_beta', 1.0)
  if name == 'emnist':
    return load_emnist(cache_dir=data_dir)
  if name == 'shakespeare':
    return load_shakespeare(cache_dir=data_dir)
  if name == 'synthetic':
    return load_synthetic(syn_alpha, syn_beta, num_clients, seed, cache_dir)
  mean = std = None
  if name == 'digits':
    arrays = load_digits_arrays(seed)
    # Standardized as the other image tasks are (their fixed statistics;
    # these from the training split): raw [0, 1] pixels left every method
    # at chance for its first rounds.
    mean, std = (float(arrays[0].mean()),), (float(arrays[0].std()),)
  elif name in _TFDS_NAMES:
    arrays = load_tfds_arrays(name, data_dir)
    mean, std = _NORMALIZATION[name]
  elif name == 'image_folder':
    arrays = load_image_folder_arrays(data_dir, image_size, seed=seed)
  else:
    raise ValueError(f'Unknown task {name!r}; choose one of {TASK_NAMES}.')
  x_train, y_train, x_test, y_test = arrays
  if validation_fraction:
    # The held-out share of the training set replaces the test split.
    order = np.random.default_rng([seed, 7]).permutation(len(y_train))
    held = int(round(validation_fraction * len(y_train)))
    x_test, y_test = x_train[order[:held]], y_train[order[:held]]
    x_train, y_train = x_train[order[held:]], y_train[order[held:]]
  parts = partition_arrays(
    y_train, partition, num_clients, seed, **partition_kwargs
  )
  return from_arrays(
    name, x_train, y_train, x_test, y_test, parts, cache_dir, mean=mean, std=std
  )


@dataclasses.dataclass(frozen=True)
class LocalBatches:
  """What a client trains on in one round, as the reference code batches it.

  Every pass over a client's data is a fresh permutation (PyTorch's
  `DataLoader(shuffle=True)`), and batches never span two passes; the last,
  partial batch of a pass is kept unless `drop_last` (the MOON repo's
  setting). The passes of a client are numbered across rounds: round r
  trains passes r*E .. r*E+E-1 with `local_epochs` E, or, with
  `local_steps` K, the batches r*K .. r*K+K-1 of the client's endless
  stream of passes, so that consecutive rounds carry on through the data
  and every example is used within ceil(n / (K*B)) rounds. The stream's
  position is the round number, not the count of rounds the client took
  part in: under full participation this is the FedCos code's iterator
  (each client's iterator advances K batches a round); under partial
  participation a client skips the batches of the rounds it sat out. Pass
  p's order is a stateless function of (`seed`, the client id, p): reruns
  repeat it exactly, on any TFF worker.
  The round's examples are gathered in order once, so a round holds as many
  copies of the client's data as it makes passes (the local training loop
  holds the round's batches in memory anyway).

  Attributes:
    batch_size: Examples per batch, B.
    local_epochs: Passes per round (when `local_steps` is None).
    local_steps: Batches per round instead of whole passes.
    drop_last: Drop each pass's last batch when it is partial.
    seed: The experiment's seed.
    with_index: Add each example's position in the client's data as
      `index` (int64), for `reference_outputs.ReferenceOutputs`.
  """

  batch_size: int
  local_epochs: int = 1
  local_steps: Optional[int] = None
  drop_last: bool = False
  seed: int = 0
  with_index: bool = False

  def __post_init__(self):
    if self.batch_size < 1:
      raise ValueError(f'batch_size must be >= 1, got {self.batch_size}.')
    if self.local_steps is not None and self.local_steps < 1:
      raise ValueError(f'local_steps must be >= 1, got {self.local_steps}.')
    if self.local_steps is None and self.local_epochs < 1:
      raise ValueError(f'local_epochs must be >= 1, got {self.local_epochs}.')

  def element_spec(self, example_spec: Any) -> collections.OrderedDict:
    """The spec of one batch, given that of one example."""
    spec = collections.OrderedDict(
      (k, tf.TensorSpec([None] + list(s.shape), s.dtype))
      for k, s in example_spec.items()
    )
    if self.with_index:
      spec['index'] = tf.TensorSpec([None], tf.int64)
    return spec

  def __call__(
    self, dataset: tf.data.Dataset, client_id: Any = '', round_num: Any = 0
  ) -> tf.data.Dataset:
    """The batches `client_id` trains on in `round_num` (eager or graph)."""
    return self.of_examples(read_all(dataset), client_id, round_num)

  def of_examples(
    self, examples: Any, client_id: Any = '', round_num: Any = 0
  ) -> tf.data.Dataset:
    """`__call__` on a client's examples stacked (`read_all` of its data
    set): the same batches, without the data set's round trip."""
    round_examples, batch_sizes = self.round_examples(
      examples, client_id, round_num
    )

    # No tf.data function (map, flat_map, reduce) anywhere: the TFF worker
    # instantiates a data set's functions on every call, about 4 ms each,
    # which dominated a small client's round.
    def batch():
      # Every batch full but the last (one pass, or no partial batches):
      # `batch` cuts them. An iterator over `rebatch` costs about 2 ms more,
      # whatever the data's size.
      return tf.data.Dataset.from_tensor_slices(round_examples).batch(
        self.batch_size
      )

    def rebatch():
      # A partial batch at each pass's end: `rebatch` cuts the round's
      # examples into the planned sizes; `take` stops it before it looks for
      # a batch that is not there (it would wait forever). The extra size is
      # never reached: `rebatch` cannot take an empty list of sizes.
      sizes = tf.concat([batch_sizes, [self.batch_size]], 0)
      return (
        tf.data.Dataset.from_tensors(round_examples)
        .rebatch(sizes)
        .take(tf.size(batch_sizes, out_type=tf.int64))
      )

    only_last_partial = tf.reduce_all(
      tf.equal(batch_sizes[:-1], self.batch_size)
    )
    return tf.cond(only_last_partial, batch, rebatch).with_options(
      PLAIN_OPTIONS
    )

  def round_examples(
    self, examples: Any, client_id: Any = '', round_num: Any = 0
  ) -> tuple[Any, tf.Tensor]:
    """`of_examples`' batches as (the round's examples in training order,
    the size of each batch in turn): batch i is the next `sizes[i]`
    examples. What the training loop reads, without a data set made and
    read back (`tff_methods.batches_in_memory.SlicedBatches`)."""
    size = tf.shape(tf.nest.flatten(examples)[0], out_type=tf.int64)[0]
    positions, batch_sizes = self._round_plan(size, client_id, round_num)
    round_examples = collections.OrderedDict(
      (k, tf.gather(v, positions)) for k, v in examples.items()
    )
    if self.with_index:
      round_examples['index'] = positions
    return round_examples, batch_sizes

  def _round_plan(self, size, client_id, round_num):
    """(positions of the round's examples in order, sizes of its batches)."""
    batch = tf.constant(self.batch_size, tf.int64)
    full_batches = size // batch
    partial = tf.constant(0, tf.int64) if self.drop_last else size % batch
    # One pass: `full_batches` of B, then the partial one if it is kept.
    pass_sizes = tf.concat(
      [
        tf.fill([full_batches], batch),
        tf.fill([tf.minimum(partial, 1)], partial),
      ],
      0,
    )
    per_pass = tf.size(pass_sizes, out_type=tf.int64)
    pass_examples = full_batches * batch + partial
    round_num = tf.cast(round_num, tf.int64)
    if self.local_steps is None:
      first_pass = round_num * self.local_epochs
      num_passes = tf.constant(self.local_epochs, tf.int64)
      skip = tf.constant(0, tf.int64)
      num_batches = num_passes * per_pass
    else:
      start = round_num * self.local_steps
      first_pass = start // tf.maximum(per_pass, 1)
      skip = start % tf.maximum(per_pass, 1)
      num_passes = tf.where(
        per_pass > 0,
        -(-(skip + self.local_steps) // tf.maximum(per_pass, 1)),
        0,
      )
      num_batches = tf.minimum(
        tf.constant(self.local_steps, tf.int64), num_passes * per_pass
      )

    def add_pass(pass_num, orders):
      order = pass_order(size, self.seed, client_id, pass_num)
      return pass_num + 1, tf.concat([orders, order[:pass_examples]], 0)

    _, orders = tf.while_loop(
      lambda pass_num, _: pass_num < first_pass + num_passes,
      add_pass,
      (first_pass, tf.zeros([0], tf.int64)),
      shape_invariants=(first_pass.shape, tf.TensorShape([None])),
    )
    batch_sizes = tf.tile(pass_sizes, [num_passes])[skip : skip + num_batches]
    # Every batch before `skip` in its pass is full.
    first = skip * batch
    positions = orders[first : first + tf.reduce_sum(batch_sizes)]
    return positions, batch_sizes


def pass_order(
  size: tf.Tensor, seed: int, client_id: Any, pass_num: tf.Tensor
) -> tf.Tensor:
  """The order of a client's `size` examples in its pass `pass_num`: a
  stateless function of (seed, client id, pass), so reruns and any TFF
  worker repeat it."""
  client_seed = tf.stack(
    [
      tf.constant(seed, tf.int64),
      tf.strings.to_hash_bucket_fast(client_id, _HASH_BUCKETS),
    ]
  )
  return tf.random.experimental.stateless_shuffle(
    tf.range(size),
    tf.random.experimental.stateless_fold_in(
      client_seed, tf.cast(pass_num, tf.int64)
    ),
  )


# tf.data's default rewrites and autotuning run whenever an iterator is made,
# which for a small client's data costs more than reading it.
PLAIN_OPTIONS = tf.data.Options()
PLAIN_OPTIONS.experimental_optimization.apply_default_optimizations = False
PLAIN_OPTIONS.autotune.enabled = False


def read_all(dataset: tf.data.Dataset) -> Any:
  """Every element of `dataset`, stacked: one tensor per component."""
  return dataset.with_options(PLAIN_OPTIONS).batch(_ALL).get_single_element()


# Larger than any client's number of examples: one batch holds them all.
_ALL = 2**31 - 1
_HASH_BUCKETS = 2**62


def round_dataset_computation(
  client_data: tff.simulation.datasets.ClientData, batches: LocalBatches
) -> tff.Computation:
  """Client and round -> that client's batches of that round, in TFF.

  The TFF worker reads the client's examples by its id
  (`ClientData.serializable_dataset_fn`, or `TFRecordClientData.
  serializable_examples_fn`'s tensors) and batches them as `batches` says:
  nothing but the `client_keys.CLIENT_KEY_TYPE` key is shipped.

  With `LocalBatches`, the computation also has `round_examples_fn`: the
  key -> the same batches as `LocalBatches.round_examples` gives them (the
  round's examples in order, the batches' sizes), which the project's
  client computations read in place of the data set
  (`tff_methods.client_data.ClientBatches`).
  """

  # A client's examples as tensors where the client data has them that way
  # (`TFRecordClientData`): a data set of them, read back whole by
  # `LocalBatches`, cost the worker about 0.1 ms a client and round.
  examples_fn = getattr(client_data, 'serializable_examples_fn', None)
  local_batches = isinstance(batches, LocalBatches)

  def examples_of(client_id):
    if examples_fn is not None:
      return examples_fn(client_id)
    return read_all(client_data.serializable_dataset_fn(client_id))

  @tff.tensorflow.computation(client_keys.CLIENT_KEY_TYPE)
  def dataset_for_client_round(key):
    client_id, round_num = client_keys.split_client_key(key)
    if local_batches:
      return batches.of_examples(examples_of(client_id), client_id, round_num)
    return batches(
      client_data.serializable_dataset_fn(client_id), client_id, round_num
    )

  if local_batches:

    def round_examples_fn(key):
      client_id, round_num = client_keys.split_client_key(key)
      return batches.round_examples(
        examples_of(client_id), client_id, round_num
      )

    dataset_for_client_round.round_examples_fn = round_examples_fn
  return dataset_for_client_round


# The round's cohort and TFF's program data source of `[client id, round]`
# keys live in the library (`tff_methods.client_keys`).
sample_clients = client_keys.sample_clients
ClientRoundDataSource = client_keys.ClientRoundDataSource
ClientRoundIterator = client_keys.ClientRoundIterator
