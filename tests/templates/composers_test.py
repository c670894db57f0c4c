"""Tests for tff_methods.templates.composers: the composer equals TFF's on TFF's
own pieces, and a process that makes its clients' batches refuses data sets."""

import collections
import sys

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.python.learning.templates import (
  model_delta_client_work,
)

from tff_methods.templates import composers

pytestmark = pytest.mark.usefixtures('tff_worker')


def _model_fn():
  keras_model = tf.keras.Sequential(
    [
      tf.keras.layers.InputLayer(input_shape=(3,)),
      tf.keras.layers.Dense(
        2, kernel_initializer=tf.keras.initializers.GlorotUniform(seed=1)
      ),
    ]
  )
  return tff.learning.models.from_keras_model(
    keras_model,
    loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    input_spec=collections.OrderedDict(
      x=tf.TensorSpec([None, 3], tf.float32),
      y=tf.TensorSpec([None], tf.int32),
    ),
  )


def _tff_pieces():
  """TFF's FedAvg pieces: broadcast, model-delta client work, mean,
  SGD finalizer, and the initial weights."""
  weights_type = tff.learning.models.weights_type_from_model(_model_fn)

  @tff.tensorflow.computation
  def initial_weights():
    return tff.learning.models.ModelWeights.from_model(_model_fn())

  return (
    initial_weights,
    tff.learning.templates.build_broadcast_process(weights_type),
    model_delta_client_work.build_model_delta_client_work(
      _model_fn,
      tff.learning.optimizers.build_sgdm(0.1),
      tff.learning.ClientWeighting.NUM_EXAMPLES,
    ),
    tff.aggregators.MeanFactory().create(
      weights_type.trainable, tff.TensorType(np.float32)
    ),
    tff.learning.templates.build_apply_optimizer_finalizer(
      tff.learning.optimizers.build_sgdm(1.0), weights_type
    ),
  )


def _client_data(seed, n):
  rng = np.random.default_rng(seed)
  return tf.data.Dataset.from_tensor_slices(
    collections.OrderedDict(
      x=rng.normal(size=(n, 3)).astype(np.float32),
      y=rng.integers(0, 2, n).astype(np.int32),
    )
  ).batch(2)


def test_on_tffs_pieces_a_round_equals_tffs_composer():
  ours = composers.compose(*_tff_pieces())
  theirs = tff.learning.templates.compose_learning_process(*_tff_pieces())
  # The same types, so a user's code that takes one takes the other.
  assert ours.next.type_signature.is_equivalent_to(theirs.next.type_signature)
  assert isinstance(ours, tff.learning.templates.LearningProcess)
  clients = [_client_data(0, 5), _client_data(1, 3)]
  states = [ours.initialize(), theirs.initialize()]
  for _ in range(2):
    states = [
      process.next(state, clients).state
      for process, state in zip((ours, theirs), states)
    ]
  weights = [
    process.get_model_weights(state).trainable
    for process, state in zip((ours, theirs), states)
  ]
  initial = ours.get_model_weights(ours.initialize()).trainable
  for mine, tffs, start in zip(*weights, initial):
    np.testing.assert_allclose(mine, tffs, rtol=1e-6)
    assert not np.allclose(mine, start)  # The rounds trained.
  assert ours.get_hparams(states[0]) == theirs.get_hparams(states[1])


def test_a_process_that_makes_its_clients_batches_refuses_data_sets():
  composers.refuse_data_sets(['client_0', 'client_1'])  # Keys: fine.
  with pytest.raises(TypeError, match='built with a dataset_computation'):
    composers.refuse_data_sets([_client_data(0, 2)])
  calls = []
  checked = composers.CheckedNext(
    lambda state, clients: calls.append(clients) or state,
    composers.refuse_data_sets,
  )
  assert checked('state', ['a']) == 'state'
  with pytest.raises(TypeError):
    checked('state', [_client_data(0, 2)])
  assert calls == [['a']]  # The refused round never ran.


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
