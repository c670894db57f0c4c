"""Tests for tff_methods_tasks.tff_baselines: TFF's baseline tasks with every
method,
on TFF's synthetic data (offline)."""

import dataclasses
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_methods.clients import client_keys
from tff_methods.templates import model_lib
from tff_methods_tasks import array_sources
from tff_methods_tasks import tff_baseline_models
from tff_methods_tasks import tff_baselines
from tff_methods_tooling import experiment
from tff_methods_tooling import presets

pytestmark = pytest.mark.usefixtures('tff_worker')

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EMNIST = 'tff_baselines/emnist_character'
CIFAR100 = 'tff_baselines/cifar100_image'
SHAKESPEARE = 'tff_baselines/shakespeare_character'
STACKOVERFLOW = 'tff_baselines/stackoverflow_word'


def _config(task, method, tmp_path, **settings):
  return experiment.ExperimentConfig(
    **{
      'method': method,
      'task': task,
      'use_synthetic_data': True,
      'rounds': 2,
      'clients_per_round': 2,
      'batch_size': 4,
      'output_dir': str(tmp_path / 'run'),
      **settings,
    }
  )


def _load(task, **settings):
  return tff_baselines.load(
    task, **{'batch_size': 4, 'use_synthetic_data': True, **settings}
  )


# ---------------------------------------------------------------------------
# The model, named for the methods.


@pytest.mark.parametrize(
  'task, model',
  [(EMNIST, m) for m in tff_baselines.models(EMNIST)]
  + [(CIFAR100, None), (SHAKESPEARE, None), (STACKOVERFLOW, None)],
)
def test_tffs_model_is_named_for_the_methods_with_its_own_weights(task, model):
  task_data = _load(task, model=model)
  named = task_data.keras_model_fn()
  tffs = tff_baseline_models.keras_model(task_data.tff_task)
  layers = tff_baselines.layer_outputs(task, model)
  assert sorted(named.output) == sorted(
    [f'layer_{k}' for k in range(1, layers + 1)] + ['features', 'z', 'logits']
  )
  # The same variables, in the same order: weights pass between the two.
  assert [v.shape for v in named.trainable_variables] == [
    v.shape for v in tffs.trainable_variables
  ]
  if task != STACKOVERFLOW:  # Its synthetic vocabulary is not the real one.
    assert tffs.count_params() == tff_baselines.parameter_count(task, model)
  model_lib.assign_weights(tffs, model_lib.get_weights(named))
  client = task_data.client_data.client_ids[0]
  x, _ = next(
    iter(
      task_data.batches(
        task_data.client_data.create_tf_dataset_for_client(client), client
      )
    )
  )
  logits = named(x, training=False)['logits'].numpy()
  output = tffs(x, training=False).numpy()
  # TFF's classifiers end in a softmax, the text models in logits.
  ends_in_softmax = task in (EMNIST, CIFAR100)
  expected = tf.nn.softmax(logits).numpy() if ends_in_softmax else logits
  np.testing.assert_allclose(output, expected, rtol=1e-5, atol=1e-6)
  # `features` (and MOON's `z`) is the classifier's input.
  assert named.output['features'].shape[-1] == (tffs.layers[-1].kernel.shape[0])


def test_without_softmax_keeps_a_model_that_ends_in_logits():
  model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(2)])
  assert model_lib.without_softmax(model) is model
  softmax_layer = tf.keras.Sequential(
    [tf.keras.Input((3,)), tf.keras.layers.Dense(2), tf.keras.layers.Softmax()]
  )
  logits = model_lib.without_softmax(softmax_layer)
  x = np.ones((1, 3), np.float32)
  np.testing.assert_allclose(
    tf.nn.softmax(logits(x)).numpy(), softmax_layer(x).numpy(), rtol=1e-6
  )


# ---------------------------------------------------------------------------
# The data: TFF's preprocessing, in a seeded order.


def _pixel_sums(batches):
  return np.concatenate([np.sum(x.numpy(), axis=(1, 2, 3)) for x, _ in batches])


def test_a_clients_batches_are_tffs_in_a_seeded_order_per_round_and_epoch():
  task_data = _load(EMNIST, local_epochs=2, seed=5)
  client = task_data.client_data.client_ids[0]
  raw = task_data.client_data.create_tf_dataset_for_client(client)
  examples = sorted(float(np.sum(e['pixels'].numpy())) for e in raw)
  round_1 = list(task_data.batches(raw, client, 1))
  # TFF's batch size and mapping (x: 28x28x1 images), the last one partial.
  sizes = [len(y) for _, y in round_1]
  assert sizes == [4, 4, 4, 4, 4] and round_1[0][0].shape[1:] == (28, 28, 1)
  sums = _pixel_sums(round_1)
  # Each epoch is every example once, in an order of its own.
  for epoch in (sums[:10], sums[10:]):
    np.testing.assert_allclose(sorted(epoch), examples, rtol=1e-6)
  assert not np.allclose(sums[:10], sums[10:])
  # The same seed, client and round give the same batches; another round
  # (or seed) another order.
  np.testing.assert_array_equal(
    _pixel_sums(task_data.batches(raw, client, 1)), sums
  )
  assert not np.allclose(_pixel_sums(task_data.batches(raw, client, 2)), sums)
  other_seed = _load(EMNIST, local_epochs=2, seed=6)
  assert not np.allclose(_pixel_sums(other_seed.batches(raw, client, 1)), sums)
  # TFF's max_elements caps the round's examples.
  capped = _load(EMNIST, local_epochs=2, max_elements=6, seed=5)
  assert [len(y) for _, y in capped.batches(raw, client, 1)] == [4, 2]


# ---------------------------------------------------------------------------
# Training and evaluation.


def test_evaluation_is_tffs_own(tmp_path):
  task_data = _load(EMNIST)
  weights = model_lib.initial_weights(task_data.keras_model_fn, 0)
  ours = task_data.evaluator(weights)
  # TFF's federated evaluation of the same weights, with the centralized
  # test data as its one client.
  evaluation = tff.learning.algorithms.build_fed_eval(task_data.tff_model_fn)
  state = evaluation.set_model_weights(evaluation.initialize(), weights)
  test = task_data.tff_task.datasets.get_centralized_test_data()
  tffs = evaluation.next(state, [test]).metrics['client_work']['eval'][
    'current_round_metrics'
  ]
  assert ours['num_examples'] == tffs['num_examples'] == 20
  assert ours['accuracy'] == pytest.approx(tffs['sparse_categorical_accuracy'])
  assert ours['loss'] == pytest.approx(tffs['loss'], rel=1e-5)


@pytest.mark.parametrize(
  'task, model', [(EMNIST, 'cnn'), (SHAKESPEARE, None)], ids=['emnist', 'text']
)
def test_project_fedavg_gives_the_weights_of_tffs_own_fed_avg(
  task, model, tmp_path
):
  # EMNIST's CNN without dropout (dropout draws differ); Shakespeare's
  # padded sequences, whose padding TFF's loss counts, with its clients
  # weighted by their tokens (Reddi et al.'s weighting): the project counts
  # them in its loop, TFF's builder reads its model's num_tokens metric.
  weighting = 'num_tokens' if task == SHAKESPEARE else 'num_examples'
  runs = [('fedavg', weighting), ('tff_fedavg', weighting)]
  final = {}
  for method, weighting in runs:
    config = _config(
      task,
      method,
      tmp_path,
      model=model,
      seed=3,
      # Two epochs on EMNIST: each epoch's order, seeded, is TFF's too.
      local_epochs=2 if task == EMNIST else 1,
      client_weighting=weighting,
    )
    data = experiment.load_data(config)
    process, keras_model_fn = experiment.build_process(config, data)
    initial = model_lib.initial_weights(keras_model_fn, 3)
    state = process.set_model_weights(process.initialize(), initial)
    for round_num in (1, 2):
      keys = [
        client_keys.client_key(c, round_num)
        for c in data.client_data.client_ids
      ]
      state = process.next(state, keys).state
    final[method, weighting] = model_lib.flat_trainable(
      process.get_model_weights(state)
    )
  ours, tffs = final['fedavg', weighting], final['tff_fedavg', weighting]
  assert np.abs(ours - model_lib.flat_trainable(initial)).max() > 1e-2
  np.testing.assert_allclose(ours, tffs, rtol=0, atol=1e-5)


# Every term on the text tasks (the compare binary's test runs the
# stateful ones and FedAdam on EMNIST): they split the two combinations
# between them (FedAvg's loop is theirs with no term;
# test_project_fedavg_gives_the_weights_of_tffs_own_fed_avg trains FedAvg
# on the text task). CIFAR-100's ResNet-18 does not train here (a process
# of it cost 75 s of CPU, the suite's second most): the terms read a
# model's named outputs the same way whatever the model, and the ResNet's
# are checked against TFF's model above; the project's ResNet-18 trains
# FedCKA in presets_test's Tiny ImageNet run.
_RUNS = [
  (SHAKESPEARE, 'moon+fedcka'),
  (STACKOVERFLOW, 'fedprox+fedcos'),
]


@pytest.mark.parametrize('task, method', _RUNS)
def test_every_task_trains_two_rounds_and_evaluates(task, method, tmp_path):
  config = _config(task, method, tmp_path)
  data = experiment.load_data(config)
  results = experiment.run(config, progress=False, data=data)
  assert results['rounds'] == 2 and results['rejected_rounds'] == 0
  final = results['final_eval']
  assert 0 <= final['accuracy'] <= 1 and np.isfinite(final['loss'])
  assert final['num_examples'] > 0  # TFF's own counts.
  initial = model_lib.initial_weights(data.keras_model_fn, config.seed)
  trained = model_lib.flat_trainable(results['final_weights'])
  assert np.all(np.isfinite(trained))
  assert np.abs(trained - model_lib.flat_trainable(initial)).max() > 1e-4


def test_tuning_holds_out_whole_training_clients(tmp_path):
  whole = _load(EMNIST)
  held_out = _load(EMNIST, validation_fraction=0.5, seed=1)
  kept = held_out.client_data.client_ids
  assert len(kept) == 1 and set(kept) < set(whole.client_data.client_ids)
  weights = model_lib.initial_weights(whole.keras_model_fn, 0)
  # The other client's 10 examples, not the test data's 20.
  assert held_out.evaluator(weights)['num_examples'] == 10
  assert whole.evaluator(weights)['num_examples'] == 20
  config = _config(EMNIST, 'fedavg', tmp_path, validation_fraction=0.5)
  experiment.validate(config)


# ---------------------------------------------------------------------------
# Settings.


@pytest.mark.parametrize(
  'settings, message',
  [
    (
      dict(method='fed2'),
      'trains its own form of the model, made from its layer plan: '
      "TFF's cnn_dropout model of tff_baselines/emnist_character has none",
    ),
    (
      dict(method='fedcka', fedcka_layers=4),
      'FedCKA reads the first 4 layers of the model, more than the 3 '
      "TFF's cnn_dropout model",
    ),
    (dict(model='resnet18'), "--model='resnet18' is not a model of"),
    (dict(local_steps=5), "--local_steps=5: TFF's preprocessing"),
    (dict(max_elements=0), '--max_elements=0 must be >= 1'),
  ],
)
def test_bad_settings_for_a_tff_task_are_named(settings, message, tmp_path):
  config = _config(
    EMNIST, settings.pop('method', 'fedavg'), tmp_path, **settings
  )
  with pytest.raises(ValueError, match=message):
    experiment.validate(config)


def test_tff_settings_are_refused_on_the_projects_tasks(tmp_path):
  config = _config('digits', 'fedavg', tmp_path)
  with pytest.raises(ValueError, match='--use_synthetic_data=True is for the'):
    experiment.validate(config)


def test_unknown_tff_task_lists_them():
  with pytest.raises(ValueError, match='tff_baselines/emnist_character'):
    experiment.validate(experiment.ExperimentConfig(task='tff_baselines/mnist'))


def test_fedopt_presets_carry_reddi_et_al_s_settings_and_numbers():
  preset = presets.get('fedopt_table2_emnist_character')
  fedadam = preset.config('fedadam')
  assert fedadam.task == EMNIST and fedadam.method == 'fedadam'
  assert (fedadam.rounds, fedadam.clients_per_round, fedadam.batch_size) == (
    1500,
    10,
    20,
  )
  assert fedadam.client_learning_rate == pytest.approx(10**-1.5)
  assert fedadam.server_learning_rate == pytest.approx(10**-2.5)
  assert fedadam.server_epsilon == pytest.approx(1e-4)
  assert fedadam.client_momentum == 0.0
  # TFF's FedAdam row: the same settings and the same published number.
  tff_fedadam = preset.config('tff_fedadam')
  assert tff_fedadam.method == 'tff_fedadam'
  assert (
    dataclasses.replace(
      tff_fedadam, method='fedadam', output_dir=fedadam.output_dir
    )
    == fedadam
  )
  assert preset.row('fedadam').reported == {'accuracy': 85.6}
  assert preset.row('fedavg').reported == {'accuracy': 84.9}
  text = presets.describe(preset)
  assert 'not in the paper' in text and 'FedAdagrad' in text
  # Table 2's Stack Overflow NWP row, ICLR 2021 version.
  reported = {
    row: presets.get('fedopt_table2_stackoverflow_word').row(row).reported
    for row in ('fedavg', 'fedavgm', 'fedadam', 'fedyogi')
  }
  assert reported == {
    'fedavg': {'accuracy': 19.5},
    'fedavgm': {'accuracy': 23.8},
    'fedadam': {'accuracy': 25.2},
    'fedyogi': {'accuracy': 25.2},
  }
  stackoverflow = presets.get('fedopt_table2_stackoverflow_word').config()
  assert (stackoverflow.max_elements, stackoverflow.clients_per_round) == (
    1000,
    50,
  )


# ---------------------------------------------------------------------------
# The binaries.


@pytest.mark.slow
def test_compare_runs_the_projects_methods_beside_tffs_offline(tmp_path):
  # TFF's FedAvg, the project's (FedAdam: with a server optimizer), and a
  # stateful method, which reads the task's named layers (FedCKA reads
  # them in test_every_task_trains_two_rounds_and_evaluates).
  methods = 'fedavg,tff_fedavg,fedadam,moon'
  result = subprocess.run(
    [
      sys.executable,
      '-m',
      'binaries.compare',
      f'--task={EMNIST}',
      '--use_synthetic_data',
      f'--methods={methods}',
      '--rounds=2',
      '--clients_per_round=2',
      '--batch_size=4',
      f'--output_dir={tmp_path}',
      '--noprogress',
    ],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert result.returncode == 0, result.stderr[-3000:]
  table = (tmp_path / 'comparison.md').read_text()
  assert "tff_baselines/emnist_character (TFF's clients" in table
  for method in methods.split(','):
    assert f'| {method} |' in table
  rows = [
    line
    for line in table.splitlines()
    if line.startswith('| ') and not line.startswith('| method')
  ]
  assert len(rows) == len(methods.split(','))


@pytest.mark.slow
def test_real_data_without_a_network_is_one_line(tmp_path):
  if array_sources._can_reach('storage.googleapis.com'):  # pylint: disable=protected-access
    pytest.skip('this machine can download EMNIST')
  result = subprocess.run(
    [
      sys.executable,
      '-m',
      'binaries.train',
      f'--task={EMNIST}',
      '--rounds=1',
      f'--data_dir={tmp_path / "tff_cache"}',
      f'--output_dir={tmp_path / "run"}',
    ],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert result.returncode == 1
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith('DataUnavailableError: tff_baselines/emnist_character')
  assert '--use_synthetic_data' in last


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
