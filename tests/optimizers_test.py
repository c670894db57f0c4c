"""Tests for tff_methods.optimizers."""

import sys
import numpy as np
import pytest
import tensorflow as tf

from tff_methods import optimizers


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
  np.testing.assert_allclose(w2[0].numpy(), w1[0].numpy() - 0.1 * v,
                             rtol=1e-6)


def test_server_optimizers_by_name():
  for name in optimizers.SERVER_OPTIMIZERS:
    assert optimizers.build_server_optimizer(name, 0.1) is not None
  with pytest.raises(ValueError, match="Unknown server optimizer 'sgdd'"):
    optimizers.build_server_optimizer('sgdd')


@pytest.mark.parametrize('kwargs, message', [
    (dict(learning_rate=0.0), 'client learning rate must be > 0, got 0.0'),
    (dict(learning_rate=0.1, momentum=1.0), 'momentum must be in'),
    (dict(learning_rate=0.1, weight_decay=-1.0), 'weight_decay must be >= 0'),
])
def test_bad_client_optimizer_settings_are_named(kwargs, message):
  with pytest.raises(ValueError, match=message):
    optimizers.build_client_sgd(**kwargs)


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
