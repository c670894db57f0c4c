"""Faults and bad input end with one clear line, and lose nothing.

A `compare` job that dies without reporting ends the parent within
seconds; `compare --jobs=2` with one run left runs it; two runs on one
output directory are refused (a dead run's lock is released by the
kernel); a rerun with fewer rounds than done changes nothing; a resumed
run whose client states are gone is refused unless told to start them over;
a comparison refuses runs saved with other settings; a full disk and an
output directory that can't be written end in one line naming the file.
"""

import dataclasses
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from tff_methods.templates import model_lib
from tff_methods_tasks import array_sources
from tff_methods_tooling import comparison
from tff_methods_tooling import experiment
from tff_methods_tooling import training_loop
from tff_methods_tooling import tuning

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config(tmp_path, name, **settings):
  return experiment.ExperimentConfig(
    **{
      'method': 'fedavg',
      'task': 'digits',
      'model': 'mlp',
      'num_clients': 4,
      'clients_per_round': 2,
      'rounds': 2,
      'batch_size': 32,
      'seed': 2,
      'output_dir': str(tmp_path / name),
      'cache_dir': str(tmp_path / 'cache'),
      **settings,
    }
  )


def _snapshot(directory):
  return {
    name: open(os.path.join(directory, name), 'rb').read()
    for name in ('results.json', 'experiment.json', 'metrics.csv')
  }


@pytest.mark.usefixtures('tff_worker')
def test_a_rerun_with_fewer_rounds_than_done_changes_nothing(tmp_path):
  config = _config(tmp_path, 'run', rounds=3)
  experiment.run(config, progress=False)
  before = _snapshot(config.output_dir)
  with pytest.raises(
    ValueError,
    match=r'already at round 3, past ' r'--rounds=2; nothing was changed',
  ):
    experiment.run(_config(tmp_path, 'run', rounds=2), progress=False)
  assert _snapshot(config.output_dir) == before


@pytest.mark.usefixtures('tff_worker')
def test_a_resumed_run_whose_client_states_are_gone_is_refused(tmp_path):
  config = _config(tmp_path, 'run', method='scaffold', rounds=2)
  experiment.run(config, progress=False)
  shutil.rmtree(os.path.join(config.output_dir, 'client_states'))
  more = _config(tmp_path, 'run', method='scaffold', rounds=3)
  with pytest.raises(
    ValueError,
    match=r'its client states \(.*'
    r'client_states\) are gone.*--restart_client_states',
  ):
    experiment.run(more, progress=False)
  results = experiment.run(
    _config(
      tmp_path, 'run', method='scaffold', rounds=3, restart_client_states=True
    ),
    progress=False,
  )
  assert results['rounds'] == 3


@pytest.mark.usefixtures('tff_worker')
def test_compare_refuses_a_finished_run_saved_with_other_settings(tmp_path):
  base = _config(tmp_path, 'unused', rounds=1)
  runs = comparison.plan(base, ['fedavg'], [0], str(tmp_path / 'cmp'))
  comparison.run_comparison(runs, progress=False)
  before = _snapshot(runs[0].output_dir)
  changed = comparison.plan(
    dataclasses.replace(base, client_learning_rate=0.5),
    ['fedavg'],
    [0],
    str(tmp_path / 'cmp'),
  )
  with pytest.raises(
    ValueError,
    match=r'saved with other settings; nothing '
    r'was run(?s:.*)fedavg/seed0: client_learning_rate: saved '
    r'0\.05, now 0\.5',
  ):
    comparison.run_comparison(changed, progress=False)
  assert _snapshot(runs[0].output_dir) == before
  # The same settings, or more rounds, are no difference.
  comparison.run_comparison(
    comparison.plan(
      dataclasses.replace(base, rounds=2),
      ['fedavg'],
      [0],
      str(tmp_path / 'cmp'),
    ),
    progress=False,
  )
  with open(os.path.join(runs[0].output_dir, 'results.json')) as f:
    assert json.load(f)['rounds'] == 2


@pytest.mark.usefixtures('tff_worker')
def test_a_full_disk_ends_the_run_in_one_line_and_it_resumes(tmp_path):
  def disk_fills(round_num, metrics):
    del metrics
    if round_num == 2:
      raise OSError(
        errno.ENOSPC,
        os.strerror(errno.ENOSPC),
        str(tmp_path / 'run' / 'metrics.csv'),
      )

  config = _config(
    tmp_path, 'run', method='scaffold', rounds=3, rounds_per_checkpoint=1
  )
  with pytest.raises(
    training_loop.DiskFullError,
    match=rf'No space left on the device writing '
    rf'{tmp_path}/run/metrics.csv\. .*resumes from the last '
    r'saved round \(2\)',
  ):
    experiment.run(config, progress=False, round_hook=disk_fills)
  resumed = experiment.run(config, progress=False)
  whole = experiment.run(
    _config(
      tmp_path, 'whole', method='scaffold', rounds=3, rounds_per_checkpoint=1
    ),
    progress=False,
  )
  for a, b in zip(
    whole['final_weights'].trainable, resumed['final_weights'].trainable
  ):
    np.testing.assert_array_equal(a, b)


def test_a_full_disk_in_the_worker_names_the_file(tmp_path):
  # What TFF's worker reports when a client's state can't be written.
  error = RuntimeError(
    'Failed to run computation: /x/client_states/c1/3.state; No space '
    'left on device\n\t [[{{node WriteFile}}]]\nHint: If you want to see '
    'a list of allocated tensors when OOM happens ...'
  )
  message = str(training_loop.disk_full_error(error, str(tmp_path)))
  assert message.startswith(
    'No space left on the device writing ' '/x/client_states/c1/3.state. '
  )
  assert 'OOM' not in message
  assert training_loop.disk_full_error(RuntimeError('other'), '.') is None


def _children(pid):
  found = []
  for entry in os.listdir('/proc'):
    if entry.isdigit():
      try:
        with open(f'/proc/{entry}/stat') as f:
          if int(f.read().rsplit(')', 1)[1].split()[1]) == pid:
            found.append(int(entry))
      except (OSError, ValueError, IndexError):
        pass
  return found


def _alive(pid):
  try:
    with open(f'/proc/{pid}/stat') as f:
      return f.read().rsplit(')', 1)[1].split()[0] != 'Z'
  except OSError:
    return False


def _jobs(pid):
  jobs = []
  for child in _children(pid):
    try:
      with open(f'/proc/{child}/cmdline', 'rb') as f:
        if b'spawn_main' in f.read():  # not the resource tracker
          jobs.append(child)
    except OSError:
      pass
  return jobs


_COMPARE = [
  sys.executable,
  '-m',
  'binaries.compare',
  '--task=digits',
  '--model=mlp',
  '--num_clients=4',
  '--clients_per_round=2',
  '--noprogress',
  '--jobs=2',
]


def _start_training_compare(tmp_path, seeds, output=subprocess.PIPE):
  """A 200-round compare in two jobs, once its first run has a round."""
  compare = subprocess.Popen(
    _COMPARE
    + [
      '--methods=fedavg,fedprox',
      f'--seeds={seeds}',
      '--rounds=200',
      f'--cache_dir={tmp_path / "cache"}',
      f'--output_dir={tmp_path / "cmp"}',
    ],
    cwd=REPO,
    stdout=output,
    stderr=output,
    text=True,
  )
  deadline = time.monotonic() + 300
  while time.monotonic() < deadline and not any(
    os.path.exists(tmp_path / 'cmp' / m / 'seed0' / 'metrics.csv')
    for m in ('fedavg', 'fedprox')
  ):
    time.sleep(0.5)
  return compare


@pytest.mark.slow
def test_a_killed_compare_job_ends_the_parent_with_an_error(tmp_path):
  compare = _start_training_compare(tmp_path, '0,1')
  try:
    jobs = _jobs(compare.pid)
    assert len(jobs) == 2, jobs
    killed_at = time.monotonic()
    os.kill(jobs[0], signal.SIGKILL)
    _, stderr = compare.communicate(timeout=120)
    assert time.monotonic() - killed_at < 30
  finally:
    compare.kill()
  assert compare.returncode != 0
  assert 'ended before reporting their run (killed by SIGKILL)' in stderr
  assert 'Traceback' not in stderr


@pytest.mark.slow
def test_a_killed_compare_parent_takes_its_jobs_and_workers_with_it(tmp_path):
  # Its output unread: the jobs would block on a full pipe once it died.
  compare = _start_training_compare(tmp_path, '0', subprocess.DEVNULL)
  try:
    # The jobs, their TFF workers and multiprocessing's resource tracker.
    left = _children(compare.pid)
    left += [w for job in _jobs(compare.pid) for w in _children(job)]
    assert len(left) >= 5, left
    assert len(_jobs(compare.pid)) == 2
  finally:
    compare.kill()
  compare.wait()
  deadline = time.monotonic() + 30
  while time.monotonic() < deadline and any(_alive(p) for p in left):
    time.sleep(0.5)
  assert not [p for p in left if _alive(p)]


@pytest.mark.slow
def test_compare_in_two_jobs_with_one_run_left_runs_it(tmp_path):
  result = subprocess.run(
    _COMPARE
    + [
      '--methods=fedavg',
      '--seeds=0',
      '--rounds=2',
      f'--cache_dir={tmp_path / "cache"}',
      f'--output_dir={tmp_path / "cmp"}',
    ],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=600,
    check=False,
  )
  assert result.returncode == 0, result.stderr[-3000:]
  with open(tmp_path / 'cmp' / 'fedavg' / 'seed0' / 'results.json') as f:
    assert json.load(f)['rounds'] == 2


def _truncate_newest_checkpoint(output_dir):
  root = os.path.join(output_dir, 'program_state')
  newest = max(os.listdir(root), key=lambda n: int(n.rsplit('_', 1)[1]))
  files = [
    os.path.join(d, f)
    for d, _, names in os.walk(os.path.join(root, newest))
    for f in names
  ]
  largest = max(files, key=os.path.getsize)
  with open(largest, 'r+b') as f:
    f.truncate(os.path.getsize(largest) // 2)
  return newest


@pytest.mark.usefixtures('tff_worker')
def test_a_truncated_checkpoint_falls_back_to_the_one_before(tmp_path):
  # SCAFFOLD: the clients' state versions the older checkpoint needs must
  # still be there. The resumed run ends as the uninterrupted one.
  straight = experiment.run(
    _config(tmp_path, 'straight', method='scaffold', rounds=4), progress=False
  )
  experiment.run(
    _config(tmp_path, 'run', method='scaffold', rounds=3), progress=False
  )
  newest = _truncate_newest_checkpoint(str(tmp_path / 'run'))
  resumed = experiment.run(
    _config(tmp_path, 'run', method='scaffold', rounds=4), progress=False
  )
  assert resumed['rounds'] == 4
  assert os.path.isdir(
    tmp_path / 'run' / 'program_state' / f'{newest}.unreadable'
  )
  np.testing.assert_allclose(
    model_lib.flat_trainable(resumed['final_weights']),
    model_lib.flat_trainable(straight['final_weights']),
    rtol=1e-5,
    atol=1e-6,
  )


def test_a_bad_settings_file_is_named_in_one_line(tmp_path):
  with pytest.raises(
    ValueError,
    match=rf'--settings_from={tmp_path}/none'
    r'\.json: No such file or directory',
  ):
    tuning.read_settings(str(tmp_path / 'none.json'))
  (tmp_path / 'bad.json').write_text('{"fedavg": ')
  with pytest.raises(ValueError, match=r'bad\.json is not JSON'):
    tuning.read_settings(str(tmp_path / 'bad.json'))
  (tmp_path / 'list.json').write_text('[1, 2]')
  with pytest.raises(
    ValueError, match=r"list\.json is not a tune run's " 'tuning.json'
  ):
    tuning.read_settings(str(tmp_path / 'list.json'))
  # Settings no run takes: each named, with what fits.
  (tmp_path / 'odd.json').write_text(
    json.dumps(
      {
        'fedavg': {
          'client_learning_rate': True,
          'rounds': 'ten',
          'lr': 0.1,
          'server_learning_rate': None,
        },
        'fedprox': {'client_learning_rate': None, 'mu': 0.01},
      }
    )
  )
  with pytest.raises(ValueError) as refused:
    tuning.read_settings(str(tmp_path / 'odd.json'))
  message = str(refused.value)
  assert len(message.splitlines()) == 1
  for part in (
    'fedavg: client_learning_rate=True (expected a value like 0.05)',
    "fedavg: rounds='ten'",
    'fedavg: lr=0.1 (not a setting)',
    'fedprox: client_learning_rate=None',
  ):
    assert part in message
  assert 'server_learning_rate' not in message  # None: its default
  assert 'mu=' not in message


def test_an_output_directory_that_cannot_be_written_is_named(tmp_path):
  (tmp_path / 'file').write_text('not a directory')
  with pytest.raises(
    ValueError,
    match=rf'--output_dir={tmp_path}/file ' 'cannot be written: File exists',
  ):
    experiment.run(_config(tmp_path, 'file'), progress=False)


@pytest.mark.parametrize(
  'binary, line',
  [
    ('analyze', '--output_dir={} cannot be written: Not a directory.'),
    ('benchmark', 'Bad flags:'),
  ],
)
def test_every_binary_names_an_output_directory_it_cannot_write(
  tmp_path, binary, line
):
  (tmp_path / 'file').write_text('not a directory')
  output_dir = tmp_path / 'file' / 'run'
  result = subprocess.run(
    [sys.executable, '-m', f'binaries.{binary}', f'--output_dir={output_dir}'],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=300,
    check=False,
  )
  assert result.returncode == 2, result.stderr
  assert result.stderr.strip().splitlines()[0] == line.format(output_dir)
  assert f'--output_dir={output_dir} cannot be written' in result.stderr
  assert 'Traceback' not in result.stderr


def _png(path, seed):
  pixels = np.random.default_rng(seed).integers(0, 255, (6, 6, 3), np.uint8)
  path.write_bytes(tf.io.encode_png(pixels).numpy())


def test_an_image_folder_names_an_empty_class_and_a_bad_file(tmp_path):
  for cls in ('cat', 'dog', 'emu'):
    (tmp_path / cls).mkdir()
  for i, cls in enumerate(('cat', 'emu')):
    _png(tmp_path / cls / 'a.png', i)
    _png(tmp_path / cls / 'b.png', i + 2)
  (tmp_path / 'cat' / '.DS_Store').write_bytes(b'\0\1 not an image')
  with pytest.raises(
    ValueError, match=rf'class folder {tmp_path}/dog has no ' 'images'
  ):
    array_sources.load_image_folder_arrays(str(tmp_path), image_size=4)
  _png(tmp_path / 'dog' / 'a.png', 5)
  x_train, _, x_test, _ = array_sources.load_image_folder_arrays(
    str(tmp_path), image_size=4
  )
  assert len(x_train) + len(x_test) == 5  # .DS_Store skipped
  data = (tmp_path / 'emu' / 'b.png').read_bytes()
  (tmp_path / 'emu' / 'b.png').write_bytes(data[: len(data) // 2])
  with pytest.raises(
    ValueError,
    match=rf'{tmp_path}/emu/b\.png is not an ' 'image TensorFlow can read',
  ):
    array_sources.load_image_folder_arrays(str(tmp_path), image_size=4)


@pytest.mark.usefixtures('tff_worker')
def test_a_truncated_client_state_file_is_named_in_one_line(tmp_path):
  config = _config(
    tmp_path, 'run', method='scaffold', rounds=2, clients_per_round=4
  )
  experiment.run(config, progress=False)
  states = os.path.join(config.output_dir, 'client_states')
  client_dir = sorted(
    d for d in os.listdir(states) if os.path.isdir(os.path.join(states, d))
  )[0]
  path = os.path.join(states, client_dir, '2.state')
  with open(path, 'r+b') as f:
    f.truncate(os.path.getsize(path) // 2)
  with pytest.raises(
    training_loop.ClientStateError,
    match=rf'Round 3: the client state file {path} cannot '
    r'be read \(truncated or corrupt\)',
  ):
    experiment.run(
      _config(
        tmp_path, 'run', method='scaffold', rounds=3, clients_per_round=4
      ),
      progress=False,
    )


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
