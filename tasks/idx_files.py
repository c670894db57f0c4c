"""MNIST-style idx files: Fashion-MNIST without a network.

The idx format (LeCun's MNIST files, which Fashion-MNIST keeps): a 4-byte
magic number `0x0000 TT DD` (TT the element type, 0x08 for unsigned bytes;
DD the number of dimensions), DD big-endian 4-byte sizes, then the elements
in row-major order. Files may be gzip-compressed (`.gz`), as Zalando and
Debian's `dataset-fashion-mnist` ship them.

Fashion-MNIST: Xiao, Rasul and Vollgraf, "Fashion-MNIST: a Novel Image
Dataset for Benchmarking Machine Learning Algorithms", arXiv:1708.07747
(https://arxiv.org/abs/1708.07747); MIT licence, Zalando SE.
"""

import gzip
import os
from typing import Optional, Sequence

import numpy as np

_UNSIGNED_BYTE = 0x08

# The four files of an MNIST-style data set, by split and part.
FILES = {
  ('train', 'images'): 'train-images-idx3-ubyte',
  ('train', 'labels'): 'train-labels-idx1-ubyte',
  ('test', 'images'): 't10k-images-idx3-ubyte',
  ('test', 'labels'): 't10k-labels-idx1-ubyte',
}

# Where Debian's `dataset-fashion-mnist` puts them.
DEBIAN_FASHION_MNIST = '/usr/share/datasets/fashion-mnist'


def read_idx(path: str) -> np.ndarray:
  """The unsigned-byte array an idx file (gzipped or not) holds.

  Raises:
    ValueError: naming `path`, for a file that is not an unsigned-byte idx
      file or whose size is not what its header says (truncated).
  """
  opener = gzip.open if path.endswith('.gz') else open
  try:
    with opener(path, 'rb') as f:
      data = f.read()
  except (OSError, EOFError) as e:
    raise ValueError(f'{path} can not be read as an idx file: {e}') from None
  if len(data) < 4 or data[:2] != b'\0\0' or data[2] != _UNSIGNED_BYTE:
    raise ValueError(
      f'{path} is not an idx file of unsigned bytes (magic number '
      f'{data[:4].hex() or "missing"}, expected 000008xx).'
    )
  num_dims = data[3]
  header = 4 + 4 * num_dims
  if len(data) < header:
    raise ValueError(f'{path} is truncated inside its header.')
  shape = tuple(
    int.from_bytes(data[4 + 4 * i : 8 + 4 * i], 'big') for i in range(num_dims)
  )
  expected = header + int(np.prod(shape, dtype=np.int64))
  if len(data) != expected:
    sizes = ' x '.join(map(str, shape))
    raise ValueError(
      f'{path} holds {len(data)} bytes; its header ({sizes} elements) says '
      f'{expected}: a truncated or damaged download.'
    )
  return np.frombuffer(data, np.uint8, offset=header).reshape(shape)


def find(directory: str, name: str) -> Optional[str]:
  """`directory/name.gz` or `directory/name`, whichever exists."""
  for candidate in (f'{name}.gz', name):
    path = os.path.join(directory, candidate)
    if os.path.isfile(path):
      return path
  return None


def has_files(directory: str) -> bool:
  """Whether `directory` holds all four files."""
  return all(find(directory, name) for name in FILES.values())


def load_arrays(directory: str, num_classes: int = 10):
  """`(x_train, y_train, x_test, y_test)` from the four idx files in
  `directory`: images float32 in [0, 1] with a channel axis, labels int32.

  Raises:
    ValueError: naming the file that is missing, damaged, or whose images
      and labels disagree in number or whose labels are out of range.
  """
  arrays = {}
  for (split, part), name in FILES.items():
    path = find(directory, name)
    if path is None:
      raise ValueError(f'{os.path.join(directory, name)}(.gz) is missing.')
    arrays[split, part] = (read_idx(path), path)
  out = []
  for split in ('train', 'test'):
    (images, images_path), (labels, labels_path) = (
      arrays[split, 'images'],
      arrays[split, 'labels'],
    )
    if images.ndim != 3 or labels.ndim != 1:
      raise ValueError(
        f'{images_path} and {labels_path} must hold images (N x H x W) and '
        f'labels (N), not shapes {images.shape} and {labels.shape}.'
      )
    if len(images) != len(labels):
      raise ValueError(
        f'{images_path} holds {len(images)} images but {labels_path} '
        f'{len(labels)} labels.'
      )
    if labels.size and labels.max() >= num_classes:
      raise ValueError(
        f'{labels_path} holds label {labels.max()}, outside 0-'
        f'{num_classes - 1}.'
      )
    out += [
      (images.astype(np.float32) / 255.0)[..., None],
      labels.astype(np.int32),
    ]
  return tuple(out)


def write_idx(path: str, array: np.ndarray) -> None:
  """Writes an unsigned-byte array as an idx file (gzipped for `.gz`), for
  tests and for data made elsewhere."""
  array = np.asarray(array, np.uint8)
  header = bytes([0, 0, _UNSIGNED_BYTE, array.ndim]) + b''.join(
    int(n).to_bytes(4, 'big') for n in array.shape
  )
  opener = gzip.open if path.endswith('.gz') else open
  with opener(path, 'wb') as f:
    f.write(header + array.tobytes())


def search_path(data_dir: Optional[str], repository_data: str) -> Sequence[str]:
  """Where Fashion-MNIST's files are looked for, in order: `data_dir`, the
  repository's data directory (`make data-fmnist`), Debian's."""
  return [d for d in (data_dir, repository_data, DEBIAN_FASHION_MNIST) if d]
