"""The project's TFF execution context, and the life of TFF's worker process.

TFF 0.87 runs every computation in a C++ `worker_binary` subprocess that
`tff.backends.native.set_sync_local_cpp_execution_context` starts lazily and
never ends reliably: its `__del__` fails at interpreter shutdown, so each run
leaves a ~1 GB process behind, holding the parent's stdout open (`cmd | tail`
then hangs). This module starts the same packaged worker itself, keeps the
handle, and ends it on every exit path:

- normal exit and uncaught exceptions: an `atexit` hook;
- SIGINT and SIGTERM: handlers that end the worker first, then raise
  `KeyboardInterrupt` / `SystemExit` so the program's own `finally` blocks run;
- SIGKILL of the parent, which no handler sees: the worker is started with
  Linux's `PR_SET_PDEATHSIG`, so the kernel ends it with its parent.

Usage, once per program, before any TFF computation runs:

  from tff_methods import runtime
  runtime.set_local_execution_context(max_concurrent_clients=2)
"""

import atexit
import ctypes
import logging as py_logging
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Optional

from absl import logging
import grpc
import portpicker

# The Python side of TFF: imported lazily by the functions that need it, so
# that `quiet()` can silence TensorFlow before TensorFlow is first imported.

_WORKER_START_TIMEOUT_SECONDS = 60.0
_GRPC_MAX_MESSAGE_BYTES = 2 * 1000 * 1000 * 1000
_GRPC_CHANNEL_OPTIONS = [
    ('grpc.max_message_length', _GRPC_MAX_MESSAGE_BYTES),
    ('grpc.max_receive_message_length', _GRPC_MAX_MESSAGE_BYTES),
    ('grpc.max_send_message_length', _GRPC_MAX_MESSAGE_BYTES),
]
_PR_SET_PDEATHSIG = 1

_workers: list[subprocess.Popen] = []
_workers_lock = threading.Lock()
_handlers_installed = False


def verbosity_from_argv(argv: list[str]) -> int:
  """absl's `--verbosity`/`-v` value in `argv`, read before flags are parsed.

  TensorFlow reads its C++ log level once, when imported, and a binary must
  import TensorFlow before `absl.app.run` (importing it inside `main` breaks
  Keras' functional API in TF 2.14), so the level is read from argv early.
  """
  for i, arg in enumerate(argv):
    for name in ('--verbosity', '-v'):
      if arg.startswith(name + '='):
        value = arg.split('=', 1)[1]
      elif arg == name and i + 1 < len(argv):
        value = argv[i + 1]
      else:
        continue
      try:
        return int(value)
      except ValueError:
        return 0
  return 0


def quiet(verbosity: int = 0) -> None:
  """Silences TensorFlow's and TFF's info logs unless `verbosity` > 0.

  Call before TensorFlow is imported for TensorFlow's C++ logs to follow.
  """
  if verbosity > 0:
    os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '0')
    logging.set_verbosity(logging.DEBUG if verbosity > 1 else logging.INFO)
    return
  os.environ['TF_CPP_MIN_LOG_LEVEL'] = '3'
  logging.set_verbosity(logging.WARNING)
  os.environ.setdefault('GRPC_VERBOSITY', 'ERROR')
  import warnings  # pylint: disable=g-import-not-at-top
  warnings.filterwarnings('ignore', category=DeprecationWarning)
  warnings.filterwarnings('ignore', category=UserWarning)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  tf.get_logger().setLevel(py_logging.ERROR)
  tf.autograph.set_verbosity(0)


def packaged_worker_binary() -> str:
  """The path of the `worker_binary` shipped in the tensorflow-federated wheel."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  path = os.path.join(os.path.dirname(tff.__file__), 'data', 'worker_binary')
  if not os.path.isfile(path):
    raise RuntimeError(f'No TFF worker binary at {path}: is tensorflow-'
                       'federated 0.87.0 installed?')
  return path


def _die_with_parent() -> None:
  # Runs in the child between fork and exec: ask the kernel to SIGKILL the
  # worker when the thread that started it (the main thread) exits.
  try:
    libc = ctypes.CDLL('libc.so.6', use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
  except OSError:
    pass  # Not Linux: the atexit hook and signal handlers still apply.


def start_worker(binary: Optional[str] = None,
                 max_concurrent_computation_calls: int = -1,
                 port: Optional[int] = None,
                 log_path: Optional[str] = None) -> tuple[subprocess.Popen,
                                                          int]:
  """Starts a TFF worker on localhost and registers it for clean-up.

  Args:
    binary: The worker executable; TFF's packaged one by default.
    max_concurrent_computation_calls: How many client computations the worker
      runs at once; non-positive means no limit.
    port: The port to serve on; a free one by default.
    log_path: Where the worker's output goes; discarded by default, so the
      worker never holds the parent's stdout open.

  Returns:
    The process and its port.
  """
  binary = binary or packaged_worker_binary()
  port = port or portpicker.pick_unused_port()
  args = [binary, f'--port={port}',
          f'--max_concurrent_computation_calls='
          f'{max_concurrent_computation_calls}']
  out = open(log_path, 'ab') if log_path else subprocess.DEVNULL  # pylint: disable=consider-using-with
  process = subprocess.Popen(  # pylint: disable=consider-using-with
      args, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
      preexec_fn=_die_with_parent if sys.platform == 'linux' else None)
  with _workers_lock:
    _workers.append(process)
  _install_exit_handlers()
  logging.debug('Started TFF worker pid %d on port %d', process.pid, port)
  return process, port


def stop_workers() -> None:
  """Ends every worker this process started; safe to call more than once."""
  with _workers_lock:
    workers = list(_workers)
    _workers.clear()
  for process in workers:
    if process.poll() is None:
      process.kill()
  for process in workers:
    try:
      process.wait(timeout=10)
    except subprocess.TimeoutExpired:
      pass


def worker_pids() -> list[int]:
  """The pids of the live workers this process started."""
  with _workers_lock:
    return [p.pid for p in _workers if p.poll() is None]


def _signal_handler(signum, frame):
  del frame
  stop_workers()
  if signum == signal.SIGINT:
    raise KeyboardInterrupt
  raise SystemExit(128 + signum)


def _install_exit_handlers() -> None:
  global _handlers_installed
  if _handlers_installed:
    return
  _handlers_installed = True
  atexit.register(stop_workers)
  if threading.current_thread() is threading.main_thread():
    for signum in (signal.SIGINT, signal.SIGTERM):
      signal.signal(signum, _signal_handler)


class _WorkerService:
  """Keeps one local worker serving, restarting it if it went down."""

  def __init__(self, binary, max_concurrent_computation_calls, log_path):
    self._binary = binary
    self._max_calls = max_concurrent_computation_calls
    self._log_path = log_path
    self._process = None
    self._stub = None
    self._lock = threading.Lock()

  def get_stub(self):
    from tensorflow_federated.python.core.impl.executors import remote_executor_grpc_stub  # pylint: disable=g-import-not-at-top
    with self._lock:
      if self._stub is not None and self._stub.is_ready:
        return self._stub
      if self._process is not None and self._process.poll() is not None:
        raise RuntimeError(
            f'The TFF worker (pid {self._process.pid}) exited with code '
            f'{self._process.returncode} during the run.')
      if self._process is None:
        self._process, port = start_worker(self._binary, self._max_calls,
                                           log_path=self._log_path)
        channel = grpc.insecure_channel(f'localhost:{port}',
                                        _GRPC_CHANNEL_OPTIONS)
        self._stub = remote_executor_grpc_stub.RemoteExecutorGrpcStub(channel)
      deadline = time.monotonic() + _WORKER_START_TIMEOUT_SECONDS
      while not self._stub.is_ready:
        if self._process.poll() is not None:
          raise RuntimeError(
              f'The TFF worker {self._binary} exited with code '
              f'{self._process.returncode} before it served.')
        if time.monotonic() > deadline:
          raise RuntimeError('The TFF worker did not start serving within '
                             f'{_WORKER_START_TIMEOUT_SECONDS} s.')
        time.sleep(0.05)
      return self._stub


def discard_default_context() -> None:
  """Drops the context TFF sets up when imported, while Python still runs.

  TFF's import-time default context fails noisily in its `__del__` at
  interpreter shutdown; a program that exits without running computations
  (e.g. on a bad flag) calls this first.
  """
  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.impl.context_stack import context_stack_impl
  from tensorflow_federated.python.core.impl.context_stack import runtime_error_context
  # pylint: enable=g-import-not-at-top
  context_stack_impl.context_stack.set_default_context(
      runtime_error_context.RuntimeErrorContext())


def set_local_execution_context(max_concurrent_clients: int = -1,
                                worker_binary: Optional[str] = None,
                                log_path: Optional[str] = None) -> None:
  """Makes TFF run computations on a local C++ worker that this module ends.

  The same runtime as `tff.backends.native.set_sync_local_cpp_execution_context`
  (the packaged C++ worker behind a remote executor), but the worker is
  started now, from the calling (main) thread, and ended on every exit path.

  Args:
    max_concurrent_clients: How many client computations run at once; non-
      positive means no limit. With 2 cores, 1-2 avoids oversubscription.
    worker_binary: A worker executable to run instead of TFF's packaged one.
    log_path: A file for the worker's output; discarded by default.
  """
  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.backends.native import compiler
  from tensorflow_federated.python.core.environments.tensorflow_frontend import tensorflow_computation
  from tensorflow_federated.python.core.impl.context_stack import context_stack_impl
  from tensorflow_federated.python.core.impl.execution_contexts import sync_execution_context
  from tensorflow_federated.python.core.impl.executor_stacks import python_executor_stacks
  from tensorflow_federated.python.core.impl.executors import remote_executor
  from tensorflow_federated.python.core.impl.types import placements
  # pylint: enable=g-import-not-at-top
  service = _WorkerService(worker_binary, max_concurrent_clients, log_path)
  service.get_stub()  # Start the worker now, from this thread.

  def executor_stack_fn(cardinalities):
    if cardinalities.get(placements.CLIENTS) is None:
      cardinalities[placements.CLIENTS] = 0
    executor = remote_executor.RemoteExecutor(service.get_stub())
    executor.set_cardinalities(cardinalities)
    return executor

  factory = python_executor_stacks.ResourceManagingExecutorFactory(
      executor_stack_fn=executor_stack_fn)
  context = sync_execution_context.SyncExecutionContext(
      executor_fn=factory,
      compiler_fn=compiler.desugar_and_transform_to_native,
      transform_args=tensorflow_computation.transform_args,
      transform_result=tensorflow_computation.transform_result)
  context_stack_impl.context_stack.set_default_context(context)
