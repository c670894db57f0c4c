"""Centralized data sets as arrays `(x_train, y_train, x_test, y_test)`, for
`tff_methods_tasks.datasets` to split over clients: scikit-learn's digits
(embedded, offline), tensorflow_datasets' images, image folders, and the FedProx
synthetic(alpha, beta) set generated in code. Images are float32 in [0, 1]
before normalization.
"""

import os
import socket
from typing import Optional

import numpy as np
import tensorflow as tf

from tff_methods_tasks import idx_files

_TFDS_NAMES = {
  'cifar10': 'cifar10',
  'cifar100': 'cifar100',
  'fmnist': 'fashion_mnist',
  'mnist': 'mnist',
}
# Where tensorflow_datasets downloads these data sets from.
_TFDS_DOWNLOAD_HOST = 'storage.googleapis.com'


# Per-channel mean and std after scaling to [0, 1].
class DataUnavailableError(RuntimeError):
  """A data set could not be loaded (e.g. no network to download it)."""


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


# Where `make data-fmnist` unpacks Fashion-MNIST: the repository's data/.
REPOSITORY_FASHION_MNIST = os.path.join(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
  'data',
  'fashion-mnist',
)


def load_fmnist_arrays(data_dir: Optional[str] = None):
  """Fashion-MNIST (60,000 + 10,000 28x28 images, 10 classes).

  From its idx files where a copy is found (`idx_files.search_path`:
  `data_dir`, the repository's `data/fashion-mnist` that `make
  data-fmnist` fills, Debian's `dataset-fashion-mnist`), else through
  tensorflow_datasets, which downloads it.

  Raises:
    DataUnavailableError: no copy, and no download; naming every place
      looked and the command that fixes it.
    ValueError: a copy whose files are damaged, naming the file.
  """
  places = idx_files.search_path(data_dir, REPOSITORY_FASHION_MNIST)
  for directory in places:
    if idx_files.has_files(directory):
      return idx_files.load_arrays(directory)
  try:
    return load_tfds_arrays('fmnist', data_dir)
  except DataUnavailableError as e:
    raise DataUnavailableError(
      "Fashion-MNIST's idx files (train-images-idx3-ubyte.gz and its three "
      f'siblings) are in none of {", ".join(places)}, and '
      f'tensorflow_datasets could not download it ({e.__cause__!r:.120}). '
      'Run `make data-fmnist` (Debian\'s dataset-fashion-mnist, no root '
      'needed), or put the four files in --data_dir.'
    ) from e


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
