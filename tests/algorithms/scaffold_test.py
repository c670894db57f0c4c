"""Tests for SCAFFOLD (option II).

Its claim, measured: on a least-squares problem whose clients have
different optima, with several local steps and full participation,
SCAFFOLD's global model converges to the global optimum while FedAvg's
stops at a measurably different point.
"""

import collections
import sys

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_methods.algorithms import scaffold
from tff_methods.clients import client_keys
from tff_methods.templates import local_training
from tff_methods.templates import model_lib
from tff_methods.templates import optimizers
from tff_methods.templates import processes

pytestmark = pytest.mark.usefixtures('tff_worker')

DIM, EXAMPLES, LOCAL_STEPS, LR = 3, 40, 10, 0.05


def _linear_model():
  x = tf.keras.Input((DIM,))
  prediction = tf.keras.layers.Dense(
    1, use_bias=False, kernel_initializer='zeros'
  )(x)
  return tf.keras.Model(x, {'features': x, 'logits': prediction})


@pytest.fixture(scope='module')
def problem():
  rng = np.random.default_rng(0)
  optima = rng.normal(size=(4, DIM)) * 2
  scales = [[3.0, 1.0, 0.3], [0.3, 1.0, 3.0], [1.0, 3.0, 0.3], [1.0, 0.3, 1.0]]
  data, gram, moment = {}, np.zeros((DIM, DIM)), np.zeros(DIM)
  for k in range(4):
    x = (rng.normal(size=(EXAMPLES, DIM)) * np.sqrt(scales[k])).astype(
      np.float32
    )
    y = (x @ optima[k]).astype(np.float32)[:, None]
    data[f'client_{k}'] = collections.OrderedDict(x=x, y=y)
    gram += x.T @ x
    moment += x.T @ y[:, 0]
  # Full-batch local gradient descent, LOCAL_STEPS steps a round.
  client_data = tff.simulation.datasets.TestClientData(data).preprocess(
    lambda ds: ds.batch(EXAMPLES).repeat(LOCAL_STEPS)
  )
  return dict(
    data=data,
    client_data=client_data,
    optimum=np.linalg.solve(gram, moment),
    spec=client_data.element_type_structure,
    initial=model_lib.initial_weights(_linear_model, 0),
  )


def _by_key(client_data):
  """The clients' data by (client_id, round_num) key (the same each round)."""

  @tff.tensorflow.computation(client_keys.CLIENT_KEY_TYPE)
  def dataset_for(key):
    return client_data.serializable_dataset_fn(key[0])

  return dataset_for


def _keys(client_ids, round_num):
  return [client_keys.client_key(c, round_num) for c in client_ids]


def _build_scaffold(problem, num_clients=4):
  return scaffold.build_scaffold(
    _linear_model,
    problem['spec'],
    dataset_computation=_by_key(problem['client_data']),
    client_learning_rate=LR,
    num_clients=num_clients,
    loss_fn=local_training.squared_error,
  )


def _train(process, problem, rounds, cohort=None):
  state = process.set_model_weights(process.initialize(), problem['initial'])
  for round_num in range(1, rounds + 1):
    state = process.next(
      state, _keys(cohort or problem['client_data'].client_ids, round_num)
    ).state
  return state, model_lib.flat_trainable(process.get_model_weights(state))


def test_scaffold_reaches_the_global_optimum_and_fedavg_does_not(problem):
  _, scaffold_weights = _train(_build_scaffold(problem), problem, rounds=60)
  fedavg = tff.simulation.compose_dataset_computation_with_learning_process(
    _by_key(problem['client_data']),
    processes.build_local_training_process(
      _linear_model,
      problem['spec'],
      optimizers.build_client_sgd(LR),
      client_weighting=tff.learning.ClientWeighting.UNIFORM,
      loss_fn=local_training.squared_error,
    ),
  )
  _, fedavg_weights = _train(fedavg, problem, rounds=60)
  scaffold_error = np.linalg.norm(scaffold_weights - problem['optimum'])
  fedavg_error = np.linalg.norm(fedavg_weights - problem['optimum'])
  assert scaffold_error < 1e-3
  assert fedavg_error > 0.05
  assert fedavg_error > 100 * scaffold_error


def test_control_variates_follow_option_two_with_partial_participation(problem):
  # N = 4 clients, |S| = 1 sampled: the server's control variate moves by
  # 1/4 of the client's change; with c = c_i = 0 at the start and server
  # learning rate 1, c_i_new = (w_g - w_g_new) / (K * eta).
  process = _build_scaffold(problem)
  cohort = [problem['client_data'].client_ids[2]]
  state, weights = _train(process, problem, rounds=1, cohort=cohort)
  client_control = process.client_states.get(cohort[0])['scaffold']
  start = model_lib.flat_trainable(problem['initial'])
  expected = (start - weights) / (LOCAL_STEPS * LR)
  np.testing.assert_allclose(
    np.ravel(client_control[0]), expected, rtol=1e-4, atol=1e-6
  )
  server_control = np.ravel(state.distributor['scaffold'][0])
  np.testing.assert_allclose(server_control, expected / 4, rtol=1e-4, atol=1e-6)
  # Clients not sampled keep the zero initial state.
  assert problem['client_data'].client_ids[0] not in process.client_states


def test_a_client_with_a_non_finite_update_is_not_counted_in_s(problem):
  # client_2 and a client whose data make its update NaN: |S| counts only
  # client_2, so c moves by 1/4 of client_2's change (not 2/4 of it).
  bad = collections.OrderedDict(
    x=np.full((EXAMPLES, DIM), np.nan, np.float32),
    y=np.zeros((EXAMPLES, 1), np.float32),
  )
  client_data = tff.simulation.datasets.TestClientData(
    dict(problem['data'], client_bad=bad)
  ).preprocess(lambda ds: ds.batch(EXAMPLES).repeat(LOCAL_STEPS))
  process = scaffold.build_scaffold(
    _linear_model,
    problem['spec'],
    dataset_computation=_by_key(client_data),
    client_learning_rate=LR,
    num_clients=4,
    loss_fn=local_training.squared_error,
  )
  state = process.set_model_weights(process.initialize(), problem['initial'])
  output = process.next(state, _keys(['client_2', 'client_bad'], 1))
  weights = model_lib.flat_trainable(process.get_model_weights(output.state))
  expected = (model_lib.flat_trainable(problem['initial']) - weights) / (
    LOCAL_STEPS * LR
  )
  server_control = np.ravel(output.state.distributor['scaffold'][0])
  np.testing.assert_allclose(server_control, expected / 4, rtol=1e-4, atol=1e-6)
  # The diverged client keeps its (zero) control variate.
  np.testing.assert_array_equal(
    process.client_states.get('client_bad')['scaffold'][0], 0.0
  )


def test_niid_benchs_variant_averages_by_examples_and_keeps_option_two(problem):
  # client_0 with 40 examples, client_2 with 10. Round 1 (c = c_i = 0) is
  # local training alone; the model average weighs client_0 by 40 / 50.
  data = dict(problem['data'])
  data['client_2'] = collections.OrderedDict(
    (k, v[:10]) for k, v in data['client_2'].items()
  )
  client_data = tff.simulation.datasets.TestClientData(data).preprocess(
    lambda ds: ds.batch(EXAMPLES).repeat(LOCAL_STEPS)
  )

  def one_round(cohort, weighting):
    process = scaffold.build_scaffold(
      _linear_model,
      problem['spec'],
      dataset_computation=_by_key(client_data),
      client_learning_rate=LR,
      num_clients=4,
      loss_fn=local_training.squared_error,
      client_momentum=0.5,
      client_weighting=weighting,
    )
    state = process.set_model_weights(process.initialize(), problem['initial'])
    state = process.next(state, _keys(cohort, 1)).state
    return process, model_lib.flat_trainable(process.get_model_weights(state))

  _, alone_0 = one_round(['client_0'], tff.learning.ClientWeighting.UNIFORM)
  _, alone_2 = one_round(['client_2'], tff.learning.ClientWeighting.UNIFORM)
  process, weighted = one_round(
    ['client_0', 'client_2'], tff.learning.ClientWeighting.NUM_EXAMPLES
  )
  np.testing.assert_allclose(
    weighted, 0.8 * alone_0 + 0.2 * alone_2, rtol=1e-5, atol=1e-6
  )
  _, uniform = one_round(
    ['client_0', 'client_2'], tff.learning.ClientWeighting.UNIFORM
  )
  np.testing.assert_allclose(
    uniform, 0.5 * (alone_0 + alone_2), rtol=1e-5, atol=1e-6
  )
  # With momentum the control variate still follows option II.
  start = model_lib.flat_trainable(problem['initial'])
  np.testing.assert_allclose(
    np.ravel(process.client_states.get('client_0')['scaffold'][0]),
    (start - alone_0) / (LOCAL_STEPS * LR),
    rtol=1e-4,
    atol=1e-6,
  )


def test_bad_client_count_is_named(problem):
  with pytest.raises(ValueError, match='num_clients must be >= 1, got 0'):
    _build_scaffold(problem, num_clients=0)


def test_more_clients_than_num_clients_are_refused_before_the_round(problem):
  # N is |S|/N's population: 4 clients in a round built for 2 would move c
  # by 4/2 of the mean change.
  process = _build_scaffold(problem, num_clients=2)
  state = process.initialize()
  state = process.next(state, _keys(['client_0', 'client_1'], 1)).state
  with pytest.raises(
    ValueError,
    match=r'SCAFFOLD num_clients=2 is the number of all clients, but 3 '
    r'distinct clients have taken part by round 2',
  ):
    process.next(state, _keys(['client_2'], 2))
  assert process.client_states.versions('client_2') == []


def _niid_bench_round(x, y, w_global, c, c_i, momentum):
  """NIID-Bench's `train_net_scaffold` for one client, in numpy: SGD with
  momentum (a fresh buffer each round) on the data loss, then
  `w -= lr (c - c_i)` after every `optimizer.step()`."""
  w, buffer = w_global.copy(), None
  for _ in range(LOCAL_STEPS):
    gradient = x.T @ (x @ w - y) / len(x)  # of 0.5 mean (x w - y)^2
    buffer = gradient if buffer is None else momentum * buffer + gradient
    w = w - LR * buffer
    w = w - LR * (c - c_i)
  c_i_new = c_i - c + (w_global - w) / (LOCAL_STEPS * LR)
  return w, c_i_new


def test_momentum_leaves_the_correction_outside_as_niid_bench_does(problem):
  # client_0 alone, 2 rounds, N = 4, momentum 0.9. Round 2 has
  # c - c_i = c_0 / 4 - c_0 != 0, which NIID-Bench applies outside momentum.
  x = problem['data']['client_0']['x'].astype(np.float64)
  y = problem['data']['client_0']['y'][:, 0].astype(np.float64)
  w_global = model_lib.flat_trainable(problem['initial']).astype(np.float64)
  c = c_i = np.zeros(DIM)
  for _ in range(2):
    w, c_i_new = _niid_bench_round(x, y, w_global, c, c_i, momentum=0.9)
    w_global, c = w, c + (1 / 4) * (c_i_new - c_i)
    c_i = c_i_new
  process = scaffold.build_scaffold(
    _linear_model,
    problem['spec'],
    dataset_computation=_by_key(problem['client_data']),
    client_learning_rate=LR,
    num_clients=4,
    loss_fn=local_training.squared_error,
    client_momentum=0.9,
  )
  state, weights = _train(process, problem, rounds=2, cohort=['client_0'])
  assert np.abs(c - c_i).max() > 0.1  # the correction matters in round 2
  np.testing.assert_allclose(weights, w_global, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(
    np.ravel(process.client_states.get('client_0')['scaffold'][0]),
    c_i,
    rtol=1e-4,
    atol=1e-5,
  )
  np.testing.assert_allclose(
    np.ravel(state.distributor['scaffold'][0]), c, rtol=1e-4, atol=1e-5
  )


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
