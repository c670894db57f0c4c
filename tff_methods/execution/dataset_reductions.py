"""A data set's reduction as a loop that calls its function, for sessions.

TensorFlow's `ReduceDataset` kernel (`tf.data.Dataset.reduce`, the loop of
TFF's own client updates) instantiates its reduce function anew each time
it runs: graph passes and Grappler over the whole training step, for
every client (TensorFlow's `reduce_dataset_op.cc` gives each run a
function handle cache of its own). A 20-example client of TFF's FedAvg
spent 99% of its time in that op in this process, most of it optimizing
the function again. `as_loops` rewrites each `ReduceDataset` of a graph
into a call of a function that iterates over the data set and calls the
same reduce function on each element, in order (`IteratorGetNextAsOptional`
in a loop): the session's call op instantiates that function once, for
every client after it. The state after the last element is the result, as
the reduction's.
"""

import itertools

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2
from tensorflow.core.framework import node_def_pb2
from tensorflow.python.ops import gen_dataset_ops
from tensorflow.python.ops import gen_functional_ops
from tensorflow.python.ops import gen_optional_ops

_REDUCE = 'ReduceDataset'


def as_loops(graph_def: tf.compat.v1.GraphDef) -> tf.compat.v1.GraphDef:
  """`graph_def` with each `ReduceDataset` node, in the graph or in its
  functions, replaced by a call of a loop over the data set
  (`_loop_functions`); `graph_def` itself when it has none. A reduction
  whose function's arguments are not all of fixed types (a polymorphic
  function), or whose loop's function names the graph has already, stays
  as it is."""
  functions = {f.signature.name: f for f in graph_def.library.function}
  if not any(
    node.op == _REDUCE
    for node in itertools.chain(
      graph_def.node, *(f.node_def for f in functions.values())
    )
  ):
    return graph_def
  graph_def = tf.compat.v1.GraphDef.FromString(graph_def.SerializeToString())
  loops = {}  # (reduce function, state shapes, arguments) -> loop

  def loop_for(node):
    reduce_fn = node.attr['f'].func.name
    state_shapes = [
      tf.TensorShape(shape) for shape in node.attr['output_shapes'].list.shape
    ]
    key = (reduce_fn, str(state_shapes), len(node.attr['Targuments'].list.type))
    if key not in loops:
      reduce_def = functions[reduce_fn]
      if any(not arg.type for arg in reduce_def.signature.input_arg):
        loops[key] = None
      else:
        loop_defs = _loop_functions(reduce_def, state_shapes, key[2])
        names = {f.signature.name for f in graph_def.library.function}
        # (Names new in this process; a graph made elsewhere may have them.)
        if names & {f.signature.name for f in loop_defs}:
          loops[key] = None
        else:
          graph_def.library.function.extend(loop_defs)
          loops[key] = loop_defs[0].signature.name
    return loops[key]

  def replace(nodes) -> list[str]:
    """Replaces each reduction of `nodes` that has a loop; their names."""
    replaced = []
    for node in nodes:
      loop = loop_for(node) if node.op == _REDUCE else None
      if loop:
        node.CopyFrom(_call(node, loop))
        replaced.append(node.name)
    return replaced

  # A graph's nodes name their inputs `node:index` whatever the op.
  replace(graph_def.node)
  for function in list(graph_def.library.function):
    reduced = replace(function.node_def)
    if not reduced:
      continue
    # A function's nodes name an output by the op's output argument.
    renamed = {f'{name}:components:': f'{name}:output:' for name in reduced}
    for node in function.node_def:
      node.input[:] = [_renamed(i, renamed) for i in node.input]
    for key, value in list(function.ret.items()):
      function.ret[key] = _renamed(value, renamed)
  return graph_def


def _renamed(reference: str, renamed: dict) -> str:
  for old, new in renamed.items():
    if reference.startswith(old):
      return new + reference[len(old) :]
  return reference


def _call(node, loop_name: str) -> node_def_pb2.NodeDef:
  """A `StatefulPartitionedCall` of `loop_name` in place of the
  `ReduceDataset` `node`: the same name, inputs and results."""
  call = node_def_pb2.NodeDef(
    name=node.name, op='StatefulPartitionedCall', device=node.device
  )
  call.input.extend(node.input)
  state = list(node.attr['Tstate'].list.type)
  call.attr['Tin'].list.type.extend(
    [tf.variant.as_datatype_enum]
    + state
    + list(node.attr['Targuments'].list.type)
  )
  call.attr['Tout'].list.type.extend(state)
  call.attr['f'].func.name = loop_name
  for name in ('config', 'config_proto', 'executor_type'):
    call.attr[name].s = b''
  return call


def _loop_functions(reduce_def, state_shapes: list, num_arguments: int) -> list:
  """The FunctionDefs of `(data set, *state, *arguments) -> state`: the
  reduction by `reduce_def` (`(*state, *element, *arguments) -> state`),
  element after element, the state of `state_shapes` throughout; the loop
  first."""
  num_state = len(state_shapes)
  types = [tf.as_dtype(arg.type) for arg in reduce_def.signature.input_arg]
  state_types = types[:num_state]
  element_types = types[num_state : len(types) - num_arguments]
  unknown = [tf.TensorShape(None)] * len(element_types)
  reduce_fn = attr_value_pb2.NameAttrList(name=reduce_def.signature.name)

  def loop(dataset, *state_and_arguments):
    state = list(state_and_arguments[:num_state])
    arguments = list(state_and_arguments[num_state:])
    iterator = gen_dataset_ops.anonymous_iterator_v3(element_types, unknown)
    made = gen_dataset_ops.make_iterator(dataset, iterator)
    with tf.control_dependencies([made]):
      first = gen_dataset_ops.iterator_get_next_as_optional(
        iterator, element_types, unknown
      )

    def step(optional, *state):
      element = gen_optional_ops.optional_get_value(
        optional, element_types, unknown
      )
      state = gen_functional_ops.stateful_partitioned_call(
        list(state) + list(element) + arguments, state_types, reduce_fn
      )
      # As the reduction's kernel checks its results' shapes.
      state = [
        tf.ensure_shape(value, shape)
        for value, shape in zip(state, state_shapes)
      ]
      return [
        gen_dataset_ops.iterator_get_next_as_optional(
          iterator, element_types, unknown
        )
      ] + list(state)

    results = tf.while_loop(
      lambda optional, *_: gen_optional_ops.optional_has_value(optional),
      step,
      [first] + state,
      shape_invariants=[tf.TensorShape([])] + state_shapes,
    )
    return results[1:]

  argument_types = types[len(types) - num_arguments :]
  signature = (
    [tf.TensorSpec([], tf.variant)]
    + [tf.TensorSpec(s, t) for s, t in zip(state_shapes, state_types)]
    + [tf.TensorSpec(None, t) for t in argument_types]
  )
  with tf.Graph().as_default():
    concrete = tf.function(loop, autograph=False).get_concrete_function(
      *signature
    )
    library = concrete.graph.as_graph_def().library.function
  return [concrete.function_def] + list(library)
