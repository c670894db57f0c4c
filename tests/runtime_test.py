"""Tests for tff_methods.runtime and .workers (the contexts and the workers'
life) and tff_methods_tooling.process_setup (the binaries' own set-up)."""

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from tff_methods import runtime
from tff_methods import workers
from tff_methods_binaries import binary_main
from tff_methods_tooling import process_setup

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
    'from tff_methods import runtime; '
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
      'from tff_methods import fedavg, runtime, workers',
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


def test_a_worker_keeps_the_users_onednn_choice(monkeypatch):
  monkeypatch.setenv('TF_ENABLE_ONEDNN_OPTS', '0')
  assert workers.worker_environment(2)['TF_ENABLE_ONEDNN_OPTS'] == '0'
  monkeypatch.delenv('TF_ENABLE_ONEDNN_OPTS')
  assert workers.worker_environment(2)['TF_ENABLE_ONEDNN_OPTS'] == '1'


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


@pytest.mark.parametrize(
  'cores, max_calls, threads',
  [
    (2, 2, '1'),
    (8, 2, '4'),
    (8, 3, '2'),
    (2, 4, '1'),
    # No limit on the clients at once: TensorFlow's default (every core).
    (8, -1, None),
    (8, 0, None),
  ],
)
def test_a_worker_splits_the_cores_between_its_clients(
  monkeypatch, cores, max_calls, threads
):
  monkeypatch.delenv('TF_NUM_INTRAOP_THREADS', raising=False)
  monkeypatch.setattr(workers, 'usable_cores', lambda: cores)
  env = workers.worker_environment(max_calls)
  assert env.get('TF_NUM_INTRAOP_THREADS') == threads
  assert env['TF_ENABLE_ONEDNN_OPTS'] == os.environ.get(
    'TF_ENABLE_ONEDNN_OPTS', '1'
  )


@pytest.mark.parametrize(
  'cores, max_calls, parameters, threads',
  [
    (2, 2, None, 1),
    (2, 2, 150_000, 1),
    (8, 2, 999_999, 4),
    # A million parameters or more: every core for each client.
    (2, 2, 1_000_000, 2),
    (8, 2, 11_000_000, 8),
    (8, -1, 11_000_000, None),
    (8, -1, None, None),
  ],
)
def test_large_models_get_every_core_for_each_client(
  monkeypatch, cores, max_calls, parameters, threads
):
  monkeypatch.delenv('TF_NUM_INTRAOP_THREADS', raising=False)
  monkeypatch.setattr(workers, 'usable_cores', lambda: cores)
  assert workers.threads_per_client(parameters, max_calls) == threads
  env = workers.worker_environment(max_calls, model_parameters=parameters)
  assert env.get('TF_NUM_INTRAOP_THREADS') == (
    None if threads is None else str(threads)
  )


def test_a_workers_threads_follow_the_callers_setting(monkeypatch):
  monkeypatch.setenv('TF_NUM_INTRAOP_THREADS', '3')
  monkeypatch.setattr(workers, 'usable_cores', lambda: 2)
  assert workers.worker_environment(2)['TF_NUM_INTRAOP_THREADS'] == '3'
  assert 'TF_NUM_INTRAOP_THREADS' in os.environ  # not consumed


@pytest.mark.slow
def test_a_started_worker_gets_onednn_and_dies_when_ended(monkeypatch):
  monkeypatch.delenv('TF_ENABLE_ONEDNN_OPTS', raising=False)
  monkeypatch.delenv('TF_NUM_INTRAOP_THREADS', raising=False)
  process, _ = workers.start_worker(max_concurrent_computation_calls=1)
  try:
    with open(f'/proc/{process.pid}/environ', 'rb') as f:
      environ = f.read().split(b'\0')
    assert b'TF_ENABLE_ONEDNN_OPTS=1' in environ
    threads = str(workers.usable_cores()).encode()
    assert b'TF_NUM_INTRAOP_THREADS=' + threads in environ
    assert 'TF_ENABLE_ONEDNN_OPTS' not in os.environ  # ours is untouched
  finally:
    process.terminate()
    process.wait(timeout=30)
  assert process.pid not in workers.worker_pids()


@pytest.mark.slow
def test_the_worker_binary_serves_with_the_cores_split():
  env = {k: v for k, v in os.environ.items() if k != 'TF_NUM_INTRAOP_THREADS'}
  port = workers.portpicker.pick_unused_port()
  process = subprocess.Popen(
    [
      sys.executable,
      '-m',
      'binaries.worker',
      f'--port={port}',
      '--max_concurrent_clients=2',
    ],
    cwd=REPO,
    env=env,
    stdout=subprocess.PIPE,
    stderr=subprocess.DEVNULL,
    text=True,
  )
  try:
    assert 'serving on 127.0.0.1, port' in process.stdout.readline()
    # The Python process becomes the worker (exec): same pid. Its
    # environment is readable once the exec has set it up.
    deadline = time.monotonic() + 30
    while True:
      assert process.poll() is None, 'the worker exited'
      if os.path.realpath(f'/proc/{process.pid}/exe') == os.path.realpath(
        workers.packaged_worker_binary()
      ):
        with open(f'/proc/{process.pid}/environ', 'rb') as f:
          environ = f.read().split(b'\0')
        if len(environ) > 1:
          break
      assert time.monotonic() < deadline, 'binaries.worker did not exec'
      time.sleep(0.05)
    assert b'TFF_METHODS_BIND_HOST=127.0.0.1' in environ  # bind_address_test
    threads = str(max(1, workers.usable_cores() // 2)).encode()
    assert b'TF_NUM_INTRAOP_THREADS=' + threads in environ
    assert (
      b'TF_ENABLE_ONEDNN_OPTS='
      + os.environ.get('TF_ENABLE_ONEDNN_OPTS', '1').encode()
      in environ
    )
    # A second worker on the same port is refused (gRPC's SO_REUSEPORT
    # would let it listen beside the first).
    while True:
      try:
        socket.create_connection(('127.0.0.1', port), timeout=1).close()
        break
      except OSError:
        assert time.monotonic() < deadline + 60, 'the worker never listened'
        time.sleep(0.1)
    second = subprocess.run(
      [sys.executable, '-m', 'binaries.worker', f'--port={port}'],
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=120,
      check=False,
    )
    assert second.returncode == 2
    assert second.stderr.strip() == (
      f'--port={port} is in use (another worker, or another program): stop '
      'it, or give another port.'
    )
  finally:
    process.terminate()
    process.wait(timeout=30)


def test_a_script_that_imports_the_library_and_exits_prints_no_traceback():
  # TFF 0.87's import-time context fails in __del__ at shutdown unless it is
  # dropped first (tff_methods/__init__.py).
  result = subprocess.run(
    [
      sys.executable,
      '-c',
      'from tff_methods import fedprox, moon, ' 'stateful, aggregation',
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


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))


def test_a_worker_ended_by_a_signal_is_the_interruption_not_a_death(
  monkeypatch,
):
  # Ctrl-C mid-round: the handler ends the worker and raises; if Python
  # dropped that exception (raised inside a weakref callback), the next
  # call finds the worker gone: it is the interruption again.
  class Exited:
    pid, returncode = 123, -9

    def poll(self):
      return -9

  worker = workers.LocalWorker(None, 2, None)
  worker._process = Exited()
  with pytest.raises(workers.WorkerExitedError, match='exited with code -9'):
    worker.get_stub()
  monkeypatch.setattr(workers, '_received_signal', signal.SIGINT)
  with pytest.raises(KeyboardInterrupt):
    worker.get_stub()
  monkeypatch.setattr(workers, '_received_signal', signal.SIGTERM)
  with pytest.raises(SystemExit, match='143'):
    worker.get_stub()


def test_from_another_thread_the_interruption_is_an_error_naming_the_signal(
  monkeypatch,
):
  # TFF calls the worker from its event-loop thread, where a
  # KeyboardInterrupt would escape with a traceback: the call fails there
  # with an error the waiting main thread gets, naming the signal; the main
  # thread is not interrupted a second time.
  class Exited:
    pid, returncode = 123, -9

    def poll(self):
      return -9

  worker = workers.LocalWorker(None, 2, None)
  worker._process = Exited()
  monkeypatch.setattr(workers, '_received_signal', signal.SIGTERM)
  in_thread = []

  def call():
    try:
      worker.get_stub()
    except workers.WorkerEndedBySignalError as e:
      in_thread.append(e.signum)

  thread = threading.Thread(target=call)
  thread.start()
  thread.join()
  time.sleep(0.2)  # A pending interruption of this thread would fire here.
  assert in_thread == [signal.SIGTERM]


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
