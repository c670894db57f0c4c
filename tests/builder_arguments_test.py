"""Every builder argument reaches what uses it.

For each method's builder, one argument is changed at a time from a base
build and two rounds are run from the same initial weights: the trained
weights must move. A builder that drops an argument (MOON's temperature
left at its default, FedCKA's M or similarity, FedCos's direction,
SCAFFOLD's weighting, ...) gives the base's weights again. The clients
hold different numbers of examples, so weighting shows too.
"""

import collections
import sys

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_methods.algorithms import fedavg
from tff_methods.algorithms import fedcka
from tff_methods.algorithms import fedcos
from tff_methods.algorithms import fedmax
from tff_methods.algorithms import fedprox
from tff_methods.algorithms import hyperparameters
from tff_methods.algorithms import moon
from tff_methods.algorithms import scaffold
from tff_methods.clients import client_keys
from tff_methods.templates import aggregation
from tff_methods.templates import model_lib
from tff_methods.templates import optimizers
from tff_methods.templates import processes
from tff_methods.templates import stateful

pytestmark = pytest.mark.usefixtures('tff_worker')

# Clients of different sizes: weighting by examples and uniform differ.
CLIENT_SIZES = (4, 12, 36)


def _sequential():
  return tf.keras.Sequential(
    [
      tf.keras.Input((4,)),
      tf.keras.layers.Dense(8, activation='relu', name='hidden'),
      tf.keras.layers.Dense(3, name='scores'),
    ]
  )


# Every output a method reads: FedCKA's layers, FedMAX's features, MOON's z.
MODEL_FN = model_lib.named_outputs(
  _sequential, features='hidden', z='hidden', layers=['hidden', 'scores']
)


def _client_data():
  rng = np.random.default_rng(0)
  data = collections.OrderedDict()
  for i, size in enumerate(CLIENT_SIZES):
    data[f'client_{i}'] = collections.OrderedDict(
      x=rng.normal(size=(size, 4)).astype(np.float32),
      y=rng.integers(0, 3, size=size).astype(np.int32),
    )
  return tff.simulation.datasets.TestClientData(data).preprocess(
    lambda ds: ds.batch(4)
  )


CLIENT_DATA = _client_data()
SPEC = CLIENT_DATA.element_type_structure
SGD = optimizers.build_client_sgd(0.2)
SERVER_MOMENTUM = tff.learning.optimizers.build_sgdm(1.0, momentum=0.9)


def _stateless(build, **changed):
  return build(
    MODEL_FN,
    SPEC,
    client_optimizer_fn=SGD,
    dataset_computation=CLIENT_DATA,
    **changed,
  )


def _stateful(build, **changed):
  kwargs = dict(client_optimizer_fn=SGD)
  kwargs.update(changed)
  return build(MODEL_FN, SPEC, dataset_computation=CLIENT_DATA, **kwargs)


def _scaffold(**changed):
  kwargs = dict(client_learning_rate=0.2, num_clients=len(CLIENT_SIZES))
  kwargs.update(changed)
  return scaffold.build_scaffold(
    MODEL_FN, SPEC, dataset_computation=CLIENT_DATA, **kwargs
  )


def _trained(process, rounds=2):
  """The flat trainable weights after `rounds` rounds of every client."""
  state = process.set_model_weights(
    process.initialize(), model_lib.initial_weights(MODEL_FN, 0)
  )
  ids = CLIENT_DATA.client_ids
  for round_num in range(1, rounds + 1):
    if isinstance(process, stateful.StatefulClientsLearningProcess):
      clients = [client_keys.client_key(c, round_num) for c in ids]
    else:
      clients = ids
    state = process.next(state, clients).state
  return model_lib.flat_trainable(process.get_model_weights(state))


UNIFORM = tff.learning.ClientWeighting.UNIFORM
NUM_EXAMPLES = tff.learning.ClientWeighting.NUM_EXAMPLES

# (method, build(**changed), base arguments, one argument changed).
CASES = [
  (
    'fedavg',
    lambda **a: _stateless(fedavg.build_fedavg, **a),
    {},
    dict(client_weighting=UNIFORM),
  ),
  (
    'fedprox',
    lambda **a: _stateless(fedprox.build_fedprox, **a),
    dict(mu=0.1),
    dict(mu=1.0),
  ),
  (
    'fedmax',
    lambda **a: _stateless(fedmax.build_fedmax, **a),
    dict(beta=1.0),
    dict(beta=20.0),
  ),
  (
    'fedcos',
    lambda **a: _stateless(fedcos.build_fedcos, **a),
    dict(mu=0.5),
    dict(mu=2.0),
  ),
  # The two directions agree under plain averaging: they part with a
  # server optimizer of momentum.
  (
    'fedcos',
    lambda **a: _stateless(fedcos.build_fedcos, **a),
    dict(
      mu=0.5,
      server_optimizer_fn=SERVER_MOMENTUM,
    ),
    dict(
      mu=0.5,
      server_optimizer_fn=SERVER_MOMENTUM,
      direction='mean_client_update',
    ),
  ),
  (
    'moon',
    lambda **a: _stateful(moon.build_moon, **a),
    dict(mu=1.0),
    dict(mu=1.0, temperature=0.1),
  ),
  (
    'fedcka',
    lambda **a: _stateful(fedcka.build_fedcka, **a),
    dict(mu=1.0, layers=1),
    dict(mu=1.0, layers=2),
  ),
  (
    'fedcka',
    lambda **a: _stateful(fedcka.build_fedcka, **a),
    dict(mu=1.0, layers=1),
    dict(mu=1.0, layers=1, similarity='frobenius'),
  ),
  ('scaffold', _scaffold, {}, dict(client_weighting=NUM_EXAMPLES)),
  ('scaffold', _scaffold, {}, dict(num_clients=10)),
  ('scaffold', _scaffold, {}, dict(client_momentum=0.5)),
]

_BASES = {}


def _base(method, build, base, rounds):
  key = (method, repr(sorted(base.items())), rounds)
  if key not in _BASES:
    _BASES[key] = _trained(build(**base), rounds)
  return _BASES[key]


def _case_id(case):
  method, _, base, changed = case
  differs = [k for k, v in changed.items() if k not in base or base[k] is not v]
  return (
    method
    + '-'
    + ','.join(
      f'{k}={changed[k]}' if isinstance(changed[k], (int, float, str)) else k
      for k in differs
    )
  )


@pytest.mark.parametrize(
  'method,build,base,changed', CASES, ids=[_case_id(c) for c in CASES]
)
def test_changing_one_builder_argument_changes_the_trained_weights(
  method, build, base, changed
):
  # FedCos's two directions part only in the third round (in the second
  # both are the first round's move, whose length the cosine ignores).
  rounds = 3 if 'direction' in changed else 2
  expected_unchanged = _base(method, build, base, rounds)
  moved = _trained(build(**changed), rounds)
  assert np.max(np.abs(moved - expected_unchanged)) > 1e-4, (
    f'{method}: {changed} trains to the same weights as {base}: the '
    'builder does not hand the argument to what uses it.'
  )


def test_moons_builder_trains_as_its_term_at_the_temperature_asked():
  # build_moon(temperature=t) must be the stateful process with MOON's term
  # at t itself, not at the term's default.
  built = _trained(_stateful(moon.build_moon, mu=1.0, temperature=0.1))
  by_hand = _trained(
    processes.build_local_training_process(
      MODEL_FN,
      SPEC,
      SGD,
      None,
      [moon.ModelContrastiveTerm(1.0, temperature=0.1)],
      dataset_computation=CLIENT_DATA,
    )
  )
  np.testing.assert_allclose(built, by_hand, rtol=1e-6, atol=1e-6)


def _first_move(process):
  """The global model's move in one round of every client."""
  start = model_lib.initial_weights(MODEL_FN, 0)
  state = process.set_model_weights(process.initialize(), start)
  state = process.next(state, CLIENT_DATA.client_ids).state
  return model_lib.flat_trainable(
    process.get_model_weights(state)
  ) - model_lib.flat_trainable(start)


def _dp_first_move(**dp):
  """FedAvg's first move under the DP aggregator the binaries' settings
  (`Hyperparameters`) build."""
  settings = hyperparameters.Hyperparameters(aggregator='dp', **dp)
  return _first_move(
    _stateless(
      fedavg.build_fedavg, model_aggregator=settings.model_aggregator()
    )
  )


def test_the_fixed_dp_clip_asked_is_the_clip_applied():
  uniform_mean = _first_move(
    _stateless(fedavg.build_fedavg, client_weighting=UNIFORM)
  )
  # Above TFF's adaptive clip's start (0.1): an adaptive clip in place of
  # the fixed one would not give the mean back.
  assert np.linalg.norm(uniform_mean) > 0.2
  unclipped = _dp_first_move(
    dp_clip=1e6, dp_noise_multiplier=0.0, clients_per_round=3
  )
  np.testing.assert_allclose(unclipped, uniform_mean, rtol=1e-5, atol=1e-6)
  clipped = _dp_first_move(
    dp_clip=0.01, dp_noise_multiplier=0.0, clients_per_round=3
  )
  assert 0 < np.linalg.norm(clipped) <= 0.01 * (1 + 1e-5)


@pytest.mark.parametrize('clients_per_round', [2, 20])
def test_the_dp_noise_is_the_multiplier_times_the_clip_over_the_cohort(
  clients_per_round,
):
  # Updates clipped to 0.01 and noise of 100 clips: the move is the noise,
  # of standard deviation 100 * 0.01 / clients_per_round per weight. Over
  # 67 weights the estimate is within 50% far beyond chance.
  move = _dp_first_move(
    dp_clip=0.01,
    dp_noise_multiplier=100.0,
    clients_per_round=clients_per_round,
  )
  expected = 100.0 * 0.01 / clients_per_round
  assert expected / 1.5 < np.std(move) < expected * 1.5


def test_an_unweighted_factory_weights_clients_uniformly():
  # TFF's `as_weighted_aggregator` drops the weights, so the mean can't
  # show it: a client without examples must still count as a client that
  # trained (weight 1), not as a diverged one (weight 0, state kept).
  dp = tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed(
    noise_multiplier=0.0, clients_per_round=2, clip=1e6
  )
  _, weighting = aggregation.model_aggregation(dp, None)
  assert weighting == UNIFORM
  data = tff.simulation.datasets.TestClientData(
    collections.OrderedDict(
      empty=collections.OrderedDict(
        x=np.zeros((0, 4), np.float32), y=np.zeros((0,), np.int32)
      ),
      full=collections.OrderedDict(
        x=np.ones((8, 4), np.float32), y=np.zeros((8,), np.int32)
      ),
    )
  ).preprocess(lambda ds: ds.batch(4))
  process = fedcka.build_fedcka(
    MODEL_FN,
    SPEC,
    dataset_computation=data,
    client_optimizer_fn=SGD,
    mu=0.0,
    layers=1,
    model_aggregator=dp,
  )
  state = process.set_model_weights(
    process.initialize(), model_lib.initial_weights(MODEL_FN, 0)
  )
  process.next(state, [client_keys.client_key(c, 1) for c in data.client_ids])
  assert process.client_states.get('empty')['has_previous'] == 1


def _first_move_of(method, **aggregation_args):
  if method == 'fedavg':
    return _first_move(_stateless(fedavg.build_fedavg, **aggregation_args))
  process = _stateful(fedcka.build_fedcka, mu=0.0, layers=1, **aggregation_args)
  start = model_lib.initial_weights(MODEL_FN, 0)
  state = process.set_model_weights(process.initialize(), start)
  keys = [client_keys.client_key(c, 1) for c in CLIENT_DATA.client_ids]
  state = process.next(state, keys).state
  return model_lib.flat_trainable(
    process.get_model_weights(state)
  ) - model_lib.flat_trainable(start)


FAMILIES = {
  # Each family with its clipping, zeroing and noise off: the mean it
  # computes is left, weighted by examples or uniform.
  'robust': lambda: tff.learning.robust_aggregator(
    zeroing=False, clipping=False
  ),
  'compression': lambda: tff.learning.compression_aggregator(
    zeroing=False, clipping=False
  ),
  'secure': lambda: tff.learning.secure_aggregator(
    zeroing=False, clipping=False
  ),
  'dp': lambda: tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed(
    noise_multiplier=0.0, clients_per_round=len(CLIENT_SIZES), clip=1e6
  ),
}


@pytest.mark.parametrize(
  'method, family',
  # The stateful processes take their weighting from the same
  # `aggregation.model_aggregation`: FedCKA under DP's uniform weighting.
  [('fedavg', family) for family in FAMILIES] + [('fedcka', 'dp')],
)
def test_each_aggregator_family_weights_clients_as_tffs_does(method, family):
  # Clients of 4, 12 and 36 examples: the weighted families give the
  # example-weighted mean, DP (unweighted) the uniform one.
  key = (method, 'means')
  if key not in _BASES:
    _BASES[key] = (
      _first_move_of(method),
      _first_move_of(method, client_weighting=UNIFORM),
    )
  weighted, uniform = _BASES[key]
  assert np.abs(weighted - uniform).max() > 1e-3
  expected = uniform if family == 'dp' else weighted
  moved = _first_move_of(method, model_aggregator=FAMILIES[family]())
  np.testing.assert_allclose(moved, expected, rtol=1e-5, atol=1e-5)


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
