"""Tests for FedMAX and FedCos (and FedCos combinations)."""

import sys

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tasks import datasets
from tff_methods import fedavg
from tff_methods import fedcos
from tff_methods import fedmax
from tff_methods import methods
from tff_methods import model_lib
from tff_methods import optimizers

pytestmark = pytest.mark.usefixtures('tff_worker')


def test_activation_entropy_loss_by_hand():
  # softmax([0, log 3]) = [1/4, 3/4]; elements (1/2)(log(1/2) - log p_j):
  # (1/2) log 2 and (1/2) log(2/3); their mean is (1/4) log(4/3).
  act = tf.constant([[0.0, np.log(3.0)]])
  assert np.isclose(fedmax.activation_entropy_loss(act).numpy(),
                    0.25 * np.log(4 / 3), rtol=1e-6)
  # Uniform softmax: KL(U || U) = 0.
  assert np.isclose(fedmax.activation_entropy_loss(tf.ones((3, 5))).numpy(),
                    0.0, atol=1e-7)


def test_activation_entropy_gradient_flattens_the_softmax():
  act = tf.Variable([[3.0, 0.0, -1.0, 0.5]])
  entropy = lambda a: -np.sum(tf.nn.softmax(a).numpy() *
                              tf.nn.log_softmax(a).numpy())
  before = entropy(act)
  with tf.GradientTape() as tape:
    loss = fedmax.activation_entropy_loss(act)
  act.assign_sub(1.0 * tape.gradient(loss, act))
  assert entropy(act) > before


def test_direction_penalty_by_hand():
  delta = [tf.constant([1.0]), tf.constant([[0.0]])]
  direction = [tf.constant([1.0]), tf.constant([[1.0]])]
  expected = 1.0 - 1.0 / np.sqrt(1.0 * 2.0 + 1e-4)
  assert np.isclose(fedcos.direction_penalty(delta, direction).numpy(),
                    expected, rtol=1e-6)
  zero = [tf.zeros([1]), tf.zeros([1, 1])]
  assert fedcos.direction_penalty(delta, zero).numpy() == 0.0


def test_direction_penalty_gradient_turns_the_update_towards_d():
  rng = np.random.default_rng(0)
  delta = tf.Variable(rng.normal(size=6).astype(np.float32))
  d = tf.constant(rng.normal(size=6).astype(np.float32))
  cosine = lambda: float(np.dot(delta.numpy(), d.numpy()) /
                         np.linalg.norm(delta.numpy()) /
                         np.linalg.norm(d.numpy()))
  before = cosine()
  for _ in range(10):
    with tf.GradientTape() as tape:
      penalty = fedcos.direction_penalty([delta], [d])
    delta.assign_sub(0.5 * tape.gradient(penalty, delta))
  assert cosine() > before + 0.1


def test_server_broadcasts_the_last_global_move():
  term = fedcos.DirectionPenalty(0.1)
  zeros = [np.zeros(2, np.float32)]
  state = term.initial_server_state(zeros)
  w1 = [tf.constant([1.0, 2.0])]
  state, d1 = term.server_broadcast(state, w1)
  np.testing.assert_array_equal(d1[0].numpy(), [0.0, 0.0])  # round 1
  w2 = [tf.constant([1.5, 1.0])]
  state, d2 = term.server_broadcast(state, w2)
  np.testing.assert_allclose(d2[0].numpy(), [0.5, -1.0])


def test_the_fedcos_codes_direction_is_the_last_mean_client_move():
  term = fedcos.DirectionPenalty(0.1, direction='mean_client_update')
  assert term.reads_mean_update
  state = term.initial_server_state([np.zeros(2, np.float32)])
  state, d1 = term.server_broadcast(state, [tf.constant([1.0, 2.0])])
  np.testing.assert_array_equal(d1[0].numpy(), [0.0, 0.0])  # round 1
  # TFF's mean update is w_g - w; d is the clients' mean move, w - w_g.
  state = term.record_mean_update(state, [tf.constant([0.5, -1.0])])
  _, d2 = term.server_broadcast(state, [tf.constant([9.0, 9.0])])
  np.testing.assert_allclose(d2[0].numpy(), [-0.5, 1.0])
  # A non-finite mean leaves d as it was.
  kept = term.record_mean_update(state, [tf.constant([np.nan, 1.0])])
  np.testing.assert_allclose(kept['previous'][0].numpy(), [0.5, -1.0])
  with pytest.raises(ValueError, match="Unknown FedCos direction 'last'"):
    fedcos.DirectionPenalty(0.1, direction='last')


@pytest.fixture(scope='module')
def setup(digits_task, small_model_fn):
  client_data = digits_task.client_data.preprocess(
      datasets.LocalBatches(batch_size=32, local_epochs=1, seed=0))
  return dict(client_data=client_data, model_fn=small_model_fn,
              spec=client_data.element_type_structure,
              ids=client_data.client_ids[:3],
              initial=model_lib.initial_weights(small_model_fn, seed=0))


def _run(setup, process, rounds=3):
  process = tff.simulation.compose_dataset_computation_with_learning_process(
      setup['client_data'].dataset_computation, process)
  state = process.set_model_weights(process.initialize(), setup['initial'])
  outputs = []
  for _ in range(rounds):
    output = process.next(state, setup['ids'])
    state = output.state
    outputs.append(output.metrics['client_work']['train'])
  return model_lib.flat_trainable(process.get_model_weights(state)), outputs


HPARAMS = dict(client_learning_rate=0.05, client_momentum=0.9)


@pytest.fixture(scope='module')
def fedavg_weights(setup):
  return _run(setup, fedavg.build_tff_fedavg(
      setup['model_fn'], setup['spec'],
      client_optimizer=optimizers.build_client_sgd(0.05, 0.9)))[0]


@pytest.mark.parametrize('name, hparams', [
    ('fedmax', dict(beta=0.0)),
    ('fedcos', dict(mu=0.0)),
])
def test_zero_strength_gives_fedavg_weights(name, hparams, setup,
                                            fedavg_weights):
  process = methods.build_method(
      name, setup['model_fn'], setup['spec'],
      methods.Hyperparameters(**HPARAMS, **hparams))
  weights, _ = _run(setup, process)
  np.testing.assert_allclose(weights, fedavg_weights, rtol=1e-5, atol=1e-6)


def test_fedcos_term_is_zero_in_round_one_then_active(setup):
  process = methods.build_method(
      'fedcos', setup['model_fn'], setup['spec'],
      methods.Hyperparameters(**HPARAMS, mu=0.5))
  _, metrics = _run(setup, process)
  assert np.isclose(metrics[0]['objective'], metrics[0]['loss'])
  assert metrics[1]['objective'] > metrics[1]['loss'] + 1e-3


def test_fedmax_term_is_active(setup):
  process = methods.build_method(
      'fedmax', setup['model_fn'], setup['spec'],
      methods.Hyperparameters(**HPARAMS, beta=100.0))
  _, metrics = _run(setup, process, rounds=1)
  assert metrics[0]['objective'] > metrics[0]['loss'] + 1e-3


def test_fedprox_plus_fedcos_at_zero_fedcos_is_fedprox(setup):
  prox, _ = _run(setup, methods.build_method(
      'fedprox', setup['model_fn'], setup['spec'],
      methods.Hyperparameters(**HPARAMS, mu=1.0)))
  combined, _ = _run(setup, methods.build_method(
      'fedprox+fedcos', setup['model_fn'], setup['spec'],
      methods.Hyperparameters(**HPARAMS, strengths=(('fedprox', 1.0),
                                                    ('fedcos', 0.0)))))
  np.testing.assert_allclose(combined, prox, rtol=1e-5, atol=1e-6)
  with_cos, _ = _run(setup, methods.build_method(
      'fedprox+fedcos', setup['model_fn'], setup['spec'],
      methods.Hyperparameters(**HPARAMS, strengths=(('fedprox', 1.0),
                                                    ('fedcos', 1.0)))))
  assert not np.allclose(with_cos, prox, atol=1e-4)


@pytest.mark.parametrize('server, same', [('fedavg', True),
                                          ('fedavgm', False)])
def test_fedcos_directions_agree_under_fedavg_only(setup, server, same):
  def weights(direction):
    return _run(setup, methods.build_method(
        f'{server}+fedcos', setup['model_fn'], setup['spec'],
        methods.Hyperparameters(**HPARAMS, mu=0.5,
                                fedcos_direction=direction)))[0]

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
      'fedadam+fedcos', setup['model_fn'], setup['spec'],
      methods.Hyperparameters(**HPARAMS, mu=0.02, server_learning_rate=lr))
  weights, _ = _run(setup, process, rounds=1)
  averaged, _ = _run(setup, methods.build_method(
      'fedavg', setup['model_fn'], setup['spec'],
      methods.Hyperparameters(**HPARAMS)), rounds=1)
  start = model_lib.flat_trainable(setup['initial'])
  delta = averaged - start
  expected = start + lr * 0.1 * delta / (0.1 * np.abs(delta) + 1e-3)
  np.testing.assert_allclose(weights, expected, rtol=1e-4, atol=1e-7)
  assert not np.allclose(weights, start + lr * delta, atol=1e-5)


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
