"""Tests for tff_methods_tooling.run_directory: the path TensorFlow reads
literally, and the output directory's lock.

The saved settings are tested with the runs that use them
(training_loop_test, faults_test).
"""

import os
import signal
import subprocess
import sys

import pytest
import tensorflow as tf

from tff_methods_tooling import experiment
from tff_methods_tooling import run_directory

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _saved_variable(directory):
  module = tf.Module()
  module.v = tf.Variable([1.0, 2.0])
  tf.saved_model.save(module, directory)


def test_a_directory_named_like_a_file_pattern_is_read_through_a_link(
  tmp_path,
):
  plain = str(tmp_path / 'plain')
  assert run_directory.tensorflow_path(plain) == plain
  named = str(tmp_path / 'a[1]*?')
  link = run_directory.tensorflow_path(named)
  assert link != named and not set('[]*?') & set(link)
  assert os.path.realpath(link) == os.path.realpath(named)  # Made, linked.
  assert run_directory.tensorflow_path(named) == link  # The same each time.
  # What the link is for: TensorFlow does not find variables saved under
  # the pattern-like name, and does through the link.
  _saved_variable(os.path.join(named, 'model'))
  with pytest.raises(Exception, match='matching files'):
    tf.saved_model.load(os.path.join(named, 'model'))
  loaded = tf.saved_model.load(os.path.join(link, 'model'))
  assert loaded.v.numpy().tolist() == [1.0, 2.0]


def test_a_link_left_by_another_directory_is_replaced(tmp_path):
  named = str(tmp_path / 'b[2]')
  link = run_directory.tensorflow_path(named)
  os.remove(link)
  os.symlink(str(tmp_path), link)  # Stale: leads elsewhere.
  assert run_directory.tensorflow_path(named) == link
  assert os.path.realpath(link) == os.path.realpath(named)


def test_a_second_run_on_a_locked_output_directory_is_refused(tmp_path):
  with run_directory.output_dir_lock(str(tmp_path / 'run')):
    with pytest.raises(
      run_directory.OutputDirInUseError,
      match=rf'--output_dir={tmp_path}/run is in use by '
      rf'another run \(process {os.getpid()}\)',
    ):
      experiment.run(
        experiment.ExperimentConfig(
          task='digits',
          model='mlp',
          num_clients=4,
          clients_per_round=2,
          rounds=1,
          output_dir=str(tmp_path / 'run'),
          cache_dir=str(tmp_path / 'cache'),
        ),
        progress=False,
      )
  # Released when the first ends.
  with run_directory.output_dir_lock(str(tmp_path / 'run')):
    pass


def test_a_killed_runs_lock_does_not_block_the_next(tmp_path):
  holder = subprocess.Popen(
    [
      sys.executable,
      '-c',
      'import sys, time; '
      'from tff_methods_tooling import run_directory; '
      'lock = run_directory.output_dir_lock(sys.argv[1]); '
      'lock.__enter__(); print("held", flush=True); time.sleep(600)',
      str(tmp_path / 'run'),
    ],
    cwd=REPO,
    stdout=subprocess.PIPE,
    text=True,
  )
  try:
    assert holder.stdout.readline().strip() == 'held'
    with pytest.raises(
      run_directory.OutputDirInUseError, match=f'process {holder.pid}'
    ):
      with run_directory.output_dir_lock(str(tmp_path / 'run')):
        pass
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=30)
    with run_directory.output_dir_lock(str(tmp_path / 'run')):
      pass
  finally:
    holder.kill()


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
