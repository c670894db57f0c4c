"""TFF execution contexts on workers this library starts and ends.

TFF 0.87's own local context starts a C++ worker it never ends reliably
(`tff_methods.execution.workers` says why). The contexts here run the same
packaged worker, or several running ones, through TFF's own executors:

  from tff_methods.execution import runtime
  runtime.set_local_execution_context(max_concurrent_clients=2)

Several workers, possibly on other hosts (each started with the `worker`
binary, or `workers.start_worker`), split every round's clients between
them through TFF's mergeable-computation context:

  runtime.set_remote_execution_context(['host1:8000', 'host2:8000'])

TFF's program logic (`tff.learning.programs.train_model`) runs in
`create_program_context()` on the same workers. Importing this module changes
nothing; it installs no signal handler and no warning filter (the binaries do,
through `tff_methods_tooling.process_setup`).
"""

import asyncio
import functools
from typing import Optional, Sequence

from tff_methods.execution import worker_compilation
from tff_methods.execution import workers

# How long a remote worker may stay unreachable before a call fails for good
# (TFF itself would retry a lost worker forever).
REMOTE_WORKER_TIMEOUT_SECONDS = 30.0
# How long to wait, when a context is made, for a remote worker that
# accepts connections to serve.
REMOTE_WORKER_CONNECT_SECONDS = 10.0


def discard_default_context() -> None:
  """Drops the context TFF sets up when imported, while Python still runs.

  TFF's import-time default context fails noisily in its `__del__` at
  interpreter shutdown; a program that exits without running computations
  (e.g. on a bad flag) calls this first.
  """
  from tensorflow_federated.python.core.impl.context_stack import (
    context_stack_impl,
  )
  from tensorflow_federated.python.core.impl.context_stack import (
    runtime_error_context,
  )

  context_stack_impl.context_stack.set_default_context(
    runtime_error_context.RuntimeErrorContext()
  )


def set_local_execution_context(
  max_concurrent_clients: int = -1,
  worker_binary: Optional[str] = None,
  log_path: Optional[str] = None,
  model_parameters: Optional[int] = None,
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
      `workers.LARGE_MODEL_PARAMETERS` or more get every core for each client,
      smaller ones (and None) the cores split (`workers.threads_per_client`).
  """
  from tensorflow_federated.python.core.impl.context_stack import (
    context_stack_impl,
  )

  context_stack_impl.context_stack.set_default_context(
    create_local_execution_context(
      max_concurrent_clients, worker_binary, log_path, model_parameters
    )
  )


def create_local_execution_context(
  max_concurrent_clients: int = -1,
  worker_binary: Optional[str] = None,
  log_path: Optional[str] = None,
  model_parameters: Optional[int] = None,
):
  """The context `set_local_execution_context` sets, to install yourself."""
  from tensorflow_federated.python.core.environments.tensorflow_frontend import (  # noqa: E501
    tensorflow_computation,
  )
  from tensorflow_federated.python.core.impl.execution_contexts import (
    sync_execution_context,
  )
  from tensorflow_federated.python.core.impl.executor_stacks import (
    python_executor_stacks,
  )
  from tensorflow_federated.python.core.impl.types import placements

  from tff_methods.execution import onednn_max_pool

  service = workers.LocalWorker(
    worker_binary, max_concurrent_clients, log_path, model_parameters
  )
  service.get_stub()  # Start the worker now, from this thread.

  def executor_stack_fn(cardinalities):
    if cardinalities.get(placements.CLIENTS) is None:
      cardinalities[placements.CLIENTS] = 0
    executor = _remote_executor(service.get_stub())
    executor.set_cardinalities(cardinalities)
    return executor

  factory = python_executor_stacks.ResourceManagingExecutorFactory(
    executor_stack_fn=executor_stack_fn
  )
  # The packaged worker runs oneDNN's MaxPool kernels; make its choice of
  # them the same in every build of a graph (`onednn_max_pool`).
  compiler_fn = functools.partial(
    worker_compilation.compile_for_simulation,
    pair_max_pool_gradients=onednn_max_pool.applies(worker_binary),
  )
  return sync_execution_context.SyncExecutionContext(
    executor_fn=factory,
    compiler_fn=compiler_fn,
    transform_args=tensorflow_computation.transform_args,
    transform_result=tensorflow_computation.transform_result,
  )


def _async_remote_context(get_stub):
  """A TFF async context running every computation on one worker's stub."""
  from tensorflow_federated.python.core.environments.tensorflow_frontend import (  # noqa: E501
    tensorflow_computation,
  )
  from tensorflow_federated.python.core.impl.execution_contexts import (
    async_execution_context,
  )
  from tensorflow_federated.python.core.impl.executor_stacks import (
    python_executor_stacks,
  )
  from tensorflow_federated.python.core.impl.types import placements

  def executor_stack_fn(cardinalities):
    if cardinalities.get(placements.CLIENTS) is None:
      cardinalities[placements.CLIENTS] = 0
    executor = _remote_executor(get_stub())
    executor.set_cardinalities(cardinalities)
    return executor

  return async_execution_context.AsyncExecutionContext(
    executor_fn=python_executor_stacks.ResourceManagingExecutorFactory(
      executor_stack_fn=executor_stack_fn
    ),
    compiler_fn=worker_compilation.compile_for_simulation,
    transform_args=tensorflow_computation.transform_args,
    transform_result=tensorflow_computation.transform_result,
  )


def _serialize_into(target, value, type_spec) -> None:
  """Writes TFF's `executor_pb2.Value` of `value` into `target`, in place.

  TFF's `value_serialization.serialize_value` builds each struct and
  federated level as a new message holding copies of the levels below, so
  a server state's tensors are copied once per level (about ten times a
  round: for ResNet-18's 45 MB most of the fixed second of a round). Here
  every level is written into its parent's field; each tensor is copied
  once more than TFF's own serializer of that tensor makes it. The
  message is equal to TFF's.
  """
  from tensorflow_federated.python.common_libs import structure
  from tensorflow_federated.python.core.impl.executors import (
    value_serialization,
  )
  from tensorflow_federated.python.core.impl.types import computation_types
  from tensorflow_federated.python.core.impl.types import type_serialization

  if isinstance(type_spec, computation_types.StructType):
    elements = structure.from_container(value)
    if len(elements) != len(type_spec):
      raise TypeError(
        f'Cannot serialize a struct value of {len(elements)} elements to a '
        f'struct type of {len(type_spec)}: {type_spec}.'
      )
    target.struct.SetInParent()
    for (name, member_type), (_, member) in zip(
      structure.iter_elements(type_spec), structure.iter_elements(elements)
    ):
      element = target.struct.element.add()
      if name:
        element.name = name
      _serialize_into(element.value, member, member_type)
  elif isinstance(type_spec, computation_types.FederatedType):
    members = [value] if type_spec.all_equal else value
    if not isinstance(members, list):
      raise TypeError(
        f'Expected a list of values for {type_spec}, got {type(value)}.'
      )
    target.federated.SetInParent()
    for member in members:
      _serialize_into(target.federated.value.add(), member, type_spec.member)
    target.federated.type.CopyFrom(
      type_serialization.serialize_type(type_spec).federated
    )
  else:
    proto, _ = value_serialization.serialize_value(value, type_spec)
    target.CopyFrom(proto)


def _remote_executor(stub):
  """TFF's `RemoteExecutor` on `stub`, whose structured values are
  serialized in place (`_serialize_into`)."""
  from tensorflow_federated.proto.v0 import executor_pb2
  from tensorflow_federated.python.core.impl.executors import remote_executor
  from tensorflow_federated.python.core.impl.types import computation_types

  class InPlaceRemoteExecutor(remote_executor.RemoteExecutor):
    async def create_value(self, value, type_spec=None):
      if not isinstance(
        type_spec,
        (computation_types.StructType, computation_types.FederatedType),
      ):
        return await super().create_value(value, type_spec)
      self._check_has_executor_id()
      request = executor_pb2.CreateValueRequest(executor=self._executor_id)
      _serialize_into(request.value, value, type_spec)
      response = self._stub.create_value(request)
      return remote_executor.RemoteValue(response.value_ref, type_spec, self)

  return InPlaceRemoteExecutor(stub)


class NotMergeableError(ValueError):
  """A computation that can't be split across several workers."""


def _mergeable_context(async_contexts, addresses):
  """TFF's mergeable-computation context, fixed, with a clear compile error."""
  from tensorflow_federated.python.core.backends.native import (
    mergeable_comp_compiler,
  )
  from tensorflow_federated.python.core.impl.execution_contexts import (
    mergeable_comp_execution_context as mergeable,
  )
  from tensorflow_federated.python.core.impl.types import computation_types
  from tensorflow_federated.python.core.impl.types import type_analysis
  from tensorflow_federated.python.core.impl.types import type_conversions

  def compile_or_explain(computation):
    try:
      return mergeable_comp_compiler.compile_to_mergeable_comp_form(computation)
    except Exception as e:
      raise NotMergeableError(
        f'This computation ({computation.type_signature}) does not compile '
        "to TFF's mergeable form (one aggregation of client values per "
        'call), so it can not be split across the workers at '
        f'{",".join(addresses)}. Run it on one worker '
        f'(`set_local_execution_context`). TFF said: {type(e).__name__}: '
        f'{e}'
      ) from e

  async def after_merge_in_order(comp, merge_result, arg_list, contexts):
    # TFF 0.87 concatenates the subrounds' CLIENTS-placed results in the
    # order the subrounds FINISH, which depends on timing. Keep the order of
    # the clients instead, so that a run repeats itself exactly.
    results = [None] * len(arg_list)

    async def run(index, context):
      results[index] = await mergeable._compute_after_merged(
        comp, arg_list[index], merge_result, context
      )

    for start in range(0, len(arg_list), len(contexts)):
      await asyncio.gather(
        *(
          run(start + k, context)
          for k, context in enumerate(contexts)
          if start + k < len(arg_list)
        )
      )
    return results

  async def invoke_in_order(comp, arg, contexts):
    # TFF's `_invoke_mergeable_comp_form`, with the after-merge step above.
    arg_list = arg.value() if arg is not None else [None] * len(contexts)
    merge_result, merge_context = await mergeable._invoke_merge_in_async_pool(
      comp, arg_list, contexts
    )
    result_type = comp.after_merge.type_signature.result
    if type_analysis.contains_only(
      result_type,
      lambda t: not isinstance(t, computation_types.FederatedType)
      or t.all_equal,
    ):
      return await mergeable._compute_after_merged(
        comp, arg_list[0], merge_result, merge_context
      )
    return mergeable._repackage_partitioned_values(
      await after_merge_in_order(comp, merge_result, arg_list, contexts),
      result_type_spec=result_type,
    )

  class OrderedMergeableContext(mergeable.MergeableCompExecutionContext):
    def invoke(self, comp, arg=None):
      comp = self._compiler_pipeline.compile(comp)
      if arg is not None:
        arg = mergeable.MergeableCompExecutionContextValue(
          arg, comp.up_to_merge.type_signature.parameter, self._num_subrounds
        )
      return type_conversions.type_to_py_container(
        self._async_runner.run_coro_and_return_result(
          invoke_in_order(comp, arg, self._async_execution_contexts)
        ),
        comp.after_merge.type_signature.result,
      )

  return OrderedMergeableContext(
    async_contexts=async_contexts, compiler_fn=compile_or_explain
  )


def set_remote_execution_context(
  addresses: Sequence[str],
  timeout_seconds: float = REMOTE_WORKER_TIMEOUT_SECONDS,
) -> None:
  """Makes TFF split every round's clients across the workers at `addresses`.

  Each address is a `host:port` where a TFF worker serves (started with
  the `worker` binary, or `workers.start_worker`). A round's
  clients are cut into one contiguous part per worker; each worker trains
  its part and sums its part's aggregates, and the parts' sums are merged:
  TFF's `MergeableCompExecutionContext`, nothing home-made. The workers read
  the clients' data by file path, so every worker needs the data cache at
  the same path (a shared file system, or the same data cache copied).

  Args:
    addresses: The workers, e.g. `['127.0.0.1:8000', '127.0.0.1:8001']`.
    timeout_seconds: How long to wait for a worker to serve, now and when a
      call finds it gone, before a RuntimeError names it.

  Raises:
    workers.WorkerUnreachableError: A worker doesn't serve (at once for a
      port nobody listens on, else after `REMOTE_WORKER_CONNECT_SECONDS`).
  """
  from tensorflow_federated.python.core.impl.context_stack import (
    context_stack_impl,
  )

  context_stack_impl.context_stack.set_default_context(
    create_remote_execution_context(addresses, timeout_seconds)
  )


def create_remote_execution_context(
  addresses: Sequence[str],
  timeout_seconds: float = REMOTE_WORKER_TIMEOUT_SECONDS,
):
  """The context `set_remote_execution_context` sets, to install yourself.

  E.g. `with tff.framework.get_context_stack().install(context): ...`.
  """
  addresses = list(addresses)
  remote = [workers.RemoteWorker(a, timeout_seconds) for a in addresses]
  for worker in remote:  # Fail now, naming the worker, not in round 1.
    worker.connect(min(timeout_seconds, REMOTE_WORKER_CONNECT_SECONDS))
  return _mergeable_context(
    [_async_remote_context(w.get_stub) for w in remote], addresses
  )


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
  import tensorflow_federated as tff

  if sync_context is None:
    sync_context = tff.framework.get_context_stack().current
  return tff.program.NativeFederatedContext(_SyncContextAsAsync(sync_context))
