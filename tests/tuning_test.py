"""Tests for tff_methods_tooling.tuning (and binaries/tune.py) and comparison
arms."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tff_methods.algorithms import methods
from tff_methods_tasks import datasets
from tff_methods_tooling import comparison
from tff_methods_tooling import experiment
from tff_methods_tooling import tuning

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _write_run(output_dir, label, seed, accuracies):
  directory = comparison.run_dir(output_dir, label, seed)
  os.makedirs(directory)
  with open(os.path.join(directory, 'metrics.csv'), 'w') as f:
    f.write('round,eval/accuracy,eval/macro_f1,seconds\n')
    for r, a in enumerate(accuracies, 1):
      f.write(f'{r},{a},{a},0.1\n')


def test_grid_tunes_the_server_rate_only_where_there_is_a_server_rule():
  points = tuning.grid(
    ['fedavg', 'fedadam', 'fedavgm+fedcos'], [0.01, 0.1], [0.03, 1.0]
  )
  by_method = {}
  for p in points:
    by_method.setdefault(p.method, []).append(p.settings())
  assert by_method['fedavg'] == [
    {'client_learning_rate': 0.01},
    {'client_learning_rate': 0.1},
  ]
  assert len(by_method['fedadam']) == 4
  assert len(by_method['fedavgm+fedcos']) == 4
  with pytest.raises(ValueError, match='server_learning_rates is empty'):
    tuning.grid(['fedyogi'], [0.1], [])


def test_choice_is_the_best_mean_validation_accuracy(tmp_path):
  out = str(tmp_path)
  points = tuning.grid(['fedavg'], [0.01, 0.1, 0.3], [])
  finals = {0.01: (0.5, 0.6), 0.1: (0.8, 0.7), 0.3: (0.9, 0.4)}
  for p in points:
    for seed, final in zip((0, 1), finals[p.client_learning_rate]):
      _write_run(out, p.label, seed, [0.1, final])
  chosen = tuning.choose(
    out, points, [0, 1], shared_settings=dict(client_momentum=0.0)
  )
  # Means 0.55, 0.75, 0.65: 0.1 wins (0.3 has the single best run).
  assert chosen['fedavg']['client_learning_rate'] == 0.1
  assert np.isclose(chosen['fedavg']['validation_accuracy'], 0.75)
  paths = tuning.write_report(out, points, [0, 1], chosen, 't')
  markdown = open(paths['markdown']).read()
  assert '| fedavg | **0.1** |' in markdown
  assert markdown.count('**') == 2
  # The rounds in the heading are those the runs recorded.
  assert markdown.startswith('# t, 2 rounds: learning rates on held-out')
  # The search's shared settings go with the choice.
  assert tuning.read_settings(paths['json']) == {
    'fedavg': {'client_learning_rate': 0.1, 'client_momentum': 0.0}
  }
  assert os.path.exists(paths['curves_fedavg'])


def test_tuning_runs_never_see_the_test_set(tmp_path):
  base = experiment.ExperimentConfig(task='digits', model='mlp')
  configs = tuning.plan(
    base, tuning.grid(['fedavg'], [0.1], []), [0], str(tmp_path)
  )
  assert configs[0].validation_fraction == tuning.VALIDATION_FRACTION
  test = datasets.load_task(
    'digits', num_clients=2, partition='iid', cache_dir=str(tmp_path / 'c')
  )
  held = datasets.load_task(
    'digits',
    num_clients=2,
    partition='iid',
    cache_dir=str(tmp_path / 'c'),
    validation_fraction=0.2,
  )
  # The held-out set comes from the training examples, not the test split.
  train_total = sum(len(y) for y in test.train_labels)
  assert len(held.test_y) == round(0.2 * train_total)
  assert sum(len(y) for y in held.train_labels) + len(held.test_y) == (
    train_total
  )
  test_rows = {x.tobytes() for x in test.test_x}
  assert not any(x.tobytes() in test_rows for x in held.test_x)
  with pytest.raises(ValueError, match='validation_fraction is for tasks'):
    datasets.load_task(
      'synthetic', validation_fraction=0.2, cache_dir=str(tmp_path / 'c')
    )


def test_comparison_arms_take_tuned_settings_and_reference_rows():
  settings = {
    'fedavg': {'client_learning_rate': 0.1},
    'moon': {'client_learning_rate': 0.03},
  }
  arms = comparison.arms(['moon'], settings, reference_rows=True)
  assert [(a.label, a.method) for a in arms] == [
    ('moon', 'moon'),
    ('centralized', 'fedavg'),
    ('fedavg_iid', 'fedavg'),
  ]
  assert arms[0].settings == {'client_learning_rate': 0.03}
  assert arms[1].settings == dict(
    client_learning_rate=0.1,
    num_clients=1,
    clients_per_round=1,
    partition='iid',
  )
  with pytest.raises(ValueError, match='no settings for fedprox'):
    comparison.arms(['fedprox'], settings)
  # A reference row tuned on its own takes its own settings.
  own = dict(settings, centralized={'client_learning_rate': 0.01})
  arms = comparison.arms(['moon'], own, reference_rows=True)
  assert arms[1].settings['client_learning_rate'] == 0.01
  assert arms[2].settings['client_learning_rate'] == 0.1
  point = tuning.grid(['centralized'], [0.01], [0.1])[0]
  assert point.arm().method == 'fedavg'
  assert point.arm().settings == dict(
    client_learning_rate=0.01,
    num_clients=1,
    clients_per_round=1,
    partition='iid',
  )


@pytest.mark.slow
@pytest.mark.parametrize(
  'path', ['demo/tuning.json', 'demo/fmnist/tuning.json']
)
def test_the_make_targets_settings_cover_every_method_they_compare(path):
  # `make demo` and `make fmnist` compare every single method but TFF's own,
  # with the reference rows tuned too.
  settings = tuning.read_settings(os.path.join(REPO, path))
  compared = [
    m for m in methods.SINGLE_METHODS if m not in methods.TFF_ALGORITHMS
  ]
  arms = comparison.arms(compared, settings, reference_rows=True)
  assert [a.label for a in arms] == compared + list(comparison.REFERENCE_ROWS)
  for arm in arms:
    assert arm.settings['client_learning_rate'] > 0, arm


def test_tune_binary_writes_its_choice(tmp_path):
  out = tmp_path / 'tune'
  command = [
    sys.executable,
    '-m',
    'binaries.tune',
    '--methods=fedavg',
    '--client_learning_rates=0.01,0.1',
    '--task=digits',
    '--model=mlp',
    '--num_clients=2',
    '--clients_per_round=2',
    '--rounds=1',
    '--client_momentum=0.5',
    f'--output_dir={out}',
    f'--cache_dir={tmp_path / "cache"}',
    '--noprogress',
  ]
  run = subprocess.run(
    command, cwd=REPO, capture_output=True, text=True, timeout=600, check=False
  )
  assert run.returncode == 0, run.stderr[-2000:]
  chosen = json.loads((out / 'tuning.json').read_text())
  assert chosen['fedavg']['client_learning_rate'] in (0.01, 0.1)
  assert chosen['fedavg']['client_momentum'] == 0.5
  bad = subprocess.run(
    command[:3] + ['--client_learning_rates=fast'],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=600,
    check=False,
  )
  assert bad.returncode == 2
  assert '--client_learning_rates=fast must be numbers' in bad.stderr


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
