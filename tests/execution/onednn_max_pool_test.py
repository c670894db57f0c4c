"""Tests for tff_methods.execution.onednn_max_pool: MaxPool gradients on
oneDNN's kernel in every build."""

import platform
import sys

import numpy as np
import pytest
import tensorflow as tf

from tff_methods.algorithms import hyperparameters
from tff_methods.execution import onednn_max_pool
from tff_methods_tooling import benchmark_processes
from tff_methods_tooling import client_profile

needs_onednn = pytest.mark.skipif(
  not onednn_max_pool.applies(),
  reason='this TensorFlow has no oneDNN MaxPool kernels, or they are off',
)


def _pools_and_gradients():
  """A graph with a float32 pool and its gradient, a pool without a
  gradient, and a float64 pool with one."""

  @tf.function
  def pools(x):
    with tf.GradientTape(persistent=True) as tape:
      tape.watch(x)
      pooled = tf.nn.max_pool2d(tf.nn.relu(x), 2, 2, 'SAME')
      loss = tf.reduce_sum(pooled * tf.range(1.0, 7.0))
      x64 = tf.cast(x, tf.float64)
      tape.watch(x64)
      loss64 = tf.reduce_sum(tf.nn.max_pool2d(x64, 2, 2, 'VALID'))
    unwatched = tf.nn.max_pool2d(tf.stop_gradient(x), 3, 1, 'VALID')
    return (
      tape.gradient(loss, x),
      tape.gradient(loss64, x64),
      unwatched,
      pooled,
    )

  graph = pools.get_concrete_function(
    tf.TensorSpec([2, 5, 6, 6], tf.float32)
  ).graph
  return (
    graph.as_graph_def(),
    [graph.inputs[0].name],
    [t.name for t in graph.outputs],
  )


def _run(graph_def, inputs, outputs, value):
  graph = tf.Graph()
  with graph.as_default():
    tf.compat.v1.import_graph_def(graph_def, name='')
  with tf.compat.v1.Session(
    graph=graph, config=client_profile.worker_session_config()
  ) as session:
    return session.run(outputs, {inputs[0]: value})


@needs_onednn
def test_pairs_a_float32_pool_with_its_gradient_and_keeps_every_bit():
  graph_def, inputs, outputs = _pools_and_gradients()
  original = tf.compat.v1.GraphDef()
  original.CopyFrom(graph_def)
  assert onednn_max_pool.pair_max_pool_gradients(graph_def) == 1
  ops = {n.name: n for n in graph_def.node}
  forward = [n for n in graph_def.node if n.op == '_MklNativeMaxPool']
  gradient = [n for n in graph_def.node if n.op == '_MklNativeMaxPoolGrad']
  assert len(forward) == 1 and len(gradient) == 1
  # (orig_input, orig_output, grad, and now the forward's workspace.)
  data_inputs = [i for i in gradient[0].input if not i.startswith('^')]
  assert len(data_inputs) == 4
  assert data_inputs[1] == forward[0].name
  assert data_inputs[3] == f'{forward[0].name}:1'
  # The pool without a gradient and the float64 pair are left alone.
  assert sorted(n.op for n in ops.values() if n.op.startswith('MaxPool')) == [
    'MaxPool',
    'MaxPool',
    'MaxPoolGrad',
  ]
  # Ties (zeros after the ReLU, repeated values): both kernels send a
  # window's gradient to its first largest input.
  rng = np.random.default_rng(0)
  value = np.round(rng.standard_normal([2, 5, 6, 6]), 1).astype(np.float32)
  for before, after in zip(
    _run(original, inputs, outputs, value),
    _run(graph_def, inputs, outputs, value),
  ):
    np.testing.assert_array_equal(before, after)


def test_leaves_a_graph_without_max_pool_gradients_alone():
  @tf.function
  def no_gradient(x):
    return tf.nn.max_pool2d(x, 2, 2, 'SAME')

  graph_def = no_gradient.get_concrete_function(
    tf.TensorSpec([1, 4, 4, 1])
  ).graph.as_graph_def()
  before = graph_def.SerializeToString()
  assert onednn_max_pool.pair_max_pool_gradients(graph_def) == 0
  assert graph_def.SerializeToString() == before
  # The cheap test before parsing a graph: this one can be passed over, a
  # graph with a gradient can't.
  assert not onednn_max_pool.may_have_max_pool_gradients(before)
  with_gradient, _, _ = _pools_and_gradients()
  assert onednn_max_pool.may_have_max_pool_gradients(
    with_gradient.SerializeToString()
  )


@needs_onednn
def test_the_local_workers_client_graph_has_only_onednn_max_pool_gradients(
  tiny_cifar,
):
  process, _ = benchmark_processes.benchmark_process(
    'fedcka',
    'fedcka_cnn',
    tiny_cifar,
    hyperparameters.Hyperparameters(),
    2,
    4,
    0,
  )
  graph_def = client_profile.client_graph(process).graph_def
  ops = [n.op for n in graph_def.node]
  # FedCKA's CNN has two pools; the training loop takes each one's gradient.
  assert ops.count('_MklNativeMaxPoolGrad') == 2
  assert 'MaxPoolGrad' not in ops


def test_applies_only_to_the_packaged_worker_with_onednn_on(monkeypatch):
  monkeypatch.setenv('TF_ENABLE_ONEDNN_OPTS', '0')
  assert not onednn_max_pool.applies()
  monkeypatch.setenv('TF_ENABLE_ONEDNN_OPTS', 'False')
  assert not onednn_max_pool.applies()
  monkeypatch.setenv('TF_ENABLE_ONEDNN_OPTS', '1')
  assert not onednn_max_pool.applies(worker_binary='/opt/cuda/worker_binary')
  if platform.machine() == 'x86_64':
    assert onednn_max_pool.applies()


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
