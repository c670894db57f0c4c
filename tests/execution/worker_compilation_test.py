"""Tests for tff_methods.execution.worker_compilation: what a TFF worker is
given, and what it is refused before it runs."""

import sys

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_methods.execution import worker_compilation


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


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
