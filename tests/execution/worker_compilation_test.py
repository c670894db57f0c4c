"""Tests for tff_methods.execution.worker_compilation: what a TFF worker is
given, and what it is refused before it runs."""

import re
import sys

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_methods.algorithms import fedavg
from tff_methods.execution import worker_compilation
from tff_methods.templates import optimizers
from tff_methods_tasks import datasets


def _federated(with_numpy_function: bool):
  @tff.tensorflow.computation(np.float32)
  def double(x):
    if with_numpy_function:
      return tf.reshape(tf.numpy_function(lambda v: v * 2, [x], tf.float32), [])
    return x * 2

  @tff.federated_computation(tff.FederatedType(np.float32, tff.CLIENTS))
  def doubled_sum(values):
    return tff.federated_sum(tff.federated_map(double, values))

  return doubled_sum


def test_a_computation_calling_back_into_python_is_refused_naming_it():
  calling_back = _federated(with_numpy_function=True)
  assert worker_compilation.python_function_ops(calling_back) == {'PyFunc'}
  with pytest.raises(
    ValueError,
    match=r'\{float32\}@CLIENTS -> float32@SERVER\) calls back into this '
    r'Python process \(PyFunc '
    r'ops\), which a TFF worker cannot run',
  ):
    worker_compilation.compile_for_simulation(calling_back)
  plain = worker_compilation.compile_for_simulation(
    _federated(with_numpy_function=False)
  )
  assert not worker_compilation.python_function_ops(plain)


def test_every_tensorflow_computation_inside_is_found():
  from tensorflow_federated.python.core.impl.computation import computation_impl

  proto = computation_impl.ConcreteComputation.get_proto(
    _federated(with_numpy_function=False)
  )
  # The mapped function, the one TensorFlow computation beside the sum.
  [found] = worker_compilation.tensorflow_computations(proto)
  graph_def = tf.compat.v1.GraphDef()
  found.tensorflow.graph_def.Unpack(graph_def)
  assert 'Mul' in {node.op for node in graph_def.node}


def _tffs_compilation(computation):
  """What TFF's own steps make of `computation` (the test context's secure
  replacement, then the native backend's compilation)."""
  from tensorflow_federated.python.core.backends.native import compiler
  from tensorflow_federated.python.core.backends.test import (
    compiler as test_compiler,
  )

  return compiler.desugar_and_transform_to_native(
    test_compiler.replace_secure_intrinsics_with_bodies(computation)
  )


def _proto(computation):
  from tensorflow_federated.python.core.impl.computation import computation_impl

  return computation_impl.ConcreteComputation.get_proto(computation)


def _comparable(computation):
  """The compiled proto as text, each graph parsed, and the names TFF
  generates for references (a random prefix a call, then a counter)
  without their prefix."""
  proto = _proto(computation)
  proto = type(proto).FromString(proto.SerializeToString())
  graphs = []
  for part in worker_compilation.tensorflow_computations(proto):
    graph_def = tf.compat.v1.GraphDef()
    part.tensorflow.graph_def.Unpack(graph_def)
    graphs.append((part.tensorflow.cache_key.id, str(graph_def)))
    part.tensorflow.ClearField('graph_def')
  return re.sub(r'"_[a-z]{3}(\d+)"', r'"_\1"', str(proto)), graphs


def test_a_training_round_compiles_to_what_tffs_own_steps_make(digits_task):
  # A round of FedAvg: a data set's loop, Grappler's rewrites, weighted
  # means. Compiled from one reading of its proto instead of three.
  batches = datasets.LocalBatches(batch_size=32, local_epochs=1, seed=0)
  client_data = digits_task.client_data.preprocess(batches)
  process = fedavg.build_fedavg(
    lambda: tf.keras.Sequential(
      [
        tf.keras.Input((8, 8, 1)),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(10, name='logits'),
      ]
    ),
    client_data.element_type_structure,
    client_optimizer_fn=optimizers.build_client_sgd(0.1),
  )
  ours = worker_compilation.compile_for_simulation(process.next)
  tffs = _tffs_compilation(process.next)
  assert _comparable(ours) == _comparable(tffs)


@pytest.mark.usefixtures('tff_worker')
def test_secure_sums_compile_in_the_clear_as_tffs_test_context_does():
  # (TFF's own steps give this computation a different graph on every
  # compilation, so it is compared by what it computes.)
  @tff.federated_computation(tff.FederatedType(np.int32, tff.CLIENTS))
  def secure_total(values):
    return tff.federated_secure_sum_bitwidth(values, 8)

  compiled = worker_compilation.compile_for_simulation(secure_total)
  assert 'federated_secure' not in str(_proto(compiled))
  assert secure_total([3, 4, 100]) == 107
  # Before a MapReduceForm (in-process): replaced where there are any.
  in_the_clear = worker_compilation.secure_sums_in_the_clear(secure_total)
  assert 'federated_secure' not in str(_proto(in_the_clear))
  plain = _federated(with_numpy_function=False)
  assert worker_compilation.secure_sums_in_the_clear(plain) is plain


def test_the_secure_prefix_names_every_intrinsic_tffs_test_compiler_replaces():
  from tensorflow_federated.python.core.backends.test import (
    compiler as test_compiler,
  )

  uris = list(test_compiler._get_secure_intrinsic_reductions())
  assert len(uris) == 4
  assert all(
    uri.startswith(worker_compilation.SECURE_INTRINSIC_PREFIX) for uri in uris
  )


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
