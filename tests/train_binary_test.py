"""End-to-end tests of binaries/train.py as a user runs it.

The TFF worker must end on every exit path: a normal end, and SIGINT or
SIGTERM mid-round.
"""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tff_methods.algorithms import methods
from tff_methods_binaries import train

pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _children(pid):
  """Pids of live processes whose parent is `pid`."""
  found = []
  for entry in os.listdir('/proc'):
    if not entry.isdigit():
      continue
    try:
      with open(f'/proc/{entry}/stat') as f:
        fields = f.read().rsplit(')', 1)[1].split()
    except OSError:
      continue
    if int(fields[1]) == pid and fields[0] != 'Z':
      found.append(int(entry))
  return found


def _alive(pid):
  try:
    with open(f'/proc/{pid}/stat') as f:
      return f.read().rsplit(')', 1)[1].split()[0] != 'Z'
  except OSError:
    return False


def _start(tmp_path, *flags, env=None):
  log = open(tmp_path / 'log.txt', 'w')
  process = subprocess.Popen(
    [
      sys.executable,
      '-m',
      'binaries.train',
      '--task=digits',
      '--model=mlp',
      f'--cache_dir={tmp_path / "cache"}',
      '--noprogress',
      *flags,
    ],
    cwd=REPO,
    stdout=log,
    stderr=subprocess.STDOUT,
    env=env,
  )
  return process


def _environment_of(pid):
  with open(f'/proc/{pid}/environ', 'rb') as f:
    pairs = [item.split(b'=', 1) for item in f.read().split(b'\0') if item]
  return {k.decode(): v.decode() for k, v in pairs}


def _cmdline(pid):
  # A short-lived child may be gone by the time it is read.
  try:
    with open(f'/proc/{pid}/cmdline') as f:
      return f.read()
  except FileNotFoundError:
    return ''


def _worker_of(process, timeout=60):
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    workers = [
      p for p in _children(process.pid) if 'worker_binary' in _cmdline(p)
    ]
    if workers:
      return workers[0]
    assert process.poll() is None, 'train exited before starting a worker'
    time.sleep(0.2)
  raise AssertionError('no TFF worker started')


@pytest.mark.parametrize('signum', [signal.SIGINT, signal.SIGTERM])
def test_signal_mid_round_leaves_no_worker(signum, tmp_path):
  output_dir = tmp_path / 'run'
  process = _start(
    tmp_path,
    '--execution=worker',
    '--rounds=500',
    '--local_epochs=3',
    f'--output_dir={output_dir}',
  )
  worker = _worker_of(process)
  # Wait until training is under way (a round has been written), then
  # interrupt in the middle of a later round.
  deadline = time.monotonic() + 120
  metrics = output_dir / 'metrics.csv'
  while not (metrics.exists() and len(metrics.read_text().splitlines()) > 1):
    assert time.monotonic() < deadline and process.poll() is None
    time.sleep(0.2)
  time.sleep(0.5)
  process.send_signal(signum)
  process.wait(timeout=60)
  assert process.returncode != 0
  if signum == signal.SIGINT:  # A Ctrl-C: one line, no traceback.
    assert process.returncode == 130
    log = (tmp_path / 'log.txt').read_text()
    assert 'Traceback' not in log
    assert log.strip().splitlines()[-1].startswith('interrupted: ')
  time.sleep(0.5)
  assert not _alive(worker), f'worker {worker} outlived the program'
  # Program state saved before the interruption is intact: a rerun resumes.
  assert any(os.scandir(output_dir / 'program_state'))


# The worker runs with TensorFlow's oneDNN kernels (twice as fast here)
# unless the user chose otherwise (runtime_test: the user's choice kept).
def test_normal_run_ends_its_worker_and_writes_results(tmp_path):
  output_dir = tmp_path / 'run'
  env = {k: v for k, v in os.environ.items() if k != 'TF_ENABLE_ONEDNN_OPTS'}
  process = _start(
    tmp_path,
    '--execution=worker',
    '--rounds=2',
    f'--output_dir={output_dir}',
    env=env,
  )
  worker = _worker_of(process)
  assert _environment_of(worker).get('TF_ENABLE_ONEDNN_OPTS') == '1'
  assert process.wait(timeout=300) == 0
  time.sleep(0.5)
  assert not _alive(worker)
  log = (tmp_path / 'log.txt').read_text()
  assert 'test accuracy' in log
  for name in (
    'metrics.csv',
    'results.json',
    'partition.png',
    'experiment.json',
  ):
    assert (output_dir / name).exists(), name


def test_bad_flags_fail_before_any_work(tmp_path):
  output_dir = tmp_path / 'run'
  result = subprocess.run(
    [
      sys.executable,
      '-m',
      'binaries.train',
      '--method=fedmagic',
      '--alpha=-1',
      f'--output_dir={output_dir}',
    ],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=120,
    check=False,
  )
  assert result.returncode == 2
  assert "--method='fedmagic': Unknown method" in result.stderr
  assert '--alpha=-1.0 must be > 0' in result.stderr
  assert not output_dir.exists()


# A user's package outside the library, as `pip install -e` would put it.
USER_METHODS = os.path.join(REPO, 'tests', 'user_methods')


def _run_binary(binary, *flags, pythonpath=USER_METHODS):
  env = dict(os.environ, PYTHONPATH=pythonpath)
  return subprocess.run(
    [sys.executable, '-m', f'binaries.{binary}', *flags],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=600,
    check=False,
    env=env,
  )


def _final_weights(run_dir):
  with np.load(run_dir / 'final_weights.npz') as saved:
    return np.concatenate([saved[k].ravel() for k in sorted(saved.files)])


def test_a_users_method_module_reaches_train_and_compare(tmp_path):
  shared = [
    '--method_module=mypkg.pull',
    '--task=digits',
    '--model=mlp',
    '--num_clients=2',
    '--clients_per_round=2',
    '--rounds=1',
    f'--cache_dir={tmp_path / "cache"}',
  ]
  # compare, its runs in spawned jobs: the user's method beside FedAvg, its
  # own flag reaching its term.
  compared = _run_binary(
    'compare',
    *shared,
    '--methods=fedavg,pull',
    '--pull_mu=1.0',
    '--jobs=2',
    f'--output_dir={tmp_path / "compare"}',
  )
  assert compared.returncode == 0, compared.stderr[-3000:]
  # Where the rounds ran, said in one line: with jobs, a worker each.
  assert 'Execution: worker (auto: --jobs=2 runs a worker a job).' in (
    compared.stdout
  )
  runs = sorted((tmp_path / 'compare').glob('*/seed0'))
  assert [r.parent.name for r in runs] == ['fedavg', 'pull'], runs
  fedavg_weights, pulled = map(_final_weights, runs)
  assert np.max(np.abs(pulled - fedavg_weights)) > 1e-4
  saved = (runs[1] / 'experiment.json').read_text()
  assert '"method_module": "mypkg.pull"' in saved
  assert '"pull_mu": 1.0' in saved
  # train: at strength 0 the user's method is FedAvg.
  trained = _run_binary(
    'train',
    *shared,
    '--method=pull',
    '--pull_mu=0',
    '--noprogress',
    f'--output_dir={tmp_path / "train"}',
  )
  assert trained.returncode == 0, trained.stderr[-3000:]
  # By default, without a GPU: in this process, the CPU split in two (the
  # worker's two clients at once).
  assert (
    'Execution: in_process on /device:CPU:0, /device:CPU:1 (auto: no GPU;'
    in trained.stdout
  )
  np.testing.assert_allclose(
    _final_weights(tmp_path / 'train'), fedavg_weights, rtol=1e-5, atol=1e-6
  )


def test_a_method_module_that_cant_be_imported_fails_in_one_line(tmp_path):
  result = _run_binary(
    'train', '--method_module=mypkg.nosuch', f'--output_dir={tmp_path}/run'
  )
  assert result.returncode == 2
  assert result.stderr.strip().splitlines() == [
    "error: --method_module=mypkg.nosuch: No module named 'mypkg.nosuch'; "
    'give a module importable from here (on PYTHONPATH or installed), e.g. '
    '--method_module=mypkg.pull.'
  ]
  assert not (tmp_path / 'run').exists()


def test_help_lists_every_method():
  help_text = train.flags.FLAGS['method'].help
  for name in methods.METHOD_NAMES:
    assert name in help_text


@pytest.mark.parametrize('binary', ['train', 'worker'])
def test_help_prints_the_docstring_and_every_flag_and_exits_0(binary):
  # absl's own --help lists only the flags of the file run as __main__
  # (none of the shared ones) and exits 1.
  result = subprocess.run(
    [sys.executable, '-m', f'binaries.{binary}', '--help'],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=120,
    check=False,
  )
  assert result.returncode == 0, result.stderr
  expected = {
    'train': ['Trains one federated method', '--method', '--tff_workers'],
    'worker': ['--port'],
  }[binary]
  for text in expected:
    assert text in result.stdout
  if binary == 'worker':  # The experiment flags are not a worker's.
    assert '--method' not in result.stdout


def _train(tmp_path, name, *flags):
  return subprocess.run(
    [
      sys.executable,
      '-m',
      'binaries.train',
      '--task=digits',
      '--model=mlp',
      '--num_clients=4',
      '--clients_per_round=4',
      '--rounds=2',
      f'--cache_dir={tmp_path / "cache"}',
      f'--output_dir={tmp_path / name}',
      '--noprogress',
      *flags,
    ],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=300,
    check=False,
  )


def test_a_bad_device_fails_in_one_line_before_any_work(tmp_path):
  # The other execution flags' refusals: multi_worker_test (runtime_flags).
  # A binary's in-process run equals the worker's: comparison_test (its
  # one-job rerun), on every method: in_process_test (the device check).
  result = _train(tmp_path, 'run', '--execution=in_process', '--devices=tpu:0')
  assert result.returncode == 2
  assert (
    "--devices: 'tpu:0' is not a device; allowed: cpu:N or gpu:N"
    in result.stderr
  )
  assert not (tmp_path / 'run').exists()


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
