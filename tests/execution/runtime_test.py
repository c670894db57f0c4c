"""Tests for tff_methods.execution.runtime (the execution contexts on TFF's
workers) and tff_methods_tooling.process_setup (the binaries' own set-up).

The workers' own life is tested in workers_test.py."""

import os
import signal
import subprocess
import sys
import time

import pytest

from tff_methods.execution import runtime
from tff_methods.execution import workers
from tff_methods_binaries import binary_main
from tff_methods_tooling import process_setup

REPO = os.path.dirname(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)


def test_structured_values_are_serialized_in_place_as_tff_serializes_them():
  import collections

  import numpy as np
  import tensorflow_federated as tff
  from tensorflow_federated.proto.v0 import executor_pb2
  from tensorflow_federated.python.core.impl.executors import (
    value_serialization,
  )

  # A server state's shape: named and unnamed levels, an empty struct.
  server = tff.FederatedType(
    tff.StructType(
      [
        ('model', tff.StructType([tff.TensorType(np.float32, [3])] * 2)),
        ('counts', tff.StructType([tff.TensorType(np.int64), ()])),
      ]
    ),
    tff.SERVER,
  )
  state = collections.OrderedDict(
    model=[np.arange(3, dtype=np.float32), np.ones(3, np.float32)],
    counts=(np.int64(7), ()),
  )
  clients = tff.FederatedType(
    tff.TensorType(np.int32, [2]), tff.CLIENTS, all_equal=False
  )
  for value, type_spec in (
    (state, server),
    ([np.array([1, 2], np.int32), np.array([3, 4], np.int32)], clients),
    ([], clients),
  ):
    in_place = executor_pb2.Value()
    runtime._serialize_into(in_place, value, type_spec)  # pylint: disable=protected-access
    expected, _ = value_serialization.serialize_value(value, type_spec)
    assert in_place == expected
  with pytest.raises(TypeError, match='struct value of 1 elements'):
    runtime._serialize_into(  # pylint: disable=protected-access
      executor_pb2.Value(),
      {'a': 1},
      tff.StructType([]),
    )


def test_importing_the_runtime_changes_no_environment():
  script = (
    'import os; before = dict(os.environ); '
    'from tff_methods.execution import runtime; '
    'print(sorted(set(os.environ.items()) ^ set(before.items())))'
  )
  env = {
    k: v
    for k, v in os.environ.items()
    if k not in ('TF_ENABLE_ONEDNN_OPTS', 'GRPC_ENABLE_FORK_SUPPORT')
  }
  out = subprocess.run(
    [sys.executable, '-c', script],
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=120,
    check=True,
  )
  assert out.stdout.strip().splitlines()[-1] == '[]'


def test_a_local_context_leaves_the_users_process_alone():
  # Signal handlers and warning filters are the binaries' choice
  # (tff_methods_tooling.process_setup), not the library's.
  script = '\n'.join(
    [
      'import signal, warnings',
      'import tensorflow as tf, tensorflow_federated as tff',
      'filters = list(warnings.filters)',
      'from tff_methods.algorithms import fedavg',
      'from tff_methods.execution import runtime, workers',
      'runtime.set_local_execution_context(max_concurrent_clients=1)',
      'assert tff.tensorflow.computation(lambda: tf.constant(3))() == 3',
      'print(signal.getsignal(signal.SIGINT) is signal.default_int_handler,',
      '      signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,',
      '      warnings.filters == filters, len(workers.worker_pids()))',
      'workers.install_signal_handlers()',
      'print(signal.getsignal(signal.SIGINT) is workers._signal_handler)',
    ]
  )
  out = subprocess.run(
    [sys.executable, '-c', script],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=300,
    check=True,
  )
  assert out.stdout.split() == ['True', 'True', 'True', '1', 'True']


def test_configure_environment_keeps_the_callers_settings(monkeypatch):
  monkeypatch.setenv('TF_ENABLE_ONEDNN_OPTS', '0')
  monkeypatch.delenv('GRPC_ENABLE_FORK_SUPPORT', raising=False)
  process_setup.configure_environment()
  assert os.environ['TF_ENABLE_ONEDNN_OPTS'] == '0'
  assert os.environ['GRPC_ENABLE_FORK_SUPPORT'] == '0'


def test_a_bad_thread_count_in_the_environment_ends_a_binary_in_one_line():
  assert process_setup.thread_settings_problem({}) is None
  assert (
    process_setup.thread_settings_problem(
      {'TF_NUM_INTRAOP_THREADS': '4', 'TF_NUM_INTEROP_THREADS': '0'}
    )
    is None
  )
  for name, value in (
    ('TF_NUM_INTRAOP_THREADS', '-4'),  # TensorFlow aborts
    ('TF_NUM_INTEROP_THREADS', 'abc'),  # TensorFlow ignores it
  ):
    assert process_setup.thread_settings_problem({name: value}).startswith(
      f'{name}={value!r} must be a whole number >= 0'
    )
  result = subprocess.run(
    [sys.executable, '-m', 'binaries.train', '--rounds=1'],
    cwd=REPO,
    env={**os.environ, 'TF_NUM_INTRAOP_THREADS': '-4'},
    capture_output=True,
    text=True,
    timeout=300,
    check=False,
  )
  assert result.returncode == 2
  assert result.stderr.strip().splitlines() == [
    "error: TF_NUM_INTRAOP_THREADS='-4' must be a whole number >= 0 (0: "
    'TensorFlow chooses); set it so, or unset it.'
  ]


def test_a_script_that_imports_the_library_and_exits_prints_no_traceback():
  # TFF 0.87's import-time context fails in __del__ at shutdown unless it is
  # dropped first (tff_methods/__init__.py).
  result = subprocess.run(
    [
      sys.executable,
      '-c',
      'from tff_methods.algorithms import fedprox, moon; '
      'from tff_methods.templates import stateful, aggregation',
    ],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=300,
    check=False,
  )
  assert result.returncode == 0
  assert 'Traceback' not in result.stderr
  assert 'Exception ignored' not in result.stderr


@pytest.mark.parametrize(
  'raised, status, says',
  [
    (KeyboardInterrupt(), 130, 'interrupted: what was saved is kept'),
    (workers.WorkerEndedBySignalError(signal.SIGINT), 130, 'interrupted:'),
    (workers.WorkerEndedBySignalError(signal.SIGTERM), 143, ''),
  ],
)
def test_a_binary_ends_on_the_interruption_as_on_the_signal(
  raised, status, says, monkeypatch, capsys
):
  def main(argv):
    del argv
    raise raised

  monkeypatch.setattr(sys, 'argv', ['binary'])
  with pytest.raises(SystemExit) as ended:
    binary_main.run(main, __name__)
  assert ended.value.code == status
  stderr = capsys.readouterr().err
  assert says in stderr and 'Traceback' not in stderr


_ORPHAN = """
import os, signal, time
from tff_methods_tooling import process_setup
# A job whose SIGTERM handler never runs (its main thread in a native call).
signal.signal(signal.SIGTERM, signal.SIG_IGN)
process_setup.exit_when_orphaned(os.getppid(), grace_seconds=0.5)
print(os.getpid(), flush=True)
time.sleep(120)
"""


def _alive(pid):
  try:
    with open(f'/proc/{pid}/stat') as f:
      return f.read().rsplit(')', 1)[1].split()[0] != 'Z'
  except OSError:
    return False


def test_an_orphaned_job_ends_though_its_sigterm_handler_cannot_run():
  parent = subprocess.Popen(
    [
      sys.executable,
      '-c',
      'import subprocess, sys, time\n'
      'subprocess.Popen([sys.executable, "-c", sys.argv[1]])\n'
      'time.sleep(120)',
      _ORPHAN,
    ],
    cwd=REPO,
    stdout=subprocess.PIPE,
    text=True,
  )
  try:
    job = int(parent.stdout.readline())
    time.sleep(1.5)  # Longer than the grace: its parent lives, so must it.
    assert _alive(job)
  finally:
    parent.kill()
    parent.wait()
  deadline = time.monotonic() + 10
  while time.monotonic() < deadline and _alive(job):
    time.sleep(0.2)
  assert not _alive(job)


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
