"""Tests for tff_methods.algorithms.grouped_layers: Fed2's groups side by side,
each group computed from its own block only, by hand with NumPy."""

import sys

import numpy as np
import pytest
import tensorflow as tf

from tff_methods.algorithms import grouped_layers


def _dense(x, kernel, bias):
  return x @ kernel + bias


def test_a_grouped_dense_layer_is_one_dense_layer_per_group_on_its_block():
  # 3 groups of unequal widths (2, 3, 1) reading 4 channels each: group g
  # is a dense layer on channels [4g, 4g + 4), its units side by side.
  widths, block = (2, 3, 1), 4
  layer = grouped_layers.GroupedDense(widths, grouped_input=True)
  x = np.random.default_rng(0).normal(size=(5, 3 * block)).astype(np.float32)
  layer.build(x.shape)
  bias = np.random.default_rng(1).normal(size=(3, 3)).astype(np.float32)
  layer.bias.assign(bias)
  kernel = layer.kernel.numpy()
  assert kernel.shape == (3, block, 3)  # Stacked, padded to the widest.
  expected = np.concatenate(
    [
      _dense(x[:, g * block : (g + 1) * block], kernel[g, :, :w], bias[g, :w])
      for g, w in enumerate(widths)
    ],
    axis=-1,
  )
  np.testing.assert_allclose(layer(x).numpy(), expected, rtol=1e-5)


def test_the_first_grouped_dense_layer_reads_the_whole_input():
  widths = (2, 2)
  layer = grouped_layers.GroupedDense(
    widths, grouped_input=False, activation='relu'
  )
  x = np.random.default_rng(2).normal(size=(4, 6)).astype(np.float32)
  y = layer(x).numpy()
  kernel, bias = layer.kernel.numpy(), layer.bias.numpy()
  expected = np.concatenate(
    [np.maximum(_dense(x, kernel[g], bias[g]), 0) for g in range(2)], axis=-1
  )
  np.testing.assert_allclose(y, expected, rtol=1e-5)


def test_flattened_groups_keep_each_groups_map_whole():
  # [B, H, W, G*w] -> block g is group g's [H, W, w] map flattened alone.
  x = np.arange(2 * 3 * 3 * 4, dtype=np.float32).reshape(2, 3, 3, 4)
  flat = grouped_layers.flatten_groups(tf.constant(x), 2).numpy()
  expected = np.concatenate(
    [x[..., :2].reshape(2, -1), x[..., 2:].reshape(2, -1)], axis=-1
  )
  np.testing.assert_array_equal(flat, expected)
  # Not Keras' Flatten, which interleaves the groups' channels.
  assert not np.array_equal(flat, x.reshape(2, -1))


def test_split_groups_and_gather_classes_move_channels_as_named():
  x = tf.constant(np.arange(12, dtype=np.float32).reshape(2, 6))
  blocks = grouped_layers.split_groups(x, 3)
  np.testing.assert_array_equal(blocks[1].numpy(), x.numpy()[:, 2:4])
  gathered = grouped_layers.GatherClasses([2, 0, 1])(x[:, :3])
  np.testing.assert_array_equal(gathered.numpy(), x.numpy()[:, [2, 0, 1]])


def test_per_group_glorot_keeps_each_groups_own_scale():
  # Group g's kernel is drawn as Glorot for its own fan-out (its width),
  # and the padding columns are zero.
  initializer = grouped_layers.per_group_glorot_uniform((1, 64))
  kernel = initializer((2, 64, 64)).numpy()
  assert not np.any(kernel[0, :, 1:])
  limit_narrow = np.sqrt(6 / (64 + 1))
  limit_wide = np.sqrt(6 / (64 + 64))
  assert np.abs(kernel[0, :, 0]).max() <= limit_narrow
  assert np.abs(kernel[1]).max() <= limit_wide
  assert np.abs(kernel[0, :, 0]).max() > limit_wide  # Not the wide one's.


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
