"""TFF's TensorFlow computations as sessions on a device, and the values
they take and give (`tff_methods.execution.in_process` runs its rounds on
these).

A `SessionGraph` imports one computation's graph (or a chain of them) into
a `tf.compat.v1.Session` on a device, placing what belongs on the host
there, and runs it on flat lists of numpy values: `flatten` turns a TFF
value of a type into them, `unflatten` turns results back into a
`tff.structure.Struct`.
"""

import collections
import re
import threading
from typing import Any

import numpy as np
import tensorflow as tf

from tff_methods.execution import devices

_TRACE_LOCK = threading.Lock()


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
      from tensorflow_federated.python.core.environments.tensorflow_backend import (  # noqa: E501
        tensorflow_utils,
      )

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


class SessionGraph:
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

  def _placed_graph_def(self, tf_proto, device: str):
    """The computation's graph, each node without a device placed on
    `device` or, if it belongs there, on the host; its op types noted."""
    graph_def = tf.compat.v1.GraphDef()
    tf_proto.graph_def.Unpack(graph_def)
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
    return outputs

  def close(self):
    self._session.close()
