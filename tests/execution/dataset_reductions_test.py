"""A data set's reduction as a loop calling its function
(`tff_methods.execution.dataset_reductions`), run in sessions by the
in-process context."""

import sys

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_methods.execution import dataset_reductions
from tff_methods.execution import in_process
from tff_methods.execution import session_graphs


@tff.tensorflow.computation(tff.SequenceType(np.float32))
def _digits_and_product(ds):
  # In order: 1, 2, 3 give 123 (any other order another number).
  return ds.reduce(
    (np.float32(0), np.float32(1)), lambda s, x: (s[0] * 10 + x, s[1] * x)
  )


@tff.tensorflow.computation(tff.SequenceType((np.float32, np.float32)))
def _in_a_function_with_a_variable(ds):
  weight = tf.Variable(3.0)

  @tf.function
  def reduce(ds):
    return ds.reduce(
      np.float32(0), lambda s, xy: s * 10 + xy[0] * xy[1] * weight
    )

  return reduce(ds)


@tff.federated_computation(
  tff.FederatedType(np.float32, tff.SERVER),
  tff.FederatedType(tff.SequenceType((np.float32, np.float32)), tff.CLIENTS),
)
def _round(state, data):
  return state, tff.federated_sum(
    tff.federated_map(_in_a_function_with_a_variable, data)
  )


def _graph_def(computation):
  graph_def = tf.compat.v1.GraphDef()
  session_graphs._tensorflow_proto(computation).graph_def.Unpack(graph_def)  # pylint: disable=protected-access
  return graph_def


def _ops(graph_def):
  return [n.op for n in graph_def.node] + [
    n.op for f in graph_def.library.function for n in f.node_def
  ]


@pytest.mark.parametrize(
  'computation', [_digits_and_product, _in_a_function_with_a_variable]
)
def test_each_reduction_becomes_a_call_of_a_loop(computation):
  before = _graph_def(computation)
  assert 'ReduceDataset' in _ops(before)
  after = dataset_reductions.as_loops(before)
  assert 'ReduceDataset' not in _ops(after)
  assert {'IteratorGetNextAsOptional', 'StatefulPartitionedCall'} <= set(
    _ops(after)
  )
  # The original is left as it was.
  assert 'ReduceDataset' in _ops(before)


def test_a_reduction_the_loop_cant_take_stays_as_it_is(monkeypatch):
  # A polymorphic reduce function: an argument of a type attribute.
  graph_def = _graph_def(_digits_and_product)
  (reduction,) = [n for n in graph_def.node if n.op == 'ReduceDataset']
  (reduce_fn,) = [
    f
    for f in graph_def.library.function
    if f.signature.name == reduction.attr['f'].func.name
  ]
  reduce_fn.signature.input_arg[0].type = 0
  reduce_fn.signature.input_arg[0].type_attr = 'T'
  assert 'ReduceDataset' in _ops(dataset_reductions.as_loops(graph_def))
  # A loop whose function names the graph has already.
  graph_def = _graph_def(_digits_and_product)
  taken = graph_def.library.function[0]
  monkeypatch.setattr(dataset_reductions, '_loop_functions', lambda *_: [taken])
  after = dataset_reductions.as_loops(graph_def)
  assert 'ReduceDataset' in _ops(after)
  assert len(after.library.function) == len(graph_def.library.function)


def test_a_graph_without_reductions_is_returned_as_it_is():
  graph_def = _graph_def(tff.tensorflow.computation(lambda: np.float32(1.0)))
  assert dataset_reductions.as_loops(graph_def) is graph_def


def test_the_loops_reduce_in_order_to_what_the_reductions_give():
  pairs = lambda values: tf.data.Dataset.from_tensor_slices(
    (np.float32(values), np.float32([2.0] * len(values)))
  )
  context = in_process.InProcessExecutionContext(['cpu:0'], fallback_fn=None)
  with tff.framework.get_context_stack().install(context):
    assert tuple(_digits_and_product([1.0, 2.0, 3.0])) == (123.0, 6.0)
    # (1 x 2 x 3) then (2 x 2 x 3): 6 x 10 + 12; nothing: the state as given.
    assert _in_a_function_with_a_variable(pairs([1.0, 2.0])) == 72.0
    assert _in_a_function_with_a_variable(pairs([])) == 0.0
    # In a device's loop over clients: 72 + 18 + 0.
    _, total = _round(0.0, [pairs([1.0, 2.0]), pairs([3.0]), pairs([])])
  assert total == 90.0
  assert context.on_fallback == []


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
