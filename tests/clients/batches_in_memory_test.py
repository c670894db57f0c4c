"""Tests for tff_methods.clients.batches_in_memory: a round's batches read first
(up to a cap) or sliced from its examples reduce exactly as the data set
does."""

import collections
import sys

import numpy as np
import pytest
import tensorflow as tf

from tff_methods.clients import batches_in_memory


def _batches(sizes):
  """Batches of the given sizes, each example's x its number."""
  x = np.arange(sum(sizes), dtype=np.float32)
  ends = np.cumsum(sizes)
  return [
    collections.OrderedDict(x=x[end - size : end], y=(x[end - size : end] > 3))
    for size, end in zip(sizes, ends)
  ]


def _dataset(sizes):
  batches = _batches(sizes)
  dataset = tf.data.Dataset.from_tensors(batches[0])
  for batch in batches[1:]:
    dataset = dataset.concatenate(tf.data.Dataset.from_tensors(batch))
  return dataset


def _order_sensitive(state, batch):
  # A polynomial in the batches' sums: any other order or batch gives
  # another value.
  return state * 3.0 + tf.reduce_sum(batch['x']) + 1.0


SIZES = (4, 4, 2, 3)


@pytest.mark.parametrize(
  # An example is 5 bytes (x a float32, y a bool), a batch of 4 is 20: a
  # cap of 0 keeps no batch, one of 25 bytes the first only, 1 MB all.
  'max_mb, kept',
  [(0.0, 0), (25 / 2**20, 1), (1.0, 4)],
)
def test_kept_and_streamed_batches_reduce_as_the_data_set(max_mb, kept):
  dataset = _dataset(SIZES)
  expected = dataset.reduce(tf.constant(0.0), _order_sensitive).numpy()

  @tf.function
  def read():
    batches = batches_in_memory.BatchesInMemory(dataset, max_mb)
    return (
      batches.kept,
      batches.seen,
      batches.reduce(tf.constant(0.0), _order_sensitive),
    )

  got_kept, seen, reduced = read()
  assert (got_kept.numpy(), seen.numpy()) == (kept, len(SIZES))
  assert reduced.numpy() == expected


def test_sliced_batches_are_the_batches_of_their_sizes():
  examples = collections.OrderedDict(
    x=tf.range(13, dtype=tf.float32), y=tf.range(13) > 3
  )
  sliced = batches_in_memory.SlicedBatches(
    examples, tf.constant(SIZES, tf.int64)
  )
  assert sliced.kept.numpy() == sliced.seen.numpy() == len(SIZES)
  for i, batch in enumerate(_batches(SIZES)):
    np.testing.assert_array_equal(sliced.batch(i)['x'].numpy(), batch['x'])
  expected = _dataset(SIZES).reduce(tf.constant(0.0), _order_sensitive)
  assert sliced.reduce(tf.constant(0.0), _order_sensitive).numpy() == (
    expected.numpy()
  )


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
