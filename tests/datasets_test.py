"""Tests for tff_methods_tasks.datasets and tff_methods_tasks.report."""

import collections
import os
import sys

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_methods import batches_in_memory
from tff_methods import client_data as client_data_lib
from tff_methods import client_keys
from tff_methods_tasks import array_sources
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


def _labelled(n):
  return tf.data.Dataset.from_tensor_slices(
    collections.OrderedDict(
      x=np.zeros((n, 2), np.float32), y=np.arange(n, dtype=np.int32)
    )
  )


def _rows(batches):
  return [b['y'].numpy().tolist() for b in batches]


def test_batches_stay_within_a_pass_and_keep_the_partial_one():
  # 40 examples, 2 epochs, batch 16: 3 batches a pass, as DataLoader gives.
  rows = _rows(datasets.LocalBatches(16, local_epochs=2)(_labelled(40)))
  assert [len(r) for r in rows] == [16, 16, 8, 16, 16, 8]
  for p in range(2):
    assert sorted(sum(rows[3 * p : 3 * p + 3], [])) == list(range(40))
  dropped = _rows(
    datasets.LocalBatches(16, local_epochs=2, drop_last=True)(_labelled(40))
  )
  assert [len(r) for r in dropped] == [16, 16, 16, 16]
  assert all(len(set(r)) == len(r) for r in dropped)


def test_every_pass_and_every_round_has_its_own_order():
  batches = datasets.LocalBatches(20, local_epochs=3, seed=7)
  first = _rows(batches(_labelled(20), 'client_1', 1))
  assert all(sorted(p) == list(range(20)) for p in first)
  assert first[0] != first[1] and first[1] != first[2]
  # Another round of the same client: other batches.
  second = _rows(batches(_labelled(20), 'client_1', 2))
  assert second != first and not set(map(tuple, second)) & set(
    map(tuple, first)
  )
  # The same (seed, client, round) repeats exactly; another client or seed
  # does not.
  assert _rows(batches(_labelled(20), 'client_1', 1)) == first
  assert _rows(batches(_labelled(20), 'client_2', 1)) != first
  assert (
    _rows(
      datasets.LocalBatches(20, local_epochs=3, seed=8)(
        _labelled(20), 'client_1', 1
      )
    )
    != first
  )


def test_local_steps_carry_on_through_the_data_across_rounds():
  # 20 examples, 3 steps of 4: every example within ceil(20 / 12) = 2 rounds.
  batches = datasets.LocalBatches(4, local_steps=3, seed=1)
  seen = [sum(_rows(batches(_labelled(20), 'c', r)), []) for r in (5, 6)]
  assert len(seen[0]) == len(seen[1]) == 12
  assert set(seen[0]) | set(seen[1]) == set(range(20))
  # 5 batches a pass: round 5 (batches 15-17) and round 6's first two
  # batches make up pass 3, each example once.
  assert sorted(seen[0] + seen[1][:8]) == list(range(20))
  # Batches within a pass: 10 examples, batch 4, steps cross pass ends.
  rows = _rows(datasets.LocalBatches(4, local_steps=4)(_labelled(10), 'c', 0))
  assert [len(r) for r in rows] == [4, 4, 2, 4]


def _pass_order(seed, client, pass_num, size):
  client_seed = tf.stack(
    [tf.constant(seed, tf.int64), tf.strings.to_hash_bucket_fast(client, 2**62)]
  )
  return (
    tf.random.experimental.stateless_shuffle(
      tf.range(size, dtype=tf.int64),
      tf.random.experimental.stateless_fold_in(
        client_seed, tf.constant(pass_num, tf.int64)
      ),
    )
    .numpy()
    .tolist()
  )


def test_batches_cut_each_pass_order_in_turn():
  # Pass p of a client is stateless_shuffle(range(n)) seeded by (seed,
  # client, p), cut into batches of B; 11 examples, B = 4, 2 epochs, round 3:
  # passes 6 and 7.
  rows = _rows(
    datasets.LocalBatches(4, local_epochs=2, seed=5)(_labelled(11), 'c', 3)
  )
  expected = []
  for p in (6, 7):
    order = _pass_order(5, 'c', p, 11)
    expected += [order[0:4], order[4:8], order[8:11]]
  assert rows == expected
  # One pass (cut by `batch` rather than `rebatch`): round 3 is pass 3.
  one_pass = datasets.LocalBatches(4, local_epochs=1, seed=5)
  order = _pass_order(5, 'c', 3, 11)
  assert _rows(one_pass(_labelled(11), 'c', 3)) == [
    order[0:4],
    order[4:8],
    order[8:11],
  ]
  assert one_pass(_labelled(11), 'c', 3).element_spec == one_pass.element_spec(
    _labelled(11).element_spec
  )
  # 2 steps a round from the stream of 3-batch passes: round 1 is batches
  # 2 and 3, pass 0's last batch and pass 1's first.
  steps = datasets.LocalBatches(4, local_steps=2, seed=5)
  assert _rows(steps(_labelled(11), 'c', 1)) == [
    _pass_order(5, 'c', 0, 11)[8:11],
    _pass_order(5, 'c', 1, 11)[0:4],
  ]
  # drop_last: 2-batch passes; 3 steps, round 1 is batches 3, 4 and 5.
  dropped = _rows(
    datasets.LocalBatches(4, local_steps=3, drop_last=True, seed=5)(
      _labelled(11), 'c', 1
    )
  )
  assert dropped == [
    _pass_order(5, 'c', 1, 11)[4:8],
    _pass_order(5, 'c', 2, 11)[0:4],
    _pass_order(5, 'c', 2, 11)[4:8],
  ]


def _sliced(batches, dataset, client='c', round_num=0):
  sliced = batches_in_memory.SlicedBatches(
    *batches.round_examples(datasets.read_all(dataset), client, round_num)
  )
  assert int(sliced.kept) == int(sliced.seen)
  return sliced, [sliced.batch(i) for i in range(int(sliced.kept))]


@pytest.mark.parametrize(
  'batches',
  [
    # One pass, the last batch partial: the data set's `batch` cut.
    datasets.LocalBatches(4, local_epochs=1, seed=5, with_index=True),
    # A partial batch in each of two passes: the `rebatch` cut.
    datasets.LocalBatches(4, local_epochs=2, seed=5, with_index=True),
    # Steps across pass ends, partial batches dropped.
    datasets.LocalBatches(4, local_steps=3, drop_last=True, seed=5),
    # No batch at all.
    datasets.LocalBatches(16, local_epochs=2, drop_last=True),
  ],
)
def test_sliced_batches_are_the_data_sets_batches(batches):
  data = tf.data.Dataset.from_tensor_slices(
    collections.OrderedDict(
      x=np.arange(22, dtype=np.float32).reshape(11, 2),
      y=np.arange(11, dtype=np.int32),
    )
  )
  for round_num in (1, 2):
    want = list(batches(data, 'c', round_num))
    sliced, got = _sliced(batches, data, 'c', round_num)
    assert sliced.element_spec == batches.element_spec(data.element_spec)
    assert len(got) == len(want)
    for g, w in zip(got, want):
      assert list(g) == list(w)
      for key in w:
        np.testing.assert_array_equal(g[key].numpy(), w[key].numpy())
  # `reduce` visits the batches in turn: here, each one's first label.
  firsts = sliced.reduce(
    tf.zeros([0], tf.int32), lambda s, b: tf.concat([s, b['y'][:1]], 0)
  )
  assert firsts.numpy().tolist() == [int(b['y'][0]) for b in want]


def test_a_client_smaller_than_a_dropped_batch_has_no_batches():
  for batches in (
    datasets.LocalBatches(8, local_epochs=2, drop_last=True),
    datasets.LocalBatches(8, local_steps=3, drop_last=True),
  ):
    assert _rows(batches(_labelled(5), 'c', 1)) == []


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


def test_local_batches_refuse_bad_settings():
  with pytest.raises(ValueError, match='batch_size'):
    datasets.LocalBatches(0)
  with pytest.raises(ValueError, match='local_steps'):
    datasets.LocalBatches(4, local_steps=0)


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
