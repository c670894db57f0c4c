"""Tests for FedMAX: the activation prior, by hand and in training."""

import sys

import numpy as np
import pytest
import tensorflow as tf

from tff_methods.algorithms import fedmax
from tff_methods.algorithms import hyperparameters
from tff_methods.algorithms import methods

pytestmark = pytest.mark.usefixtures('tff_worker')

HPARAMS = dict(client_learning_rate=0.05, client_momentum=0.9)


@pytest.fixture(scope='module')
def setup(digits_rounds):
  return digits_rounds


def test_activation_entropy_loss_by_hand():
  # softmax([0, log 3]) = [1/4, 3/4]; elements (1/2)(log(1/2) - log p_j):
  # (1/2) log 2 and (1/2) log(2/3); their mean is (1/4) log(4/3).
  act = tf.constant([[0.0, np.log(3.0)]])
  assert np.isclose(
    fedmax.activation_entropy_loss(act).numpy(), 0.25 * np.log(4 / 3), rtol=1e-6
  )
  # Uniform softmax: KL(U || U) = 0.
  assert np.isclose(
    fedmax.activation_entropy_loss(tf.ones((3, 5))).numpy(), 0.0, atol=1e-7
  )


def test_activation_entropy_gradient_flattens_the_softmax():
  act = tf.Variable([[3.0, 0.0, -1.0, 0.5]])
  entropy = lambda a: -np.sum(
    tf.nn.softmax(a).numpy() * tf.nn.log_softmax(a).numpy()
  )
  before = entropy(act)
  with tf.GradientTape() as tape:
    loss = fedmax.activation_entropy_loss(act)
  act.assign_sub(1.0 * tape.gradient(loss, act))
  assert entropy(act) > before


def test_zero_strength_gives_fedavg_weights(setup, tff_fedavg_weights):
  process = methods.build_method(
    'fedmax',
    setup['model_fn'],
    setup['spec'],
    hyperparameters.Hyperparameters(
      **HPARAMS, method_settings={'fedmax': {'beta': 0.0}}
    ),
  )
  weights, _ = setup['run'](process)
  np.testing.assert_allclose(weights, tff_fedavg_weights, rtol=1e-5, atol=1e-6)


def test_fedmax_term_is_active(setup):
  process = methods.build_method(
    'fedmax',
    setup['model_fn'],
    setup['spec'],
    hyperparameters.Hyperparameters(
      **HPARAMS, method_settings={'fedmax': {'beta': 100.0}}
    ),
  )
  _, metrics = setup['run'](process, rounds=1)
  assert metrics[0]['objective'] > metrics[0]['loss'] + 1e-3


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
