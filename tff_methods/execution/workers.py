"""The life of TFF's worker processes: started, sized, and always ended.

TFF 0.87 runs every computation in a C++ `worker_binary` subprocess that
`tff.backends.native.set_sync_local_cpp_execution_context` starts lazily and
never ends reliably: its `__del__` fails at interpreter shutdown, so each run
leaves a ~1 GB process behind, holding the parent's stdout open (`cmd | tail`
then hangs). This module starts the same packaged worker itself, keeps the
handle, and ends it on every exit path:

- normal exit and uncaught exceptions: an `atexit` hook;
- SIGKILL or SIGTERM of the parent, which no hook sees: the worker is
  started with Linux's `PR_SET_PDEATHSIG`, so the kernel ends it with its
  parent;
- SIGINT and SIGTERM, when the program asks for it
  (`install_signal_handlers`, which the binaries call): the worker is ended
  first, so that a computation waiting on it returns at once, then
  `KeyboardInterrupt` / `SystemExit` is raised for the program's own
  `finally` blocks. Without it, the process's handlers are left alone.

Importing this module changes nothing. `tff_methods.execution.runtime` builds
TFF's execution contexts on these workers; `LocalWorker` and `RemoteWorker` are
the connections it uses.
"""

import atexit
import ctypes
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Optional

from absl import logging
import portpicker

from tff_methods.execution import bind_address

# TensorFlow 2.14 turns its oneDNN CPU kernels on by default only on the
# newest Intel CPUs. The workers this module starts get them unless the
# caller's environment says otherwise.
ONEDNN = ('TF_ENABLE_ONEDNN_OPTS', '1')

# TensorFlow's threads per op (intra-op), which the worker reads once.
_INTRA_OP_THREADS = 'TF_NUM_INTRAOP_THREADS'

_WORKER_START_TIMEOUT_SECONDS = 60.0
_GRPC_MAX_MESSAGE_BYTES = 2 * 1000 * 1000 * 1000
GRPC_CHANNEL_OPTIONS = [
  ('grpc.max_message_length', _GRPC_MAX_MESSAGE_BYTES),
  ('grpc.max_receive_message_length', _GRPC_MAX_MESSAGE_BYTES),
  ('grpc.max_send_message_length', _GRPC_MAX_MESSAGE_BYTES),
]
_PR_SET_PDEATHSIG = 1


class WorkerExitedError(RuntimeError):
  """The local TFF worker died (e.g. a crash) while a computation needed it.

  What ran on it is lost. A new context (`set_local_execution_context`,
  called from the main thread) starts a new worker; a run then resumes from
  its last checkpoint.
  """


class WorkerEndedBySignalError(RuntimeError):
  """This process's signal handler ended the worker (a Ctrl-C, a SIGTERM)
  while a computation needed it: the interruption, met in a thread where
  the handler's own exception could not be raised (TFF's event-loop
  thread). The binaries end on it as on the signal (`binary_main`).

  Attributes:
    signum: The signal.
  """

  def __init__(self, signum: int):
    super().__init__('The TFF worker was ended by this process on a signal.')
    self.signum = signum


class WorkerUnreachableError(RuntimeError):
  """A remote TFF worker does not serve at its address.

  Attributes:
    address: The worker's `host:port`.
  """

  def __init__(self, message: str, address: str):
    super().__init__(message)
    self.address = address


_workers: list[subprocess.Popen] = []
# Reentrant: the signal handler (`stop_workers`) runs on the main thread
# between any two bytecodes, also while that thread holds the lock, or in a
# handler interrupted by a second signal.
_workers_lock = threading.RLock()
_atexit_registered = False
_signal_handlers_installed = False


def packaged_worker_binary() -> str:
  """The path of the `worker_binary` in the tensorflow-federated wheel."""
  # Found without importing TFF (and TensorFlow): `binaries.worker` starts fast.
  spec = importlib.util.find_spec('tensorflow_federated')
  if spec is None or not spec.submodule_search_locations:
    raise RuntimeError('tensorflow-federated is not installed.')
  path = os.path.join(
    list(spec.submodule_search_locations)[0], 'data', 'worker_binary'
  )
  if not os.path.isfile(path):
    raise RuntimeError(
      f'No TFF worker binary at {path}: is tensorflow-'
      'federated 0.87.0 installed?'
    )
  return path


def check_worker_binary(path: str) -> str:
  """`path` if it is an executable file, else a ValueError naming it."""
  if not (os.path.isfile(path) and os.access(path, os.X_OK)):
    raise ValueError(
      f'{path!r} is not an executable file (a TFF '
      'worker_binary, e.g. one built with CUDA)'
    )
  return path


def end_with_parent(signum: int = signal.SIGKILL) -> None:
  """Asks Linux to send this process `signum` when the thread that started
  it exits (`PR_SET_PDEATHSIG`); nothing elsewhere."""
  try:
    libc = ctypes.CDLL('libc.so.6', use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signum)
  except OSError:
    pass  # Not Linux: the atexit hook and signal handlers still apply.


def _die_with_parent() -> None:
  # Runs in the child between fork and exec: the kernel SIGKILLs the worker
  # when the thread that started it (the main thread) exits.
  end_with_parent(signal.SIGKILL)


def usable_cores() -> int:
  """The CPU cores this process may run on."""
  if hasattr(os, 'sched_getaffinity'):
    return len(os.sched_getaffinity(0))
  return os.cpu_count() or 1


# Models of this many parameters or more train faster with every core for
# each client (`threads_per_client`): their ops are large enough to share.
LARGE_MODEL_PARAMETERS = 1_000_000


def threads_per_client(
  model_parameters: Optional[int] = None, max_concurrent_clients: int = -1
) -> Optional[int]:
  """TensorFlow's threads per op for a local worker's clients.

  With at most k clients at once, small models get the cores split between
  them (cores // k): their many small ops spend much of their time handed
  between threads otherwise. Models of `LARGE_MODEL_PARAMETERS` or more get
  every core: their ops are large enough to share, and with one thread
  each, clients that keep state (MOON, FedCKA, SCAFFOLD) leave the cores
  partly idle (docs/performance.md).

  Args:
    model_parameters: The model's parameter count; None when unknown (taken
      as small).
    max_concurrent_clients: Client computations the worker runs at once;
      non-positive means no limit (TensorFlow's default: None).

  Returns:
    Threads per op, or None for TensorFlow's default (every core).
  """
  if max_concurrent_clients <= 0:
    return None
  if model_parameters is not None and (
    model_parameters >= LARGE_MODEL_PARAMETERS
  ):
    return usable_cores()
  return max(1, usable_cores() // max_concurrent_clients)


# Environment variables this process set for its own TensorFlow, which the
# workers it starts do not inherit (`not_for_workers`).
_NOT_FOR_WORKERS = set()


def not_for_workers(name: str) -> None:
  """Keeps environment variable `name`, which this process set for itself,
  from the workers it starts."""
  _NOT_FOR_WORKERS.add(name)


def worker_environment(
  max_concurrent_computation_calls: int = -1,
  model_parameters: Optional[int] = None,
  host: str = bind_address.LOOPBACK,
) -> dict[str, str]:
  """The environment to start a TFF worker with.

  This process's environment, plus oneDNN on and TensorFlow's threads per op
  (`TF_NUM_INTRAOP_THREADS`) from `threads_per_client`: when the worker runs
  at most k client computations at once, cores // k for small models and
  every core for large ones. The caller's own settings win. A round of fewer
  clients than k leaves cores idle with a split. The worker listens on
  `host` only (`bind_address`; 0.0.0.0: every interface).
  """
  env = {k: v for k, v in os.environ.items() if k not in _NOT_FOR_WORKERS}
  env.setdefault(*ONEDNN)
  threads = threads_per_client(
    model_parameters, max_concurrent_computation_calls
  )
  if threads is not None:
    env.setdefault(_INTRA_OP_THREADS, str(threads))
  return bind_address.environment(host, env)


def start_worker(
  binary: Optional[str] = None,
  max_concurrent_computation_calls: int = -1,
  port: Optional[int] = None,
  log_path: Optional[str] = None,
  model_parameters: Optional[int] = None,
) -> tuple[subprocess.Popen, int]:
  """Starts a TFF worker on localhost and registers it for clean-up.

  Args:
    binary: The worker executable; TFF's packaged one by default.
    max_concurrent_computation_calls: How many client computations the worker
      runs at once; non-positive means no limit. With a limit, small models
      get the cores split between them (`threads_per_client`).
    port: The port to serve on; a free one by default.
    log_path: Where the worker's output goes; discarded by default, so the
      worker never holds the parent's stdout open.
    model_parameters: The size of the model the worker will train, which
      sets its threads per client (`threads_per_client`); None: small.

  Returns:
    The process and its port.
  """
  binary = binary or packaged_worker_binary()
  port = port or portpicker.pick_unused_port()
  args = [
    binary,
    f'--port={port}',
    f'--max_concurrent_computation_calls='
    f'{max_concurrent_computation_calls}',
  ]
  out = open(log_path, 'ab') if log_path else subprocess.DEVNULL
  process = subprocess.Popen(
    args,
    stdin=subprocess.DEVNULL,
    stdout=out,
    stderr=out,
    env=worker_environment(max_concurrent_computation_calls, model_parameters),
    preexec_fn=_die_with_parent if sys.platform == 'linux' else None,
  )
  with _workers_lock:
    _workers.append(process)
  _register_atexit()
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


def _register_atexit() -> None:
  global _atexit_registered
  with _workers_lock:
    if _atexit_registered:
      return
    _atexit_registered = True
  atexit.register(stop_workers)


# The signal whose handler ended this process's workers, if one did.
_received_signal = None


def _signal_handler(signum, frame):
  global _received_signal
  del frame
  _received_signal = signum
  stop_workers()
  _raise_for(signum)


def _raise_for(signum) -> None:
  if signum == signal.SIGINT:
    raise KeyboardInterrupt
  raise SystemExit(128 + signum)


def install_signal_handlers() -> None:
  """SIGINT and SIGTERM end this process's workers, then raise.

  SIGINT raises `KeyboardInterrupt`, SIGTERM `SystemExit(128 + 15)`, so the
  program's `finally` blocks run; ending the workers first makes a
  computation that waits on one return at once. Call from the main thread;
  the binaries do. Replaces the process's handlers for both signals.
  """
  global _signal_handlers_installed
  if _signal_handlers_installed:
    return
  if threading.current_thread() is not threading.main_thread():
    raise RuntimeError(
      'install_signal_handlers must be called from the ' 'main thread.'
    )
  _signal_handlers_installed = True
  for signum in (signal.SIGINT, signal.SIGTERM):
    signal.signal(signum, _signal_handler)


class LocalWorker:
  """Keeps one local worker serving (started on first use), or says that it
  died."""

  def __init__(
    self,
    binary,
    max_concurrent_computation_calls,
    log_path,
    model_parameters=None,
  ):
    self._binary = binary
    self._max_calls = max_concurrent_computation_calls
    self._log_path = log_path
    self._model_parameters = model_parameters
    self._process = None
    self._stub = None
    self._lock = threading.Lock()

  def get_stub(self):
    from tensorflow_federated.python.core.impl.executors import (
      remote_executor_grpc_stub,
    )

    with self._lock:
      if self._stub is not None and self._stub.is_ready:
        return self._stub
      if self._process is not None and self._process.poll() is not None:
        if _received_signal is not None:
          # The signal handler ended the worker: this is the interruption,
          # not a worker that died. Raised as the handler raises it in the
          # main thread (whose own may have been lost: Python ignores one
          # raised inside a weakref callback). From TFF's event-loop thread,
          # where a KeyboardInterrupt would escape with a traceback, as an
          # error the waiting main thread gets (interrupting the main thread
          # from here would interrupt it twice).
          if threading.current_thread() is threading.main_thread():
            _raise_for(_received_signal)
          raise WorkerEndedBySignalError(_received_signal)
        raise WorkerExitedError(
          f'The TFF worker (pid {self._process.pid}) exited with code '
          f'{self._process.returncode} during the run.'
        )
      if self._process is None:
        self._process, port = start_worker(
          self._binary,
          self._max_calls,
          log_path=self._log_path,
          model_parameters=self._model_parameters,
        )
        import grpc

        channel = grpc.insecure_channel(
          f'localhost:{port}', GRPC_CHANNEL_OPTIONS
        )
        self._stub = remote_executor_grpc_stub.RemoteExecutorGrpcStub(channel)
      deadline = time.monotonic() + _WORKER_START_TIMEOUT_SECONDS
      while not self._stub.is_ready:
        if self._process.poll() is not None:
          raise RuntimeError(
            f'The TFF worker {self._binary} exited with code '
            f'{self._process.returncode} before it served.'
          )
        if time.monotonic() > deadline:
          raise RuntimeError(
            'The TFF worker did not start serving within '
            f'{_WORKER_START_TIMEOUT_SECONDS} s.'
          )
        time.sleep(0.05)
      return self._stub


class RemoteWorker:
  """A connection to a worker someone else started, at `address`.

  `connect` checks once that it serves; `get_stub` (every computation) waits
  up to `timeout_seconds` for a worker that stopped serving, then fails
  instead of letting TFF retry for ever.
  """

  def __init__(self, address: str, timeout_seconds: float):
    self.address = address
    self._timeout = timeout_seconds
    import grpc

    self._channel = grpc.insecure_channel(address, GRPC_CHANNEL_OPTIONS)
    self._stub = None
    self._lock = threading.Lock()

  def connect(self, timeout_seconds: float) -> None:
    """Returns once the worker serves; a `WorkerUnreachableError` if not.

    Waits up to `timeout_seconds` for a worker that is still starting; the
    error says what the last attempt met (e.g. "Connection refused").
    """
    host, _, port = self.address.rpartition(':')
    deadline = time.monotonic() + timeout_seconds
    while True:
      try:
        socket.create_connection(
          (host.strip('[]'), int(port)),
          timeout=max(0.1, deadline - time.monotonic()),
        ).close()
        break
      except OSError as e:
        if time.monotonic() >= deadline:
          raise WorkerUnreachableError(
            f'No TFF worker serves at {self.address} (for '
            f'{timeout_seconds:.0f} s: {e.strerror or type(e).__name__}). '
            'Start one there, then run again; nothing has run yet.',
            self.address,
          ) from None
        time.sleep(0.1)
    if not self._serves_within(max(0.1, deadline - time.monotonic())):
      raise WorkerUnreachableError(
        f'The TFF worker at {self.address} accepts connections but did not '
        f'serve TFF within {timeout_seconds:.0f} s (is it a TFF worker?). '
        'Nothing has run yet.',
        self.address,
      )

  def _serves_within(self, timeout: float) -> bool:
    import grpc

    try:
      grpc.channel_ready_future(self._channel).result(timeout=timeout)
    except grpc.FutureTimeoutError:
      return False
    return True

  def get_stub(self):
    """The worker's stub once it serves; a WorkerUnreachableError if not."""
    from tensorflow_federated.python.core.impl.executors import (
      remote_executor_grpc_stub,
    )

    with self._lock:
      if not self._serves_within(self._timeout):
        # Not TFF's retryable error: a lost worker must end the call, not
        # make TFF retry it forever.
        raise WorkerUnreachableError(
          f'The TFF worker at {self.address} is not reachable (it stopped, '
          f'or its host did) after {self._timeout:.0f} s, so this '
          'computation did not complete. The program state saved before '
          'it is intact: start the worker again and rerun to resume.',
          self.address,
        )
      if self._stub is None:
        self._stub = remote_executor_grpc_stub.RemoteExecutorGrpcStub(
          self._channel
        )
      return self._stub
