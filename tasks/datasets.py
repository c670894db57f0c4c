"""Federated data sets as `tff.simulation.datasets.ClientData`.

A `FederatedData` holds the clients' training data as a `ClientData` and a
central test split as arrays. Two kinds of source:

- Centralized arrays split by a partitioner (`tff_methods_tasks.partition`):
  scikit- learn's digits (embedded, offline), CIFAR-10/100, Fashion-MNIST and
  MNIST through tensorflow_datasets, the FedProx synthetic(alpha, beta) set
  generated in code, and image folders. Each client's examples are written once
  to a TFRecord file under a cache directory keyed by the data set, partition
  and seed, and served by `TFRecordClientData` (a TFF `FilePerUserClientData`).
  The TFF worker then reads a client's data by its
  id (the `dataset_computation` of the `ClientData`): no arrays are shipped
  into computations, and data sets of any size work.
- Natural splits from `tff.simulation.datasets`: EMNIST/FEMNIST and
  Shakespeare.

Every element is an `OrderedDict(x=..., y=...)`. `LocalBatches` says what a
client trains on in a round (fresh permutations per pass, as the reference
code's data loaders); `round_dataset_computation` serves it to the TFF
worker by (client id, round).

The parts live by job: the centralized sources in
`tff_methods_tasks.array_sources`,
the clients' files in `tff_methods_tasks.client_files`, a round's batches in
`tff_methods_tasks.local_batches`; this module loads a task by name and keeps
the names callers use.
"""

import collections
import os
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_methods.clients import client_keys
from tff_methods_tasks import array_sources
from tff_methods_tasks import client_files
from tff_methods_tasks import local_batches

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

_NORMALIZATION = {
  'cifar10': ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
  'cifar100': ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
  'fmnist': ((0.2860,), (0.3530,)),
  'mnist': ((0.1307,), (0.3081,)),
}


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
) -> client_files.FederatedData:
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
  return client_files.from_arrays(
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
) -> client_files.FederatedData:
  """EMNIST / FEMNIST by writer, through `tff.simulation.datasets.emnist`."""
  try:
    train, test = tff.simulation.datasets.emnist.load_data(
      only_digits=only_digits, cache_dir=cache_dir
    )
  except Exception as e:
    raise array_sources.DataUnavailableError(
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
  return client_files.FederatedData(
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
) -> client_files.FederatedData:
  """Shakespeare by speaking role, through `tff.simulation.datasets`."""
  try:
    train, test = tff.simulation.datasets.shakespeare.load_data(
      cache_dir=cache_dir
    )
  except Exception as e:
    raise array_sources.DataUnavailableError(
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
  from tff_methods_tasks import models

  return client_files.FederatedData(
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
) -> client_files.FederatedData:
  """FedProx's synthetic(alpha, beta); each client holds out a test slice."""
  clients = array_sources.generate_synthetic(
    alpha, beta, num_clients, seed=seed
  )
  rng = np.random.default_rng(seed)
  train, test_x, test_y = [], [], []
  for x, y in clients:
    order = rng.permutation(len(y))
    num_test = max(1, int(round(test_fraction * len(y))))
    train.append((x[order[num_test:]], y[order[num_test:]]))
    test_x.append(x[order[:num_test]])
    test_y.append(y[order[:num_test]])
  key = client_files.cache_key(alpha=alpha, beta=beta, n=num_clients, seed=seed)
  directory = os.path.join(cache_dir, 'synthetic', key)
  files = client_files.write_client_files(directory, train)
  client_data = client_files.TFRecordClientData(
    directory, list(files), (60,), tf.float32, (), tf.int32
  )
  return client_files.FederatedData(
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
) -> client_files.FederatedData:
  """Loads task `name` and splits it into clients.

  Args:
    name: One of `TASK_NAMES`.
    num_clients: Clients to split into (array tasks and `synthetic`).
    partition: A `tff_methods_tasks.partition` scheme name (array tasks only).
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
  cache_dir = cache_dir or client_files.default_cache_dir()
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
    arrays = array_sources.load_digits_arrays(seed)
    # Standardized as the other image tasks are (their fixed statistics;
    # these from the training split): raw [0, 1] pixels left every method
    # at chance for its first rounds.
    mean, std = (float(arrays[0].mean()),), (float(arrays[0].std()),)
  elif name == 'fmnist':
    arrays = array_sources.load_fmnist_arrays(data_dir)
    mean, std = _NORMALIZATION[name]
  elif name in array_sources._TFDS_NAMES:
    arrays = array_sources.load_tfds_arrays(name, data_dir)
    mean, std = _NORMALIZATION[name]
  elif name == 'image_folder':
    arrays = array_sources.load_image_folder_arrays(
      data_dir, image_size, seed=seed
    )
  else:
    raise ValueError(f'Unknown task {name!r}; choose one of {TASK_NAMES}.')
  x_train, y_train, x_test, y_test = arrays
  if validation_fraction:
    # The held-out share of the training set replaces the test split.
    order = np.random.default_rng([seed, 7]).permutation(len(y_train))
    held = int(round(validation_fraction * len(y_train)))
    x_test, y_test = x_train[order[:held]], y_train[order[:held]]
    x_train, y_train = x_train[order[held:]], y_train[order[held:]]
  parts = client_files.partition_arrays(
    y_train, partition, num_clients, seed, **partition_kwargs
  )
  return client_files.from_arrays(
    name, x_train, y_train, x_test, y_test, parts, cache_dir, mean=mean, std=std
  )


# What a client trains on in a round (`tff_methods_tasks.local_batches`), by the
# names callers use.
LocalBatches = local_batches.LocalBatches
pass_order = local_batches.pass_order
read_all = local_batches.read_all
round_dataset_computation = local_batches.round_dataset_computation

# Clients' files (`tff_methods_tasks.client_files`), by the names callers use.
FederatedData = client_files.FederatedData
TFRecordClientData = client_files.TFRecordClientData
from_arrays = client_files.from_arrays
DataUnavailableError = array_sources.DataUnavailableError


# The round's cohort and TFF's program data source of `[client id, round]`
# keys live in the library (`tff_methods.clients.client_keys`).
sample_clients = client_keys.sample_clients
ClientRoundDataSource = client_keys.ClientRoundDataSource
ClientRoundIterator = client_keys.ClientRoundIterator
