"""Tests for tff_methods.templates.optimizers."""

import sys

import numpy as np
import pytest
import tensorflow as tf

from tff_methods.templates import optimizers


def test_sgd_with_momentum_and_weight_decay_by_hand():
  opt = optimizers.build_client_sgd(0.1, momentum=0.5, weight_decay=0.2)
  w = (tf.constant([1.0, -2.0]),)
  state = opt.initialize((tf.TensorSpec([2], tf.float32),))
  g = (tf.constant([0.5, 0.5]),)
  state, w1 = opt.next(state, w, g)
  # PyTorch SGD: d = g + wd*w = [0.7, 0.1]; v = d; w -= lr*v.
  np.testing.assert_allclose(w1[0].numpy(), [1 - 0.07, -2 - 0.01], rtol=1e-6)
  state, w2 = opt.next(state, w1, g)
  d = np.array([0.5, 0.5]) + 0.2 * w1[0].numpy()
  v = 0.5 * np.array([0.7, 0.1]) + d
  np.testing.assert_allclose(w2[0].numpy(), w1[0].numpy() - 0.1 * v, rtol=1e-6)


def _server_steps_by_hand(
  name,
  w,
  gradients,
  lr=0.1,
  momentum=0.9,
  beta_1=0.9,
  beta_2=0.99,
  epsilon=1e-3,
):
  """Each rule's weights after each step, from its formula (TFF's forms)."""
  accumulator, preconditioner = 0.0, (1e-6 if name == 'yogi' else 0.0)
  out = []
  for t, g in enumerate(gradients, start=1):
    if name == 'sgd':
      w = w - lr * g
    elif name == 'sgdm':  # Heavy ball: m = beta m + g.
      accumulator = momentum * accumulator + g
      w = w - lr * accumulator
    elif name == 'sgdm_ema':  # The FedCos code: m = beta m + (1 - beta) g.
      accumulator = momentum * accumulator + (1 - momentum) * g
      w = w - lr * accumulator
    else:
      accumulator += (g - accumulator) * (1 - beta_1)
      if name == 'adam':
        preconditioner += (g * g - preconditioner) * (1 - beta_2)
      else:  # Yogi: v -= (1 - beta_2) sign(v - g^2) g^2.
        preconditioner += (1 - beta_2) * np.sign(g * g - preconditioner) * g * g
      corrected = lr * np.sqrt(1 - beta_2**t) / (1 - beta_1**t)
      w = w - corrected * accumulator / (np.sqrt(preconditioner) + epsilon)
    out.append(w)
  return out


GRADIENTS = [
  np.array([0.5, -0.02]),
  np.array([0.1, 0.3]),
  np.array([-0.4, 0.3]),
]


def _steps(optimizer, gradients=GRADIENTS):
  """The optimizer's weights after each step from [1, -1]."""
  weights = (tf.constant([1.0, -1.0]),)
  state = optimizer.initialize((tf.TensorSpec([2], tf.float32),))
  got = []
  for g in gradients:
    state, weights = optimizer.next(
      state, weights, (tf.constant(g, tf.float32),)
    )
    got.append(weights[0].numpy())
  return got


@pytest.mark.parametrize('name', optimizers.SERVER_OPTIMIZERS)
def test_server_optimizers_follow_their_formulas(name):
  gradients = GRADIENTS
  got = _steps(optimizers.build_server_optimizer(name, 0.1))
  expected = _server_steps_by_hand(name, np.array([1.0, -1.0]), gradients)
  np.testing.assert_allclose(got, expected, rtol=1e-5)
  # No other rule gives the same weights: the names are not swapped.
  for other in set(optimizers.SERVER_OPTIMIZERS + ('sgdm_ema',)) - {name}:
    assert not np.allclose(
      _server_steps_by_hand(other, np.array([1.0, -1.0]), gradients),
      expected,
      rtol=1e-4,
    )


def test_fedavgm_in_the_fedcos_codes_form():
  got = _steps(
    optimizers.build_server_optimizer('sgdm', 0.1, momentum_form='ema')
  )
  np.testing.assert_allclose(
    got,
    _server_steps_by_hand('sgdm_ema', np.array([1.0, -1.0]), GRADIENTS),
    rtol=1e-5,
  )
  with pytest.raises(ValueError, match="momentum form 'nesterov'"):
    optimizers.build_server_optimizer('sgdm', momentum_form='nesterov')


def test_unknown_server_optimizer_is_named():
  with pytest.raises(ValueError, match="Unknown server optimizer 'sgdd'"):
    optimizers.build_server_optimizer('sgdd')


@pytest.mark.parametrize(
  'kwargs, message',
  [
    (dict(learning_rate=0.0), 'client learning rate must be > 0, got 0.0'),
    (dict(learning_rate=0.1, momentum=1.0), 'momentum must be in'),
    (dict(learning_rate=0.1, weight_decay=-1.0), 'weight_decay must be >= 0'),
  ],
)
def test_bad_client_optimizer_settings_are_named(kwargs, message):
  with pytest.raises(ValueError, match=message):
    optimizers.build_client_sgd(**kwargs)


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
