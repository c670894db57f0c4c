"""Tests for tff_methods_tasks.array_sources: the centralized data sets split
over clients (generated, image folders)."""

import os
import sys

import numpy as np
import pytest
import tensorflow as tf

from tff_methods_tasks import array_sources
from tff_methods_tasks import datasets


def test_synthetic_clients_differ_and_label_from_their_own_model(tmp_path):
  data = datasets.load_task(
    'synthetic',
    num_clients=4,
    seed=1,
    cache_dir=str(tmp_path),
    synthetic_alpha=1.0,
    synthetic_beta=1.0,
  )
  assert data.input_shape == (60,)
  assert len(data.client_data.client_ids) == 4
  counts = data.class_counts()
  # Heterogeneous: the clients' label distributions are not all the same.
  shares = counts / counts.sum(1, keepdims=True)
  assert np.abs(shares - shares.mean(0)).max() > 0.1


def test_image_folder_reads_class_directories(tmp_path):
  rng = np.random.default_rng(0)
  for cls in ('cat', 'dog'):
    os.makedirs(tmp_path / 'images' / cls)
    for i in range(6):
      pixels = rng.integers(0, 255, (12, 10, 3), dtype=np.uint8)
      tf.io.write_file(
        str(tmp_path / 'images' / cls / f'{i}.png'), tf.io.encode_png(pixels)
      )
  data = datasets.load_task(
    'image_folder',
    num_clients=2,
    partition='iid',
    data_dir=str(tmp_path / 'images'),
    image_size=8,
    cache_dir=str(tmp_path / 'cache'),
  )
  assert data.input_shape == (8, 8, 3)
  assert data.num_classes == 2
  assert sum(len(y) for y in data.train_labels) + len(data.test_y) == 12


def _write_png(path):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  tf.io.write_file(str(path), tf.io.encode_png(np.zeros((4, 4, 3), np.uint8)))


def test_image_folder_layouts_it_cannot_read_are_named(tmp_path):
  # A folder inside a class folder: named, not a traceback.
  _write_png(tmp_path / 'a' / 'cat' / '0.png')
  _write_png(tmp_path / 'a' / 'cat' / 'more' / '1.png')
  with pytest.raises(ValueError, match=r'cat/more is a folder inside'):
    array_sources.load_image_folder_arrays(str(tmp_path / 'a'), 8)
  # A test class the training data lacks: named, not silently dropped.
  for split, cls in (('train', 'cat'), ('test', 'cat'), ('test', 'owl')):
    _write_png(tmp_path / 'b' / split / cls / '0.png')
  with pytest.raises(ValueError, match=r'holds classes owl that'):
    array_sources.load_image_folder_arrays(str(tmp_path / 'b'), 8)


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
