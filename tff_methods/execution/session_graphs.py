"""TFF's TensorFlow computations as sessions on a device, and the values
they take and give (`tff_methods.execution.in_process` runs its rounds on
these).

A `SessionGraph` imports one computation's graph (or a chain of them) into
a `tf.compat.v1.Session` on a device, placing what belongs on the host
there, and runs it on flat lists of numpy values: `flatten` turns a TFF
value of a type into them, `unflatten` turns results back into a
`tff.structure.Struct`. A `ClientLoopGraph` runs many clients' `work` and
`accumulate` in one call, in a loop on the device.
"""

import collections
import re
import threading
from typing import Any

import numpy as np
import tensorflow as tf

from tff_methods.execution import dataset_reductions
from tff_methods.execution import devices

_TRACE_LOCK = threading.Lock()


# Ops that run functions (calls the session did not inline, functional
# control flow): their time spans their functions' ops, traced themselves.
_CALL_OPS = frozenset(
  {
    'PartitionedCall',
    'StatefulPartitionedCall',
    'While',
    'StatelessWhile',
    'If',
    'StatelessIf',
    'Case',
    'StatelessCase',
  }
)


def op_micros(step_stats) -> collections.Counter:
  """Each op type's microseconds in a traced run's `step_stats`, ops that
  run functions left out (their functions' ops are counted)."""
  micros = collections.Counter()
  for stats in step_stats.dev_stats:
    for node in stats.node_stats:
      op = _op_type(node.timeline_label)
      if op not in _CALL_OPS:
        micros[op] += node.op_end_rel_micros
  return micros


def _op_type(timeline_label: str) -> str:
  """The op type in a step stat's label, `name = Type(inputs)`."""
  match = re.search(r'= (\w+)\(', timeline_label)
  return match.group(1) if match else timeline_label.split(' ')[0]


def _session_config(threads: int = 0) -> tf.compat.v1.ConfigProto:
  """The eager context's config (its logical devices, threads, GPU memory
  options), allowing soft placement for ops inside functions that have no
  kernel on their device; a fresh ConfigProto would lose the devices.
  `threads`: the session's intra-op threads, where sessions have pools of
  their own (`devices.intra_op_threads`); 0 keeps the context's."""
  from tensorflow.python.eager import context

  config = tf.compat.v1.ConfigProto()
  config.CopyFrom(context.context().config)
  config.allow_soft_placement = True
  if threads:
    config.intra_op_parallelism_threads = threads
  return config


def leaves(binding) -> list:
  """A TFF TensorFlow binding's tensor and sequence bindings, in order."""
  kind = binding.WhichOneof('binding')
  if kind == 'struct':
    return [leaf for b in binding.struct.element for leaf in leaves(b)]
  if kind is None:
    return []
  return [binding]


def flatten(value: Any, type_spec) -> list:
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
      for leaf in flatten(element, member_type)
    ]
  if isinstance(type_spec, computation_types.SequenceType):
    if isinstance(value, list):
      from tensorflow_federated.python.core.impl.utils import tensorflow_utils

      value = tensorflow_utils.make_data_set_from_elements(
        None, value, type_spec.element
      )
    return [value_serialization._serialize_dataset(value)]  # pylint: disable=protected-access
  return [np.asarray(value, dtype=type_spec.dtype)]


def unflatten(leaves: list, type_spec):
  """The inverse of `flatten` for tensor-only types: a `Struct` tree."""
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


def leaves_of_type(type_spec) -> list:
  """The tensor types of a tensor-only TFF type, in order."""
  from tensorflow_federated.python.common_libs import structure

  return structure.flatten(type_spec)


def _parameter_inputs(tf_proto, bound, results, named):
  """A part's parameter leaves: ({graph tensor: the earlier part's result
  it is bound to, or a data set made on the host from a fed serialized
  graph}, the feeds: tensor names or placeholders, in order)."""
  input_map, fed = {}, []
  for k, leaf in enumerate(leaves(tf_proto.parameter)):
    if k in bound:
      input_map[leaf.tensor.tensor_name] = results[bound[k]]
    elif leaf.WhichOneof('binding') == 'tensor':
      fed.append(named(leaf.tensor.tensor_name))
    elif leaf.sequence.WhichOneof('binding') == 'graph_def_tensor_name':
      fed.append(named(leaf.sequence.graph_def_tensor_name))
    else:
      with tf.device(devices.HOST):
        serialized = tf.compat.v1.placeholder(tf.string, [])
        input_map[leaf.sequence.variant_tensor_name] = (
          tf.raw_ops.DatasetFromGraph(graph_def=serialized)
        )
      fed.append(serialized)
  return input_map, fed


def _tensorflow_proto(computation):
  from tensorflow_federated.python.core.impl.computation import computation_impl

  return computation_impl.ConcreteComputation.get_proto(computation).tensorflow


class SessionGraph:
  """TFF TensorFlow computations imported into one session on a device.

  Usually one computation. Given several (`parts`: (computation, bound)
  pairs), each after the first may take parameters from the results of the
  one before, `bound` mapping its parameter's leaves to that one's result
  leaves. The feeds are every part's other parameter leaves, part by part;
  the results the last part's.

  After a traced run (`run(..., trace=True)`): `traced`, the nodes that ran
  on each device; `elsewhere`, the op types that ran off this graph's
  device; `op_micros`, each op type's microseconds (`op_micros`).
  """

  def __init__(self, parts, device: str, threads: int = 0):
    self.device = device
    self.threads = threads
    self.op_types = set()
    self._graph = tf.Graph()
    feeds, init_ops, tokens, results = [], [], [], []
    with self._graph.as_default():
      for index, (computation, bound) in enumerate(parts):
        tf_proto = _tensorflow_proto(computation)
        graph_def = self._placed_graph_def(tf_proto, device)
        prefix = f'part{index}' if len(parts) > 1 else ''
        named = (
          lambda name, prefix=prefix: f'{prefix}/{name}' if prefix else name
        )
        input_map, fed = _parameter_inputs(tf_proto, bound, results, named)
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
            leaf.tensor.tensor_name for leaf in leaves(tf_proto.result)
          ],
          name=prefix,
        )
        feeds += [
          f if isinstance(f, tf.Tensor) else self._graph.get_tensor_by_name(f)
          for f in fed
        ]
    self._open(feeds, list(results), tokens, init_ops)

  def _open(self, feeds, fetches, tokens=(), init_ops=()):
    """The session, and callables: less Python per call than `Session.run`
    (a computation with variables is two calls: their initialization, then
    the computation)."""
    self._feeds = feeds
    self._fetches = fetches
    self._tokens = {self._graph.get_tensor_by_name(t): b'' for t in tokens}
    self._init_ops = [self._graph.get_operation_by_name(o) for o in init_ops]
    self._session = tf.compat.v1.Session(
      graph=self._graph, config=_session_config(self.threads)
    )
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
    self.op_micros = None

  def _placed_graph_def(self, tf_proto, device: str):
    """The computation's graph, its data sets' reductions as loops
    (`dataset_reductions`), each node without a device placed on `device`
    or, if it belongs there, on the host; its op types noted."""
    graph_def = tf.compat.v1.GraphDef()
    tf_proto.graph_def.Unpack(graph_def)
    graph_def = dataset_reductions.as_loops(graph_def)
    for node in graph_def.node:
      if not node.device:
        node.device = (
          devices.HOST if self._host_only(node.op, device) else device
        )
    self.op_types |= {n.op for n in graph_def.node} | {
      n.op for f in graph_def.library.function for n in f.node_def
    }
    return graph_def

  @staticmethod
  def _host_only(op: str, device: str) -> bool:
    return devices.is_host_op(op) or (
      ':GPU:' in device and not devices.has_gpu_kernel(op)
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
    self.op_micros = op_micros(metadata.step_stats)
    return outputs

  def close(self):
    self._session.close()


def _initialized_first(graph_def, initialize_op: str):
  """`graph_def` with every node its variables' initialization does not
  need made to wait for it: inside a loop, one call runs both (a session
  runs them as two calls)."""
  if not initialize_op:
    return graph_def
  by_name = {node.name: node for node in graph_def.node}
  needed, pending = set(), [initialize_op]
  while pending:
    name = pending.pop()
    if name in needed or name not in by_name:
      continue
    needed.add(name)
    pending += [re.sub(r'^\^|:\d+$', '', i) for i in by_name[name].input]
  for node in graph_def.node:
    if node.name not in needed and node.op != 'Placeholder':
      node.input.append(f'^{initialize_op}')
  return graph_def


class ClientLoopGraph(SessionGraph):
  """Many clients in one session call: `work` and the `accumulate` of its
  update in a `tf.while_loop` over the clients, one after the other (their
  variables are one set, initialized at each client's start), the running
  sum kept on the device.

  `accumulate` takes (sum so far, update), the update being the first
  leaves of `work`'s result (MapReduceForm's `work` and `accumulate`).

  Feeds: each of the first `client_leaves` leaves of `work`'s parameter
  stacked over the clients (a data set as its serialized graph, a string
  per client), then `work`'s other leaves (the same for every client), then
  the sum so far (`accumulate`'s leaves before the update's). Results: the
  sum after the last client. `threads`: the session's intra-op threads
  (`devices.intra_op_threads`; 0: the context's).
  """

  def __init__(
    self, work, accumulate, client_leaves: int, device: str, threads: int = 0
  ):
    self.device = device
    self.threads = threads
    self.op_types = set()
    self._graph = tf.Graph()
    work_proto, sum_proto = (
      _tensorflow_proto(work),
      _tensorflow_proto(accumulate),
    )
    work_def = _initialized_first(
      self._placed_graph_def(work_proto, device), work_proto.initialize_op
    )
    sum_def = _initialized_first(
      self._placed_graph_def(sum_proto, device), sum_proto.initialize_op
    )
    work_leaves, sum_leaves = (
      leaves(work_proto.parameter),
      leaves(sum_proto.parameter),
    )
    work_types = leaves_of_type(work.type_signature.parameter)
    # accumulate: (<sum so far, update> -> sum), the update being the
    # first leaves of work's result.
    sum_types = leaves_of_type(accumulate.type_signature.parameter[0])
    update_leaves = len(sum_leaves) - len(sum_types)
    with self._graph.as_default(), tf.device(device):
      stacked = [
        _placeholder(t, stacked=True) for t in work_types[:client_leaves]
      ]
      shared = [_placeholder(t) for t in work_types[client_leaves:]]
      sums = [_placeholder(t) for t in sum_types]

      def one_client(i, *running):
        inputs = _client_inputs(work_leaves[:client_leaves], stacked, i)
        # The importer connects to the tensors it is given: those of this
        # loop's body, so the body captures what it reads from outside.
        for leaf, value in zip(work_leaves[client_leaves:], shared):
          inputs[leaf.tensor.tensor_name] = tf.identity(value)
        token = work_proto.session_token_tensor_name
        if token and token.split(':')[0] in {n.name for n in work_def.node}:
          inputs[token] = tf.constant(b'')
        update = tf.graph_util.import_graph_def(
          work_def,
          input_map=inputs,
          return_elements=[
            leaf.tensor.tensor_name
            for leaf in leaves(work_proto.result)[:update_leaves]
          ],
          name='work',
        )
        operands = list(running) + list(update)
        total = tf.graph_util.import_graph_def(
          sum_def,
          input_map={
            leaf.tensor.tensor_name: value
            for leaf, value in zip(sum_leaves, operands)
          },
          return_elements=[
            leaf.tensor.tensor_name for leaf in leaves(sum_proto.result)
          ],
          name='accumulate',
        )
        return [i + 1] + list(total)

      count = tf.shape(stacked[0])[0] if stacked else tf.constant(0)
      # One client at a time: each client's variables are the same ones.
      results = tf.while_loop(
        lambda i, *_: i < count,
        one_client,
        [tf.constant(0)] + sums,
        parallel_iterations=1,
      )[1:]
    self._open(stacked + shared + sums, list(results))


def _placeholder(type_spec, stacked: bool = False):
  """A feed for a leaf of `type_spec` (a data set: its serialized graph),
  with a leading dimension over clients when `stacked`."""
  from tensorflow_federated.python.core.impl.types import computation_types

  if isinstance(type_spec, computation_types.SequenceType):
    dtype, shape = tf.string, []
  else:
    dtype, shape = type_spec.dtype, list(type_spec.shape)
  return tf.compat.v1.placeholder(dtype, [None] + shape if stacked else shape)


def _client_inputs(client_leaves, stacked, i) -> dict:
  """The `i`th client's parameter leaves, from their stacks: a data set is
  made from its serialized graph on the host."""
  inputs = {}
  for leaf, values in zip(client_leaves, stacked):
    value = tf.gather(values, i)
    if leaf.WhichOneof('binding') == 'tensor':
      inputs[leaf.tensor.tensor_name] = value
    elif leaf.sequence.WhichOneof('binding') == 'graph_def_tensor_name':
      inputs[leaf.sequence.graph_def_tensor_name] = value
    else:
      with tf.device(devices.HOST):
        inputs[leaf.sequence.variant_tensor_name] = tf.raw_ops.DatasetFromGraph(
          graph_def=value
        )
  return inputs


def stack(clients: list) -> list:
  """Clients' flat leaves (`flatten`, one list a client) as the stacks
  `ClientLoopGraph` takes: one array a leaf, over the clients."""
  return [
    np.array(column, dtype=object)
    if isinstance(column[0], bytes)
    else np.stack(column)
    for column in zip(*clients)
  ]
