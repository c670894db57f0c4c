"""Tests for tff_methods_tasks.idx_files and Fashion-MNIST's offline
loading (tff_methods_tasks.array_sources.load_fmnist_arrays)."""

import gzip
import os
import sys

import numpy as np
import pytest

from tff_methods_tasks import array_sources
from tff_methods_tasks import idx_files


def _write_set(directory, num_train=6, num_test=4, gz=True):
  rng = np.random.default_rng(0)
  os.makedirs(directory, exist_ok=True)
  suffix = '.gz' if gz else ''
  parts = {
    ('train', 'images'): rng.integers(0, 256, (num_train, 5, 3)),
    ('train', 'labels'): np.arange(num_train) % 10,
    ('test', 'images'): rng.integers(0, 256, (num_test, 5, 3)),
    ('test', 'labels'): (np.arange(num_test) + 3) % 10,
  }
  for key, array in parts.items():
    idx_files.write_idx(
      os.path.join(directory, idx_files.FILES[key] + suffix), array
    )
  return parts


@pytest.mark.parametrize('gz', [True, False])
def test_the_idx_files_read_back_as_written(tmp_path, gz):
  parts = _write_set(str(tmp_path), gz=gz)
  x_train, y_train, x_test, y_test = idx_files.load_arrays(str(tmp_path))
  assert x_train.shape == (6, 5, 3, 1) and x_train.dtype == np.float32
  np.testing.assert_array_equal(
    x_train[..., 0] * 255.0, parts['train', 'images']
  )
  assert 0.0 <= x_test.min() and x_test.max() <= 1.0
  assert y_train.dtype == np.int32
  np.testing.assert_array_equal(y_train, parts['train', 'labels'])
  np.testing.assert_array_equal(y_test, [3, 4, 5, 6])


def test_the_header_is_read_big_endian_by_hand(tmp_path):
  # Magic 0x00000801 (unsigned bytes, one dimension), size 3, then 3 bytes.
  path = str(tmp_path / 'labels')
  with open(path, 'wb') as f:
    f.write(bytes([0, 0, 8, 1, 0, 0, 0, 3, 7, 8, 9]))
  np.testing.assert_array_equal(idx_files.read_idx(path), [7, 8, 9])


def test_a_truncated_or_foreign_file_is_refused_naming_it(tmp_path):
  _write_set(str(tmp_path))
  path = os.path.join(str(tmp_path), 'train-images-idx3-ubyte.gz')
  with gzip.open(path, 'rb') as f:
    data = f.read()
  with gzip.open(path, 'wb') as f:
    f.write(data[:-5])
  with pytest.raises(ValueError, match=f'{path} holds .* truncated'):
    idx_files.load_arrays(str(tmp_path))
  with gzip.open(path, 'wb') as f:
    f.write(b'PK\x03\x04 not an idx file')
  with pytest.raises(ValueError, match=f'{path} is not an idx file'):
    idx_files.load_arrays(str(tmp_path))


def test_labels_out_of_range_or_miscounted_are_refused(tmp_path):
  parts = _write_set(str(tmp_path))
  labels = os.path.join(str(tmp_path), 'train-labels-idx1-ubyte.gz')
  idx_files.write_idx(labels, np.full(6, 12))
  with pytest.raises(ValueError, match='label 12, outside 0-9'):
    idx_files.load_arrays(str(tmp_path))
  idx_files.write_idx(labels, parts['train', 'labels'][:5])
  with pytest.raises(ValueError, match='6 images but .* 5 labels'):
    idx_files.load_arrays(str(tmp_path))


def test_fmnist_is_read_from_data_dir_first(tmp_path, monkeypatch):
  _write_set(str(tmp_path / 'mine'))
  monkeypatch.setattr(
    array_sources, 'load_tfds_arrays', lambda *a: pytest.fail('downloaded')
  )
  x_train, *_ = array_sources.load_fmnist_arrays(str(tmp_path / 'mine'))
  assert x_train.shape == (6, 5, 3, 1)


def test_no_copy_and_no_download_names_every_place_and_the_fix(
  tmp_path, monkeypatch
):
  def no_network(name, data_dir):
    try:
      raise OSError('storage.googleapis.com is unreachable')
    except OSError as e:
      raise array_sources.DataUnavailableError('no network') from e

  monkeypatch.setattr(array_sources, 'load_tfds_arrays', no_network)
  monkeypatch.setattr(
    array_sources, 'REPOSITORY_FASHION_MNIST', str(tmp_path / 'repo')
  )
  monkeypatch.setattr(
    idx_files, 'DEBIAN_FASHION_MNIST', str(tmp_path / 'debian')
  )
  with pytest.raises(array_sources.DataUnavailableError) as refused:
    array_sources.load_fmnist_arrays(str(tmp_path / 'given'))
  message = str(refused.value)
  for place in ('given', 'repo', 'debian'):
    assert str(tmp_path / place) in message
  assert 'make data-fmnist' in message and 'unreachable' in message


_REAL = [
  d
  for d in (
    array_sources.REPOSITORY_FASHION_MNIST,
    idx_files.DEBIAN_FASHION_MNIST,
  )
  if idx_files.has_files(d)
]


@pytest.mark.skipif(
  not _REAL, reason='Fashion-MNIST not here: make data-fmnist'
)
def test_the_real_fashion_mnist_has_its_published_shapes_and_classes():
  x_train, y_train, x_test, y_test = idx_files.load_arrays(_REAL[0])
  assert x_train.shape == (60000, 28, 28, 1) and x_test.shape == (
    10000,
    28,
    28,
    1,
  )
  assert np.bincount(y_train).tolist() == [6000] * 10
  assert np.bincount(y_test).tolist() == [1000] * 10


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
