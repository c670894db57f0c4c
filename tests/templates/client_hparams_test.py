"""Tests for tff_methods.templates.client_hparams: TFF's optimizer interfaces.

Every builder's process reads and sets the client and server learning
rates through `get_hparams`/`set_hparams` as TFF's processes do, takes a
per-round client learning-rate schedule as TFF's
`build_weighted_fed_avg_with_optimizer_schedule` does, and SCAFFOLD takes
TFF's optimizer arguments.
"""

import collections
import sys

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_methods.algorithms import fedavg
from tff_methods.algorithms import moon
from tff_methods.algorithms import scaffold
from tff_methods.clients import client_keys
from tff_methods.templates import client_hparams
from tff_methods.templates import model_lib
from tff_methods.templates import stateful

pytestmark = pytest.mark.usefixtures('tff_worker')


def _sequential():
  return tf.keras.Sequential(
    [
      tf.keras.Input((4,)),
      tf.keras.layers.Dense(8, activation='relu', name='hidden'),
      tf.keras.layers.Dense(3, name='scores'),
    ]
  )


MODEL_FN = model_lib.named_outputs(_sequential, z='hidden')


def _client_data():
  rng = np.random.default_rng(0)
  data = collections.OrderedDict()
  for i, size in enumerate((8, 16)):
    data[f'client_{i}'] = collections.OrderedDict(
      x=rng.normal(size=(size, 4)).astype(np.float32),
      y=rng.integers(0, 3, size=size).astype(np.int32),
    )
  return tff.simulation.datasets.TestClientData(data).preprocess(
    lambda ds: ds.batch(4)
  )


CLIENT_DATA = _client_data()
SPEC = CLIENT_DATA.element_type_structure
IDS = CLIENT_DATA.client_ids


def _sgd(learning_rate):
  return tff.learning.optimizers.build_sgdm(learning_rate, momentum=0.5)


def _start(process):
  return process.set_model_weights(
    process.initialize(), model_lib.initial_weights(MODEL_FN, 0)
  )


def _round(process, state, round_num):
  if isinstance(process, stateful.StatefulClientsLearningProcess):
    clients = [client_keys.client_key(c, round_num) for c in IDS]
  else:
    clients = [CLIENT_DATA.create_tf_dataset_for_client(c) for c in IDS]
  return process.next(state, clients)


def _weights(process, state):
  return model_lib.flat_trainable(process.get_model_weights(state))


BUILDERS = {
  'fedavg': lambda lr, **kw: fedavg.build_fedavg(
    MODEL_FN, SPEC, client_optimizer_fn=_sgd(lr), **kw
  ),
  'moon': lambda lr, **kw: moon.build_moon(
    MODEL_FN,
    SPEC,
    dataset_computation=CLIENT_DATA,
    client_optimizer_fn=_sgd(lr),
    mu=1.0,
    **kw,
  ),
  'scaffold': lambda lr, **kw: scaffold.build_scaffold(
    MODEL_FN,
    SPEC,
    dataset_computation=CLIENT_DATA,
    client_optimizer_fn=_sgd(lr),
    num_clients=2,
    **kw,
  ),
}


@pytest.fixture(scope='module')
def tffs_hparams():
  theirs = tff.learning.algorithms.build_weighted_fed_avg(
    model_lib.tff_model_fn(MODEL_FN, SPEC),
    client_optimizer_fn=_sgd(0.1),
    server_optimizer_fn=tff.learning.optimizers.build_sgdm(0.7),
  )
  return theirs.get_hparams(theirs.initialize())


@pytest.mark.parametrize('method', list(BUILDERS))
def test_get_hparams_reads_both_learning_rates_as_tffs_do(method, tffs_hparams):
  process = BUILDERS[method](
    0.1, server_optimizer_fn=tff.learning.optimizers.build_sgdm(0.7)
  )
  ours = process.get_hparams(process.initialize())
  expected = tffs_hparams
  assert ours['client_work']['learning_rate'] == pytest.approx(0.1)
  assert ours['finalizer']['learning_rate'] == pytest.approx(0.7)
  assert tf.nest.map_structure(float, ours) == tf.nest.map_structure(
    float, expected
  )


@pytest.mark.parametrize('method', list(BUILDERS))
def test_set_hparams_trains_as_a_process_built_with_those_rates(method):
  # Two rounds at 0.1, then the client rate set to 0.3: the same as a
  # process that ran its first rounds at 0.1 and was built at 0.3 (for
  # SCAFFOLD eta in the correction and in c_i moves too).
  process = BUILDERS[method](0.1)
  state = _start(process)
  state = _round(process, state, 1).state
  hparams = process.get_hparams(state)
  hparams['client_work']['learning_rate'] = 0.3
  state = process.set_hparams(state, hparams)
  assert process.get_hparams(state)['client_work'][
    'learning_rate'
  ] == pytest.approx(0.3)
  set_weights = _weights(process, _round(process, state, 2).state)

  scheduled = BUILDERS[method](
    0.1, client_learning_rate_fn=lambda r: tf.where(tf.equal(r, 0), 0.1, 0.3)
  )
  state = _start(scheduled)
  state = _round(scheduled, state, 1).state
  output = _round(scheduled, state, 2)
  assert output.metrics['client_work']['client_learning_rate'] == (
    pytest.approx(0.3)
  )
  np.testing.assert_allclose(
    _weights(scheduled, output.state), set_weights, rtol=1e-5, atol=1e-6
  )
  if method == 'fedavg':  # The rate set moved the weights.
    unchanged = BUILDERS[method](0.1)
    state = _round(unchanged, _start(unchanged), 1).state
    state = _round(unchanged, state, 2).state
    assert np.abs(_weights(unchanged, state) - set_weights).max() > 1e-4


def test_a_schedule_trains_as_tffs_fed_avg_with_optimizer_schedule():
  def schedule(round_num):
    return 0.2 * tf.pow(0.5, tf.cast(round_num, tf.float32))

  ours = fedavg.build_fedavg(
    MODEL_FN,
    SPEC,
    client_optimizer_fn=lambda lr: tff.learning.optimizers.build_sgdm(lr),
    client_learning_rate_fn=schedule,
  )
  theirs = (
    tff.learning.algorithms.build_weighted_fed_avg_with_optimizer_schedule(
      model_lib.tff_model_fn(MODEL_FN, SPEC),
      client_learning_rate_fn=schedule,
      client_optimizer_fn=lambda lr: tff.learning.optimizers.build_sgdm(lr),
    )
  )
  trained, rates = [], []
  for process in (ours, theirs):
    state, learning_rates = _start(process), []
    for round_num in (1, 2, 3):
      output = _round(process, state, round_num)
      state = output.state
      learning_rates.append(
        output.metrics['client_work']['client_learning_rate']
      )
    trained.append(_weights(process, state))
    rates.append(learning_rates)
  np.testing.assert_allclose(rates[0], [0.2, 0.1, 0.05], rtol=1e-6)
  np.testing.assert_allclose(rates[0], rates[1], rtol=1e-6)
  np.testing.assert_allclose(trained[0], trained[1], rtol=1e-5, atol=1e-6)


def test_scaffold_takes_tffs_optimizer_arguments():
  by_rate = BUILDERS['scaffold'](0.1)  # TFF's SGD with momentum 0.5.
  by_name = scaffold.build_scaffold(
    MODEL_FN,
    SPEC,
    dataset_computation=CLIENT_DATA,
    client_learning_rate=0.1,
    client_momentum=0.5,
    server_learning_rate=1.0,
    num_clients=2,
  )
  weights = []
  for process in (by_rate, by_name):
    state = _start(process)
    for round_num in (1, 2):
      state = _round(process, state, round_num).state
    weights.append(_weights(process, state))
  np.testing.assert_allclose(weights[0], weights[1], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(
  'kwargs, match',
  [
    (
      dict(client_optimizer_fn=tff.learning.optimizers.build_adam(0.01)),
      r"assume SGD steps.*\['beta_1', 'beta_2', 'epsilon', 'learning_rate'\]",
    ),
    (
      dict(client_optimizer_fn=_sgd(0.1), client_learning_rate=0.1),
      'not both',
    ),
    (dict(), 'needs client_optimizer_fn'),
    (
      dict(
        client_learning_rate=0.1,
        server_learning_rate=1.0,
        server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0),
      ),
      'server_optimizer_fn or server_learning_rate, not both',
    ),
  ],
)
def test_scaffold_refuses_optimizers_it_cant_take(kwargs, match):
  with pytest.raises(ValueError, match=match):
    scaffold.build_scaffold(
      MODEL_FN, SPEC, dataset_computation=CLIENT_DATA, num_clients=2, **kwargs
    )


def test_a_schedule_needs_an_optimizer_with_a_learning_rate():
  class NoRate(tff.learning.optimizers.Optimizer):
    def initialize(self, specs):
      return collections.OrderedDict(scale=1.0)

    def next(self, state, weights, gradients):
      return state, weights

    def get_hparams(self, state):
      return collections.OrderedDict(scale=state['scale'])

    def set_hparams(self, state, hparams):
      return hparams

  with pytest.raises(ValueError, match=r"'learning_rate'.*\['scale'\]"):
    client_hparams.ClientHparams(NoRate(), lambda r: 0.1)
  with pytest.raises(TypeError, match='function of the round number'):
    client_hparams.ClientHparams(_sgd(0.1), 0.1)


def test_scaffolds_eta_is_the_client_learning_rate_that_was_set():
  # eta in the correction and in c_i's update must follow set_hparams:
  # built at 0.1 and set to 0.3 trains as built at 0.3.
  weights = []
  for built, set_to in ((0.3, None), (0.1, 0.3)):
    process = BUILDERS['scaffold'](built)
    state = _start(process)
    if set_to is not None:
      hparams = process.get_hparams(state)
      hparams['client_work']['learning_rate'] = set_to
      state = process.set_hparams(state, hparams)
    for round_num in (1, 2, 3):
      state = _round(process, state, round_num).state
    weights.append(_weights(process, state))
  np.testing.assert_allclose(weights[1], weights[0], rtol=1e-5, atol=1e-6)


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
