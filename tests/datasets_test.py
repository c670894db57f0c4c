"""Tests for tff_methods_tasks.datasets and tff_methods_tasks.report."""

import collections
import sys

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_methods.clients import batches_in_memory
from tff_methods.clients import client_data as client_data_lib
from tff_methods.clients import client_keys
from tff_methods_tasks import datasets
from tff_methods_tasks import report


@pytest.fixture(scope='module')
def digits(tmp_path_factory):
  return datasets.load_task(
    'digits',
    num_clients=5,
    partition='dirichlet',
    alpha=0.5,
    seed=0,
    cache_dir=str(tmp_path_factory.mktemp('cache')),
  )


def test_digits_clients_hold_exactly_their_partition(digits):
  assert digits.input_shape == (8, 8, 1)
  assert digits.num_classes == 10
  client_data = digits.client_data
  assert len(client_data.client_ids) == 5
  total = 0
  for cid, labels in zip(client_data.client_ids, digits.train_labels):
    ys = [int(e['y']) for e in client_data.create_tf_dataset_for_client(cid)]
    assert ys == list(labels)
    total += len(ys)
  # 1797 digits, 20% held out centrally.
  assert total + len(digits.test_y) == 1797
  assert digits.test_x.shape == (359, 8, 8, 1)
  # Standardized with the training split's statistics.
  train_x = np.concatenate(
    [
      np.stack(
        [
          e['x'].numpy()
          for e in digits.client_data.create_tf_dataset_for_client(c)
        ]
      )
      for c in digits.client_data.client_ids
    ]
  )
  assert abs(train_x.mean()) < 1e-3 and abs(train_x.std() - 1.0) < 1e-3
  assert abs(digits.test_x.mean()) < 0.1


@pytest.mark.usefixtures('tff_worker')
def test_client_data_is_served_by_a_dataset_computation(digits):
  # What the TFF worker runs: client id in, dataset out.
  computation = digits.client_data.dataset_computation
  ds = computation(digits.client_data.client_ids[1])
  assert sum(1 for _ in ds) == len(digits.train_labels[1])


def test_same_seed_same_cache_files(digits, tmp_path):
  again = datasets.load_task(
    'digits',
    num_clients=5,
    partition='dirichlet',
    alpha=0.5,
    seed=0,
    cache_dir=str(tmp_path),
  )
  assert all(
    np.array_equal(a, b)
    for a, b in zip(digits.train_labels, again.train_labels)
  )


@pytest.mark.usefixtures('tff_worker')
def test_dataset_computation_takes_a_client_and_a_round(digits):
  batches = datasets.LocalBatches(8, local_epochs=1, with_index=True)
  computation = datasets.round_dataset_computation(digits.client_data, batches)
  client = digits.client_data.client_ids[1]
  rounds = [
    [
      b['index'].numpy().tolist()
      for b in computation(client_keys.client_key(client, r))
    ]
    for r in (1, 2)
  ]
  assert rounds[0] != rounds[1]
  assert sorted(sum(rounds[0], [])) == list(range(len(digits.train_labels[1])))
  # The TFF worker's batches are the ones computed here in Python from the
  # client's data set (the computation reads its examples as tensors).
  eager = list(
    batches(digits.client_data.create_tf_dataset_for_client(client), client, 1)
  )
  assert [b['index'].numpy().tolist() for b in eager] == rounds[0]
  key_of_round_1 = client_keys.client_key(client, 1)
  worker = list(computation(key_of_round_1))
  assert len(worker) == len(eager)
  for got, want in zip(worker, eager):
    np.testing.assert_array_equal(got['y'].numpy(), want['y'].numpy())
    # The worker's graph is optimized (TFF's compiler): the normalized
    # pixels may round differently in the last bit.
    np.testing.assert_allclose(got['x'].numpy(), want['x'].numpy(), rtol=1e-6)

  # Exactly the batches of the client's data set read back whole, as TFF's
  # `ClientData` gives it, in the worker too.
  @tff.tensorflow.computation(client_keys.CLIENT_KEY_TYPE)
  def through_the_data_set(key):
    client_id, round_num = client_keys.split_client_key(key)
    return batches(
      digits.client_data.serializable_dataset_fn(client_id),
      client_id,
      round_num,
    )

  for got, want in zip(worker, through_the_data_set(key_of_round_1)):
    for key in ('x', 'y', 'index'):
      np.testing.assert_array_equal(got[key].numpy(), want[key].numpy())

  # The computation's in-memory batches (what the project's client
  # computations train on), in the worker: the same batches, each
  # summarized as [its size, the sum of its indices, the sum of its labels].
  round_examples = getattr(computation, client_data_lib.ROUND_EXAMPLES_FN)

  def summary(batch):
    return tf.stack(
      [
        tf.size(batch['y'], out_type=tf.int64),
        tf.reduce_sum(batch['index']),
        tf.reduce_sum(tf.cast(batch['y'], tf.int64)),
      ]
    )

  @tff.tensorflow.computation(client_keys.CLIENT_KEY_TYPE)
  def sliced_summaries(key):
    sliced = batches_in_memory.SlicedBatches(*round_examples(key))
    return tf.map_fn(
      lambda i: summary(sliced.batch(i)),
      tf.range(sliced.kept),
      fn_output_signature=tf.int64,
    )

  assert sliced_summaries(key_of_round_1).tolist() == [
    summary(b).numpy().tolist() for b in worker
  ]


def test_shakespeare_snippets_become_next_character_sequences():
  snippets = tf.data.Dataset.from_tensor_slices(
    collections.OrderedDict(snippets=['abc'])
  )
  (element,) = list(datasets.shakespeare_sequences(snippets, seq_length=6))
  x, y = element['x'].numpy(), element['y'].numpy()
  # <bos> a b c <eos> then padding; y is x shifted by one.
  assert x[0] == 2 and list(x[4:]) == [3, 0]
  np.testing.assert_array_equal(x[1:], y[:-1])
  assert len(set(x[1:4])) == 3 and min(x[1:4]) >= 4


def test_unknown_task_is_named():
  with pytest.raises(ValueError, match="Unknown task 'svhn'"):
    datasets.load_task('svhn')


@pytest.mark.parametrize('name', ['cifar10', 'cifar100', 'fmnist', 'mnist'])
def test_tfds_tasks_load_when_the_data_can_be_had(name, tmp_path):
  try:
    data = datasets.load_task(
      name, num_clients=10, partition='iid', cache_dir=str(tmp_path)
    )
  except datasets.DataUnavailableError as e:
    pytest.skip(f'{name} cannot be downloaded here (no network): {e}')
  assert data.num_classes == (100 if name == 'cifar100' else 10)
  assert len(data.client_data.client_ids) == 10


@pytest.mark.parametrize('name', ['emnist', 'shakespeare'])
def test_natural_split_tasks_load_when_the_data_can_be_had(name):
  try:
    data = datasets.load_task(name)
  except datasets.DataUnavailableError as e:
    pytest.skip(f'{name} cannot be downloaded here (no network): {e}')
  assert len(data.client_data.client_ids) > 100


def test_partition_report_text_and_heatmap(tmp_path):
  counts = np.array([[3, 0], [1, 5]])
  text = report.partition_table(counts)
  assert text.splitlines()[1].split() == ['0', '3', '0', '3']
  assert text.splitlines()[-1].split() == ['total', '4', '5', '9']
  _, png = report.write_partition_report(counts, str(tmp_path))
  with open(png, 'rb') as f:
    assert f.read(8) == b'\x89PNG\r\n\x1a\n'


def test_generated_clients_sizes_span_the_asked_range(tmp_path):
  data = datasets.generated_like(
    'emnist', 40, 2, str(tmp_path), num_test=3, max_examples_per_client=5
  )
  sizes = [len(y) for y in data.train_labels]
  assert min(sizes) == 2 and max(sizes) == 5 and set(sizes) <= {2, 3, 4, 5}
  assert data.num_classes == 62 and data.input_shape == (28, 28, 1)
  with pytest.raises(ValueError, match='max_examples_per_client=1'):
    datasets.generated_like(
      'emnist', 4, 2, str(tmp_path), max_examples_per_client=1
    )


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
