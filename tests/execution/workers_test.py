"""Tests for tff_methods.execution.workers: the local TFF worker's environment,
threads and life, and how a signal that ends it reaches the caller."""

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from tff_methods.execution import workers

REPO = os.path.dirname(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)


def test_a_worker_keeps_the_users_onednn_choice(monkeypatch):
  monkeypatch.setenv('TF_ENABLE_ONEDNN_OPTS', '0')
  assert workers.worker_environment(2)['TF_ENABLE_ONEDNN_OPTS'] == '0'
  monkeypatch.delenv('TF_ENABLE_ONEDNN_OPTS')
  assert workers.worker_environment(2)['TF_ENABLE_ONEDNN_OPTS'] == '1'


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


_SIGNAL_WHILE_LOCKED = """
import os, signal, subprocess, sys
from tff_methods.execution import workers
workers.install_signal_handlers()
sleeper = subprocess.Popen(['sleep', '60'])
workers._workers.append(sleeper)  # As a started worker is.
print(sleeper.pid, flush=True)
with workers._workers_lock:  # A SIGTERM lands while the lock is held.
  os.kill(os.getpid(), signal.SIGTERM)
  sum(range(10))
"""


def test_a_signal_while_the_workers_lock_is_held_still_ends_them():
  # The handler (`stop_workers`) took the lock its own thread held: the
  # job and its worker hung for ever.
  result = subprocess.run(
    [sys.executable, '-c', _SIGNAL_WHILE_LOCKED],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=60,
  )
  assert result.returncode == 128 + signal.SIGTERM, result.stderr[-2000:]
  sleeper = int(result.stdout.split()[0])
  assert not os.path.exists(f'/proc/{sleeper}') or (
    open(f'/proc/{sleeper}/stat').read().rsplit(')', 1)[1].split()[0] == 'Z'
  )


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
