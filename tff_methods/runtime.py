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
  runtime.configure_process()  # optional; first thing, before TensorFlow
  runtime.set_local_execution_context(max_concurrent_clients=2)

Importing this module changes nothing: the process is set up by the calls.

Several workers, possibly on other hosts (each started with
`python -m binaries.worker --port=PORT`), split every round's clients
between them through TFF's mergeable-computation context:

  runtime.set_remote_execution_context(['host1:8000', 'host2:8000'])

`set_execution_context` picks one of the two from the binaries' flags.
"""

import asyncio
import atexit
import ctypes
import importlib.util
import logging as py_logging
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Optional, Sequence

from absl import logging
import portpicker

# TensorFlow 2.14 turns its oneDNN CPU kernels on by default only on the
# newest Intel CPUs; on these machines they halve a FedCKA CNN training step
# (19 -> 9.5 ms) and a FedAvg round through TFF (9.05 -> 4.18 s). The
# workers this module starts get them unless the caller's environment says
# otherwise; `configure_process` turns them on in the calling process too.
_ONEDNN = ('TF_ENABLE_ONEDNN_OPTS', '1')

# TensorFlow's threads per op (intra-op), which the worker reads once.
_INTRA_OP_THREADS = 'TF_NUM_INTRAOP_THREADS'

# The Python side of TFF: imported lazily by the functions that need it, so
# that `quiet()` can silence TensorFlow before TensorFlow is first imported.

_WORKER_START_TIMEOUT_SECONDS = 60.0
# How long a remote worker may stay unreachable before a call fails for good
# (TFF itself would retry a lost worker forever).
REMOTE_WORKER_TIMEOUT_SECONDS = 30.0
BINARY_WITH_REMOTE_WORKERS = (
    '--tff_worker_binary starts a local worker, but --tff_workers connects '
    'to running ones: start each of those with python -m binaries.worker '
    '--tff_worker_binary=PATH instead')
_GRPC_MAX_MESSAGE_BYTES = 2 * 1000 * 1000 * 1000
_GRPC_CHANNEL_OPTIONS = [
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


def configure_process(verbosity: int = 0) -> None:
  """Sets up this process for TFF; the binaries call it first thing.

  Call it before TensorFlow and gRPC are imported: both read these settings
  once, when they initialize. The caller's own environment settings win.

  - TensorFlow's oneDNN CPU kernels on (`_ONEDNN`: twice as fast here).
  - gRPC's fork handlers off: the workers are started by fork + exec while
    gRPC threads run, and the handlers would only log "skipping fork()
    handlers" each time.
  - TensorFlow's and TFF's info logs silenced unless `verbosity` > 0
    (`quiet`).

  A library user who skips it still gets workers with oneDNN on
  (`start_worker`), and TensorFlow's defaults in their own process.
  """
  configure_environment()
  quiet(verbosity)


def configure_environment() -> None:
  """`configure_process`'s environment settings alone (no TensorFlow)."""
  os.environ.setdefault(*_ONEDNN)
  os.environ.setdefault('GRPC_ENABLE_FORK_SUPPORT', '0')


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
  # Found without importing TFF (and TensorFlow): `binaries.worker` starts fast.
  spec = importlib.util.find_spec('tensorflow_federated')
  if spec is None or not spec.submodule_search_locations:
    raise RuntimeError('tensorflow-federated is not installed.')
  path = os.path.join(list(spec.submodule_search_locations)[0], 'data',
                      'worker_binary')
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


def usable_cores() -> int:
  """The CPU cores this process may run on."""
  if hasattr(os, 'sched_getaffinity'):
    return len(os.sched_getaffinity(0))
  return os.cpu_count() or 1


# Models of this many parameters or more train faster with every core for
# each client (`threads_per_client`): their ops are large enough to share.
LARGE_MODEL_PARAMETERS = 1_000_000


def threads_per_client(model_parameters: Optional[int] = None,
                       max_concurrent_clients: int = -1) -> Optional[int]:
  """TensorFlow's threads per op for a local worker's clients.

  With at most k clients at once, small models get the cores split between
  them (cores // k): their many small ops spend much of their time handed
  between threads otherwise (on 2 cores, one thread a client took FedAvg's
  round of 100 CNN clients from 0.58 to 0.46 s). Models of
  `LARGE_MODEL_PARAMETERS` or more get every core: their ops are large,
  and with one thread each, clients that keep state (MOON, FedCKA,
  SCAFFOLD) left the cores partly idle (ResNet-18: MOON 59 against 55 s a
  round, FedAvg unchanged; docs/performance.md).

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
      model_parameters >= LARGE_MODEL_PARAMETERS):
    return usable_cores()
  return max(1, usable_cores() // max_concurrent_clients)


def worker_environment(max_concurrent_computation_calls: int = -1,
                       model_parameters: Optional[int] = None
                       ) -> dict[str, str]:
  """The environment to start a TFF worker with.

  This process's environment, plus oneDNN on and TensorFlow's threads per op
  (`TF_NUM_INTRAOP_THREADS`) from `threads_per_client`: when the worker runs
  at most k client computations at once, cores // k for small models and
  every core for large ones. The caller's own settings win. A round of fewer
  clients than k leaves cores idle with a split.
  """
  env = dict(os.environ)
  env.setdefault(*_ONEDNN)
  threads = threads_per_client(model_parameters,
                               max_concurrent_computation_calls)
  if threads is not None:
    env.setdefault(_INTRA_OP_THREADS, str(threads))
  return env


def start_worker(binary: Optional[str] = None,
                 max_concurrent_computation_calls: int = -1,
                 port: Optional[int] = None,
                 log_path: Optional[str] = None,
                 model_parameters: Optional[int] = None
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
  args = [binary, f'--port={port}',
          f'--max_concurrent_computation_calls='
          f'{max_concurrent_computation_calls}']
  out = open(log_path, 'ab') if log_path else subprocess.DEVNULL  # pylint: disable=consider-using-with
  process = subprocess.Popen(  # pylint: disable=consider-using-with
      args, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
      env=worker_environment(max_concurrent_computation_calls,
                             model_parameters),
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
  """Keeps one local worker serving, or says that it died."""

  def __init__(self, binary, max_concurrent_computation_calls, log_path,
               model_parameters=None):
    self._binary = binary
    self._max_calls = max_concurrent_computation_calls
    self._log_path = log_path
    self._model_parameters = model_parameters
    self._process = None
    self._stub = None
    self._lock = threading.Lock()

  def get_stub(self):
    from tensorflow_federated.python.core.impl.executors import remote_executor_grpc_stub  # pylint: disable=g-import-not-at-top
    with self._lock:
      if self._stub is not None and self._stub.is_ready:
        return self._stub
      if self._process is not None and self._process.poll() is not None:
        raise WorkerExitedError(
            f'The TFF worker (pid {self._process.pid}) exited with code '
            f'{self._process.returncode} during the run.')
      if self._process is None:
        self._process, port = start_worker(
            self._binary, self._max_calls, log_path=self._log_path,
            model_parameters=self._model_parameters)
        import grpc  # pylint: disable=g-import-not-at-top
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
                                log_path: Optional[str] = None,
                                model_parameters: Optional[int] = None
                                ) -> None:
  """Makes TFF run computations on a local C++ worker that this module ends.

  The same runtime as `tff.backends.native.set_sync_local_cpp_execution_context`
  (the packaged C++ worker behind a remote executor), but the worker is
  started now, from the calling (main) thread, and ended on every exit path.

  Args:
    max_concurrent_clients: How many client computations run at once; non-
      positive means no limit. With 2 cores, 1-2 avoids oversubscription.
    worker_binary: A worker executable to run instead of TFF's packaged one.
    log_path: A file for the worker's output; discarded by default.
    model_parameters: The parameter count of the model to train: models of
      `LARGE_MODEL_PARAMETERS` or more get every core for each client,
      smaller ones (and None) the cores split (`threads_per_client`).
  """
  from tensorflow_federated.python.core.impl.context_stack import context_stack_impl  # pylint: disable=g-import-not-at-top
  context_stack_impl.context_stack.set_default_context(
      create_local_execution_context(max_concurrent_clients, worker_binary,
                                     log_path, model_parameters))


def create_local_execution_context(max_concurrent_clients: int = -1,
                                   worker_binary: Optional[str] = None,
                                   log_path: Optional[str] = None,
                                   model_parameters: Optional[int] = None):
  """The context `set_local_execution_context` sets, to install yourself."""
  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.environments.tensorflow_frontend import tensorflow_computation
  from tensorflow_federated.python.core.impl.execution_contexts import sync_execution_context
  from tensorflow_federated.python.core.impl.executor_stacks import python_executor_stacks
  from tensorflow_federated.python.core.impl.executors import remote_executor
  from tensorflow_federated.python.core.impl.types import placements
  # pylint: enable=g-import-not-at-top
  service = _WorkerService(worker_binary, max_concurrent_clients, log_path,
                           model_parameters)
  service.get_stub()  # Start the worker now, from this thread.

  def executor_stack_fn(cardinalities):
    if cardinalities.get(placements.CLIENTS) is None:
      cardinalities[placements.CLIENTS] = 0
    executor = remote_executor.RemoteExecutor(service.get_stub())
    executor.set_cardinalities(cardinalities)
    return executor

  factory = python_executor_stacks.ResourceManagingExecutorFactory(
      executor_stack_fn=executor_stack_fn)
  return sync_execution_context.SyncExecutionContext(
      executor_fn=factory,
      compiler_fn=compile_for_simulation,
      transform_args=tensorflow_computation.transform_args,
      transform_result=tensorflow_computation.transform_result)


def compile_for_simulation(computation):
  """TFF's native compilation, after replacing secure aggregation's
  intrinsics (`federated_secure_sum_bitwidth`, ...) by their plain bodies.

  What TFF's test context does: in a simulation every party is this
  program, so the secure sum is computed in the clear, with the secure
  aggregator's quantization and bounds (`tff.learning.secure_aggregator()`
  then runs under this runtime's contexts, as under TFF's test context).
  """
  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.backends.native import compiler
  from tensorflow_federated.python.core.backends.test import compiler as test_compiler
  # pylint: enable=g-import-not-at-top
  return compiler.desugar_and_transform_to_native(
      test_compiler.replace_secure_intrinsics_with_bodies(computation))


def parse_worker_addresses(text: str) -> list[str]:
  """`'host:port,host:port'` -> the list of addresses; names a bad one.

  Raises:
    ValueError: An address that is not `host:port` with a port in 1..65535,
      or the same address twice.
  """
  addresses = [a.strip() for a in text.split(',') if a.strip()]
  if not addresses:
    raise ValueError(f'--tff_workers={text!r} names no worker; give '
                     'host:port[,host:port...]')
  for address in addresses:
    host, _, port = address.rpartition(':')
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
      raise ValueError(
          f'--tff_workers: {address!r} is not host:port with a port in '
          '1..65535 (e.g. 127.0.0.1:8000)')
  duplicates = sorted({a for a in addresses if addresses.count(a) > 1})
  if duplicates:
    raise ValueError(f'--tff_workers names {duplicates} more than once')
  return addresses


def check_worker_binary(path: str) -> str:
  """`path` if it is an executable file, else a ValueError naming it."""
  if not (os.path.isfile(path) and os.access(path, os.X_OK)):
    raise ValueError(f'--tff_worker_binary={path!r} is not an executable '
                     'file (a TFF worker_binary, e.g. one built with CUDA)')
  return path


class _RemoteWorker:
  """A connection to a worker someone else started, at `address`."""

  def __init__(self, address: str, timeout_seconds: float):
    self.address = address
    self._timeout = timeout_seconds
    import grpc  # pylint: disable=g-import-not-at-top
    self._channel = grpc.insecure_channel(address, _GRPC_CHANNEL_OPTIONS)
    self._stub = None
    self._lock = threading.Lock()

  def get_stub(self):
    """The worker's stub once it serves; a RuntimeError if it doesn't."""
    from tensorflow_federated.python.core.impl.executors import remote_executor_grpc_stub  # pylint: disable=g-import-not-at-top
    import grpc  # pylint: disable=g-import-not-at-top
    with self._lock:
      try:
        grpc.channel_ready_future(self._channel).result(
            timeout=self._timeout)
      except grpc.FutureTimeoutError:
        # Not TFF's retryable error: a lost worker must end the call, not
        # make TFF retry it forever.
        raise RuntimeError(
            f'The TFF worker at {self.address} is not reachable (not started, '
            f'or it died) after {self._timeout:.0f} s, so the round did not '
            'complete. The program state saved before this round is intact: '
            'start the worker again (python -m binaries.worker --port='
            f'{self.address.rpartition(":")[2]}) and rerun the same command to '
            'resume.') from None
      if self._stub is None:
        self._stub = remote_executor_grpc_stub.RemoteExecutorGrpcStub(
            self._channel)
      return self._stub


def _async_remote_context(get_stub):
  """A TFF async context running every computation on one worker's stub."""
  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.environments.tensorflow_frontend import tensorflow_computation
  from tensorflow_federated.python.core.impl.execution_contexts import async_execution_context
  from tensorflow_federated.python.core.impl.executor_stacks import python_executor_stacks
  from tensorflow_federated.python.core.impl.executors import remote_executor
  from tensorflow_federated.python.core.impl.types import placements
  # pylint: enable=g-import-not-at-top

  def executor_stack_fn(cardinalities):
    if cardinalities.get(placements.CLIENTS) is None:
      cardinalities[placements.CLIENTS] = 0
    executor = remote_executor.RemoteExecutor(get_stub())
    executor.set_cardinalities(cardinalities)
    return executor

  return async_execution_context.AsyncExecutionContext(
      executor_fn=python_executor_stacks.ResourceManagingExecutorFactory(
          executor_stack_fn=executor_stack_fn),
      compiler_fn=compile_for_simulation,
      transform_args=tensorflow_computation.transform_args,
      transform_result=tensorflow_computation.transform_result)


class NotMergeableError(ValueError):
  """A computation that can't be split across several workers."""


def _mergeable_context(async_contexts, addresses):
  """TFF's mergeable-computation context, fixed, with a clear compile error."""
  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.backends.native import mergeable_comp_compiler
  from tensorflow_federated.python.core.impl.execution_contexts import mergeable_comp_execution_context as mergeable
  from tensorflow_federated.python.core.impl.types import computation_types
  from tensorflow_federated.python.core.impl.types import type_analysis
  from tensorflow_federated.python.core.impl.types import type_conversions
  # pylint: enable=g-import-not-at-top

  def compile_or_explain(computation):
    try:
      return mergeable_comp_compiler.compile_to_mergeable_comp_form(
          computation)
    except Exception as e:  # pylint: disable=broad-except
      raise NotMergeableError(
          f'This computation ({computation.type_signature}) does not compile '
          "to TFF's mergeable form (one aggregation of client values per "
          'call), so it can not be split across --tff_workers='
          f'{",".join(addresses)}. Run it on one worker: drop --tff_workers '
          '(and use --tff_worker_binary for another worker executable). TFF '
          f'said: {type(e).__name__}: {e}') from e

  async def after_merge_in_order(comp, merge_result, arg_list, contexts):
    # TFF 0.87 concatenates the subrounds' CLIENTS-placed results in the
    # order the subrounds FINISH, which depends on timing. Keep the order of
    # the clients instead, so that a run repeats itself exactly.
    results = [None] * len(arg_list)

    async def run(index, context):
      results[index] = await mergeable._compute_after_merged(  # pylint: disable=protected-access
          comp, arg_list[index], merge_result, context)

    for start in range(0, len(arg_list), len(contexts)):
      await asyncio.gather(*(run(start + k, context)
                             for k, context in enumerate(contexts)
                             if start + k < len(arg_list)))
    return results

  async def invoke_in_order(comp, arg, contexts):
    # TFF's `_invoke_mergeable_comp_form`, with the after-merge step above.
    arg_list = arg.value() if arg is not None else [None] * len(contexts)
    merge_result, merge_context = await mergeable._invoke_merge_in_async_pool(  # pylint: disable=protected-access
        comp, arg_list, contexts)
    result_type = comp.after_merge.type_signature.result
    if type_analysis.contains_only(
        result_type, lambda t: not isinstance(t, computation_types.FederatedType) or
        t.all_equal):
      return await mergeable._compute_after_merged(  # pylint: disable=protected-access
          comp, arg_list[0], merge_result, merge_context)
    return mergeable._repackage_partitioned_values(  # pylint: disable=protected-access
        await after_merge_in_order(comp, merge_result, arg_list, contexts),
        result_type_spec=result_type)

  class OrderedMergeableContext(mergeable.MergeableCompExecutionContext):

    def invoke(self, comp, arg=None):
      comp = self._compiler_pipeline.compile(comp)  # pylint: disable=protected-access
      if arg is not None:
        arg = mergeable.MergeableCompExecutionContextValue(
            arg, comp.up_to_merge.type_signature.parameter,
            self._num_subrounds)  # pylint: disable=protected-access
      return type_conversions.type_to_py_container(
          self._async_runner.run_coro_and_return_result(  # pylint: disable=protected-access
              invoke_in_order(comp, arg, self._async_execution_contexts)),  # pylint: disable=protected-access
          comp.after_merge.type_signature.result)

  return OrderedMergeableContext(async_contexts=async_contexts,
                                 compiler_fn=compile_or_explain)


def set_remote_execution_context(
    addresses: Sequence[str],
    timeout_seconds: float = REMOTE_WORKER_TIMEOUT_SECONDS) -> None:
  """Makes TFF split every round's clients across the workers at `addresses`.

  Each address is a `host:port` where a TFF worker serves (started with
  `python -m binaries.worker --port=PORT`, or `start_worker`). A round's
  clients are cut into one contiguous part per worker; each worker trains
  its part and sums its part's aggregates, and the parts' sums are merged:
  TFF's `MergeableCompExecutionContext`, nothing home-made. The workers read
  the clients' data by file path, so every worker needs the data cache at
  the same path (a shared file system, or the same `--cache_dir` copied).

  Args:
    addresses: The workers, e.g. `['127.0.0.1:8000', '127.0.0.1:8001']`.
    timeout_seconds: How long to wait for a worker to serve, now and when a
      call finds it gone, before a RuntimeError names it.

  Raises:
    RuntimeError: A worker doesn't serve within `timeout_seconds`.
  """
  from tensorflow_federated.python.core.impl.context_stack import context_stack_impl  # pylint: disable=g-import-not-at-top
  context_stack_impl.context_stack.set_default_context(
      create_remote_execution_context(addresses, timeout_seconds))


def create_remote_execution_context(
    addresses: Sequence[str],
    timeout_seconds: float = REMOTE_WORKER_TIMEOUT_SECONDS):
  """The context `set_remote_execution_context` sets, to install yourself.

  E.g. `with tff.framework.get_context_stack().install(context): ...`.
  """
  addresses = list(addresses)
  workers = [_RemoteWorker(a, timeout_seconds) for a in addresses]
  for worker in workers:
    worker.get_stub()  # Fail now, naming the worker, not in round 1.
  return _mergeable_context(
      [_async_remote_context(w.get_stub) for w in workers], addresses)


def set_execution_context(tff_workers: Optional[Sequence[str]] = None,
                          worker_binary: Optional[str] = None,
                          max_concurrent_clients: int = -1,
                          log_path: Optional[str] = None,
                          model_parameters: Optional[int] = None) -> None:
  """The binaries' choice: remote workers if given, else a local worker.

  Args:
    tff_workers: `host:port` addresses of running workers; None or empty for
      one local worker started (and ended) by this process.
    worker_binary: The local worker's executable (e.g. a CUDA build of TFF's
      worker); TFF's packaged one by default. Not allowed with
      `tff_workers`: remote workers run what they were started with.
    max_concurrent_clients: The local worker's client concurrency.
    log_path: A file for the local worker's output.
    model_parameters: The model's size, for the local worker's threads per
      client (`threads_per_client`).
  """
  if tff_workers:
    if worker_binary:
      raise ValueError(BINARY_WITH_REMOTE_WORKERS)
    set_remote_execution_context(tff_workers)
  else:
    set_local_execution_context(max_concurrent_clients, worker_binary,
                                log_path, model_parameters)


class _SyncContextAsAsync:
  """A sync TFF context behind the async interface TFF's program logic uses.

  `tff.program.NativeFederatedContext` awaits `invoke`; the project's
  contexts (the local worker, several workers through TFF's mergeable
  context) are sync, so each call runs to completion when awaited.
  """

  def __init__(self, sync_context):
    self._sync_context = sync_context

  async def invoke(self, comp, arg):
    return self._sync_context.invoke(comp, arg)


def create_program_context(sync_context=None):
  """A `tff.program.NativeFederatedContext` on the same workers.

  TFF's program logic (`tff.learning.programs.train_model` and its kin)
  runs in a `tff.program.FederatedContext`; install this one around it
  (`tff.framework.get_context_stack().install(...)`).

  Args:
    sync_context: The context whose workers run the computations; the
      current one by default (`set_local_execution_context`,
      `set_remote_execution_context`).
  """
  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff
  # pylint: enable=g-import-not-at-top
  if sync_context is None:
    sync_context = tff.framework.get_context_stack().current
  return tff.program.NativeFederatedContext(_SyncContextAsAsync(sync_context))
