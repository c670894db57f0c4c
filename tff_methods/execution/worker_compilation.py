"""How a computation is compiled for a TFF worker: TFF's native
compilation with secure sums in the clear, oneDNN's max-pool pairing where
the worker needs it, and a clear refusal of what a worker can't run
(`runtime`'s contexts compile with `compile_for_simulation`).
"""


def compile_for_simulation(computation, *, pair_max_pool_gradients=False):
  """TFF's native compilation, after replacing secure aggregation's
  intrinsics (`federated_secure_sum_bitwidth`, ...) by their plain bodies.

  What TFF's test context does: in a simulation every party is this
  program, so the secure sum is computed in the clear, with the secure
  aggregator's quantization and bounds (`tff.learning.secure_aggregator()`
  then runs under this runtime's contexts, as under TFF's test context).

  The result is the computation TFF's
  `compiler.desugar_and_transform_to_native` makes of it
  (`_native_form`), about a quarter faster: without secure intrinsics the
  computation is read from its proto once, not three times.

  With `pair_max_pool_gradients`, every MaxPool gradient of its TensorFlow
  graphs gets oneDNN's kernel (`onednn_max_pool`), as the local worker's
  context asks when `onednn_max_pool.applies()`.
  """
  from tensorflow_federated.python.core.backends.native import compiler
  from tensorflow_federated.python.core.backends.test import (
    compiler as test_compiler,
  )

  tree = computation.to_building_block()
  if _calls_secure_intrinsics(tree):
    compiled = compiler.desugar_and_transform_to_native(
      test_compiler.replace_secure_intrinsics_with_bodies(computation)
    )
  else:
    compiled = _native_form(tree)
  found = python_function_ops(compiled)
  if found:
    raise ValueError(
      f'{computation.type_signature} calls back into this Python process '
      f'({", ".join(sorted(found))} ops), which a TFF worker cannot run. '
      "A process built with client_states_in_memory=True keeps its clients' "
      'states here: run it in-process (tff_methods.execution.in_process, '
      '--execution=in_process), or build it with '
      'client_states_in_memory=False.'
    )
  if pair_max_pool_gradients:
    compiled = _with_onednn_max_pool_gradients(compiled)
  return compiled


# The URIs of the intrinsics TFF's test compiler replaces by plain bodies
# (`replace_secure_intrinsics_with_bodies`): federated_secure_sum,
# federated_secure_sum_bitwidth, federated_secure_modular_sum,
# federated_secure_select.
SECURE_INTRINSIC_PREFIX = 'federated_secure_'


def secure_sums_in_the_clear(computation):
  """`computation` with its secure intrinsics replaced by their plain
  bodies (TFF's `replace_secure_intrinsics_with_bodies`), or itself when
  its proto names none: TFF's function writes every computation back to a
  proto, which costs a tenth to a quarter of a MapReduceForm compilation.
  """
  from tensorflow_federated.python.core.backends.test import (
    compiler as test_compiler,
  )
  from tensorflow_federated.python.core.impl.computation import computation_impl

  proto = computation_impl.ConcreteComputation.get_proto(computation)
  if SECURE_INTRINSIC_PREFIX.encode() not in proto.SerializeToString():
    return computation
  return test_compiler.replace_secure_intrinsics_with_bodies(computation)


def _calls_secure_intrinsics(tree) -> bool:
  from tensorflow_federated.python.core.impl.compiler import building_blocks
  from tensorflow_federated.python.core.impl.compiler import tree_analysis

  return tree_analysis.contains(
    tree,
    lambda node: isinstance(node, building_blocks.Intrinsic)
    and node.uri.startswith(SECURE_INTRINSIC_PREFIX),
  )


def _native_form(tree):
  """`compiler.desugar_and_transform_to_native` of the computation whose
  building block is `tree`, on the building block throughout.

  TFF's function writes the tree to a proto after replacing the
  intrinsics and reads it back in `transform_to_native_form`; the steps
  here are its steps, in its order, with its Grappler settings.
  """
  import tensorflow as tf
  from tensorflow_federated.python.core.environments.tensorflow_backend import (  # noqa: E501
    compiled_computation_transformations as compiled_transformations,
  )
  from tensorflow_federated.python.core.environments.tensorflow_backend import (  # noqa: E501
    tensorflow_tree_transformations,
  )
  from tensorflow_federated.python.core.impl.compiler import transformations
  from tensorflow_federated.python.core.impl.computation import computation_impl
  from tensorflow_federated.python.core.impl.context_stack import (
    context_stack_impl,
  )

  grappler_config = tf.compat.v1.ConfigProto()
  rewrite_options = grappler_config.graph_options.rewrite_options
  aggressive = rewrite_options.AGGRESSIVE
  rewrite_options.memory_optimization = aggressive
  rewrite_options.constant_folding = aggressive
  rewrite_options.arithmetic_optimization = aggressive
  rewrite_options.loop_optimization = aggressive
  rewrite_options.function_optimization = aggressive

  desugared, _ = tensorflow_tree_transformations.replace_intrinsics_with_bodies(
    tree
  )
  try:
    native = transformations.to_call_dominant(desugared)
    native, _ = compiled_transformations.optimize_tensorflow_graphs(
      native, grappler_config
    )
    native, _ = (
      compiled_transformations.transform_tf_call_ops_to_disable_grappler(native)
    )
    native, _ = compiled_transformations.transform_tf_add_ids(native)
  except ValueError:
    # As `transform_to_native_form`: the desugared computation, uncompiled.
    native = desugared
  return computation_impl.ConcreteComputation(
    computation_proto=native.proto,
    context_stack=context_stack_impl.context_stack,
  )


def tensorflow_computations(proto):
  """Every TensorFlow computation (a `computation_pb2.Computation`) inside
  a computation's proto, e.g. of `compile_for_simulation`'s result."""
  from tensorflow_federated.proto.v0 import computation_pb2

  def walk(message):
    if (
      isinstance(message, computation_pb2.Computation)
      and message.WhichOneof('computation') == 'tensorflow'
    ):
      yield message
      return
    for field, value in message.ListFields():
      if field.type != field.TYPE_MESSAGE:
        continue
      for item in value if field.label == field.LABEL_REPEATED else [value]:
        yield from walk(item)

  return walk(proto)


# The op types of `tf.numpy_function` and `tf.py_function`: they call back
# into the Python process that built them, which a worker is not
# (`states_in_memory` reads and writes client states with them).
PY_FUNCTION_OPS = frozenset({'PyFunc', 'PyFuncStateless', 'EagerPyFunc'})


def python_function_ops(computation) -> set[str]:
  """The `PY_FUNCTION_OPS` types in `computation`'s TensorFlow graphs."""
  import tensorflow as tf
  from tensorflow_federated.python.core.impl.computation import computation_impl

  found = set()
  proto = computation_impl.ConcreteComputation.get_proto(computation)
  for part in tensorflow_computations(proto):
    # Every such op type contains 'PyFunc'; a graph whose bytes don't need
    # not be parsed.
    if b'PyFunc' not in part.tensorflow.graph_def.value:
      continue
    graph_def = tf.compat.v1.GraphDef()
    part.tensorflow.graph_def.Unpack(graph_def)
    nodes = list(graph_def.node) + [
      node
      for function in graph_def.library.function
      for node in function.node_def
    ]
    found.update(n.op for n in nodes if n.op in PY_FUNCTION_OPS)
  return found


def _with_onednn_max_pool_gradients(computation):
  """`computation` (compiled) with `onednn_max_pool.pair_max_pool_gradients`
  applied to each of its TensorFlow graphs; itself when none changes."""
  import tensorflow as tf
  from tensorflow_federated.python.core.impl.computation import computation_impl
  from tensorflow_federated.python.core.impl.context_stack import (
    context_stack_impl,
  )

  from tff_methods.execution import onednn_max_pool

  proto = type(computation_impl.ConcreteComputation.get_proto(computation))()
  proto.CopyFrom(computation_impl.ConcreteComputation.get_proto(computation))
  changed = False
  for part in tensorflow_computations(proto):
    if not onednn_max_pool.may_have_max_pool_gradients(
      part.tensorflow.graph_def.value
    ):
      continue
    graph_def = tf.compat.v1.GraphDef()
    part.tensorflow.graph_def.Unpack(graph_def)
    if onednn_max_pool.pair_max_pool_gradients(graph_def):
      part.tensorflow.graph_def.Pack(graph_def)
      changed = True
  if not changed:
    return computation
  return computation_impl.ConcreteComputation(
    computation_proto=proto, context_stack=context_stack_impl.context_stack
  )
