"""Tests for tff_methods.clients.client_data: how a client gets its batches."""

import collections
import sys

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_methods.clients import batches_in_memory
from tff_methods.clients import client_data
from tff_methods.clients import client_keys


def test_batches_as_tuples_are_named_and_bad_specs_are_refused():
  batch = client_data.named_batch((1, 2))
  assert (batch['x'], batch['y']) == (1, 2)
  client_data.check_element_spec((None, None))
  with pytest.raises(ValueError, match=r"missing \['y'\]"):
    client_data.check_element_spec({'x': None, 'label': None})
  with pytest.raises(TypeError, match=r'OrderedDict\(x=..., y=...\)'):
    client_data.check_element_spec([None, None, None])


def _by_client_id():
  @tff.tensorflow.computation(np.str_)
  def dataset_for_client(client_id):
    size = tf.strings.length(client_id)
    return tf.data.Dataset.from_tensor_slices(
      collections.OrderedDict(
        x=tf.fill([size, 1], 1.0), y=tf.zeros([size], tf.int32)
      )
    ).batch(2)

  return dataset_for_client


@pytest.mark.usefixtures('tff_worker')
def test_a_client_id_computation_takes_keys_and_ignores_the_round():
  by_key = client_data.key_dataset_computation(_by_client_id())
  assert by_key.type_signature.parameter == client_keys.CLIENT_KEY_TYPE
  # 'abc' has 3 examples, in batches of 2, whatever the round.
  for round_num in (1, 7):
    sizes = [
      len(b['y']) for b in by_key(client_keys.client_key('abc', round_num))
    ]
    assert sizes == [2, 1]
  with pytest.raises(TypeError, match='needs dataset_computation'):
    client_data.key_dataset_computation(None)

  @tff.tensorflow.computation(np.int32)
  def by_number(n):
    return tf.data.Dataset.from_tensors(n)

  with pytest.raises(TypeError, match='this one takes int32'):
    client_data.key_dataset_computation(by_number)


def test_client_batches_are_slices_of_the_examples_a_computation_offers():
  data_type = _by_client_id().type_signature.result
  offering = _by_client_id()

  def round_examples(client_id):
    # 'abc' -> 3 examples in batches of 2 and 1, as the computation cuts them.
    size = tf.strings.length(client_id)
    examples = collections.OrderedDict(
      x=tf.reshape(tf.range(size, dtype=tf.float32), [-1, 1]),
      y=tf.zeros([size], tf.int32),
    )
    return examples, tf.constant([2, 1])

  setattr(offering, client_data.ROUND_EXAMPLES_FN, round_examples)
  # In a client computation's graph: slices of the examples, not a call of
  # the computation (the data set's path is every TFF ClientData's).
  batches = client_data.ClientBatches(offering, data_type)(tf.constant('abc'))
  assert isinstance(batches, batches_in_memory.SlicedBatches)
  assert [b['x'].numpy().ravel().tolist() for b in _batches_of(batches)] == [
    [0.0, 1.0],
    [2.0],
  ]
  # No dataset computation: the client data are the batches.
  assert client_data.ClientBatches(None, data_type)('batches') == 'batches'


def _batches_of(sliced):
  return [sliced.batch(i) for i in range(int(sliced.kept))]


def test_client_batches_refuse_data_of_another_type():
  data_type = tff.SequenceType(
    collections.OrderedDict(
      x=tff.TensorType(np.float32, [None, 2]),
      y=tff.TensorType(np.int32, [None]),
    )
  )
  with pytest.raises(TypeError, match='The dataset computation makes'):
    client_data.ClientBatches(_by_client_id(), data_type)


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
