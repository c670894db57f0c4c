"""Tests for FedCKA's loss, by hand, and the layers it computes.

FedCKA as a process (per-client state) is tested in stateful_test.py.
"""

import functools
import sys

import numpy as np
import pytest
import tensorflow as tf

from tff_methods.algorithms import fedcka
from tff_methods.algorithms import similarity
from tff_methods.templates import model_lib
from tff_methods.templates import reference_outputs
from tff_methods.templates import regularizers
from tff_methods_tasks import models


def test_cka_loss_by_hand():
  rng = np.random.default_rng(2)
  a1, p1 = [rng.normal(size=(8, 5)).astype(np.float32) for _ in range(2)]
  a2, p2 = [rng.normal(size=(8, 3, 3, 2)).astype(np.float32) for _ in range(2)]
  # The global model's activations equal the local ones: CKA = 1.
  c1 = similarity.linear_cka(a1, p1).numpy()
  c2 = similarity.linear_cka(a2, p2).numpy()
  expected = (np.log1p(np.exp(c1 - 1)) + np.log1p(np.exp(c2 - 1))) / 2
  loss = fedcka.cka_contrastive_loss([a1, a2], [a1, a2], [p1, p2])
  assert np.isclose(loss.numpy(), expected, rtol=1e-5)


def test_cka_gradient_moves_activations_towards_the_global_ones():
  rng = np.random.default_rng(3)
  a = tf.Variable(rng.normal(size=(10, 6)).astype(np.float32))
  a_global = tf.constant(rng.normal(size=(10, 6)).astype(np.float32))
  a_prev = tf.constant(rng.normal(size=(10, 6)).astype(np.float32))
  before = similarity.linear_cka(a, a_global).numpy()
  for _ in range(30):
    with tf.GradientTape() as tape:
      loss = fedcka.cka_contrastive_loss([a], [a_global], [a_prev])
    a.assign_sub(0.5 * tape.gradient(loss, a))
  assert similarity.linear_cka(a, a_global).numpy() > before + 0.05


def test_fedcka_computes_only_the_first_m_layers_of_reference_models():
  model_fn = functools.partial(models.get_model, 'fedcka_cnn', 10, (32, 32, 3))
  view = reference_outputs.reference_view(
    model_fn,
    ('layer_1', 'layer_2'),
  )
  # Only the two conv layers (kernel + bias each) of the model's 14 tensors
  # exist: no copy of the rest of the model is built.
  assert len(view.model.variables) == 4
  assert not any('dense' in v.name for v in view.model.variables)
  # Given the full model's weights, it computes the full model's outputs.
  full = model_fn()
  view.assign(model_lib.get_weights(full))
  x = np.random.default_rng(0).normal(size=(3, 32, 32, 3)).astype(np.float32)
  expected, got = full(x, training=False), view.model(x, training=False)
  assert sorted(got) == ['layer_1', 'layer_2']
  for name in got:
    np.testing.assert_allclose(got[name], expected[name], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('m, tensors', [(1, 2), (3, 6), (7, 14)])
def test_fedcka_views_hold_exactly_the_first_m_layers(m, tensors):
  model_fn = functools.partial(models.get_model, 'fedcka_cnn', 10, (32, 32, 3))
  term = fedcka.CKAContrastiveTerm(1.0, layers=m)
  view = reference_outputs.reference_view(model_fn, term.global_outputs)
  # Kernel and bias of each of the first m layers; M = 7 is the whole CNN.
  assert len(view.model.trainable_variables) == tensors
  assert sorted(view.model.output) == [f'layer_{k}' for k in range(1, m + 1)]


def _numpy_linear_cka(x, y):
  x = x.reshape(len(x), -1) - x.reshape(len(x), -1).mean(axis=0)
  y = y.reshape(len(y), -1) - y.reshape(len(y), -1).mean(axis=0)
  return np.linalg.norm(y.T @ x) ** 2 / (
    np.linalg.norm(x.T @ x) * np.linalg.norm(y.T @ y)
  )


def _layer_loss(a, a_global, a_prev):
  s_global, s_prev = (
    _numpy_linear_cka(a, a_global),
    _numpy_linear_cka(a, a_prev),
  )
  return np.log(np.exp(s_global) + np.exp(s_prev)) - s_global


def test_the_term_is_mu_times_the_mean_over_the_first_m_layers():
  rng = np.random.default_rng(4)
  shapes = {
    'layer_1': (6, 4, 4, 2),
    'layer_2': (6, 7),
    'layer_3': (6, 5),
    'layer_4': (6, 3),
  }

  def draw():
    return {k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()}

  outputs, global_outputs, previous_outputs = draw(), draw(), draw()

  def term(outputs):
    step = regularizers.LocalStep(
      weights=[],
      global_weights=[],
      outputs=outputs,
      batch=None,
      global_outputs=global_outputs,
      previous_outputs=previous_outputs,
      has_previous=True,
    )
    return float(fedcka.CKAContrastiveTerm(mu=2.5, layers=3)(step))

  # By hand: 2.5 x the mean of layers 1..3's contrastive losses.
  expected = 2.5 * np.mean(
    [
      _layer_loss(outputs[k], global_outputs[k], previous_outputs[k])
      for k in ('layer_1', 'layer_2', 'layer_3')
    ]
  )
  assert term(outputs) == pytest.approx(expected, rel=1e-4)
  # Layer 2 (below M) moves it; layer 4 (above M) does not.
  nearer = dict(outputs, layer_2=global_outputs['layer_2'])
  assert term(nearer) < term(outputs) - 1e-3
  assert term(dict(outputs, layer_4=draw()['layer_4'])) == pytest.approx(
    term(outputs), rel=1e-6
  )


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
