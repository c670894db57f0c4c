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

  With `pair_max_pool_gradients`, every MaxPool gradient of its TensorFlow
  graphs gets oneDNN's kernel (`onednn_max_pool`), as the local worker's
  context asks when `onednn_max_pool.applies()`.
  """
  from tensorflow_federated.python.core.backends.native import compiler
  from tensorflow_federated.python.core.backends.test import (
    compiler as test_compiler,
  )

  compiled = compiler.desugar_and_transform_to_native(
    test_compiler.replace_secure_intrinsics_with_bodies(computation)
  )
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
