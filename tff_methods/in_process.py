"""An execution context that runs the clients' TensorFlow in this process,
on the devices the caller names (GPUs where there are any).

TFF 0.87's C++ worker is a CPU-only build of TensorFlow (an op pinned to a
GPU runs on its CPU), and TFF's Python executors, which took devices, are
gone. The TensorFlow in this Python process can use GPUs, so this context
runs computations here:

  from tff_methods import in_process
  in_process.set_in_process_execution_context(devices=['gpu:0', 'gpu:1'])

A round (`next(state, client_data)`) is compiled once by TFF's own
`tff.backends.mapreduce.get_map_reduce_form_for_computation` into
TensorFlow graphs (`prepare`, `work`, `zero`, `accumulate`, `merge`,
`report`, `update`). The server's graphs run on the first device; the
round's clients are dealt to the devices in turn (client k to device
k mod n); each device trains its clients one after the other, a client's
`work` and the `accumulate` of its update as one graph in a session of the
device's own (the update stays on the device), the devices run at the same
time, and their sums are merged in device order. Computations with no
clients (`initialize`, `get_model_weights`, ...) are turned into one
TensorFlow graph each by TFF's local compiler and run on the first device.
Anything else goes to a TFF worker (`runtime.create_local_execution_context`,
started the first time it is needed), or, without one, fails in one line
naming the computation.

Secure aggregation's intrinsics are replaced by their plain bodies first, as
the worker's contexts do (`runtime.compile_for_simulation`): in a
simulation every party is this program.

Placement is explicit: each graph is imported on its device, and an op with
no kernel for that device (the input pipeline, the client-state files'
reads and writes) goes to the host CPU. `placement()` counts where a traced
call's nodes actually ran, from TensorFlow's step stats.
"""

import collections
import concurrent.futures
import logging
import re
import threading
from typing import Any, Optional, Sequence

import numpy as np
import tensorflow as tf
from tensorflow_federated.python.core.impl.context_stack import context_base

DEVICE_PATTERN = re.compile(r'^(cpu|gpu):(\d+)$')
_HOST = '/device:CPU:0'
_TRACE_LOCK = threading.Lock()
# Ops that stay on the host CPU whatever the device: TFF's worker keeps its
# data sets and iterators there (its session provider); file IO, strings
# and the input pipeline's parsing have no kernel elsewhere. Those the
# project's clients run: data sets and their parsing and shuffling, a
# client key's strings, the client-state files and their serialization.
_HOST_OP = re.compile(
  r'Dataset|Iterator|ReadFile|WriteFile|MatchingFiles|ParseExample|DecodeRaw|'
  r'StatelessShuffle|^String|^StaticRegex|^AsString$|^ParseTensor$|'
  r'^SerializeTensor$'
)


# What a graph's own device may hand to the host besides `_HOST_OP`s: the
# arguments and results of the host's functions, and the control flow and
# constants around them.
_PLUMBING = re.compile(
  r'^(_Arg|_Retval|_Send|_Recv|NoOp|Switch|Merge|Identity|Const)$'
)


def runs_on_host(op: str) -> bool:
  """Whether op type `op` belongs on the host whatever the client's device:
  the input pipeline, files and strings, and the plumbing around them."""
  return bool(_HOST_OP.search(op) or _PLUMBING.match(op))


class DeviceError(ValueError):
  """Devices that can't be used as asked."""


class NotRunnableError(RuntimeError):
  """A computation this context can't run and has no worker to send to."""


def parse_devices(devices: Sequence[str]) -> list[str]:
  """`['cpu:0', 'gpu:1']` as TensorFlow's device names, checked.

  Raises:
    DeviceError: An entry is not `cpu:N` or `gpu:N`, or appears twice.
  """
  names = []
  for entry in devices:
    match = DEVICE_PATTERN.match(str(entry).strip().lower())
    if not match:
      raise DeviceError(
        f'devices: {entry!r} is not a device; allowed: cpu:N or gpu:N '
        '(e.g. gpu:0,gpu:1, or cpu:0,cpu:1 to split the CPU).'
      )
    name = f'/device:{match.group(1).upper()}:{match.group(2)}'
    if name in names:
      raise DeviceError(f'devices: {entry!r} is named twice.')
    names.append(name)
  if not names:
    raise DeviceError('devices: name at least one device.')
  return names


def configure_devices(devices: Optional[Sequence[str]] = None) -> list[str]:
  """Makes `devices` exist in this process; returns their TensorFlow names.

  `None` means every GPU, or the CPU where there is none. Asking for
  `cpu:N` beyond the one CPU device splits the CPU into N + 1 logical
  devices, so the multi-device path runs (and is tested) without a GPU.
  This has to happen before TensorFlow's runtime starts (before any op
  runs); afterwards only devices that already exist can be named.

  Raises:
    DeviceError: A device is not there (a GPU this machine lacks, or a CPU
      split asked for after TensorFlow started), naming what there is.
  """
  if devices is None:
    gpus = tf.config.list_physical_devices('GPU')
    return [f'/device:GPU:{k}' for k in range(len(gpus))] or [_HOST]
  names = parse_devices(devices)
  cpus_needed = 1 + max(
    (int(n.rsplit(':', 1)[1]) for n in names if ':CPU:' in n), default=0
  )
  cpu = tf.config.list_physical_devices('CPU')[0]
  if cpus_needed > 1:
    configured = tf.config.get_logical_device_configuration(cpu) or []
    if len(configured) < cpus_needed:
      try:
        tf.config.set_logical_device_configuration(
          cpu, [tf.config.LogicalDeviceConfiguration()] * cpus_needed
        )
      except RuntimeError as e:
        raise DeviceError(
          f'devices: splitting the CPU into {cpus_needed} logical devices '
          'must happen before TensorFlow starts running ops; configure the '
          'devices first thing (configure_devices).'
        ) from e
  there = {
    d.name.replace('/physical_device:', '/device:')
    for d in tf.config.list_logical_devices()
  }
  there = {re.sub(r'^/job:[^/]*/replica:\d+/task:\d+', '', n) for n in there}
  missing = [n for n in names if n not in there]
  if missing:
    raise DeviceError(
      f'devices: {", ".join(missing)} not found; this process has '
      f'{", ".join(sorted(there))}.'
    )
  return names


def configure_determinism(deterministic: bool) -> None:
  """With `deterministic`, TF32 off and TensorFlow's op determinism on: a
  GPU's results then repeat, and differ from the CPU's only by rounding
  (for equality checks; slower)."""
  if deterministic:
    tf.config.experimental.enable_tensor_float_32_execution(False)
    tf.config.experimental.enable_op_determinism()


def has_gpu_kernel(op: str) -> bool:
  """Whether TensorFlow has a kernel for `op` that runs on a GPU (the CUDA
  build registers them with or without a GPU)."""
  from tensorflow.python.framework import kernels

  registered = kernels.get_registered_kernels_for_op(op).kernel
  return any(k.device_type in ('GPU', 'DEFAULT') for k in registered)


def available_devices() -> list[str]:
  """This process's devices, as `cpu:N`/`gpu:N`."""
  return [
    re.sub(r'.*device:', '', d.name).lower()
    for d in tf.config.list_logical_devices()
    if d.device_type in ('CPU', 'GPU')
  ]


def _op_type(timeline_label: str) -> str:
  """The op type in a step stat's label, `name = Type(inputs)`."""
  match = re.search(r'= (\w+)\(', timeline_label)
  return match.group(1) if match else timeline_label.split(' ')[0]


def _session_config() -> tf.compat.v1.ConfigProto:
  """The eager context's config (its logical devices, threads, GPU memory
  options), allowing soft placement for ops inside functions that have no
  kernel on their device; a fresh ConfigProto would lose the devices."""
  from tensorflow.python.eager import context

  config = tf.compat.v1.ConfigProto()
  config.CopyFrom(context.context().config)
  config.allow_soft_placement = True
  return config


def _leaves(binding) -> list:
  """A TFF TensorFlow binding's tensor and sequence bindings, in order."""
  kind = binding.WhichOneof('binding')
  if kind == 'struct':
    return [leaf for b in binding.struct.element for leaf in _leaves(b)]
  if kind is None:
    return []
  return [binding]


def _flatten(value: Any, type_spec) -> list:
  """`value` of TFF type `type_spec` as its leaves: numpy arrays, and a
  data set's serialized graph for each sequence."""
  from tensorflow_federated.python.common_libs import structure
  from tensorflow_federated.python.core.impl.executors import (
    value_serialization,
  )
  from tensorflow_federated.python.core.impl.types import computation_types

  if isinstance(type_spec, computation_types.FederatedType):
    type_spec = type_spec.member
  if isinstance(type_spec, computation_types.StructType):
    elements = structure.from_container(value)
    if len(elements) != len(type_spec):
      raise TypeError(
        f'Expected a value of {len(type_spec)} elements for {type_spec}, '
        f'got {len(elements)}: {value!r:.200}'
      )
    return [
      leaf
      for element, member_type in zip(elements, type_spec)
      for leaf in _flatten(element, member_type)
    ]
  if isinstance(type_spec, computation_types.SequenceType):
    if isinstance(value, list):
      from tensorflow_federated.python.core.environments.tensorflow_backend import (  # noqa: E501
        tensorflow_utils,
      )

      value = tensorflow_utils.make_data_set_from_elements(
        None, value, type_spec.element
      )
    return [value_serialization._serialize_dataset(value)]  # pylint: disable=protected-access
  return [np.asarray(value, dtype=type_spec.dtype)]


def _unflatten(leaves: list, type_spec):
  """The inverse of `_flatten` for tensor-only types: a `Struct` tree."""
  from tensorflow_federated.python.common_libs import structure
  from tensorflow_federated.python.core.impl.types import computation_types

  leaves = iter(leaves)

  def build(t):
    if isinstance(t, computation_types.FederatedType):
      return build(t.member)
    if isinstance(t, computation_types.StructType):
      return structure.Struct(
        [(name, build(member)) for name, member in structure.iter_elements(t)]
      )
    return next(leaves)

  return build(type_spec)


class _Graph:
  """TFF TensorFlow computations imported into one session on a device.

  Usually one computation. Given several (`parts`: (computation, bound)
  pairs), each after the first may take parameters from the results of the
  one before, `bound` mapping its parameter's leaves to that one's result
  leaves: a client's training and the sum of its update in one call. The
  feeds are every part's other parameter leaves, part by part; the results
  the last part's.
  """

  def __init__(self, parts, device: str):
    from tensorflow_federated.python.core.impl.computation import (
      computation_impl,
    )

    self.device = device
    self.op_types = set()
    self._graph = tf.Graph()
    feeds, init_ops, tokens, results = [], [], [], []
    with self._graph.as_default():
      for index, (computation, bound) in enumerate(parts):
        tf_proto = computation_impl.ConcreteComputation.get_proto(
          computation
        ).tensorflow
        graph_def = tf.compat.v1.GraphDef()
        tf_proto.graph_def.Unpack(graph_def)
        for node in graph_def.node:
          if not node.device:
            node.device = _HOST if self._host_only(node.op, device) else device
        self.op_types |= {n.op for n in graph_def.node} | {
          n.op for f in graph_def.library.function for n in f.node_def
        }
        prefix = f'part{index}' if len(parts) > 1 else ''
        named = (
          lambda name, prefix=prefix: f'{prefix}/{name}' if prefix else name
        )
        input_map, fed = {}, []
        for k, leaf in enumerate(_leaves(tf_proto.parameter)):
          if k in bound:
            input_map[leaf.tensor.tensor_name] = results[bound[k]]
          elif leaf.WhichOneof('binding') == 'tensor':
            fed.append(named(leaf.tensor.tensor_name))
          elif leaf.sequence.WhichOneof('binding') == 'graph_def_tensor_name':
            fed.append(named(leaf.sequence.graph_def_tensor_name))
          else:
            with tf.device(_HOST):
              serialized = tf.compat.v1.placeholder(tf.string, [])
              input_map[leaf.sequence.variant_tensor_name] = (
                tf.raw_ops.DatasetFromGraph(graph_def=serialized)
              )
            fed.append(serialized)
        names = {n.name for n in graph_def.node}
        token = tf_proto.session_token_tensor_name
        if token and token.split(':')[0] in names:
          tokens.append(named(token))
        if tf_proto.initialize_op:
          init_ops.append(named(tf_proto.initialize_op))
        results = tf.graph_util.import_graph_def(
          graph_def,
          input_map=input_map,
          return_elements=[
            leaf.tensor.tensor_name for leaf in _leaves(tf_proto.result)
          ],
          name=prefix,
        )
        feeds += [
          f if isinstance(f, tf.Tensor) else self._graph.get_tensor_by_name(f)
          for f in fed
        ]
    self._feeds = feeds
    self._fetches = list(results)
    self._tokens = {self._graph.get_tensor_by_name(t): b'' for t in tokens}
    self._init_ops = [self._graph.get_operation_by_name(o) for o in init_ops]
    self._session = tf.compat.v1.Session(
      graph=self._graph, config=_session_config()
    )
    # Callables: less Python per call than `Session.run` (a client's
    # training is two calls: its variables' initialization, then the step).
    self._initialize = (
      self._session.make_callable(self._init_ops, feed_list=list(self._tokens))
      if self._init_ops
      else None
    )
    self._call = (
      self._session.make_callable(
        self._fetches, feed_list=self._feeds + list(self._tokens)
      )
      if self._fetches
      else None
    )
    self.traced = None
    self.elsewhere = None

  @staticmethod
  def _host_only(op: str, device: str) -> bool:
    return bool(_HOST_OP.search(op)) or (
      ':GPU:' in device and not has_gpu_kernel(op)
    )

  def run(self, leaves: list, trace: bool = False) -> list:
    if self._initialize:
      self._initialize(*self._tokens.values())
    if not self._fetches:
      return []
    if not trace:
      return self._call(*leaves, *self._tokens.values())
    feed = dict(zip(self._feeds, leaves))
    feed.update(self._tokens)
    metadata = tf.compat.v1.RunMetadata()
    with _TRACE_LOCK:  # TensorFlow traces one session run at a time.
      outputs = self._session.run(
        self._fetches,
        feed_dict=feed,
        options=tf.compat.v1.RunOptions(
          trace_level=tf.compat.v1.RunOptions.FULL_TRACE
        ),
        run_metadata=metadata,
      )
    self.traced = collections.Counter(
      {
        re.sub(r'^/job:[^/]*/replica:\d+/task:\d+', '', stats.device): len(
          stats.node_stats
        )
        for stats in metadata.step_stats.dev_stats
      }
    )
    # The op types that ran elsewhere than this graph's device.
    self.elsewhere = collections.Counter(
      _op_type(node.timeline_label)
      for stats in metadata.step_stats.dev_stats
      if not stats.device.endswith(self.device.replace('/device', 'device'))
      for node in stats.node_stats
    )
    return outputs

  def close(self):
    self._session.close()


class _MapReduceRound:
  """A round compiled to TFF's MapReduceForm, with its graphs on devices."""

  def __init__(self, form, devices: Sequence[str]):
    self._form = form
    self._devices = list(devices)
    work_result = form.work.type_signature.result
    if any(_leaves_of_type(secure) for secure in list(work_result)[1:]):
      raise NotRunnableError(
        'in_process: a round whose clients still sum securely (secure '
        'intrinsics should have been replaced by their bodies).'
      )
    server = self._devices[0]
    one = lambda computation, device: _Graph([(computation, {})], device)
    self._prepare = one(form.prepare, server)
    self._merge = one(form.merge, server)
    self._report = one(form.report, server)
    self._update = one(form.update, server)
    self._zero = {d: one(form.zero, d) for d in self._devices}
    # A client's step: `work`, then `accumulate` of the running sum and
    # work's update (its first result; the secure sums' inputs are empty),
    # in one call: the update never leaves the device.
    accumulated = len(_leaves_of_type(form.zero.type_signature.result))
    update = {
      accumulated + k: k for k in range(len(_leaves_of_type(work_result[0])))
    }
    self._step = {
      d: _Graph([(form.work, {}), (form.accumulate, update)], d)
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
    state_leaves = _flatten(state, parameter[0])
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
      for client in shares[device]:
        total = self._step[device].run(
          _flatten(client, client_type) + broadcast + total, trace=self.trace
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
    return _unflatten(outputs, result_type)

  def close(self):
    self._pool.shutdown()
    for graph in self.graphs():
      graph.close()


def _leaves_of_type(type_spec) -> list:
  """The tensor types of a tensor-only TFF type, in order."""
  from tensorflow_federated.python.core.impl.types import computation_types

  if isinstance(type_spec, computation_types.StructType):
    return [leaf for member in type_spec for leaf in _leaves_of_type(member)]
  return [type_spec]


class _LocalComputation:
  """A computation without clients, as one TensorFlow graph on a device."""

  def __init__(self, computation, device: str):
    self._type = computation.type_signature
    self._graph = _Graph([(computation, {})], device)

  def graphs(self):
    yield self._graph

  def __call__(self, arg):
    parameter = self._type.parameter
    leaves = [] if parameter is None else _flatten(arg, parameter)
    return _unflatten(self._graph.run(leaves), self._type.result)

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
  from tensorflow_federated.python.core.backends.test import (
    compiler as test_compiler,
  )

  return tff.backends.mapreduce.get_map_reduce_form_for_computation(
    test_compiler.replace_secure_intrinsics_with_bodies(computation),
    _no_grappler(),
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
  ):
    """Args:
    devices: Where the clients run, as `cpu:N`/`gpu:N` (every GPU, or the
      CPU, by default; `configure_devices`). The server's graphs run on the
      first.
    fallback_fn: Makes the context that runs what this one can't (e.g.
      `runtime.create_local_execution_context`), called once, the first time
      it is needed; None: such a computation fails in one line.
    """
    self.devices = configure_devices(devices)
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
          plan = _MapReduceRound(_map_reduce_form(computation), self.devices)
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
        graph.traced = graph.elsewhere = None
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
        if not runs_on_host(op)
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
    but the host's (`_HOST_OP`: data sets, iterators, files)."""
    graph = next(iter(self._work_graphs(computation).values()))
    return {
      op
      for op in graph.op_types
      if not _HOST_OP.search(op) and not has_gpu_kernel(op)
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
) -> InProcessExecutionContext:
  """The context `set_in_process_execution_context` sets, to install
  yourself (arguments as there)."""
  configure_determinism(deterministic)
  if fallback_fn is None:
    from tff_methods import runtime

    fallback_fn = runtime.create_local_execution_context
  return InProcessExecutionContext(devices, fallback_fn or None)


def set_in_process_execution_context(
  devices: Optional[Sequence[str]] = None,
  *,
  deterministic: bool = False,
  fallback_fn=None,
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

  Returns:
    The context, e.g. for `placement`.
  """
  from tensorflow_federated.python.core.impl.context_stack import (
    context_stack_impl,
  )

  context = create_in_process_execution_context(
    devices, deterministic=deterministic, fallback_fn=fallback_fn
  )
  context_stack_impl.context_stack.set_default_context(context)
  return context
