"""Every stateless method is a LearningProcess that TFF's own loop can drive.

Stateful methods (per-client state) are tested in stateful_test.py.
"""

import dataclasses
import inspect
import os
import sys

from absl import flags
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
from tff_methods.algorithms import hyperparameters
from tff_methods.algorithms import method_spec
from tff_methods.algorithms import methods
from tff_methods.algorithms import moon
from tff_methods.algorithms import scaffold
from tff_methods.templates import model_lib
from tff_methods.templates import processes
from tff_methods.templates import regularizers
from tff_methods_binaries import experiment_flags
from tff_methods_tasks import datasets
from tff_methods_tasks import models
from tff_methods_tooling import device_check
from tff_methods_tooling import experiment
from tff_methods_tooling import experiment_config

pytestmark = pytest.mark.usefixtures('tff_worker')

REPO = os.path.dirname(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)


@pytest.fixture(scope='module')
def client_data(digits_task):
  return digits_task.client_data.preprocess(
    datasets.LocalBatches(batch_size=32, local_epochs=1, seed=0)
  )


# Each single method runs two rounds on the worker and in-process in
# in_process_test (device_check's rows), and TFF's program logic with every
# kind of server state (the combinations too) in programs_test: here TFF's
# FedOpt builders and the combinations in TFF's simulation loop.
_LOOP_METHODS = tuple(
  m for m in methods.STATELESS_METHODS if m not in device_check.EVERY_METHOD
)


def test_the_loop_and_the_device_check_cover_every_stateless_method():
  assert set(_LOOP_METHODS) | set(device_check.EVERY_METHOD) >= set(
    methods.STATELESS_METHODS
  )
  assert 'fedprox+fedcos' in _LOOP_METHODS and 'tff_fedadam' in _LOOP_METHODS


@pytest.mark.parametrize('name', _LOOP_METHODS)
def test_method_runs_in_tffs_training_loop(
  name, client_data, small_model_fn, tmp_path
):
  hparams = hyperparameters.Hyperparameters(
    client_learning_rate=0.05,
    client_momentum=0.0,
    mu=0.1,
    method_settings={'fed2': {'groups': 2}},
  )
  # Fed2 trains its grouped form of a model it can group.
  model_fn = (
    experiment.model_fn_for(name, 'fedcka_cnn', 10, (8, 8, 1), hparams)
    if name == 'fed2'
    else small_model_fn
  )
  process = methods.build_method(
    name, model_fn, client_data.element_type_structure, hparams
  )
  assert isinstance(process, tff.learning.templates.LearningProcess)
  by_id = tff.simulation.compose_dataset_computation_with_learning_process(
    client_data.dataset_computation, process
  )
  ids = client_data.client_ids
  state = tff.simulation.run_training_process(
    by_id,
    training_selection_fn=lambda round_num: ids[:2],
    total_rounds=2,
    program_state_manager=tff.program.FileProgramStateManager(str(tmp_path)),
  )
  weights = by_id.get_model_weights(state)
  initial = model_lib.flat_trainable(
    by_id.get_model_weights(by_id.initialize())
  )
  trained = model_lib.flat_trainable(weights)
  assert trained.shape == initial.shape
  assert np.all(np.isfinite(trained))


def test_fed2_refuses_a_model_without_groups(client_data, small_model_fn):
  with pytest.raises(ValueError, match='needs its grouped model'):
    methods.build_method(
      'fed2',
      small_model_fn,
      client_data.element_type_structure,
      hyperparameters.Hyperparameters(method_settings={'fed2': {'groups': 2}}),
    )


def test_unknown_method_is_named():
  with pytest.raises(
    ValueError,
    match="Unknown method 'fedsgd' \\('fedsgd' "
    'is not one of fedavg, fedavgm',
  ):
    methods.build_method(
      'fedsgd', None, None, hyperparameters.Hyperparameters()
    )


@pytest.mark.parametrize(
  'name, message',
  [
    ('fedprox+fedcos+fedprox', 'names a component twice'),
    ('scaffold+fedcos', 'scaffold cannot be combined'),
    ('fedavgm+fedadam', 'names 2 server rules'),
    ('fedprox+fedcoss', "'fedcoss' is not one of"),
  ],
)
def test_bad_combinations_are_named(name, message):
  with pytest.raises(ValueError, match=message):
    methods.parse_method(name)


def _captured(monkeypatch, module, builder):
  """Calls to `module.builder`, each its positional and keyword arguments;
  the server optimizers' stand-ins are their rules' names."""
  calls = []
  monkeypatch.setattr(
    module,
    builder,
    lambda *args, **kwargs: calls.append((args, kwargs)) or 'built',
  )
  monkeypatch.setattr(
    hyperparameters.Hyperparameters, 'server_optimizer', lambda self, rule: rule
  )
  return calls


@pytest.mark.parametrize(
  'name, terms, rule',
  [
    ('fedavg', [], 'sgd'),
    ('fedadam', [], 'adam'),
    ('fedprox', [('ProximalTerm', 0.5)], 'sgd'),
    ('fedmax', [('ActivationEntropyTerm', None)], 'sgd'),
    ('fedcos', [('DirectionPenalty', 0.05)], 'sgd'),
    (
      'fedprox+fedcos',
      [('ProximalTerm', 0.5), ('DirectionPenalty', 0.05)],
      'sgd',
    ),
    ('fedavgm+fedcos', [('DirectionPenalty', 0.05)], 'sgdm'),
  ],
)
def test_components_build_the_shared_loop_with_their_terms_and_rule(
  name, terms, rule, monkeypatch
):
  calls = _captured(monkeypatch, processes, 'build_local_training_process')
  hparams = hyperparameters.Hyperparameters(
    mu=0.5, method_settings={'fedcos': {'mu': 0.05}}
  )
  assert methods.build_method(name, None, None, hparams) == 'built'
  ((args, kwargs),) = calls
  assert args[3] == rule  # keras_model_fn, spec, client, server optimizer.
  assert [
    (type(t).__name__, getattr(t, 'mu', None)) for t in kwargs['regularizers']
  ] == terms


@pytest.mark.parametrize(
  'name, terms',
  [
    ('moon', ['ModelContrastiveTerm']),
    ('moon+fedcos', ['ModelContrastiveTerm', 'DirectionPenalty']),
    ('fedcka', ['CKAContrastiveTerm']),
  ],
)
def test_components_with_client_state_build_the_stateful_loop(
  name, terms, monkeypatch
):
  calls = _captured(monkeypatch, processes, 'build_local_training_process')
  assert (
    methods.build_method_for_client_ids(
      name, None, None, None, hyperparameters.Hyperparameters()
    )
    == 'built'
  )
  ((args, kwargs),) = calls
  assert [type(t).__name__ for t in kwargs['regularizers']] == terms
  assert 'client_state_dir' in kwargs


@pytest.mark.parametrize(
  'name, module, builder',
  [
    ('tff_fedavg', fedavg, 'build_tff_fedavg'),
    ('fed2', fed2, 'build_fed2'),
    ('scaffold', scaffold, 'build_scaffold'),
  ],
)
def test_a_method_with_a_process_of_its_own_runs_its_modules_builder(
  name, module, builder, monkeypatch
):
  calls = _captured(monkeypatch, module, builder)
  assert (
    methods.build_method_for_client_ids(
      name, None, None, None, hyperparameters.Hyperparameters()
    )
    == 'built'
  ) or name == 'tff_fedavg'  # Composed with the client's data sets.
  assert len(calls) == 1


@pytest.mark.parametrize(
  'name, module, builder',
  [
    ('fedavg', fedavg, 'build_fedavg'),
    ('fedprox', fedprox, 'build_fedprox'),
    ('fedmax', fedmax, 'build_fedmax'),
    ('fedcos', fedcos, 'build_fedcos'),
    ('moon', moon, 'build_moon'),
    ('fedcka', fedcka, 'build_fedcka'),
  ],
)
def test_a_components_public_builder_is_the_one_its_declaration_generates(
  name, module, builder
):
  # One build path: the function a TFF user calls is the registry's.
  assert getattr(module, builder) is method_spec.builder(methods.REGISTRY[name])


def test_the_registry_builds_the_last_terms_builder_with_the_others_before(
  monkeypatch,
):
  calls = []
  real_builder = method_spec.builder

  def recording_builder(spec):
    built = real_builder(spec)
    return lambda *args, **kwargs: calls.append((spec.name, kwargs)) or built

  monkeypatch.setattr(method_spec, 'builder', recording_builder)
  monkeypatch.setattr(
    hyperparameters.Hyperparameters, 'server_optimizer', lambda self, rule: rule
  )
  methods.build_method(
    'fedavgm+fedprox+fedcos',
    None,
    None,
    hyperparameters.Hyperparameters(
      method_settings={
        'fedprox': {'mu': 0.5},
        'fedcos': {'mu': 0.05, 'direction': 'mean_client_update'},
      }
    ),
  )
  ((name, kwargs),) = calls
  assert name == 'fedcos'
  assert (kwargs['mu'], kwargs['direction']) == (0.05, 'mean_client_update')
  assert [(type(t).__name__, t.mu) for t in kwargs['base_regularizers']] == [
    ('ProximalTerm', 0.5)
  ]
  assert kwargs['server_optimizer_fn'] == 'sgdm'


def test_a_generated_builder_takes_its_terms_settings_by_name(monkeypatch):
  calls = _captured(monkeypatch, processes, 'build_local_training_process')
  parameters = inspect.signature(fedcka.build_fedcka).parameters
  assert [
    (name, p.default)
    for name, p in parameters.items()
    if name in ('mu', 'layers', 'similarity')
  ] == [('mu', fedcka.DEFAULT_MU), ('layers', 2), ('similarity', 'linear_cka')]
  assert (
    parameters['client_optimizer_fn'].kind is inspect.Parameter.KEYWORD_ONLY
  )
  # MOON's first round is its clients' preparation, not its term's.
  assert 'first_round' not in inspect.signature(moon.build_moon).parameters
  assert 'mu' not in inspect.signature(fedavg.build_fedavg).parameters
  fedcka.build_fedcka(None, None, client_optimizer_fn='sgd', layers=3)
  ((_, kwargs),) = calls
  (term,) = kwargs['regularizers']
  assert (term.mu, term.layers, term.outputs[-1]) == (3.0, 3, 'layer_3')


def test_a_generated_builder_refuses_a_value_or_name_before_building(
  monkeypatch,
):
  calls = _captured(monkeypatch, processes, 'build_local_training_process')
  with pytest.raises(ValueError, match=r'FedProx: mu=-1.0 must be >= 0'):
    fedprox.build_fedprox(None, None, client_optimizer_fn='sgd', mu=-1.0)
  with pytest.raises(ValueError, match="direction='up' is unknown"):
    fedcos.build_fedcos(None, None, client_optimizer_fn='sgd', direction='up')
  with pytest.raises(TypeError, match='unknown arguments beta; it takes .*mu'):
    fedprox.build_fedprox(None, None, client_optimizer_fn='sgd', beta=1.0)
  with pytest.raises(TypeError, match='needs client_optimizer_fn'):
    fedprox.build_fedprox(None, None)
  assert not calls


def test_statefulness_is_learned_from_the_terms():
  assert methods.is_stateful('moon+fedcos')
  assert methods.is_stateful('fedcka') and methods.is_stateful('scaffold')
  assert not methods.is_stateful('fedadam+fedcos')
  assert methods.reads_reference_outputs('fedcka')
  assert not methods.reads_reference_outputs('fedprox+fedcos')
  # What a model must expose: MOON its projection, FedCKA its first layers.
  assert methods.reads_outputs('moon') == {'z'}
  assert methods.reads_outputs('fedmax') == {'features'}
  assert 'z' not in methods.reads_outputs('fedcka')
  assert methods.reads_outputs('fedavg') == set()
  assert set(methods.STATELESS_METHODS) == set(methods.METHOD_NAMES) - {
    'moon',
    'fedcka',
    'scaffold',
  }


class _Pull(regularizers.Regularizer):
  """A method defined outside the library: `mu/2 ||w - w_g||^2`."""

  name = 'pull'
  display_name = 'Pull'

  def __init__(self, mu):
    self.mu = mu

  def __call__(self, step):
    return (
      0.5
      * self.mu
      * tf.add_n(
        [
          tf.reduce_sum(tf.square(w - g))
          for w, g in zip(step.weights, step.global_weights)
        ]
      )
    )


@dataclasses.dataclass(frozen=True)
class _PullSettings:
  mu: float = method_spec.setting(0.0, 'The pull towards w_g.', minimum=0.0)


# Its module's declaration: its settings (a strength of 0 by default) and
# its term.
PULL = method_spec.MethodSpec(
  name='pull',
  display_name='Pull',
  settings=_PullSettings,
  term=_Pull,
)


@pytest.fixture
def pull_registered():
  methods.register(PULL)  # The one registry line.
  yield
  del methods.REGISTRY['pull']


@pytest.mark.usefixtures('pull_registered')
def test_a_new_method_needs_its_declaration_and_one_registry_line(
  digits_rounds, tff_fedavg_weights, digits_task, tmp_path
):
  assert methods.parse_method('fedavgm+pull') == ['fedavgm', 'pull']
  assert not methods.is_stateful('pull+fedprox')
  assert not methods.reads_reference_outputs('pull')
  hparams = dict(client_learning_rate=0.05, client_momentum=0.9)

  def trained(name, **settings):
    process = methods.build_method(
      name,
      digits_rounds['model_fn'],
      digits_rounds['spec'],
      hyperparameters.Hyperparameters(**hparams, **settings),
    )
    return digits_rounds['run'](process)[0]

  # Its default strength, 0: FedAvg's weights.
  np.testing.assert_allclose(
    trained('pull'), tff_fedavg_weights, rtol=1e-5, atol=1e-6
  )
  # With a strength it is FedProx's term, so FedProx's weights.
  pulled = trained('pull', method_settings={'pull': {'mu': 0.5}})
  np.testing.assert_allclose(
    pulled, trained('fedprox', mu=0.5), rtol=1e-5, atol=1e-6
  )
  assert np.max(np.abs(pulled - tff_fedavg_weights)) > 1e-3
  # The runner (and so every binary) takes it as it takes the library's.
  config = experiment.ExperimentConfig(
    method='fedadam+pull',
    task='digits',
    model='mlp',
    num_clients=4,
    clients_per_round=2,
    output_dir=str(tmp_path / 'run'),
  )
  experiment.validate(config)
  process, _ = experiment.build_process(config, digits_task)
  assert 'client_work' in process.get_hparams(process.initialize())
  with pytest.raises(ValueError, match="'pull' is already registered"):
    methods.register(PULL)


@pytest.mark.usefixtures('pull_registered')
def test_a_new_methods_settings_are_flags_checks_and_docs():
  # What the binaries make of the registry: a flag per setting, checked as
  # declared, and a row in docs/flags.md's table.
  config_class = experiment_config.config_class(methods.REGISTRY)
  flag_values = flags.FlagValues()
  experiment_flags.define_config_flags(flag_values, config_class)
  flag_values(['prog', '--pull_mu=0.5'])
  assert flag_values['pull_mu'].value == 0.5
  config = config_class(method='pull', pull_mu=0.5)
  assert config.method_settings()['pull'] == {'mu': 0.5}
  assert config.hyperparameters().settings_of(PULL).mu == 0.5
  assert (
    config_class(method='pull').hyperparameters().settings_of(PULL).mu == 0.0
  )
  problems = method_spec.problems(PULL, _PullSettings(mu=-1.0))
  assert problems == ['--pull_mu=-1.0 must be >= 0.']
  table = experiment_config.method_settings_table(methods.REGISTRY)
  assert '| `--pull_mu` | Pull | `0.0` | The pull towards w_g.' in table


def test_scaffold_notes_the_client_momentum_it_does_not_use():
  with_momentum = dict(client_momentum=0.9)
  (note,) = methods.notes(
    'scaffold', hyperparameters.Hyperparameters(**with_momentum)
  )
  assert 'plain SGD' in note and '0.9' in note
  assert not methods.notes(
    'scaffold',
    hyperparameters.Hyperparameters(
      **with_momentum, method_settings={'scaffold': {'momentum': True}}
    ),
  )
  assert not methods.notes(
    'scaffold', hyperparameters.Hyperparameters(client_momentum=0)
  )
  assert not methods.notes(
    'fedprox', hyperparameters.Hyperparameters(**with_momentum)
  )


def test_fed2_declares_the_grouped_form_of_the_model_it_trains():
  plan = lambda: models.fed2_plan('fedcka_cnn', (8, 8, 1))
  hparams = hyperparameters.Hyperparameters(
    method_settings={'fed2': {'groups': 2}}
  )
  grouped = methods.model_fn('fed2', hparams, plan, 10, (8, 8, 1))
  stacked = [
    tuple(v.shape)
    for v, group in zip(
      grouped().trainable_variables, fed2.tensor_groups(grouped)
    )
    if group == fed2.STACKED
  ]
  assert stacked and {shape[0] for shape in stacked} == {2}  # G = 2.
  # Every other method trains the model as it is.
  assert methods.model_fn('fedprox+fedcos', hparams, plan, 10, (8, 8, 1)) is (
    None
  )


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
