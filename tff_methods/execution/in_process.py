"""An execution context that runs the clients' TensorFlow in this process,
on the devices the caller names (GPUs where there are any).

TFF 0.87's C++ worker is a CPU-only build of TensorFlow (an op pinned to a
GPU runs on its CPU), and TFF's Python executors, which took devices, are
gone. The TensorFlow in this Python process can use GPUs, so this context
runs computations here:

  from tff_methods.execution import in_process
  in_process.set_in_process_execution_context(devices=['gpu:0', 'gpu:1'])

A round (`next(state, client_data)`) is compiled once by TFF's own
`tff.backends.mapreduce.get_map_reduce_form_for_computation` into
TensorFlow graphs (`prepare`, `work`, `zero`, `accumulate`, `merge`,
`report`, `update`). The server's graphs run on the first device; the
round's clients are dealt to the devices in turn (client k to device
k mod n); each device trains its share in one session call (at most
`clients_per_call` clients a call): `work` and the `accumulate` of each
client's update in a `tf.while_loop` over the device's clients, in their
order, the running sum kept on the device
(`session_graphs.ClientLoopGraph`), as GPU-oriented simulators run a
device's clients in one compiled program. The devices run at the same
time, and their sums are merged in device order. On a CPU split into
logical devices each device's sessions have threads of their own, the
cores split between them (`devices.intra_op_threads`). Computations with no
clients (`initialize`, `get_model_weights`, ...) are turned into one
TensorFlow graph each by TFF's local compiler and run on the first device.
Anything else goes to a TFF worker (`runtime.create_local_execution_context`,
started the first time it is needed), or, without one, fails in one line
naming the computation.

Secure aggregation's intrinsics are replaced by their plain bodies first, as
the worker's contexts do (`worker_compilation.compile_for_simulation`): in a
simulation every party is this program.

Placement is explicit: each graph is imported on its device
(`session_graphs.SessionGraph`), and an op that belongs on the host (the
input pipeline, the client-state files' reads and writes) or has no kernel
for a GPU goes to the host CPU (`devices`). `placement()` counts where a
traced call's nodes actually ran, from TensorFlow's step stats.
"""

import concurrent.futures
import logging
import threading
from typing import Optional, Sequence

import tensorflow as tf
from tensorflow_federated.python.core.impl.context_stack import context_base

from tff_methods.execution import devices as devices_lib
from tff_methods.execution import session_graphs
from tff_methods.execution import worker_compilation

# A device's clients per session call, by default: enough that a round of
# small clients is a call or two a device.
CLIENTS_PER_CALL = 100


class NotRunnableError(RuntimeError):
  """A computation this context can't run and has no worker to send to."""


class _MapReduceRound:
  """A round compiled to TFF's MapReduceForm, with its graphs on devices."""

  def __init__(self, form, devices: Sequence[str], clients_per_call: int):
    self._form = form
    self.clients_per_call = clients_per_call
    self._devices = list(devices)
    work_result = form.work.type_signature.result
    if any(
      session_graphs.leaves_of_type(secure) for secure in list(work_result)[1:]
    ):
      raise NotRunnableError(
        'in_process: a round whose clients still sum securely (secure '
        'intrinsics should have been replaced by their bodies).'
      )
    server = self._devices[0]
    one = lambda computation, device: session_graphs.SessionGraph(
      [(computation, {})], device
    )
    self._prepare = one(form.prepare, server)
    self._merge = one(form.merge, server)
    self._report = one(form.report, server)
    self._update = one(form.update, server)
    self._zero = {d: one(form.zero, d) for d in self._devices}
    # A device's clients in one call: `work`, then `accumulate` of the
    # running sum and work's update (its first result; the secure sums'
    # inputs are empty), client after client in a loop on the device.
    client_leaves = len(
      session_graphs.leaves_of_type(form.work.type_signature.parameter[0])
    )
    self._step = {
      d: session_graphs.ClientLoopGraph(
        form.work,
        form.accumulate,
        client_leaves,
        d,
        devices_lib.intra_op_threads(d, self._devices),
      )
      for d in self._devices
    }
    self._pool = concurrent.futures.ThreadPoolExecutor(len(self._devices))
    self.trace = False

  def graphs(self):
    """Every graph of the round, server's first."""
    yield from (self._prepare, self._merge, self._report, self._update)
    for d in self._devices:
      yield from (self._zero[d], self._step[d])

  def work_graphs(self) -> dict:
    """The clients' step (training, and the sum of updates) on each device."""
    return dict(self._step)

  def __call__(self, state, clients: list):
    from tensorflow_federated.python.core.impl.types import computation_types

    parameter = self._form.type_signature.parameter
    state_leaves = session_graphs.flatten(state, parameter[0])
    broadcast = list(self._prepare.run(state_leaves))
    client_type = parameter[1].member
    # Client k on device k mod n: each device's clients in order, the
    # devices at once.
    shares = {
      d: [c for k, c in enumerate(clients) if k % len(self._devices) == i]
      for i, d in enumerate(self._devices)
    }

    def train(device):
      total = list(self._zero[device].run([]))
      share = shares[device]
      for start in range(0, len(share), self.clients_per_call):
        clients = [
          session_graphs.flatten(client, client_type)
          for client in share[start : start + self.clients_per_call]
        ]
        total = self._step[device].run(
          session_graphs.stack(clients) + broadcast + total, trace=self.trace
        )
      return total

    totals = list(self._pool.map(train, self._devices))
    merged = totals[0]
    for total in totals[1:]:
      merged = self._merge.run(list(merged) + list(total))
    report = self._report.run(list(merged))
    outputs = self._update.run(state_leaves + list(report))
    result_type = self._form.type_signature.result
    assert isinstance(result_type, computation_types.StructType)
    return session_graphs.unflatten(outputs, result_type)

  def close(self):
    self._pool.shutdown()
    for graph in self.graphs():
      graph.close()


class _LocalComputation:
  """A computation without clients, as one TensorFlow graph on a device."""

  def __init__(self, computation, device: str):
    self._type = computation.type_signature
    self._graph = session_graphs.SessionGraph([(computation, {})], device)

  def graphs(self):
    yield self._graph

  def __call__(self, arg):
    parameter = self._type.parameter
    leaves = [] if parameter is None else session_graphs.flatten(arg, parameter)
    return session_graphs.unflatten(self._graph.run(leaves), self._type.result)

  def close(self):
    self._graph.close()


def _is_round(type_signature) -> bool:
  """`(<S@SERVER, {D}@CLIENTS> -> <S@SERVER, X@SERVER>)`: MapReduceForm's
  shape."""
  from tensorflow_federated.python.core.impl.types import computation_types
  from tensorflow_federated.python.core.impl.types import placements

  def placed(t, placement):
    return (
      isinstance(t, computation_types.FederatedType)
      and t.placement is placement
    )

  parameter, result = type_signature.parameter, type_signature.result
  return (
    isinstance(parameter, computation_types.StructType)
    and len(parameter) == 2
    and placed(parameter[0], placements.SERVER)
    and placed(parameter[1], placements.CLIENTS)
    and isinstance(result, computation_types.StructType)
    and len(result) == 2
    and all(placed(r, placements.SERVER) for r in result)
  )


def _has_clients(type_signature) -> bool:
  from tensorflow_federated.python.core.impl.types import computation_types
  from tensorflow_federated.python.core.impl.types import placements
  from tensorflow_federated.python.core.impl.types import type_analysis

  return type_analysis.contains(
    type_signature,
    lambda t: isinstance(t, computation_types.FederatedType)
    and t.placement is placements.CLIENTS,
  )


def _no_grappler() -> tf.compat.v1.ConfigProto:
  """Compile the graphs as they are: each session's Grappler optimizes
  them when they run, as the worker's do."""
  config = tf.compat.v1.ConfigProto()
  config.graph_options.rewrite_options.disable_meta_optimizer = True
  return config


def _local_tensorflow(computation):
  """A computation without clients as one TensorFlow computation (TFF's
  local compiler), or the computation itself if it is one already."""
  from tensorflow_federated.python.core.backends.mapreduce import compiler
  from tensorflow_federated.python.core.environments.tensorflow_backend import (  # noqa: E501
    tensorflow_tree_transformations,
  )
  from tensorflow_federated.python.core.impl.compiler import tree_analysis
  from tensorflow_federated.python.core.impl.computation import computation_impl
  from tensorflow_federated.python.core.impl.context_stack import (
    context_stack_impl,
  )

  proto = computation_impl.ConcreteComputation.get_proto(computation)
  if proto.WhichOneof('computation') == 'tensorflow':
    return computation
  tree = computation.to_building_block()
  tree, _ = tensorflow_tree_transformations.replace_intrinsics_with_bodies(tree)
  tree_analysis.check_contains_only_reducible_intrinsics(tree)
  tree = compiler.consolidate_and_extract_local_processing(tree, _no_grappler())
  return computation_impl.ConcreteComputation(
    computation_proto=tree.proto, context_stack=context_stack_impl.context_stack
  )


def _map_reduce_form(computation):
  """TFF's MapReduceForm of `computation`, its secure sums in the clear."""
  import tensorflow_federated as tff

  return tff.backends.mapreduce.get_map_reduce_form_for_computation(
    worker_compilation.secure_sums_in_the_clear(computation), _no_grappler()
  )


class InProcessExecutionContext(context_base.SyncContext):
  """A TFF sync context running computations' TensorFlow in this process.

  Install it with `set_in_process_execution_context`, or around code with
  `tff.framework.get_context_stack().install(context)`; TFF's program logic
  runs in `runtime.create_program_context(context)`.
  """

  def __init__(
    self,
    devices: Optional[Sequence[str]] = None,
    fallback_fn=None,
    clients_per_call: int = CLIENTS_PER_CALL,
  ):
    """Args:
    devices: Where the clients run, as `cpu:N`/`gpu:N` (every GPU, or the
      CPU, by default; `devices.configure_devices`). The server's graphs
      run on the first.
    fallback_fn: Makes the context that runs what this one can't (e.g.
      `runtime.create_local_execution_context`), called once, the first time
      it is needed; None: such a computation fails in one line.
    clients_per_call: At most this many of a device's clients are trained
      in one session call (their inputs are held at once: a data set's
      serialized graph each).
    """
    if clients_per_call < 1:
      raise ValueError(f'clients_per_call={clients_per_call} must be >= 1.')
    self.clients_per_call = clients_per_call
    self.devices = devices_lib.configure_devices(devices)
    self._fallback_fn = fallback_fn
    self._fallback = None
    self._plans = {}  # id(computation) -> (computation, plan or None)
    self._lock = threading.Lock()
    self.trace = False
    # The type signatures of the computations sent to the fallback.
    self.on_fallback = []

  def _plan(self, computation):
    with self._lock:
      held = self._plans.get(id(computation))
      if held is not None and held[0] is computation:
        return held[1]
      plan, why = None, None
      type_signature = computation.type_signature
      try:
        if _is_round(type_signature):
          plan = _MapReduceRound(
            _map_reduce_form(computation), self.devices, self.clients_per_call
          )
        elif not _has_clients(type_signature):
          plan = _LocalComputation(
            _local_tensorflow(computation), self.devices[0]
          )
        else:
          why = 'it is not one round of (state@SERVER, data@CLIENTS)'
      except Exception as e:  # pylint: disable=broad-except
        why = f'{type(e).__name__}: {e}'
      if plan is None and self._fallback_fn is None:
        raise NotRunnableError(
          f'in_process: {type_signature} compiles neither to a MapReduceForm '
          'nor to local TensorFlow, and this context has no worker to send '
          f'it to ({why}); run it with the worker (execution=worker).'
        )
      if plan is None:
        logging.info(
          'in_process: %s goes to the worker: %s', type_signature, why
        )
        self.on_fallback.append(str(type_signature))
      self._plans[id(computation)] = (computation, plan)
      return plan

  def invoke(self, comp, arg):
    from tensorflow_federated.python.core.impl.types import type_conversions

    plan = self._plan(comp)
    if plan is None:
      if self._fallback is None:
        self._fallback = self._fallback_fn()
      return self._fallback.invoke(comp, arg)
    if self.trace:
      for graph in plan.graphs():
        graph.traced = graph.elsewhere = graph.op_micros = None
    plan.trace = self.trace
    if isinstance(plan, _MapReduceRound):
      result = plan(arg[0], list(arg[1]))
    else:
      result = plan(arg)
    return type_conversions.type_to_py_container(
      result, comp.type_signature.result
    )

  def placement(self, computation) -> dict:
    """Where the last traced call (`trace = True`) of `computation`'s client
    work ran: {assigned device: {device that ran nodes: node count}}."""
    return {
      device: dict(graph.traced or {})
      for device, graph in self._work_graphs(computation).items()
    }

  def op_micros(self, computation) -> dict:
    """The op time of the last traced call of `computation`'s client work:
    {assigned device: {op type: microseconds}}. A traced call runs its
    devices one at a time."""
    return {
      device: dict(graph.op_micros or {})
      for device, graph in self._work_graphs(computation).items()
    }

  def off_device_ops(self, computation) -> dict:
    """The op types of the last traced call of `computation`'s client work
    that ran off their device but do not belong on the host
    (`runs_on_host`): {assigned device: {op type: nodes}}; empty where
    every client step ran on its device."""
    found = {}
    for device, graph in self._work_graphs(computation).items():
      wrong = {
        op: n
        for op, n in (graph.elsewhere or {}).items()
        if not devices_lib.runs_on_host(op)
      }
      if wrong:
        found[device] = wrong
    return found

  def _work_graphs(self, computation) -> dict:
    plan = self._plan(computation)
    if not isinstance(plan, _MapReduceRound):
      raise ValueError(f'{computation.type_signature} has no client work.')
    return plan.work_graphs()

  def ops_without_gpu_kernel(self, computation) -> set[str]:
    """The op types of `computation`'s client work that no GPU could run,
    but the host's (`devices.HOST_OP`: data sets, iterators, files)."""
    graph = next(iter(self._work_graphs(computation).values()))
    return {
      op
      for op in graph.op_types
      if not devices_lib.is_host_op(op) and not devices_lib.has_gpu_kernel(op)
    }

  def close(self):
    for _, plan in self._plans.values():
      if plan is not None:
        plan.close()
    self._plans.clear()


def create_in_process_execution_context(
  devices: Optional[Sequence[str]] = None,
  *,
  deterministic: bool = False,
  fallback_fn=None,
  clients_per_call: int = CLIENTS_PER_CALL,
) -> InProcessExecutionContext:
  """The context `set_in_process_execution_context` sets, to install
  yourself (arguments as there)."""
  devices_lib.configure_determinism(deterministic)
  if fallback_fn is None:
    from tff_methods.execution import runtime

    fallback_fn = runtime.create_local_execution_context
  return InProcessExecutionContext(
    devices, fallback_fn or None, clients_per_call
  )


def is_current() -> bool:
  """Whether TFF's current context is an in-process one: computations built
  now run their TensorFlow in this process (the binaries then build
  stateful processes with `client_states_in_memory=True`)."""
  from tensorflow_federated.python.core.impl.context_stack import (
    context_stack_impl,
  )

  return isinstance(
    context_stack_impl.context_stack.current, InProcessExecutionContext
  )


def set_in_process_execution_context(
  devices: Optional[Sequence[str]] = None,
  *,
  deterministic: bool = False,
  fallback_fn=None,
  clients_per_call: int = CLIENTS_PER_CALL,
) -> InProcessExecutionContext:
  """Makes TFF run computations' TensorFlow in this process, on `devices`.

  Args:
    devices: `cpu:N`/`gpu:N` names; every GPU (or the CPU) by default.
      More `cpu:N` than the one CPU device splits the CPU into logical
      devices (only before TensorFlow starts).
    deterministic: TF32 off and op determinism on (`configure_determinism`).
    fallback_fn: Makes the context for computations this one can't compile;
      a local TFF worker by default (`runtime.create_local_execution_context`,
      started when first needed); `False`: they fail in one line.
    clients_per_call: At most this many of a device's clients in one
      session call.

  Returns:
    The context, e.g. for `placement`.
  """
  from tensorflow_federated.python.core.impl.context_stack import (
    context_stack_impl,
  )

  context = create_in_process_execution_context(
    devices,
    deterministic=deterministic,
    fallback_fn=fallback_fn,
    clients_per_call=clients_per_call,
  )
  context_stack_impl.context_stack.set_default_context(context)
  return context
