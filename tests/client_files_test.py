"""Tests for tff_methods_tasks.client_files: each client's examples in files of
its own, read back in order as TFF client data."""

import os
import shutil
import sys

import numpy as np
import pytest
import tensorflow as tf

from tff_methods_tasks import client_files
from tff_methods_tasks import datasets


def _written_clients(tmp_path, x_shape, y_shape, mean=None, std=None):
  rng = np.random.default_rng(3)
  x = rng.standard_normal((30,) + x_shape).astype(np.float32)
  y = rng.integers(0, 7, (30,) + y_shape).astype(np.int32)
  parts = [np.array([4, 0, 17, 9]), np.arange(10, 30), np.array([3])]
  data = datasets.from_arrays(
    'written',
    x,
    y,
    x[:2],
    y[:2],
    parts,
    str(tmp_path),
    num_classes=7,
    mean=mean,
    std=std,
  )
  if mean is not None:
    x = (x - np.float32(mean)) / np.float32(std)
  return data, [(x[p], y[p]) for p in parts]


def _arrays(dataset):
  elements = list(dataset)
  return (
    np.stack([e['x'].numpy() for e in elements]),
    np.stack([e['y'].numpy() for e in elements]),
  )


@pytest.mark.parametrize(
  'x_shape,y_shape,mean,std',
  [
    ((4, 4, 2), (), (0.5, -1.0), (2.0, 0.25)),  # images, normalized
    ((6,), (6,), None, None),  # sequences of labels
  ],
)
def test_client_files_hold_each_clients_examples_in_order(
  tmp_path, x_shape, y_shape, mean, std
):
  data, expected = _written_clients(tmp_path, x_shape, y_shape, mean, std)
  client_data = data.client_data
  for cid, (x, y) in zip(client_data.client_ids, expected):
    for dataset in (
      client_data.create_tf_dataset_for_client(cid),
      client_data.serializable_dataset_fn(tf.constant(cid)),
    ):
      got_x, got_y = _arrays(dataset)
      np.testing.assert_array_equal(got_x, x)
      np.testing.assert_array_equal(got_y, y)


def test_a_clients_examples_are_its_data_sets_stacked(tmp_path):
  data, expected = _written_clients(
    tmp_path, (4, 4, 2), (), (0.5, -1.0), (2.0, 0.25)
  )
  client_data = data.client_data
  for cid, (x, y) in zip(client_data.client_ids, expected):
    examples = client_data.serializable_examples_fn(tf.constant(cid))
    np.testing.assert_array_equal(examples['x'].numpy(), x)
    np.testing.assert_array_equal(examples['y'].numpy(), y)


def test_a_clients_dataset_has_no_tf_data_function(tmp_path):
  # The TFF worker instantiates a data set's functions on every call: a
  # client's file is read and parsed whole, with none.
  data, _ = _written_clients(tmp_path, (3,), ())
  dataset = data.client_data.serializable_dataset_fn(
    tf.constant(data.client_data.client_ids[1])
  )
  graph = tf.compat.v1.GraphDef.FromString(
    dataset._as_serialized_graph().numpy()
  )
  assert not graph.library.function
  assert not any('Map' in node.op for node in graph.node)


def test_a_cache_another_run_wrote_meanwhile_is_used(tmp_path, monkeypatch):
  # Two runs of a comparison (--jobs=2) write the same clients' files: the
  # second rename finds the directory in place (ENOTEMPTY) and uses it.
  directory = str(tmp_path / 'cache' / 'key')
  clients = [(np.arange(6, dtype=np.float32).reshape(2, 3), np.array([1, 2]))]
  rename = os.rename

  def other_run_first(source, destination):
    shutil.copytree(source, destination)
    rename(source, destination)

  monkeypatch.setattr(os, 'rename', other_run_first)
  paths = client_files.write_client_files(directory, clients)
  assert os.path.isfile(paths['client_00000'])
  assert os.listdir(tmp_path / 'cache') == ['key']  # no .writing_ left


def test_records_are_cut_as_tensorflows_reader_reads_them(tmp_path):
  data, _ = _written_clients(tmp_path, (4, 4, 2), ())
  client_data = data.client_data
  record_bytes = client_data._record_bytes  # pylint: disable=protected-access
  for cid in client_data.client_ids:
    path = client_data.path(cid)
    # As bytes (numpy's byte strings would drop trailing zeros).
    assert client_files.read_records(path, record_bytes).numpy().tolist() == [
      r.numpy() for r in tf.data.TFRecordDataset(path)
    ]
  empty = str(tmp_path / 'empty.tfrecord')
  open(empty, 'wb').close()
  assert client_files.read_records(empty, record_bytes).shape == (0,)


def test_a_file_not_of_equal_records_fails_naming_it(tmp_path):
  data, _ = _written_clients(tmp_path, (4, 4, 2), ())
  client_data = data.client_data
  path = client_data.path(client_data.client_ids[1])
  record_bytes = client_data._record_bytes  # pylint: disable=protected-access
  with open(path, 'rb') as f:
    whole = f.read()
  truncated = str(tmp_path / 'truncated.tfrecord')
  with open(truncated, 'wb') as f:
    f.write(whole[:-1])
  other = str(tmp_path / 'other.tfrecord')
  with tf.io.TFRecordWriter(other) as writer:
    writer.write(b'x' * (record_bytes - 16))
    writer.write(b'x' * (record_bytes + 16))  # The same size in all.
  for bad in (truncated, other):
    with pytest.raises(tf.errors.InvalidArgumentError, match=bad):
      client_files.read_records(bad, record_bytes)


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
