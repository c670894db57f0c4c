"""Tests for tff_methods.templates.model_lib: the model contract and weight
helpers."""

import sys

import numpy as np
import pytest
import tensorflow as tf

from tff_methods.templates import model_lib


def _plain_cnn():
  inputs = tf.keras.Input((8, 8, 1))
  x = tf.keras.layers.Conv2D(4, 3, activation='relu', name='conv_1')(inputs)
  x = tf.keras.layers.Conv2D(4, 3, activation='relu', name='conv_2')(x)
  x = tf.keras.layers.Flatten()(x)
  features = tf.keras.layers.Dense(6, activation='relu', name='hidden')(x)
  logits = tf.keras.layers.Dense(3, name='out')(features)
  return tf.keras.Model(inputs, logits, name='plain')


def test_named_outputs_names_the_layers_a_method_reads():
  model = model_lib.named_outputs(
    _plain_cnn(), features='hidden', layers=['conv_1', 'conv_2']
  )
  assert sorted(model.output) == ['features', 'layer_1', 'layer_2', 'logits']
  assert model_lib.layer_names(model) == ['layer_1', 'layer_2']
  x = np.ones((2, 8, 8, 1), np.float32)
  out = model(x)
  assert out['layer_1'].shape == (2, 6, 6, 4)
  assert out['features'].shape == (2, 6)
  # The same layers and weights: the logits are the plain model's.
  assert len(model.trainable_variables) == 8


def test_a_one_output_model_is_taken_as_its_logits_and_bad_ones_named():
  model = model_lib.contract_model(_plain_cnn())
  assert list(model.output) == ['logits']
  softmax = tf.keras.Sequential(
    [tf.keras.Input((3,)), tf.keras.layers.Dense(2, activation='softmax')]
  )
  with pytest.raises(ValueError, match='softmax'):
    model_lib.contract_model(softmax)
  inputs = tf.keras.Input((3,))
  two = tf.keras.Model(
    inputs, [tf.keras.layers.Dense(2)(inputs), tf.keras.layers.Dense(2)(inputs)]
  )
  with pytest.raises(TypeError, match='2 unnamed outputs'):
    model_lib.contract_model(two)


def test_weights_assigned_before_use_start_at_zeros():
  with model_lib.weights_assigned_before_use():
    model = _plain_cnn()
  assert all(not np.any(v.numpy()) for v in model.variables)
  seeded = model_lib.initial_weights(_plain_cnn, seed=3)
  again = model_lib.initial_weights(_plain_cnn, seed=3)
  for a, b in zip(seeded.trainable, again.trainable):
    np.testing.assert_array_equal(a, b)
  assert any(np.any(w) for w in seeded.trainable)


def test_weight_helpers_by_hand():
  zeros = model_lib.zero_weights(_plain_cnn)
  assert [w.shape for w in zeros.trainable][:2] == [(3, 3, 1, 4), (4,)]
  assert model_lib.all_finite(zeros)
  flat = model_lib.flat_trainable(zeros)
  assert flat.shape == (sum(w.size for w in zeros.trainable),)
  zeros.trainable[1][2] = np.nan
  assert not model_lib.all_finite(zeros)
  named = model_lib.weights_to_dict(zeros)
  assert list(named)[:2] == ['trainable_0', 'trainable_1']


def test_a_trained_model_is_exported_as_the_users_own_keras_model():
  weights = model_lib.initial_weights(_plain_cnn, seed=4)
  model = model_lib.keras_model_with_weights(_plain_cnn, weights)
  assert not isinstance(model.output, dict)  # The plain model, as built.
  for v, w in zip(model.trainable_variables, weights.trainable):
    np.testing.assert_array_equal(v.numpy(), w)


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
