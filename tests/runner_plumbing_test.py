"""Every setting travels from the runner's config into its method's builder.

`experiment.build_process` is run with each builder the registry calls
(the shared loop's two, and the processes of SCAFFOLD, Fed2 and TFF's
FedAvg) replaced by a recorder, and each setting given a value other than
its default: the builder must receive that value, in its arguments or in
the terms it is given (a setting only its default exercises, or one
dropped on the way, fails here). SCAFFOLD's N is also checked on a
real round: the runner's process moves `c` by |S|/N of the mean change.
"""

import inspect
import os
import sys
import types

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_methods.algorithms import fed2
from tff_methods.algorithms import fedavg
from tff_methods.algorithms import fedcka
from tff_methods.algorithms import fedcos
from tff_methods.algorithms import fedmax
from tff_methods.algorithms import fedprox
from tff_methods.algorithms import moon
from tff_methods.algorithms import scaffold
from tff_methods.clients import client_keys
from tff_methods.templates import processes
from tff_methods_tooling import experiment

BUILDERS = [
  (processes, 'build_local_training_process'),
  (fedavg, 'build_tff_fedavg'),
  (scaffold, 'build_scaffold'),
  (fed2, 'build_fed2'),
]
# Their signatures, read before any test replaces them.
SIGNATURES = {name: inspect.signature(getattr(m, name)) for m, name in BUILDERS}


@pytest.fixture(scope='module')
def data(tmp_path_factory):
  return experiment.load_data(
    experiment.ExperimentConfig(
      task='digits',
      num_clients=4,
      clients_per_round=2,
      cache_dir=str(tmp_path_factory.mktemp('cache')),
    )
  )


def _builds(monkeypatch, data, tmp_path, **settings):
  """(builder name, its keyword arguments) the runner calls for `settings`."""
  calls = []
  for module, name in BUILDERS:

    def record(*args, _name=name, _signature=SIGNATURES[name], **kwargs):
      # Every argument by its name, given by position or keyword.
      calls.append((_name, _signature.bind(*args, **kwargs).arguments))
      return types.SimpleNamespace(client_states=None)

    monkeypatch.setattr(module, name, record)
  config = experiment.ExperimentConfig(
    **{
      'task': 'digits',
      'num_clients': 4,
      'clients_per_round': 2,
      'output_dir': str(tmp_path / 'run'),
      **settings,
    }
  )
  experiment.validate(config)
  experiment.build_process(config, data)
  (call,) = calls
  return call


def _term(kwargs, kind):
  """The one term of `kind` the builder was given."""
  (term,) = [t for t in kwargs['regularizers'] if isinstance(t, kind)]
  return term


def _hparams(optimizer):
  return {
    k: float(v)
    for k, v in optimizer.get_hparams(
      optimizer.initialize(tf.TensorSpec([], tf.float32))
    ).items()
  }


def test_client_and_server_optimizer_settings_reach_the_builder(
  monkeypatch, data, tmp_path
):
  name, kwargs = _builds(
    monkeypatch,
    data,
    tmp_path,
    method='fedavgm',
    model='mlp',
    client_learning_rate=0.07,
    client_momentum=0.5,
    weight_decay=0.001,
    server_learning_rate=0.3,
    server_momentum=0.7,
  )
  assert name == 'build_local_training_process'
  assert not kwargs.get('regularizers')
  client = kwargs['client_optimizer_fn']
  assert _hparams(client) == pytest.approx(
    dict(learning_rate=0.07, momentum=0.5)
  )
  assert client._weight_decay == 0.001
  assert _hparams(kwargs['server_optimizer_fn']) == pytest.approx(
    dict(learning_rate=0.3, momentum=0.7)
  )
  _, kwargs = _builds(
    monkeypatch,
    data,
    tmp_path,
    method='fedadam',
    model='mlp',
    server_learning_rate=0.02,
  )
  assert _hparams(kwargs['server_optimizer_fn'])['learning_rate'] == (
    pytest.approx(0.02)
  )


def test_each_methods_strengths_and_options_reach_its_builder(
  monkeypatch, data, tmp_path
):
  _, kwargs = _builds(
    monkeypatch, data, tmp_path, method='fedprox', model='mlp', mu=0.3
  )
  assert _term(kwargs, fedprox.ProximalTerm).mu == 0.3
  _, kwargs = _builds(
    monkeypatch, data, tmp_path, method='fedmax', model='mlp', fedmax_beta=7.0
  )
  assert _term(kwargs, fedmax.ActivationEntropyTerm).beta == 7.0
  name, kwargs = _builds(
    monkeypatch,
    data,
    tmp_path,
    method='fedprox+fedcos',
    model='mlp',
    fedprox_mu=0.2,
    fedcos_mu=0.04,
    fedcos_direction='mean_client_update',
  )
  assert name == 'build_local_training_process'
  direction = _term(kwargs, fedcos.DirectionPenalty)
  assert (direction.mu, direction.direction) == (0.04, 'mean_client_update')
  assert _term(kwargs, fedprox.ProximalTerm).mu == 0.2
  name, kwargs = _builds(
    monkeypatch,
    data,
    tmp_path,
    method='moon',
    model='fedcka_cnn',
    mu=2.0,
    moon_temperature=0.1,
  )
  assert name == 'build_local_training_process'
  contrast = _term(kwargs, moon.ModelContrastiveTerm)
  assert (contrast.mu, contrast.temperature) == (2.0, 0.1)
  assert kwargs['client_state_dir'] == str(tmp_path / 'run' / 'client_states')
  _, kwargs = _builds(
    monkeypatch,
    data,
    tmp_path,
    method='fedcka',
    model='fedcka_cnn',
    mu=4.0,
    fedcka_layers=3,
    fedcka_similarity='kernel_cka',
    client_state_dir=str(tmp_path / 'states'),
  )
  cka = _term(kwargs, fedcka.CKAContrastiveTerm)
  assert (cka.mu, cka.layers, cka.similarity) == (4.0, 3, 'kernel_cka')
  # A directory of the run's own under the one given, claimed by the run.
  assert os.path.dirname(kwargs['client_state_dir']) == str(tmp_path / 'states')
  with open(os.path.join(kwargs['client_state_dir'], 'owner.txt')) as f:
    assert f.read().strip() == str(tmp_path / 'run')
  _, kwargs = _builds(
    monkeypatch,
    data,
    tmp_path,
    method='fed2',
    model='fedcka_cnn',
    fed2_groups=2,
  )
  assert kwargs['num_groups'] == 2


def test_scaffolds_settings_reach_its_builder(monkeypatch, data, tmp_path):
  _, kwargs = _builds(
    monkeypatch,
    data,
    tmp_path,
    method='scaffold',
    model='mlp',
    client_learning_rate=0.07,
    server_learning_rate=0.5,
    weight_decay=0.001,
    scaffold_weighting='num_examples',
    scaffold_momentum=True,
    client_momentum=0.8,
  )
  assert kwargs['num_clients'] == 4  # all clients, not the 2 per round
  assert kwargs['client_learning_rate'] == 0.07
  assert kwargs['server_learning_rate'] == 0.5
  assert kwargs['weight_decay'] == 0.001
  assert kwargs['client_momentum'] == 0.8
  assert kwargs['client_weighting'] == (
    tff.learning.ClientWeighting.NUM_EXAMPLES
  )
  _, kwargs = _builds(
    monkeypatch,
    data,
    tmp_path,
    method='scaffold',
    model='mlp',
    client_momentum=0.8,
  )
  assert kwargs['client_momentum'] == 0.0  # the paper's plain SGD
  assert kwargs['client_weighting'] == tff.learning.ClientWeighting.UNIFORM


def test_the_aggregator_settings_reach_every_builder(
  monkeypatch, data, tmp_path
):
  # SCAFFOLD is refused under DP (its control variates would escape the
  # noise): it takes TFF's robust aggregator here.
  for method, model, aggregator, factory in (
    ('fedavg', 'mlp', 'dp', tff.aggregators.UnweightedAggregationFactory),
    ('moon', 'fedcka_cnn', 'dp', tff.aggregators.UnweightedAggregationFactory),
    ('scaffold', 'mlp', 'robust', tff.aggregators.WeightedAggregationFactory),
    ('fed2', 'fedcka_cnn', 'dp', tff.aggregators.UnweightedAggregationFactory),
  ):
    _, kwargs = _builds(
      monkeypatch,
      data,
      tmp_path,
      method=method,
      model=model,
      aggregator=aggregator,
      dp_noise_multiplier=0.05,
      dp_clip=0.5,
    )
    assert isinstance(kwargs['model_aggregator'], factory), method
    _, kwargs = _builds(monkeypatch, data, tmp_path, method=method, model=model)
    assert kwargs.get('model_aggregator') is None, method


@pytest.mark.usefixtures('tff_worker')
def test_scaffold_through_the_runner_moves_c_by_the_sampled_share(
  data, tmp_path
):
  config = experiment.ExperimentConfig(
    method='scaffold',
    task='digits',
    model='mlp',
    num_clients=4,
    clients_per_round=2,
    output_dir=str(tmp_path / 'run'),
  )
  process, _ = experiment.build_process(config, data)
  cohort = data.client_data.client_ids[:2]
  state = process.next(
    process.initialize(), [client_keys.client_key(c, 1) for c in cohort]
  ).state
  # c and every c_i start at 0: c moves by |S| / N = 2 / 4 of the mean c_i.
  client_controls = [process.client_states.get(c)['scaffold'] for c in cohort]
  for t, c in enumerate(state.distributor['scaffold']):
    expected = 0.5 * np.mean(
      [controls[t] for controls in client_controls], axis=0
    )
    assert np.abs(expected).max() > 0
    np.testing.assert_allclose(c, expected, rtol=1e-5, atol=1e-7)


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
