"""Tests for tff_methods_tasks.local_batches: the batches a client trains on in
a round, each pass in its own seeded order, as NIID-Bench cuts them."""

import collections
import sys

import numpy as np
import pytest
import tensorflow as tf

from tff_methods.clients import batches_in_memory
from tff_methods_tasks import datasets


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


def test_local_batches_refuse_bad_settings():
  with pytest.raises(ValueError, match='batch_size'):
    datasets.LocalBatches(0)
  with pytest.raises(ValueError, match='local_steps'):
    datasets.LocalBatches(4, local_steps=0)


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
