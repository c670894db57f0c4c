"""Tests for MOON's loss, by hand, and its reference projection.

MOON as a process (per-client state) is tested in stateful_test.py.
"""

import functools
import sys

import numpy as np
import pytest
import tensorflow as tf

from tff_methods.algorithms import moon
from tff_methods.templates import model_lib
from tff_methods.templates import reference_outputs
from tff_methods.templates import regularizers
from tff_methods_tasks import models


def test_moon_loss_by_hand():
  z = tf.constant([[1.0, 0.0]])
  z_global = tf.constant([[2.0, 0.0]])  # cos = 1
  z_prev = tf.constant([[0.0, 3.0]])  # cos = 0
  # -log(e^{1/0.5} / (e^{1/0.5} + e^{0})) = log(1 + e^{-2}).
  assert np.isclose(
    moon.contrastive_loss(z, z_global, z_prev, 0.5).numpy(),
    np.log1p(np.exp(-2.0)),
    rtol=1e-6,
  )
  # Batch mean: a second example with cos_g = 0, cos_p = 1 (tau = 1).
  z2 = tf.constant([[1.0, 0.0], [0.0, 1.0]])
  zg2 = tf.constant([[1.0, 0.0], [1.0, 0.0]])
  zp2 = tf.constant([[0.0, 1.0], [0.0, 1.0]])
  expected = (np.log1p(np.exp(-1.0)) + np.log1p(np.exp(1.0))) / 2
  assert np.isclose(
    moon.contrastive_loss(z2, zg2, zp2, 1.0).numpy(), expected, rtol=1e-6
  )


def _cos(a, b):
  a, b = np.ravel(a), np.ravel(b)
  return a @ b / np.linalg.norm(a) / np.linalg.norm(b)


def test_moon_gradient_moves_z_towards_the_global_projection():
  rng = np.random.default_rng(1)
  z = tf.Variable(rng.normal(size=(1, 4)).astype(np.float32))
  z_global = tf.constant(rng.normal(size=(1, 4)).astype(np.float32))
  z_prev = tf.constant(rng.normal(size=(1, 4)).astype(np.float32))
  before = _cos(z.numpy(), z_global.numpy())
  for _ in range(20):
    with tf.GradientTape() as tape:
      loss = moon.contrastive_loss(z, z_global, z_prev, 0.5)
    z.assign_sub(0.1 * tape.gradient(loss, z))
  assert _cos(z.numpy(), z_global.numpy()) > before + 0.1


def test_reference_view_up_to_moons_projection_computes_the_models_z():
  model_fn = functools.partial(
    models.get_model, 'resnet18', 10, (8, 8, 3), projection_dim=4
  )
  view = reference_outputs.reference_view(model_fn, ('z',))
  full = model_fn()
  # The copy starts from its own initialization: equal outputs show every
  # weight was taken from the right place of the full model's list.
  view.assign(model_lib.get_weights(full))
  assert len(view.model.trainable_variables) < len(full.trainable_variables)
  x = np.random.default_rng(1).normal(size=(2, 8, 8, 3)).astype(np.float32)
  np.testing.assert_allclose(
    view.model(x, training=False)['z'],
    full(x, training=False)['z'],
    rtol=1e-4,
    atol=1e-5,
  )


@pytest.mark.parametrize('temperature', [0.1, 0.5, 2.0])
def test_the_term_uses_the_temperature_it_is_given(temperature):
  rng = np.random.default_rng(5)
  z, z_global, z_prev = [
    rng.normal(size=(4, 3)).astype(np.float32) for _ in range(3)
  ]
  step = regularizers.LocalStep(
    weights=[],
    global_weights=[],
    outputs={'z': z},
    batch=None,
    global_outputs={'z': z_global},
    previous_outputs={'z': z_prev},
    has_previous=True,
  )
  term = float(moon.ModelContrastiveTerm(mu=3.0, temperature=temperature)(step))
  # By hand: 3 x the batch mean of -log softmax([cos_g, cos_p] / tau)[0].
  cos_g = np.array([_cos(a, b) for a, b in zip(z, z_global)])
  cos_p = np.array([_cos(a, b) for a, b in zip(z, z_prev)])
  expected = 3.0 * np.mean(
    np.log(np.exp(cos_g / temperature) + np.exp(cos_p / temperature))
    - cos_g / temperature
  )
  assert term == pytest.approx(expected, rel=1e-5)
  assert term == pytest.approx(
    3.0 * float(moon.contrastive_loss(z, z_global, z_prev, temperature)),
    rel=1e-6,
  )


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
