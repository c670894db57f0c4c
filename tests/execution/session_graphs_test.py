"""TFF's TensorFlow computations as sessions
(`tff_methods.execution.session_graphs`)."""

import collections
import sys

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_methods.execution import session_graphs

_PAIR = collections.OrderedDict(a=np.float32, b=(np.int32, np.int32))


def test_values_flatten_in_type_order_and_come_back_as_structs():
  type_spec = tff.types.to_type(_PAIR)
  value = collections.OrderedDict(a=1.5, b=(2, 3))
  leaves = session_graphs.flatten(value, type_spec)
  assert [x.dtype for x in leaves] == [np.float32, np.int32, np.int32]
  assert [float(x) for x in leaves] == [1.5, 2, 3]
  back = session_graphs.unflatten(leaves, type_spec)
  assert back.a == 1.5 and tuple(back.b) == (2, 3)
  assert len(session_graphs.leaves_of_type(type_spec)) == 3


def test_a_chained_graph_feeds_the_first_results_to_the_second():
  @tff.tensorflow.computation(np.float32, np.float32)
  def scale(x, y):
    return x * 2.0, y + 1.0

  @tff.tensorflow.computation(np.float32, np.float32, np.float32)
  def combine(total, u, v):
    return total + u * v

  # combine's u and v are scale's results; its total is fed.
  graph = session_graphs.SessionGraph(
    [(scale, {}), (combine, {1: 0, 2: 1})], '/device:CPU:0'
  )
  assert graph.run([np.float32(3.0), np.float32(4.0), np.float32(10.0)]) == [
    10.0 + 6.0 * 5.0
  ]
  # Traced, its nodes ran on its device.
  graph.run([np.float32(1.0), np.float32(1.0), np.float32(0.0)], trace=True)
  assert set(graph.traced) == {'/device:CPU:0'}
  assert not graph.elsewhere
  graph.close()


def test_a_data_set_reaches_its_graph_serialized():
  @tff.tensorflow.computation(tff.SequenceType(np.int32))
  def total(ds):
    return ds.reduce(np.int32(0), lambda s, x: s + x)

  graph = session_graphs.SessionGraph([(total, {})], '/device:CPU:0')
  leaves = session_graphs.flatten(
    tf.data.Dataset.range(5).map(lambda x: tf.cast(x, tf.int32)),
    total.type_signature.parameter,
  )
  assert graph.run(leaves) == [10]
  graph.close()


def _fresh_variable_work():
  """A client that counts in a variable of its own: its result is its
  value times the shared weight, only if the variable starts at zero."""

  @tff.tensorflow.computation(np.float32, np.float32)
  def work(value, weight):
    counter = tf.Variable(0.0)
    with tf.control_dependencies([counter.assign_add(value * weight)]):
      return counter.read_value()

  @tff.tensorflow.computation(np.float32, np.float32)
  def accumulate(total, update):
    return total + update

  return work, accumulate


def test_a_loop_trains_each_client_from_fresh_variables_and_sums_them():
  work, accumulate = _fresh_variable_work()
  loop = session_graphs.ClientLoopGraph(work, accumulate, 1, '/device:CPU:0')
  clients = [[np.float32(v)] for v in (1.0, 2.0, 3.0)]
  # Fresh variables: 2 + 4 + 6 on top of 10. A variable that kept its
  # value between clients would give 2 + 6 + 12.
  total = loop.run(
    session_graphs.stack(clients) + [np.float32(2.0), np.float32(10.0)]
  )
  assert total == [22.0]
  # Traced, the loop ran on its device (its control flow beside the host's
  # ops excepted).
  loop.run(session_graphs.stack(clients[:1]) + [np.float32(1.0)] * 2, True)
  assert '/device:CPU:0' in loop.traced
  assert not loop.elsewhere
  loop.close()


def test_a_loop_reads_each_clients_data_set_from_its_serialized_graph():
  @tff.tensorflow.computation(tff.SequenceType(np.int32), np.int32)
  def work(ds, offset):
    return ds.reduce(np.int32(0), lambda s, x: s + x) + offset

  @tff.tensorflow.computation(np.int32, np.int32)
  def accumulate(total, update):
    return total + update

  loop = session_graphs.ClientLoopGraph(work, accumulate, 1, '/device:CPU:0')
  clients = [
    session_graphs.flatten(
      tf.data.Dataset.range(n).map(lambda x: tf.cast(x, tf.int32)),
      work.type_signature.parameter[0],
    )
    for n in (3, 5)
  ]
  # (0+1+2 + 100) + (0+1+2+3+4 + 100)
  assert loop.run(session_graphs.stack(clients) + [np.int32(100), 0]) == [213]
  loop.close()


def test_op_time_counts_a_functions_ops_and_not_the_call_around_them():
  from tensorflow.core.framework import step_stats_pb2

  def node(label, micros):
    return step_stats_pb2.NodeExecStats(
      timeline_label=label, op_end_rel_micros=micros
    )

  stats = step_stats_pb2.StepStats(
    dev_stats=[
      step_stats_pb2.DeviceStepStats(
        device='/job:localhost/replica:0/task:0/device:CPU:0',
        node_stats=[
          # A call that was not inlined spans its function's two ops.
          node('call = StatefulPartitionedCall(x)', 50),
          node('call/conv = Conv2D(x, w)', 30),
          node('call/add = AddV2(conv, b)', 15),
          node('loop = While(i)', 40),
          node('loop/mul = Mul(a, b)', 35),
          node('other = AddV2(y, z)', 5),
        ],
      )
    ]
  )
  assert session_graphs.op_micros(stats) == {
    'Conv2D': 30,
    'AddV2': 20,
    'Mul': 35,
  }


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
