"""Tests for tff_methods_tooling.comparison (and binaries/compare.py)."""

import csv
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tff_methods import privacy
from tff_methods_tooling import comparison
from tff_methods_tooling import comparison_report
from tff_methods_tooling import experiment

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _write_run(output_dir, method, seed, accuracies, seconds=0.5):
  directory = comparison.run_dir(output_dir, method, seed)
  os.makedirs(directory)
  with open(os.path.join(directory, 'metrics.csv'), 'w') as f:
    f.write('round,eval/accuracy,eval/macro_f1,seconds\n')
    for r, a in enumerate(accuracies, 1):
      f.write(f'{r},{a},{a / 2},{seconds}\n')


def test_summary_numbers_by_hand(tmp_path):
  out = str(tmp_path)
  _write_run(out, 'fedavg', 0, [0.2, 0.6, 0.5])
  _write_run(out, 'fedavg', 1, [0.4, 0.7, 0.8])
  _write_run(out, 'fedprox+fedcos', 0, [0.1, 0.2, 0.3], seconds=2.0)
  _write_run(out, 'fedprox+fedcos', 1, [0.3, 0.5, 0.7], seconds=2.0)
  fedavg, combo = comparison_report.summarize(
    out, ['fedavg', 'fedprox+fedcos'], [0, 1], target_accuracy=0.6
  )
  assert np.allclose(fedavg.final_accuracy, (0.65, 0.15))
  assert np.allclose(fedavg.best_accuracy, (0.7, 0.1))  # bests 0.6, 0.8
  assert np.allclose(fedavg.final_macro_f1, (0.325, 0.075))
  assert fedavg.rounds_to_target == 2.0  # round 2 in both seeds
  assert combo.rounds_to_target is None and combo.reached_target == 1
  assert combo.seconds_per_round == 2.0
  paths = comparison_report.write_report([fedavg, combo], out, 0.6, 'test')
  table = open(paths['markdown']).read()
  assert '| fedavg | 65.00 ± 15.00 | 70.00 ± 10.00 |' in table
  assert 'not reached (1/2 seeds)' in table
  assert os.path.exists(
    comparison_report.plot_accuracy(out, ['fedavg'], [0, 1], 't')
  )
  # One seed: no spread to show.
  one = comparison_report.summarize(out, ['fedavg'], [0], target_accuracy=0.6)
  table = open(
    comparison_report.write_report(one, out, 0.6, 't')['markdown']
  ).read()
  assert '| fedavg | 50.00 ± - | 60.00 ± - |' in table
  assert '± 0.00' not in table


def test_the_centralized_row_takes_a_rounds_examples_in_local_steps(tmp_path):
  arms = comparison.arms(['fedavg'], reference_rows=True)
  by_steps = experiment.ExperimentConfig(
    num_clients=10, clients_per_round=4, local_steps=20
  )
  runs = comparison.plan(by_steps, arms, [0], str(tmp_path))
  steps = {os.path.basename(os.path.dirname(c.output_dir)): c for c in runs}
  assert steps['fedavg'].local_steps == 20
  assert steps['fedavg_iid'].local_steps == 20
  # Pooled on one client: the 4 clients' 20 steps a round, 80.
  assert steps['centralized'].local_steps == 80
  assert steps['centralized'].num_clients == 1
  # By epochs it makes the same passes over the pooled data as is.
  by_epochs = experiment.ExperimentConfig(num_clients=10, local_epochs=2)
  runs = comparison.plan(by_epochs, arms, [0], str(tmp_path))
  assert {(c.local_epochs, c.local_steps) for c in runs} == {(2, None)}


def test_final_figures_average_the_last_rounds(tmp_path):
  out = str(tmp_path)
  _write_run(out, 'fedavg', 0, [0.2, 0.6, 0.5])
  _write_run(out, 'fedavg', 1, [0.4, 0.7, 0.8])
  (fedavg,) = comparison_report.summarize(
    out, ['fedavg'], [0, 1], 0.6, last_rounds=2
  )
  # Seed 0: (0.6 + 0.5) / 2 = 0.55; seed 1: (0.7 + 0.8) / 2 = 0.75.
  assert np.allclose(fedavg.final_accuracy, (0.65, 0.10))
  assert np.allclose(fedavg.final_macro_f1, (0.325, 0.05))
  assert np.allclose(fedavg.best_accuracy, (0.7, 0.1))  # unchanged
  table = open(
    comparison_report.write_report([fedavg], out, 0.6, 't')['markdown']
  ).read()
  assert "mean of the last 2 rounds' evaluations" in table
  # More last rounds than evaluations: the note says what was averaged.
  (fedavg,) = comparison_report.summarize(out, ['fedavg'], [0, 1], 0.6, 1000)
  table = open(
    comparison_report.write_report([fedavg], out, 0.6, 't')['markdown']
  ).read()
  assert "mean of the last 3 rounds' evaluations" in table
  with pytest.raises(ValueError, match='last_rounds'):
    comparison_report.summarize(out, ['fedavg'], [0], 0.6, last_rounds=0)
  with pytest.raises(ValueError, match='jobs'):
    comparison.run_comparison([], jobs=0)


def test_the_table_states_the_rounds_the_runs_recorded(tmp_path):
  out = str(tmp_path)
  _write_run(out, 'fedavg', 0, [0.2, 0.6, 0.5])
  _write_run(out, 'fedprox', 0, [0.3])
  for method, rounds, rate in (('fedavg', 3, 0.1), ('fedprox', 1, 0.03)):
    run = comparison.run_dir(out, method, 0)
    with open(os.path.join(run, 'results.json'), 'w') as f:
      json.dump({'rounds': rounds}, f)
    with open(os.path.join(run, 'experiment.json'), 'w') as f:
      json.dump(
        {
          'method': method,
          'rounds': rounds,
          'client_learning_rate': rate,
          'batch_size': 32,
        },
        f,
      )
  summaries = comparison_report.summarize(out, ['fedavg', 'fedprox'], [0], 0.6)
  assert comparison_report.rounds_run(summaries) == '1-3 rounds'
  settings = comparison_report.arm_settings(out, ['fedavg', 'fedprox'], [0])
  assert settings == {
    'fedavg': {'client_learning_rate': 0.1},
    'fedprox': {'client_learning_rate': 0.03},
  }
  table = open(
    comparison_report.write_report(summaries, out, 0.6, 't', settings=settings)[
      'markdown'
    ]
  ).read()
  assert 'Rounds trained differ: fedavg 3, fedprox 1.' in table
  assert (
    'Settings in which the arms differ: fedavg client_learning_rate=0.1; '
    'fedprox client_learning_rate=0.03' in table
  )
  assert comparison_report.rounds_run(summaries[:1]) == '3 rounds'
  # metrics.csv cut short of what results.json records: refused, by name.
  _write_run(out, 'fedmax', 0, [0.3, 0.4])
  with open(
    os.path.join(comparison.run_dir(out, 'fedmax', 0), 'results.json'), 'w'
  ) as f:
    json.dump({'rounds': 5}, f)
  with pytest.raises(ValueError, match=r'metrics.csv ends at round 2, but'):
    comparison_report.summarize(out, ['fedmax'], [0], 0.6)
  # Emptied, binary or gone: named, with what to do.
  metrics = os.path.join(comparison.run_dir(out, 'fedprox', 0), 'metrics.csv')
  for content in (b'', b'\xff\xfe\x00garbage'):
    with open(metrics, 'wb') as f:
      f.write(content)
    with pytest.raises(ValueError, match=rf'{metrics} .*restore it'):
      comparison_report.summarize(out, ['fedprox'], [0], 0.6)
  os.remove(metrics)
  with pytest.raises(ValueError, match=rf'{metrics} can.t be read'):
    comparison_report.summarize(out, ['fedprox'], [0], 0.6)
  # Deleted mid-run, then resumed: it holds only the later rounds.
  with open(metrics, 'w') as f:
    f.write('round,eval/accuracy,eval/macro_f1,seconds\n2,0.5,0.2,0.1\n')
  with pytest.raises(ValueError, match=r'does not hold rounds 1-2 once each'):
    comparison_report.summarize(out, ['fedprox'], [0], 0.6)


def test_a_dp_arm_shows_its_epsilon_beside_the_others(tmp_path):
  out = str(tmp_path)
  _write_run(out, 'fedavg', 0, [0.2, 0.6])
  directory = comparison.run_dir(out, 'fedavg@dp', 0)
  os.makedirs(directory)
  with open(os.path.join(directory, 'metrics.csv'), 'w') as f:
    f.write('round,eval/accuracy,seconds,dp/epsilon\n1,0.1,0.5,3.0\n')
    f.write('2,0.4,0.5,4.25\n')
  summaries = comparison_report.summarize(
    out, ['fedavg', 'fedavg@dp'], [0], 0.6
  )
  assert [s.epsilon for s in summaries] == [None, 4.25]  # after the last round
  paths = comparison_report.write_report(summaries, out, 0.6, 't')
  table = open(paths['markdown']).read()
  assert '| s/round | DP epsilon |' in table
  assert '| 0.50 | 4.25 |' in table and '| 0.50 |  |' in table
  with open(paths['csv']) as f:
    rows = list(csv.DictReader(f))
  assert {r['method']: r['dp_epsilon'] for r in rows} == {
    'fedavg': '',
    'fedavg@dp': '4.25',
  }


def test_a_dp_arm_over_seeds_reports_its_runs_composed(tmp_path):
  # Three seeds' runs of 3 rounds on the same 20 clients: publishing all
  # three spends what 9 rounds of one run would.
  out = str(tmp_path)
  guarantee = dict(
    noise_multiplier=1.0,
    clients_per_round=5,
    num_clients=20,
    rounds=3,
    sampling='without_replacement',
    adjacency='replace-one',
    accountant='rdp',
    delta=1e-5,
  )
  one_run = privacy.epsilon(1.0, 5, 20, 3, 1e-5, 'without_replacement')
  for seed in range(3):
    directory = comparison.run_dir(out, 'fedavg@dp', seed)
    os.makedirs(directory)
    with open(os.path.join(directory, 'metrics.csv'), 'w') as f:
      f.write('round,eval/accuracy,seconds,dp/epsilon\n')
      for r in (1, 2, 3):
        f.write(f'{r},0.4,0.5,{one_run}\n')
    with open(os.path.join(directory, 'results.json'), 'w') as f:
      json.dump(dict(dp=dict(guarantee, epsilon=one_run)), f)
  (summary,) = comparison_report.summarize(out, ['fedavg@dp'], [0, 1, 2], 0.6)
  nine_rounds = privacy.epsilon(1.0, 5, 20, 9, 1e-5, 'without_replacement')
  assert summary.epsilon == pytest.approx(one_run)  # 16.30
  assert summary.epsilon_all_seeds == pytest.approx(nine_rounds, rel=1e-9)
  assert nine_rounds > 1.5 * one_run
  paths = comparison_report.write_report([summary], out, 0.6, 't')
  table = open(paths['markdown']).read()
  assert f'| {one_run:.2f} ({nine_rounds:.2f} for all 3) |' in table
  assert 'client-level under replace-one adjacency,' in table
  with open(paths['csv']) as f:
    (row,) = list(csv.DictReader(f))
  assert float(row['dp_epsilon_all_seeds']) == pytest.approx(nine_rounds)


def test_plan_checks_every_run_before_any_starts(tmp_path):
  base = experiment.ExperimentConfig(task='digits', model='mlp')
  with pytest.raises(ValueError) as error:
    comparison.plan(base, ['fedavg', 'moon', 'fedmagic'], [0], str(tmp_path))
  assert 'moon (seed 0)' in str(error.value)  # mlp has no projection head
  assert 'fedmagic (seed 0)' in str(error.value)
  configs = comparison.plan(base, ['fedavg', 'fedprox'], [0, 3], str(tmp_path))
  assert [(c.method, c.seed) for c in configs] == [
    ('fedavg', 0),
    ('fedavg', 3),
    ('fedprox', 0),
    ('fedprox', 3),
  ]
  assert configs[1].output_dir == os.path.join(str(tmp_path), 'fedavg', 'seed3')


def _wait_with_sigterm(handler):
  signal.signal(signal.SIGTERM, handler)
  time.sleep(600)


def test_stopping_jobs_kills_a_job_that_ignores_sigterm():
  # fork: a local target, no pickling; the child runs only these two calls.
  context = multiprocessing.get_context('fork')
  stuck = context.Process(target=_wait_with_sigterm, args=(signal.SIG_IGN,))
  ending = context.Process(target=_wait_with_sigterm, args=(signal.SIG_DFL,))
  stuck.start()
  ending.start()
  time.sleep(0.5)  # The handler is in place.
  comparison.stop_jobs([stuck, ending], grace_seconds=1.0)
  assert ending.exitcode == -signal.SIGTERM
  assert stuck.exitcode == -signal.SIGKILL


def _accuracies(run_directory):
  with open(os.path.join(run_directory, 'metrics.csv')) as f:
    return [row['eval/accuracy'] for row in csv.DictReader(f)]


@pytest.mark.slow
def test_compare_binary_in_two_jobs_equals_one_and_a_rerun_skips(tmp_path):
  out = tmp_path / 'cmp'
  command = [
    sys.executable,
    '-m',
    'binaries.compare',
    '--methods=fedavg,fedprox',
    '--seeds=1',
    '--task=digits',
    '--model=mlp',
    '--num_clients=4',
    '--clients_per_round=4',
    '--rounds=2',
    f'--cache_dir={tmp_path / "cache"}',
    '--noprogress',
  ]
  first = subprocess.run(
    command + [f'--output_dir={out}', '--jobs=2'],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=600,
    check=False,
  )
  assert first.returncode == 0, first.stderr[-2000:]
  assert first.stdout.count('== [') == 2  # one line per finished run
  for name in ('comparison.md', 'comparison.csv', 'accuracy.png'):
    assert (out / name).exists()
  again = subprocess.run(
    command + [f'--output_dir={out}', '--jobs=2'],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=600,
    check=False,
  )
  assert again.returncode == 0
  assert again.stdout.count('== ') == 0  # every run had finished
  # A run's figures depend neither on the job that trained it nor on where
  # its TensorFlow ran (this one in-process, on two logical CPU devices).
  alone = tmp_path / 'alone'
  one = subprocess.run(
    command[:3]
    + ['--methods=fedprox', '--seeds=1']
    + command[5:]
    + [
      f'--output_dir={alone}',
      '--execution=in_process',
      '--devices=cpu:0,cpu:1',
    ],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=600,
    check=False,
  )
  assert one.returncode == 0, one.stderr[-2000:]
  assert _accuracies(alone / 'fedprox' / 'seed1') == _accuracies(
    out / 'fedprox' / 'seed1'
  )


_KILL_THE_WORKER_MID_RUN = r"""
import json, os, signal, sys
from tff_methods.execution import runtime
from tff_methods.execution import workers
from tff_methods_tooling import process_setup
process_setup.configure_process()
from tff_methods_tooling import comparison, experiment

def start_worker():
  runtime.set_local_execution_context(max_concurrent_clients=2)

def config(name):
  return experiment.ExperimentConfig(
      task='digits', model='mlp', num_clients=4, clients_per_round=4,
      rounds=4, rounds_per_checkpoint=2, cache_dir=sys.argv[1] + '/cache',
      output_dir=os.path.join(sys.argv[1], name))

def kill_after_round_2(round_num, metrics):
  del metrics
  if round_num == 2 and not killed:
    killed.append(workers.worker_pids())
    for pid in workers.worker_pids():
      os.kill(pid, signal.SIGSEGV)

killed = []
start_worker()
clean = comparison.run_restarting_worker(config('clean'), start_worker,
                                         progress=False)
restarted = comparison.run_restarting_worker(
    config('restarted'), start_worker, progress=False,
    round_hook=kill_after_round_2)
print(json.dumps(dict(killed=killed, clean=clean['final_eval'],
                      restarted=restarted['final_eval'])))
"""


@pytest.mark.slow
def test_a_run_whose_worker_dies_resumes_on_a_new_worker(tmp_path):
  result = subprocess.run(
    [sys.executable, '-c', _KILL_THE_WORKER_MID_RUN, str(tmp_path)],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=600,
    check=False,
  )
  assert result.returncode == 0, result.stderr[-3000:]
  assert 'exited with code -11' in result.stderr  # the kill was seen
  figures = json.loads(result.stdout.strip().splitlines()[-1])
  assert figures['killed'] and figures['killed'][0]
  # Resumed from round 2's checkpoint: the same run as without the crash.
  assert figures['restarted'] == figures['clean']
  assert _accuracies(tmp_path / 'restarted') == _accuracies(tmp_path / 'clean')


def test_a_method_at_an_aggregator_is_an_arm_beside_the_method(tmp_path):
  arms = comparison.arms(
    ['fedcka', 'fedcka@dp'], settings={'fedcka': {'client_learning_rate': 0.1}}
  )
  assert [(a.label, a.method) for a in arms] == [
    ('fedcka', 'fedcka'),
    ('fedcka@dp', 'fedcka'),
  ]
  assert arms[1].settings == {'client_learning_rate': 0.1, 'aggregator': 'dp'}
  base = experiment.ExperimentConfig(task='digits')
  configs = comparison.plan(
    base, ['fedavg', 'fedavg@robust'], [0], str(tmp_path)
  )
  assert [c.aggregator for c in configs] == ['mean', 'robust']
  assert configs[1].output_dir == os.path.join(
    str(tmp_path), 'fedavg@robust', 'seed0'
  )
  with pytest.raises(
    ValueError, match="(?s)fedavg@median.*--aggregator='median'"
  ):
    comparison.plan(base, ['fedavg@median'], [0], str(tmp_path))


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
