"""Tests for tff_methods.templates.local_training: the loop every method
shares."""

import collections
import sys

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_methods.templates import local_training
from tff_methods.templates import model_lib
from tff_methods.templates import optimizers
from tff_methods.templates import regularizers as regularizers_lib


def _linear_model_fn():
  inputs = tf.keras.Input((3,))
  logits = tf.keras.layers.Dense(2, name='dense')(inputs)
  return model_lib.named_outputs(
    tf.keras.Model(inputs, logits), features='dense'
  )


class _HalfSquaredNorm(regularizers_lib.Regularizer):
  """`strength / 2 * ||w||^2`: its gradient is `strength * w`."""

  name = 'half_squared_norm'
  display_name = 'HalfSquaredNorm'

  def __init__(self, strength):
    self._strength = strength

  def __call__(self, step):
    return (
      0.5
      * self._strength
      * tf.add_n([tf.reduce_sum(tf.square(w)) for w in step.weights])
    )


def _batches(num_batches, batch_size=4):
  rng = np.random.default_rng(0)
  x = rng.normal(size=(num_batches * batch_size, 3)).astype(np.float32)
  y = rng.integers(0, 2, num_batches * batch_size).astype(np.int32)
  return tf.data.Dataset.from_tensor_slices(
    collections.OrderedDict(x=x, y=y)
  ).batch(batch_size)


def test_hand_computed_values_of_the_data_terms():
  logits = tf.constant([[0.0, np.log(3.0)]])
  # softmax = (1/4, 3/4): label 1 costs -log(3/4).
  assert local_training.cross_entropy(
    tf.constant([1]), {'logits': logits}
  ).numpy() == pytest.approx(-np.log(0.75), rel=1e-6)
  assert local_training.squared_error(
    tf.constant([1.0, 3.0]), {'logits': tf.constant([[2.0], [1.0]])}
  ).numpy() == pytest.approx(0.5 * (1 + 4) / 2)


def test_each_step_follows_the_objectives_gradient_with_plain_sgd():
  # With no data term, SGD on strength/2 ||w||^2 scales w by (1 - lr * c)
  # each step: after k batches the update (start - end) is
  # (1 - (1 - lr c)^k) w.
  learning_rate, strength, steps = 0.1, 2.0, 3
  update_fn = local_training.build_client_update_fn(
    _linear_model_fn,
    optimizers.build_client_sgd(learning_rate),
    [_HalfSquaredNorm(strength)],
    tff.learning.ClientWeighting.NUM_EXAMPLES,
    loss_fn=lambda labels, outputs: 0.0 * tf.reduce_sum(outputs['logits']),
  )
  start = model_lib.initial_weights(_linear_model_fn, seed=1)
  result, sums, final = update_fn(start, _batches(steps))
  shrink = (1 - learning_rate * strength) ** steps
  for w, u, f in zip(start.trainable, result.update, final.trainable):
    np.testing.assert_allclose(u, (1 - shrink) * np.asarray(w), atol=1e-6)
    np.testing.assert_allclose(f, shrink * np.asarray(w), atol=1e-6)
  assert result.update_weight.numpy() == 4 * steps  # NUM_EXAMPLES.
  assert sums['num_batches'].numpy() == steps


def test_a_clients_training_is_traced_without_autograph(monkeypatch):
  # Written in TensorFlow's control flow (tf.cond, tf.while_loop), the
  # loop needs no conversion; autograph converting it and everything it
  # calls cost about 2 s of each new process's first build.
  from tensorflow.python.autograph.impl import api

  converted = []
  convert = api.converted_call

  def recorded(f, *args, **kwargs):
    module = getattr(f, '__module__', None) or ''
    converted.append(f'{module}.{getattr(f, "__qualname__", f)}')
    return convert(f, *args, **kwargs)

  monkeypatch.setattr(api, 'converted_call', recorded)
  update_fn = local_training.build_client_update_fn(
    _linear_model_fn,
    optimizers.build_client_sgd(0.1),
    [_HalfSquaredNorm(1.0)],
    tff.learning.ClientWeighting.NUM_EXAMPLES,
  )
  result, _, _ = update_fn(
    model_lib.initial_weights(_linear_model_fn, seed=1), _batches(2)
  )
  assert result.update_weight.numpy() == 8
  # (Keras converts its layers' `call` itself.)
  assert [name for name in converted if not name.startswith('keras.')] == []


@pytest.mark.parametrize('label_shape', [(-1,), (-1, 1)])
def test_training_accuracy_counts_each_label_once_whatever_its_shape(
  label_shape,
):
  # TFF's tutorials batch labels as (B, 1); compared with (B,) predictions
  # without a reshape they broadcast to (B, B). With a zero learning rate the
  # model never moves, so the count is the initial model's, by hand.
  update_fn = local_training.build_client_update_fn(
    _linear_model_fn,
    tff.learning.optimizers.build_sgdm(learning_rate=0.0),
    [],
    tff.learning.ClientWeighting.NUM_EXAMPLES,
  )
  start = model_lib.initial_weights(_linear_model_fn, seed=1)
  data = _batches(3)
  x = np.concatenate([b['x'].numpy() for b in data])
  y = np.concatenate([b['y'].numpy() for b in data])
  kernel, bias = start.trainable
  expected = np.sum(np.argmax(x @ kernel + bias, axis=-1) == y)
  shaped = data.map(
    lambda b: collections.OrderedDict(
      x=b['x'], y=tf.reshape(b['y'], label_shape)
    )
  )
  _, sums, _ = update_fn(start, shaped)
  assert sums['correct'].numpy() == expected
  assert sums['num_labels'].numpy() == len(y)


def test_a_diverged_client_reports_nothing():
  update_fn = local_training.build_client_update_fn(
    _linear_model_fn,
    optimizers.build_client_sgd(1e30),
    [],
    tff.learning.ClientWeighting.NUM_EXAMPLES,
    loss_fn=lambda labels, outputs: tf.reduce_sum(outputs['logits']) ** 4,
  )
  start = model_lib.initial_weights(_linear_model_fn, seed=1)
  result, sums, _ = update_fn(start, _batches(3))
  assert result.update_weight.numpy() == 0.0
  assert all(not np.any(u) for u in result.update)
  assert sums['num_non_finite_clients'].numpy() == 1.0


def test_a_client_whose_update_norm_overflows_reports_nothing():
  # Every entry finite (about 1e20, below float32's 3.4e38), the l2 norm
  # not: a DP clip would scale it to NaN, so it is dropped as diverged.
  update_fn = local_training.build_client_update_fn(
    _linear_model_fn,
    optimizers.build_client_sgd(1.0),
    [],
    tff.learning.ClientWeighting.NUM_EXAMPLES,
    loss_fn=lambda labels, outputs: 1e20 * tf.reduce_mean(outputs['logits']),
  )
  start = model_lib.initial_weights(_linear_model_fn, seed=1)
  one_step = _batches(1)
  result, sums, final = update_fn(start, one_step)
  moved = [
    np.asarray(w) - np.asarray(f)
    for w, f in zip(start.trainable, final.trainable)
  ]
  assert all(np.all(np.isfinite(m)) for m in moved)
  assert max(np.abs(m).max() for m in moved) > 1e19
  assert result.update_weight.numpy() == 0.0
  assert all(not np.any(u) for u in result.update)
  assert sums['num_non_finite_clients'].numpy() == 1.0


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
