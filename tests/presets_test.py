"""Tests for tff_methods_tooling.presets and the binaries' --preset flag."""

import dataclasses
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tff_methods_tasks import datasets
from tff_methods_tooling import comparison_report
from tff_methods_tooling import experiment
from tff_methods_tooling import presets

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Settings that shape a run's data or length but not the TFF computations
# it builds (SCAFFOLD's N aside, which is kept for it below).
_NOT_IN_COMPUTATION = (
  'rounds',
  'partition',
  'alpha',
  'min_size',
  'classes_per_client',
  'shards_per_client',
  'non_iid_fraction',
  'synthetic_alpha',
  'synthetic_beta',
  'num_clients',
  'clients_per_round',
  'local_epochs',
  'local_steps',
  'batch_size',
  'rounds_per_eval',
  'rounds_per_checkpoint',
  'output_dir',
  'data_dir',
  'cache_dir',
)


def _config(preset, key=None, **overrides):
  if preset.settings.get('task') == 'image_folder':
    overrides.setdefault('data_dir', REPO)  # Any directory passes validate.
  return preset.config(key, **overrides)


@pytest.mark.parametrize('name', list(presets.PRESETS))
def test_every_row_of_every_preset_is_a_valid_experiment(name):
  preset = presets.PRESETS[name]
  assert preset.row().key == preset.main
  keys = [row.key for row in preset.rows]
  assert len(set(keys)) == len(keys)
  for row in preset.rows:
    experiment.validate(_config(preset, row.key))
    # A figure's points may have no number; the paper's own method has one.
    assert not row.reported or 0 < row.reported['accuracy'] <= 100
  assert 0 < preset.row().reported['accuracy'] <= 100


def test_fedcka_fig5_sweeps_every_layer_of_the_cnn():
  preset = presets.get('fedcka_fig5_layers')
  assert [preset.config(r.key).fedcka_layers for r in preset.rows] == list(
    range(1, 8)
  )
  assert preset.config('m7').model == 'fedcka_cnn'
  assert 'not given' in presets.describe(preset)


def test_presets_carry_the_papers_settings():
  # FedCKA Table 1: each column's best mu from the text.
  cifar100 = presets.get('fedcka_table1_cifar100')
  assert cifar100.config('moon').mu == 5.0
  assert cifar100.config('fedcka').mu == 10.0
  assert cifar100.config('fedprox').mu == 0.1
  config = cifar100.config()
  assert (config.model, config.projection_dim, config.rounds, config.alpha) == (
    'resnet50',
    256,
    40,
    5.0,
  )
  assert (
    config.client_learning_rate,
    config.client_momentum,
    config.weight_decay,
    config.local_epochs,
    config.batch_size,
  ) == (0.1, 0.9, 1e-5, 10, 128)
  # FedCos Table I: FedOpt(1.5)+FedCos(0.02) is FedCos at server lr 1.5.
  fedcos = presets.get('fedcos_table1_90pct')
  combo = fedcos.config('fedopt1.5+fedcos0.02')
  assert (combo.method, combo.server_learning_rate, combo.fedcos_mu) == (
    'fedcos',
    1.5,
    0.02,
  )
  assert (combo.partition, combo.non_iid_fraction) == ('mixed', 0.9)
  assert fedcos.row('fedavg').reported['accuracy'] == 64.30
  # FedMAX Table 1: 10% of 100 clients, 5 local epochs at 600 rounds.
  fedmax = presets.get('fedmax_table1_cifar10_noniid_600').config()
  assert (
    fedmax.num_clients,
    fedmax.clients_per_round,
    fedmax.local_epochs,
    fedmax.classes_per_client,
  ) == (100, 10, 5, 2)
  # A row's settings stay its own: the shared config has no strength.
  table3 = presets.get('fedcka_table3_similarity')
  assert table3.shared_config().fedcka_similarity == 'linear_cka'
  assert table3.config('kernel_cka').fedcka_similarity == 'kernel_cka'
  assert presets.get('fedcos_table1_iid').shared_config().fedcos_mu is None


def test_unknown_preset_and_row_are_named():
  with pytest.raises(ValueError, match="--preset='fedcka_t9' is unknown"):
    presets.get('fedcka_t9')
  with pytest.raises(
    ValueError, match="no row 'fedcos'; choose one of " 'fedavg, fedprox0.1'
  ):
    presets.get('fedcos_table1_iid').row('fedcos')


def _computation_key(config):
  """What determines the TFF computations a run builds."""
  values = dataclasses.asdict(config)
  for name in _NOT_IN_COMPUTATION:
    if not (name == 'num_clients' and config.method == 'scaffold'):
      values.pop(name)
  return json.dumps(values, sort_keys=True)


# The ResNet-50 presets (FedCKA's Table 1, CIFAR-100 and Tiny ImageNet)
# differ only in the data's classes and image size; one round of ResNet-50
# FedCKA costs two minutes here, so one of them runs (Tiny ImageNet: it also
# reads an image folder) and the other is validated like every preset.
# Reddi et al.'s presets but EMNIST's train TFF's models of the tasks
# tff_baselines_test trains with every method. FedCos's ResNet-18 preset
# reads only the weights; ResNet-18 trains in FedCKA's Tiny ImageNet run.
# Fed2's presets differ from Fed2's runs in fed2_test (its process, and
# the grouped VGG-9 and MobileNet built and checked group by group) only
# in the model's size: one to two minutes a round here.
_ONE_ROUND_SKIPPED = (
  'fedcos_table3_',
  'fedcka_table1_cifar100',
  'fedopt_table2_cifar100_image',
  'fedopt_table2_shakespeare_character',
  'fedopt_table2_stackoverflow_word',
)


def _one_round_configs():
  """The paper's method of every preset; presets whose runs would build the
  same computations share one run."""
  runs = {}
  for preset in presets.PRESETS.values():
    if preset.name.startswith(_ONE_ROUND_SKIPPED):  # names, or prefixes
      continue
    config = _config(preset)
    if config.method == 'fed2':
      continue
    runs.setdefault(_computation_key(config), (preset, config))
  return list(runs.values())


@pytest.mark.usefixtures('tff_worker')
@pytest.mark.parametrize(
  'preset, config', _one_round_configs(), ids=lambda v: getattr(v, 'name', '')
)
def test_every_preset_runs_one_round_on_generated_data(
  preset, config, tmp_path
):
  # The preset's task shape, model, method and optimizer; 2 clients of 4
  # random examples and one or two local steps keep the round short.
  # ResNet-50 runs as ResNet-18 here: its round took 107 s, this one 40 s
  # (the same `_resnet` code; models_test builds ResNet-50 itself).
  if config.model == 'resnet50':
    config = dataclasses.replace(config, model='resnet18')
  if config.is_tff_baseline():  # TFF's synthetic data for TFF's tasks.
    short = dataclasses.replace(
      config,
      rounds=1,
      clients_per_round=2,
      use_synthetic_data=True,
      output_dir=str(tmp_path / 'run'),
    )
    results = experiment.run(short, progress=False)
    assert results['rounds'] == 1 and results['rejected_rounds'] == 0
    assert np.isfinite(results['final_eval']['accuracy'])
    return
  shape, num_classes = datasets.TASK_SHAPES[config.task]
  data = datasets.generated_like(
    config.task,
    num_clients=2,
    examples_per_client=4,
    cache_dir=str(tmp_path / 'cache'),
    image_size=config.image_size,
    num_classes=200 if config.task == 'image_folder' else None,
    num_test=8,
  )
  if shape is not None:
    assert data.input_shape == shape and data.num_classes == num_classes
  short = dataclasses.replace(
    config,
    rounds=1,
    num_clients=2,
    clients_per_round=2,
    local_epochs=1,
    local_steps=None if config.local_steps is None else 2,
    output_dir=str(tmp_path / 'run'),
  )
  results = experiment.run(short, progress=False, data=data)
  assert results['rounds'] == 1
  assert results['rejected_rounds'] == 0
  assert np.isfinite(results['final_eval']['accuracy'])


@pytest.mark.slow
def test_train_binary_takes_a_preset_and_lets_flags_win(tmp_path):
  # FedCos Table II on the offline digits: --task/--model/--rounds/
  # --local_steps given on the command line, the rest from the preset.
  result = subprocess.run(
    [
      sys.executable,
      '-m',
      'binaries.train',
      '--preset=fedcos_table2_totally',
      '--method=fedprox0.1+fedcos0.02',
      '--task=digits',
      '--rounds=1',
      '--local_steps=2',
      '--noprogress',
      f'--cache_dir={tmp_path / "cache"}',
    ],
    cwd=tmp_path,
    env=dict(os.environ, PYTHONPATH=REPO),
    capture_output=True,
    text=True,
    timeout=600,
    check=False,
  )
  assert result.returncode == 0, result.stderr[-2000:]
  run = tmp_path / 'runs/fedcos_table2_totally/fedprox0.1_plus_fedcos0.02/seed0'
  with open(run / 'experiment.json') as f:
    settings = json.load(f)
  settings = settings.get('config', settings)
  assert settings['task'] == 'digits' and settings['rounds'] == 1
  assert (
    settings['method'],
    settings['fedprox_mu'],
    settings['fedcos_mu'],
  ) == ('fedprox+fedcos', 0.1, 0.02)
  assert (
    settings['model'],
    settings['num_clients'],
    settings['batch_size'],
    settings['partition'],
  ) == ('mlp1', 7, 128, 'mixed')


@pytest.mark.slow
def test_compare_binary_names_a_bad_preset_row(tmp_path):
  result = subprocess.run(
    [
      sys.executable,
      '-m',
      'binaries.compare',
      '--preset=fed2_vgg9_10x5',
      '--methods=fedavg,fedcka',
    ],
    cwd=tmp_path,
    env=dict(os.environ, PYTHONPATH=REPO),
    capture_output=True,
    text=True,
    timeout=300,
    check=False,
  )
  assert result.returncode == 2
  assert "no row 'fedcka'; choose one of fedavg, fed2" in result.stderr
  assert not (tmp_path / 'runs').exists()


@pytest.mark.slow
def test_presets_binary_lists_every_preset_with_the_papers_numbers():
  result = subprocess.run(
    [sys.executable, '-m', 'binaries.presets'],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=300,
    check=True,
  )
  for name in presets.PRESETS:
    assert f'\n{name}: ' in '\n' + result.stdout
  assert 'paper: 67.86' in result.stdout  # FedCKA, CIFAR-10
  assert 'paper: 73.10 ± 1.20' in result.stdout  # FedMAX, CIFAR-10 non-IID
  assert 'Exception ignored' not in result.stderr


def test_published_rows_of_methods_not_implemented_are_shown_not_run(tmp_path):
  preset = presets.get('fed2_fig6_vgg9')
  (fedma,) = preset.references
  assert (fedma.label, fedma.method, fedma.reported['accuracy']) == (
    'FedMA',
    '',
    87.53,
  )
  assert 'fedma' not in [row.key for row in preset.rows]  # never run
  assert '87.53 (reference: not run here)' in presets.describe(preset)
  summary = comparison_report.MethodSummary(
    'fed2', 1, (0.88, 0.0), (0.88, 0.0), (0.87, 0.0), 10.0, 1, 1.0
  )
  table = open(
    comparison_report.write_report(
      [summary],
      str(tmp_path),
      0.8,
      't',
      {'fed2': {'accuracy': 88.29}},
      {'fed2': 'Fed2'},
      preset.references,
    )['markdown']
  ).read()
  assert '| FedMA (paper only, not run here) | | | | | | 87.53 |' in table


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
