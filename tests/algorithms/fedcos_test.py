"""Tests for FedCos and its combinations: the penalty, the direction d."""

import sys

import numpy as np
import pytest
import tensorflow as tf

from tff_methods.algorithms import fedcos
from tff_methods.algorithms import hyperparameters
from tff_methods.algorithms import methods
from tff_methods.templates import model_lib

pytestmark = pytest.mark.usefixtures('tff_worker')

HPARAMS = dict(client_learning_rate=0.05, client_momentum=0.9)


@pytest.fixture(scope='module')
def setup(digits_rounds):
  return digits_rounds


def test_direction_penalty_by_hand():
  delta = [tf.constant([1.0]), tf.constant([[0.0]])]
  direction = [tf.constant([1.0]), tf.constant([[1.0]])]
  expected = 1.0 - 1.0 / np.sqrt(1.0 * 2.0 + 1e-4)
  assert np.isclose(
    fedcos.direction_penalty(delta, direction).numpy(), expected, rtol=1e-6
  )
  zero = [tf.zeros([1]), tf.zeros([1, 1])]
  assert fedcos.direction_penalty(delta, zero).numpy() == 0.0


def test_direction_penalty_gradient_turns_the_update_towards_d():
  rng = np.random.default_rng(0)
  delta = tf.Variable(rng.normal(size=6).astype(np.float32))
  d = tf.constant(rng.normal(size=6).astype(np.float32))
  cosine = lambda: float(
    np.dot(delta.numpy(), d.numpy())
    / np.linalg.norm(delta.numpy())
    / np.linalg.norm(d.numpy())
  )
  before = cosine()
  for _ in range(10):
    with tf.GradientTape() as tape:
      penalty = fedcos.direction_penalty([delta], [d])
    delta.assign_sub(0.5 * tape.gradient(penalty, delta))
  assert cosine() > before + 0.1


def test_server_broadcasts_the_last_global_move():
  term = fedcos.DirectionPenalty(0.1)
  zeros = [np.zeros(2, np.float32)]
  server = term.server_state
  assert server.record_mean_update is None  # It learns the global weights.
  state = server.initial(zeros)
  w1 = [tf.constant([1.0, 2.0])]
  state, d1 = server.broadcast(state, w1)
  np.testing.assert_array_equal(d1[0].numpy(), [0.0, 0.0])  # round 1
  w2 = [tf.constant([1.5, 1.0])]
  state, d2 = server.broadcast(state, w2)
  np.testing.assert_allclose(d2[0].numpy(), [0.5, -1.0])


def test_the_fedcos_codes_direction_is_the_last_mean_client_move():
  term = fedcos.DirectionPenalty(0.1, direction='mean_client_update')
  server = term.server_state
  state = server.initial([np.zeros(2, np.float32)])
  state, d1 = server.broadcast(state, [tf.constant([1.0, 2.0])])
  np.testing.assert_array_equal(d1[0].numpy(), [0.0, 0.0])  # round 1
  # TFF's mean update is w_g - w; d is the clients' mean move, w - w_g.
  state = server.record_mean_update(state, [tf.constant([0.5, -1.0])])
  _, d2 = server.broadcast(state, [tf.constant([9.0, 9.0])])
  np.testing.assert_allclose(d2[0].numpy(), [-0.5, 1.0])
  # A non-finite mean leaves d as it was.
  kept = server.record_mean_update(state, [tf.constant([np.nan, 1.0])])
  np.testing.assert_allclose(kept['previous'][0].numpy(), [0.5, -1.0])
  with pytest.raises(ValueError, match="Unknown FedCos direction 'last'"):
    fedcos.DirectionPenalty(0.1, direction='last')


def test_zero_strength_gives_fedavg_weights(setup, tff_fedavg_weights):
  process = methods.build_method(
    'fedcos',
    setup['model_fn'],
    setup['spec'],
    hyperparameters.Hyperparameters(**HPARAMS, mu=0.0),
  )
  weights, _ = setup['run'](process)
  np.testing.assert_allclose(weights, tff_fedavg_weights, rtol=1e-5, atol=1e-6)


def test_fedcos_term_is_zero_in_round_one_then_active(setup):
  process = methods.build_method(
    'fedcos',
    setup['model_fn'],
    setup['spec'],
    hyperparameters.Hyperparameters(**HPARAMS, mu=0.5),
  )
  _, metrics = setup['run'](process)
  assert np.isclose(metrics[0]['objective'], metrics[0]['loss'])
  assert metrics[1]['objective'] > metrics[1]['loss'] + 1e-3


def test_fedprox_plus_fedcos_at_zero_fedcos_is_fedprox(setup):
  prox, _ = setup['run'](
    methods.build_method(
      'fedprox',
      setup['model_fn'],
      setup['spec'],
      hyperparameters.Hyperparameters(**HPARAMS, mu=1.0),
    )
  )
  combined, _ = setup['run'](
    methods.build_method(
      'fedprox+fedcos',
      setup['model_fn'],
      setup['spec'],
      hyperparameters.Hyperparameters(
        **HPARAMS,
        method_settings={'fedprox': {'mu': 1.0}, 'fedcos': {'mu': 0.0}},
      ),
    )
  )
  np.testing.assert_allclose(combined, prox, rtol=1e-5, atol=1e-6)
  with_cos, _ = setup['run'](
    methods.build_method(
      'fedprox+fedcos',
      setup['model_fn'],
      setup['spec'],
      hyperparameters.Hyperparameters(
        **HPARAMS,
        method_settings={'fedprox': {'mu': 1.0}, 'fedcos': {'mu': 1.0}},
      ),
    )
  )
  assert not np.allclose(with_cos, prox, atol=1e-4)


@pytest.mark.parametrize('server, same', [('fedavg', True), ('fedavgm', False)])
def test_fedcos_directions_agree_under_fedavg_only(setup, server, same):
  def weights(direction):
    return setup['run'](
      methods.build_method(
        f'{server}+fedcos',
        setup['model_fn'],
        setup['spec'],
        hyperparameters.Hyperparameters(
          **HPARAMS,
          mu=0.5,
          method_settings={'fedcos': {'direction': direction}},
        ),
      )
    )[0]

  paper, code = weights('global_move'), weights('mean_client_update')
  # Under FedAvg the two d differ by float rounding only (w_t - w_{t-1}
  # against the mean update itself), which training then carries on.
  relative = np.linalg.norm(code - paper) / np.linalg.norm(paper)
  if same:
    assert relative < 1e-4
  else:
    assert relative > 1e-2


def test_fedadam_plus_fedcos_uses_adam_at_the_server(setup):
  # Round 1: d = 0, so the clients train as FedAvg's; the server then takes
  # one Adam step on the mean update. With TFF's bias correction, step 1 is
  # w0 + lr * delta / (|delta| + eps) (beta_2 = 0.99: sqrt(1 - beta_2) |delta|
  # over sqrt(1 - beta_2), so eps enters as eps / 0.1). FedAvgM's first
  # step would be w0 + lr * delta.
  lr = 0.01
  process = methods.build_method(
    'fedadam+fedcos',
    setup['model_fn'],
    setup['spec'],
    hyperparameters.Hyperparameters(
      **HPARAMS, mu=0.02, server_learning_rate=lr
    ),
  )
  weights, _ = setup['run'](process, rounds=1)
  averaged, _ = setup['run'](
    methods.build_method(
      'fedavg',
      setup['model_fn'],
      setup['spec'],
      hyperparameters.Hyperparameters(**HPARAMS),
    ),
    rounds=1,
  )
  start = model_lib.flat_trainable(setup['initial'])
  delta = averaged - start
  expected = start + lr * 0.1 * delta / (0.1 * np.abs(delta) + 1e-3)
  np.testing.assert_allclose(weights, expected, rtol=1e-4, atol=1e-7)
  assert not np.allclose(weights, start + lr * delta, atol=1e-5)


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
