"""Tests for tff_methods.templates.tff_models: TFF's model interfaces in every
builder.

A TFF user's `model_fn` returns `tff.learning.models.from_keras_model(...)`
(a `VariableModel`, here one ending in a softmax and trained on its
probabilities, as TFF's tutorials do) or a `FunctionalModel`; the methods
that read weights and logits train it with its own loss, to TFF's weights.
"""

import collections
import sys

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_methods.algorithms import fedavg
from tff_methods.algorithms import fedcos
from tff_methods.algorithms import fedprox
from tff_methods.algorithms import moon
from tff_methods.algorithms import scaffold
from tff_methods.clients import client_keys
from tff_methods.templates import aggregation
from tff_methods.templates import model_lib
from tff_methods.templates import optimizers
from tff_methods.templates import stateful
from tff_methods.templates import tff_models

pytestmark = pytest.mark.usefixtures('tff_worker')


def _keras_model():
  return tf.keras.Sequential(
    [
      tf.keras.Input((4,)),
      tf.keras.layers.Dense(8, activation='relu', name='hidden'),
      tf.keras.layers.Dense(3, activation='softmax', name='probabilities'),
    ]
  )


def _client_data():
  rng = np.random.default_rng(0)
  data = collections.OrderedDict()
  for i, size in enumerate((8, 16, 12)):
    data[f'client_{i}'] = collections.OrderedDict(
      x=rng.normal(size=(size, 4)).astype(np.float32),
      y=rng.integers(0, 3, size=(size, 1)).astype(np.int32),
    )
  return tff.simulation.datasets.TestClientData(data).preprocess(
    lambda ds: ds.batch(4)
  )


CLIENT_DATA = _client_data()
SPEC = CLIENT_DATA.element_type_structure
IDS = CLIENT_DATA.client_ids


def tff_model_fn():
  """As TFF's tutorials write it: softmax output, a loss on probabilities,
  labels shaped (B, 1)."""
  return tff.learning.models.from_keras_model(
    _keras_model(),
    loss=tf.keras.losses.SparseCategoricalCrossentropy(),
    input_spec=SPEC,
    metrics=[tf.keras.metrics.SparseCategoricalAccuracy()],
  )


def _functional_model():
  return tff.learning.models.functional_model_from_keras(
    _keras_model(),
    loss_fn=tf.keras.losses.SparseCategoricalCrossentropy(),
    input_spec=SPEC,
  )


def _trained(process, rounds=2):
  state = process.set_model_weights(
    process.initialize(), model_lib.initial_weights(_keras_model, 0)
  )
  for round_num in range(1, rounds + 1):
    if isinstance(process, stateful.StatefulClientsLearningProcess):
      clients = [client_keys.client_key(c, round_num) for c in IDS]
    else:
      clients = [CLIENT_DATA.create_tf_dataset_for_client(c) for c in IDS]
    output = process.next(state, clients)
    state = output.state
  train = output.metrics['client_work']['train']
  return model_lib.flat_trainable(process.get_model_weights(state)), train


SGD = optimizers.build_client_sgd(0.5)


@pytest.fixture(scope='module')
def tffs_weights():
  """TFF's FedAvg after 1 and 2 rounds, by rounds."""
  process = tff.learning.algorithms.build_weighted_fed_avg(
    tff_model_fn, client_optimizer_fn=SGD
  )
  return {rounds: _trained(process, rounds) for rounds in (1, 2)}


BUILDS = {
  'fedavg': lambda model_fn: fedavg.build_fedavg(
    model_fn, SPEC, client_optimizer_fn=SGD
  ),
  'fedprox': lambda model_fn: fedprox.build_fedprox(
    model_fn, SPEC, client_optimizer_fn=SGD, mu=0.0
  ),
  'fedcos': lambda model_fn: fedcos.build_fedcos(
    model_fn, SPEC, client_optimizer_fn=SGD, mu=0.0
  ),
  'scaffold': lambda model_fn: scaffold.build_scaffold(
    model_fn,
    SPEC,
    dataset_computation=CLIENT_DATA,
    client_optimizer_fn=SGD,
    num_clients=3,
    # SCAFFOLD's paper weights uniformly; TFF's FedAvg by examples.
    client_weighting=tff.learning.ClientWeighting.NUM_EXAMPLES,
  ),
}


@pytest.mark.parametrize('method', list(BUILDS))
def test_a_from_keras_model_variable_model_trains_to_tffs_weights(
  method, tffs_weights
):
  # At strength 0 every method is FedAvg; SCAFFOLD's first round is too
  # (c = c_i = 0).
  rounds = 1 if method == 'scaffold' else 2
  ours, train = _trained(BUILDS[method](tff_model_fn), rounds)
  theirs, their_train = tffs_weights[rounds]
  np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
  assert train['loss'] == pytest.approx(their_train['loss'], rel=1e-5)
  assert train['sparse_categorical_accuracy'] == pytest.approx(
    their_train['sparse_categorical_accuracy'], abs=1e-6
  )


def test_a_functional_model_trains_to_tffs_weights(tffs_weights):
  ours, _ = _trained(BUILDS['fedavg'](_functional_model()))
  np.testing.assert_allclose(ours, tffs_weights[2][0], rtol=1e-5, atol=1e-6)
  # A function returning one, as a lambda model_fn would.
  ours, _ = _trained(BUILDS['fedavg'](_functional_model), rounds=1)
  np.testing.assert_allclose(ours, tffs_weights[1][0], rtol=1e-5, atol=1e-6)


def test_a_variable_model_not_from_keras_is_refused_with_what_to_pass():
  functional = _functional_model()
  with pytest.raises(TypeError, match='not made by .*from_keras_model'):
    tff_models.keras_model_and_loss(
      lambda: tff.learning.models.model_from_functional(functional), None
    )


def test_a_method_reading_inner_layers_names_them_for_a_variable_model():
  with pytest.raises(ValueError, match="MOON reads the model's 'z' output"):
    moon.build_moon(
      tff_model_fn,
      SPEC,
      dataset_computation=CLIENT_DATA,
      client_optimizer_fn=SGD,
    )


def test_trained_weights_export_into_the_users_own_softmax_model():
  process = BUILDS['fedavg'](tff_model_fn)
  state = process.set_model_weights(
    process.initialize(), model_lib.initial_weights(_keras_model, 0)
  )
  clients = [CLIENT_DATA.create_tf_dataset_for_client(c) for c in IDS]
  weights = process.get_model_weights(process.next(state, clients).state)
  exported = model_lib.keras_model_with_weights(_keras_model, weights)
  for variable, trained in zip(exported.trainable_variables, weights.trainable):
    np.testing.assert_array_equal(variable.numpy(), trained)
  probabilities = exported.predict(np.ones((2, 4), np.float32), verbose=0)
  np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-5)
  with pytest.raises(ValueError, match='trainable tensors of shapes'):
    model_lib.keras_model_with_weights(
      lambda: tf.keras.Sequential(
        [tf.keras.Input((4,)), tf.keras.layers.Dense(3)]
      ),
      weights,
    )


def test_token_weighting_counts_the_labels_that_are_not_padding():
  labels = tf.constant([[3, 0, 0], [5, 6, 0]])  # 3 tokens in 6 positions
  assert float(aggregation.NumTokens().count(labels)) == 3.0
  assert float(aggregation.NumTokens(pad_token=5).count(labels)) == 5.0
  # TFF's builder gets the same count as the model's examples.
  keras_model = tf.keras.Sequential(
    [
      tf.keras.Input((3,), dtype=tf.int32),
      tf.keras.layers.Embedding(10, 4),
      tf.keras.layers.Dense(10),
    ]
  )
  spec = (
    tf.TensorSpec([None, 3], tf.int32),
    tf.TensorSpec([None, 3], tf.int32),
  )
  model = tff_models.TokensAsExamples(
    tff.learning.models.from_keras_model(
      keras_model,
      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      input_spec=spec,
    )
  )
  batch = (tf.constant([[1, 2, 3], [4, 5, 6]]), labels)
  output = model.forward_pass(batch, training=False)
  assert int(output.num_examples) == 3
  assert output.predictions.shape == (2, 3, 10)


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
