"""Every stateless method is a LearningProcess that TFF's own loop can drive.

Stateful methods (per-client state) are tested in stateful_test.py.
"""

import sys

import numpy as np
import pytest
import tensorflow_federated as tff

from tasks import datasets
from tff_methods import fed2
from tff_methods import fedavg
from tff_methods import fedcka
from tff_methods import fedcos
from tff_methods import fedmax
from tff_methods import fedprox
from tff_methods import methods
from tff_methods import model_lib
from tff_methods import moon
from tff_methods import scaffold
from tooling import device_check
from tooling import experiment

pytestmark = pytest.mark.usefixtures('tff_worker')


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
  hparams = methods.Hyperparameters(
    client_learning_rate=0.05, client_momentum=0.0, mu=0.1, fed2_groups=2
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
      methods.Hyperparameters(fed2_groups=2),
    )


def test_unknown_method_is_named():
  with pytest.raises(
    ValueError,
    match="Unknown method 'fedsgd' \\('fedsgd' "
    'is not one of fedavg, fedavgm',
  ):
    methods.build_method('fedsgd', None, None, methods.Hyperparameters())


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


@pytest.mark.parametrize(
  'name, module, builder',
  [
    ('fedavg', fedavg, 'build_fedavg'),
    ('fedadam', fedavg, 'build_fedavg'),
    ('tff_fedavg', fedavg, 'build_tff_fedavg'),
    ('fedprox', fedprox, 'build_fedprox'),
    ('fedmax', fedmax, 'build_fedmax'),
    ('fedcos', fedcos, 'build_fedcos'),
    ('fedprox+fedcos', fedcos, 'build_fedcos'),
    ('fed2', fed2, 'build_fed2'),
  ],
)
def test_the_registry_runs_each_methods_own_builder(
  name, module, builder, monkeypatch
):
  calls = []
  monkeypatch.setattr(
    module, builder, lambda *args, **kwargs: calls.append(kwargs) or 'built'
  )
  hparams = methods.Hyperparameters(mu=0.5, strengths=(('fedcos', 0.05),))
  assert methods.build_method(name, None, None, hparams) == 'built'
  assert len(calls) == 1
  if name == 'fedprox+fedcos':
    # A combination: the main component's builder, given the others' terms.
    kwargs = calls[0]
    assert kwargs['mu'] == 0.05
    assert [type(r).__name__ for r in kwargs['base_regularizers']] == [
      'ProximalTerm'
    ]
    assert kwargs['base_regularizers'][0].mu == 0.5


@pytest.mark.parametrize(
  'name, module, builder',
  [
    ('moon', moon, 'build_moon'),
    ('moon+fedcos', moon, 'build_moon'),
    ('fedcka', fedcka, 'build_fedcka'),
    ('scaffold', scaffold, 'build_scaffold'),
  ],
)
def test_stateful_methods_run_their_own_builders(
  name, module, builder, monkeypatch
):
  calls = []
  monkeypatch.setattr(
    module, builder, lambda *args, **kwargs: calls.append(kwargs) or 'built'
  )
  assert (
    methods.build_method_for_client_ids(
      name, None, None, None, methods.Hyperparameters()
    )
    == 'built'
  )
  assert len(calls) == 1


def test_statefulness_is_learned_from_the_terms():
  assert methods.is_stateful('moon+fedcos')
  assert methods.is_stateful('fedcka') and methods.is_stateful('scaffold')
  assert not methods.is_stateful('fedadam+fedcos')
  assert methods.reads_reference_outputs('fedcka')
  assert not methods.reads_reference_outputs('fedprox+fedcos')
  assert set(methods.STATELESS_METHODS) == set(methods.METHOD_NAMES) - {
    'moon',
    'fedcka',
    'scaffold',
  }


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
