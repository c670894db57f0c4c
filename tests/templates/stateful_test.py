"""Tests for per-client state (tff_methods.templates.stateful): MOON and FedCKA
as processes.

The TFF computations are built once per module.
"""

import collections
import dataclasses
import functools
import os
import sys

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_methods.algorithms import fedavg
from tff_methods.algorithms import fedcka
from tff_methods.algorithms import hyperparameters
from tff_methods.algorithms import methods
from tff_methods.algorithms import moon
from tff_methods.clients import client_keys
from tff_methods.clients import client_states
from tff_methods.execution import in_process
from tff_methods.templates import client_works
from tff_methods.templates import model_lib
from tff_methods.templates import optimizers
from tff_methods.templates import reference_outputs
from tff_methods.templates import regularizers
from tff_methods_tasks import datasets
from tff_methods_tasks import models
from tff_methods_tooling import experiment
from tff_methods_tooling import training_loop

pytestmark = pytest.mark.usefixtures('tff_worker')


def test_bad_strengths_and_options_are_named():
  with pytest.raises(ValueError, match='MOON mu must be a number >= 0'):
    moon.ModelContrastiveTerm(-1.0)
  with pytest.raises(ValueError, match='temperature must be > 0'):
    moon.ModelContrastiveTerm(1.0, temperature=0.0)
  with pytest.raises(ValueError, match="Unknown similarity 'l1'"):
    fedcka.CKAContrastiveTerm(1.0, similarity='l1')
  with pytest.raises(ValueError, match='layers must be an int >= 1'):
    fedcka.CKAContrastiveTerm(1.0, layers=0)


# ---------------------------------------------------------------------------
# The processes.


@pytest.fixture(scope='module')
def setup(digits_task):
  batches = datasets.LocalBatches(batch_size=32, local_epochs=1, seed=0)
  model_fn = functools.partial(models.get_model, 'fedcka_cnn', 10, (8, 8, 1))
  return dict(
    client_data=digits_task.client_data,
    model_fn=model_fn,
    datasets_by_key=datasets.round_dataset_computation(
      digits_task.client_data, batches
    ),
    spec=batches.element_spec(digits_task.client_data.element_type_structure),
    optimizer=optimizers.build_client_sgd(0.05, 0.9),
    initial=model_lib.initial_weights(model_fn, seed=0),
  )


def _rounds(process, initial, cohorts):
  state = process.set_model_weights(process.initialize(), initial)
  outputs = []
  for round_num, cohort in enumerate(cohorts, start=1):
    output = process.next(
      state, [client_keys.client_key(c, round_num) for c in cohort]
    )
    state = output.state
    outputs.append(output)
  return process.get_model_weights(state), outputs


@pytest.fixture(scope='module')
def fedavg_two_rounds(setup):
  import tensorflow_federated as tff

  process = tff.simulation.compose_dataset_computation_with_learning_process(
    setup['datasets_by_key'],
    fedavg.build_tff_fedavg(
      setup['model_fn'], setup['spec'], client_optimizer_fn=setup['optimizer']
    ),
  )
  ids = setup['client_data'].client_ids[:2]
  return _rounds(process, setup['initial'], [ids, ids])[0]


@pytest.mark.parametrize(
  'build',
  [
    lambda s, mu: moon.build_moon(
      s['model_fn'],
      s['spec'],
      dataset_computation=s['datasets_by_key'],
      client_optimizer_fn=s['optimizer'],
      mu=mu,
    ),
    lambda s, mu: fedcka.build_fedcka(
      s['model_fn'],
      s['spec'],
      dataset_computation=s['datasets_by_key'],
      client_optimizer_fn=s['optimizer'],
      mu=mu,
    ),
  ],
  ids=['moon', 'fedcka'],
)
def test_mu_zero_gives_fedavg_and_mu_positive_differs(
  build, setup, fedavg_two_rounds
):
  ids = setup['client_data'].client_ids[:2]
  zero, _ = _rounds(build(setup, 0.0), setup['initial'], [ids, ids])
  np.testing.assert_allclose(
    model_lib.flat_trainable(zero),
    model_lib.flat_trainable(fedavg_two_rounds),
    rtol=1e-5,
    atol=1e-6,
  )
  process = build(setup, 5.0)
  weights, outputs = _rounds(process, setup['initial'], [ids, ids])
  first, second = [o.metrics['client_work']['train'] for o in outputs]
  # Round 1: no client has a previous model, so the term is 0.
  assert np.isclose(first['objective'], first['loss'])
  assert second['objective'] > second['loss'] + 1e-3
  assert not np.allclose(
    model_lib.flat_trainable(weights),
    model_lib.flat_trainable(fedavg_two_rounds),
  )
  # Each sampled client now holds its own previous model.
  store = process.client_states
  states = [store.get(c) for c in ids]
  assert all(s['has_previous'] == 1 for s in states)
  assert not np.allclose(
    states[0]['model'].trainable[0], states[1]['model'].trainable[0]
  )
  assert setup['client_data'].client_ids[3] not in store
  # The client computations wrote one version a round.
  assert store.versions(ids[0]) == [1, 2]
  assert isinstance(process, tff.learning.templates.LearningProcess)
  assert outputs[1].metrics['client_work']['client_states']['written'] == 2


@pytest.mark.parametrize('first_round', ['skip', 'initial_model'])
def test_moon_client_taking_part_late(setup, first_round):
  # Round 1: clients 0, 1 (no previous model anywhere, no term). Round 2:
  # clients 2, 3 take part for the first time.
  process = moon.build_moon(
    setup['model_fn'],
    setup['spec'],
    dataset_computation=setup['datasets_by_key'],
    client_optimizer_fn=setup['optimizer'],
    mu=1.0,
  )
  ids = setup['client_data'].client_ids
  # MOON's declared hook, as every binary runs it after building.
  methods.prepare_clients(
    'moon',
    process,
    hyperparameters.Hyperparameters(
      method_settings={'moon': {'first_round': first_round}}
    ),
    ids,
    setup['model_fn'],
    seed=3,
  )
  _, outputs = _rounds(process, setup['initial'], [ids[:2], ids[2:4]])
  first, second = [o.metrics['client_work']['train'] for o in outputs]
  assert np.isclose(first['objective'], first['loss'])
  if first_round == 'skip':
    assert np.isclose(second['objective'], second['loss'])
  else:
    # The MOON repo: contrasted against the client's own initial model.
    assert second['objective'] > second['loss'] + 1e-3
    # Each client its own model, seeded: the same again, another for another.
    files = process.client_states
    own = [files.get(c, before_round=1)['model'].trainable[0] for c in ids[2:4]]
    assert not np.allclose(own[0], own[1])
    again = client_states.ClientStateFiles(files.initial_state)
    moon.write_own_initial_models(again, ids[2:3], setup['model_fn'], seed=3)
    np.testing.assert_array_equal(
      again.get(ids[2])['model'].trainable[0], own[0]
    )


def test_a_client_keeps_only_the_layers_read_of_its_previous_model(setup):
  process = fedcka.build_fedcka(
    setup['model_fn'],
    setup['spec'],
    dataset_computation=setup['datasets_by_key'],
    client_optimizer_fn=setup['optimizer'],
    mu=1.0,
    layers=2,
  )
  full = setup['initial']
  ids = setup['client_data'].client_ids[:2]
  _, outputs = _rounds(process, full, [ids])
  kept = process.client_states.get(ids[0])['model']
  # FedCKA reads the previous model's first two layers: the two
  # convolutions' kernels and biases, of the CNN's fourteen tensors.
  assert len(full.trainable) == 14
  view = reference_outputs.ReferenceView(
    setup['model_fn'], fedcka.CKAContrastiveTerm(1.0, 2).previous_outputs
  )
  assert (
    [np.shape(w) for w in kept.trainable]
    == [tuple(v.shape) for v in view.model.trainable_variables]
    == [np.shape(w) for w in full.trainable[:4]]
  )
  # What it keeps is its local model's, not the initial weights.
  assert not np.allclose(kept.trainable[0], full.trainable[0])
  # MOON reads up to z: every layer but the classifier.
  moon_process = moon.build_moon(
    setup['model_fn'],
    setup['spec'],
    dataset_computation=setup['datasets_by_key'],
    client_optimizer_fn=setup['optimizer'],
    mu=1.0,
  )
  moon_kept = moon_process.client_states.initial_state['model']
  assert len(moon_kept.trainable) == 12


def test_a_state_of_another_shape_is_refused(setup, tmp_path):
  files = client_states.ClientStateFiles(
    collections.OrderedDict(w=np.zeros((2, 3), np.float32)), str(tmp_path)
  )
  with pytest.raises(
    ValueError, match=r'shape \(3, 2\) where the files hold \(2, 3\)'
  ):
    files.put('a', collections.OrderedDict(w=np.zeros((3, 2))), round_num=1)
  assert 'a' not in files


def test_a_rejected_round_restores_the_clients_states(setup, tmp_path):
  process = moon.build_moon(
    setup['model_fn'],
    setup['spec'],
    dataset_computation=setup['datasets_by_key'],
    client_optimizer_fn=setup['optimizer'],
    mu=1.0,
  )
  ids = setup['client_data'].client_ids[:2]

  class NonFiniteInRound2:
    """The process, with round 2's global model made NaN after training."""

    def __init__(self):
      self.rounds = 0

    def __getattr__(self, name):
      return getattr(process, name)

    def next(self, state, keys):
      output = process.next(state, keys)
      self.rounds += 1
      if self.rounds == 2:
        nan = tf.nest.map_structure(
          lambda a: np.full_like(a, np.nan),
          process.get_model_weights(output.state),
        )
        output = output._replace(
          state=process.set_model_weights(output.state, nan)
        )
      return output

  after_round_1 = {}

  def remember(round_num, metrics):
    del metrics
    if round_num == 1:
      after_round_1.update({c: process.client_states.get(c) for c in ids})

  results = training_loop.run_training(
    NonFiniteInRound2(),
    ids,
    2,
    2,
    str(tmp_path / 'run'),
    setup['initial'],
    progress=False,
    round_hook=remember,
    client_key_fn=client_keys.client_key,
  )
  assert results['rejected_rounds'] == 1
  for c in ids:
    state = process.client_states.get(c)
    assert state['has_previous'] == 1
    for got, kept in zip(
      tf.nest.flatten(state), tf.nest.flatten(after_round_1[c])
    ):
      np.testing.assert_array_equal(got, kept)
  # The rejected round's files are gone: round 1's are the clients' states.
  assert process.client_states.versions(ids[0]) == [1]


def test_stateful_run_resumes_exactly_with_client_states(tmp_path):
  base = dict(
    method='moon',
    task='digits',
    model='fedcka_cnn',
    mu=1.0,
    num_clients=4,
    clients_per_round=2,
    rounds=4,
    batch_size=32,
    client_learning_rate=0.05,
    seed=5,
    cache_dir=str(tmp_path / 'cache'),
  )
  whole = experiment.run(
    experiment.ExperimentConfig(output_dir=str(tmp_path / 'whole'), **base),
    progress=False,
  )

  class Interrupted(Exception):
    pass

  def stop_after_2(round_num, metrics):
    del metrics
    if round_num == 2:
      raise Interrupted()

  config = experiment.ExperimentConfig(
    output_dir=str(tmp_path / 'resumed'), client_state_dir=None, **base
  )
  with pytest.raises(Interrupted):
    experiment.run(config, progress=False, round_hook=stop_after_2)
  resumed = experiment.run(config, progress=False)
  np.testing.assert_allclose(
    model_lib.flat_trainable(resumed['final_weights']),
    model_lib.flat_trainable(whole['final_weights']),
    rtol=1e-5,
    atol=1e-6,
  )
  # The states live with the run, beside its program state.
  assert os.path.exists(
    tmp_path / 'resumed' / 'client_states' / 'initial.state'
  )


def test_a_given_state_directory_gives_the_default_ones_weights(tmp_path):
  base = dict(
    method='fedcka',
    task='digits',
    model='fedcka_cnn',
    mu=3.0,
    num_clients=4,
    clients_per_round=2,
    rounds=3,
    batch_size=32,
    seed=6,
    cache_dir=str(tmp_path / 'cache'),
  )
  memory = experiment.run(
    experiment.ExperimentConfig(output_dir=str(tmp_path / 'memory'), **base),
    progress=False,
  )
  disk = experiment.run(
    experiment.ExperimentConfig(
      output_dir=str(tmp_path / 'disk'),
      client_state_dir=str(tmp_path / 'states'),
      **base,
    ),
    progress=False,
  )
  np.testing.assert_allclose(
    model_lib.flat_trainable(disk['final_weights']),
    model_lib.flat_trainable(memory['final_weights']),
    rtol=1e-5,
    atol=1e-6,
  )
  assert os.listdir(tmp_path / 'states')


def test_what_a_method_needs_of_a_zoo_model_comes_from_its_declarations(
  tmp_path,
):
  # Fed2 declares a form of its own (model_fn): only models with a layer
  # plan. FedMAX's term reads `features`, which every zoo model has.
  config = experiment.ExperimentConfig(
    method='fed2', model='lenet', output_dir=str(tmp_path / 'x')
  )
  with pytest.raises(
    ValueError,
    match='--method=fed2 trains its own form of the model, made from its '
    'layer plan: --model=lenet has none',
  ):
    experiment.validate(config)
  experiment.validate(dataclasses.replace(config, model='fedcka_cnn'))
  experiment.validate(dataclasses.replace(config, method='fedmax'))


def test_a_methods_own_weighting_is_checked_as_the_shared_one(tmp_path):
  # SCAFFOLD declares its weighting setting (weighting_setting): DP's
  # uniform mean and num_tokens' text tasks apply to it as to
  # --client_weighting.
  config = experiment.ExperimentConfig(
    method='scaffold', model='mlp', output_dir=str(tmp_path / 'x')
  )
  with pytest.raises(
    ValueError,
    match='--aggregator=dp averages clients uniformly; it needs '
    '--scaffold_weighting=uniform',
  ):
    experiment.validate(
      dataclasses.replace(
        config, aggregator='dp', scaffold_weighting='num_examples'
      )
    )
  with pytest.raises(
    ValueError, match='--scaffold_weighting=num_tokens is for the text tasks'
  ):
    experiment.validate(
      dataclasses.replace(config, scaffold_weighting='num_tokens')
    )
  # Uniform, it is refused for its control variates alone.
  with pytest.raises(ValueError) as refused:
    experiment.validate(dataclasses.replace(config, aggregator='dp'))
  (line,) = str(refused.value).strip().splitlines()[1:]
  assert 'control variates' in line
  # Another method's run leaves SCAFFOLD's setting alone.
  experiment.validate(
    dataclasses.replace(
      config, method='fedavg', aggregator='dp', scaffold_weighting='num_tokens'
    )
  )


def test_moon_without_a_projection_head_is_refused(tmp_path):
  config = experiment.ExperimentConfig(
    method='moon', model='mlp', output_dir=str(tmp_path / 'x')
  )
  # What MOON's term declares it reads, against the zoo's outputs of mlp.
  with pytest.raises(
    ValueError,
    match="--method=moon: MOON reads the model's 'z' output \\(a projection "
    "head's output\\), which --model=mlp does not have: use fedcka_cnn, or "
    'resnet18/resnet50 with --projection_dim > 0',
  ):
    experiment.validate(config)
  experiment.validate(
    dataclasses.replace(config, model='resnet18', projection_dim=32)
  )
  with pytest.raises(
    ValueError,
    match='--projection_dim=32 must be >= 0, '
    'and is for --model=resnet18/resnet50 only',
  ):
    experiment.validate(
      dataclasses.replace(config, model='fedcka_cnn', projection_dim=32)
    )
  with pytest.raises(
    ValueError,
    match='--method=fedcka: FedCKA reads the first 8 layers of the model, '
    'more than the 7 --model=fedcka_cnn has',
  ):
    experiment.validate(
      dataclasses.replace(
        config, method='fedcka', model='fedcka_cnn', fedcka_layers=8
      )
    )
  experiment.validate(
    dataclasses.replace(
      config, method='fedcka', model='fedcka_cnn', fedcka_layers=7
    )
  )
  with pytest.raises(
    ValueError,
    match="--scaffold_weighting='examples' is "
    'unknown; choose one of uniform, num_examples',
  ):
    experiment.validate(
      dataclasses.replace(
        config, method='scaffold', scaffold_weighting='examples'
      )
    )
  with pytest.raises(
    ValueError,
    match="--server_momentum_form='nag' is "
    'unknown; choose one of heavy_ball, ema',
  ):
    experiment.validate(dataclasses.replace(config, server_momentum_form='nag'))


def test_regularizers_reading_previous_models_need_a_stateful_process(setup):
  with pytest.raises(ValueError, match='needs per-client state'):
    client_works.build_local_training_client_work(
      setup['model_fn'],
      setup['spec'],
      setup['optimizer'],
      [moon.ModelContrastiveTerm(1.0)],
    )
  assert regularizers.needs_previous_model([fedcka.CKAContrastiveTerm(1.0)])


def test_where_states_live_is_the_builders_argument_not_the_context(setup):
  # Built while the in-process context is current, a process keeps its
  # clients' states where its builder says: files by default, memory when
  # asked (the binaries ask under --execution=in_process).
  context = in_process.InProcessExecutionContext(['cpu:0'], fallback_fn=None)

  def built(**kwargs):
    return fedcka.build_fedcka(
      setup['model_fn'],
      setup['spec'],
      dataset_computation=setup['datasets_by_key'],
      client_optimizer_fn=setup['optimizer'],
      layers=1,
      **kwargs,
    )

  with tff.framework.get_context_stack().install(context):
    assert not built().client_states.in_memory
    assert built(client_states_in_memory=True).client_states.in_memory
  assert built(client_states_in_memory=True).client_states.in_memory
  assert methods.build_method_for_client_ids(
    'moon',
    setup['model_fn'],
    setup['datasets_by_key'],
    setup['spec'],
    hyperparameters.Hyperparameters(client_states_in_memory=True),
  ).client_states.in_memory


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
