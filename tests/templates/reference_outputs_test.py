"""Tests for tff_methods.templates.reference_outputs: the reference models'
outputs a client reads, computed once per example and kept in tables."""

import collections
import functools
import sys

import numpy as np
import pytest
import tensorflow as tf

from tff_methods.algorithms import methods
from tff_methods.clients import batches_in_memory
from tff_methods.clients import client_keys
from tff_methods.templates import model_lib
from tff_methods.templates import reference_outputs
from tff_methods_tasks import datasets
from tff_methods_tasks import models
from tff_methods_tooling import experiment

pytestmark = pytest.mark.usefixtures('tff_worker')


def _indexed_digits_like(epochs, batch_size=4):
  x = np.random.default_rng(2).normal(size=(10, 8, 8, 1)).astype(np.float32)
  dataset = tf.data.Dataset.from_tensor_slices(
    collections.OrderedDict(x=x, y=np.zeros(10, np.int32))
  )
  return datasets.LocalBatches(
    batch_size, local_epochs=epochs, with_index=True
  )(dataset)


class _CountingView:
  """A reference view that counts the examples it computes outputs for."""

  def __init__(self, view):
    self._view = view
    self.computed = tf.Variable(0)

  def __getattr__(self, name):
    return getattr(self._view, name)

  def __call__(self, x):
    self.computed.assign_add(tf.shape(x)[0])
    return self._view(x)


@pytest.mark.parametrize(
  'max_mb,batch_size,chunk_max,expected_computed',
  [
    # 3 passes of 10 examples in batches of 4 (8 batches, 30 examples): the
    # first 3 batches hold every example (batch 3 spans passes 1 and 2);
    # only first occurrences are computed, so 10 examples, each once, in
    # one chunk; the rest is read back.
    (1.0, 4, 512, 10),
    # The same in chunks of a batch (4, 4 and 2 examples).
    (1.0, 4, 1, 10),
    # Fewer examples than a batch: the first batch of 16 holds 6 examples
    # twice; they are computed once (10, not 16).
    (1.0, 16, 512, 10),
    # Tables too large for the cap: computed at every step.
    (0.0, 4, 512, 30),
  ],
)
# Batches read from a data set, or slices of the round's examples (the
# project's own clients).
@pytest.mark.parametrize('sliced', [False, True])
def test_reference_outputs_are_computed_once_per_example(
  max_mb, batch_size, chunk_max, expected_computed, sliced, monkeypatch
):
  monkeypatch.setattr(
    reference_outputs, 'REFERENCE_CHUNK_MAX_EXAMPLES', chunk_max
  )
  model_fn = functools.partial(
    models.get_model, 'mlp', 10, (8, 8, 1), hidden=(16, 8)
  )
  view = _CountingView(
    reference_outputs.ReferenceView(model_fn, ('layer_1', 'layer_2'))
  )
  one_round = _round_reading_tables(view, max_mb, sliced)
  for _ in range(2):  # A second round computes its own tables.
    # Equal up to float rounding (an example's row computed in another
    # batch).
    assert one_round(_indexed_digits_like(3, batch_size)).numpy() < 1e-5
    assert view.computed.numpy() == expected_computed


def _round_reading_tables(view, max_mb=1.0, sliced=False):
  """A round over a data set's batches (`sliced`: cut from the round's
  examples): the largest difference between the outputs
  `ReferenceOutputs` reads and `view`'s own."""
  reference = reference_outputs.ReferenceOutputs({'global': view}, max_mb)

  @tf.function
  def one_round(dataset):
    view.computed.assign(0)
    if sliced:
      batches = batches_in_memory.SlicedBatches(
        dataset.unbatch().batch(2**31 - 1).get_single_element(),
        dataset.reduce(
          tf.zeros([0], tf.int32),
          lambda sizes, b: tf.concat([sizes, tf.shape(b['y'])[:1]], 0),
        ),
      )
    else:
      batches = batches_in_memory.BatchesInMemory(dataset)
    tables = reference.tabulate(batches)

    def step(largest_error, batch):
      got = reference.outputs(batch, tables)['global']
      expected = view.model(batch['x'], training=False)
      return tf.maximum(
        largest_error,
        tf.reduce_max(
          [tf.reduce_max(tf.abs(got[k] - expected[k])) for k in expected]
        ),
      )

    return batches.reduce(tf.constant(0.0), step)

  return one_round


def _indexed_batches(num_examples, batches_rows, seed):
  """Batches of random 8x8 examples holding `rows`, each with its index."""
  x = (
    np.random.default_rng(seed)
    .normal(size=(num_examples, 8, 8, 1))
    .astype(np.float32)
  )
  dataset = None
  for rows in batches_rows:
    batch = tf.data.Dataset.from_tensors(
      collections.OrderedDict(
        x=x[rows],
        y=np.zeros(len(rows), np.int32),
        index=np.array(rows, np.int64),
      )
    )
    dataset = batch if dataset is None else dataset.concatenate(batch)
  return dataset


def _mlp_counting_view():
  return _CountingView(
    reference_outputs.ReferenceView(
      functools.partial(models.get_model, 'mlp', 10, (8, 8, 1), hidden=(16, 8)),
      ('layer_1', 'layer_2'),
    )
  )


def test_reference_tables_hold_examples_first_seen_after_partial_batches():
  # A round that starts at the end of a pass: batches of 4, 1, 1 and 4
  # examples, so example 9, first seen at position 9, is in the fourth
  # batch, not the third (9 // 4 + 1).
  dataset = _indexed_batches(
    10, ([0, 1, 2, 3], [4], [5], [6, 7, 8, 9], [9, 8, 7, 6]), seed=3
  )
  view = _mlp_counting_view()
  assert _round_reading_tables(view)(dataset).numpy() < 1e-5
  assert view.computed.numpy() == 10


def test_reference_tables_hold_examples_first_seen_after_a_repeat():
  # Example 1 comes twice before example 3 is first seen (as with
  # drop_last): each example's row is computed once, from its first
  # occurrence, and every step reads its own examples' rows.
  dataset = _indexed_batches(4, ([0, 1, 2, 1], [3, 0, 2, 3]), seed=4)
  view = _mlp_counting_view()
  assert _round_reading_tables(view)(dataset).numpy() < 1e-5
  assert view.computed.numpy() == 4


def test_reference_chunks_hold_at_most_the_cap_of_activations():
  cnn = reference_outputs.ReferenceView(
    functools.partial(models.get_model, 'fedcka_cnn', 10, (32, 32, 3)),
    ('layer_1', 'layer_2'),
  )
  # Its largest layer output: the first convolution's 28 x 28 x 16 floats.
  assert cnn.largest_layer_bytes() == 4 * 28 * 28 * 16
  assert reference_outputs.reference_chunk_examples([cnn, cnn]) == (
    reference_outputs.REFERENCE_CHUNK_MAX_EXAMPLES
  )
  resnet = reference_outputs.ReferenceView(
    functools.partial(models.get_model, 'resnet18', 10, (32, 32, 3)),
    ('layer_1', 'layer_2'),
  )
  # 32 x 32 x 64 floats, 256 KB an example: 64 MB hold 128 for two views.
  assert resnet.largest_layer_bytes() == 4 * 32 * 32 * 64
  assert reference_outputs.reference_chunk_examples([resnet, resnet]) == 128


def test_cached_reference_outputs_give_the_uncached_weights(tmp_path):
  base = dict(
    method='fedcka',
    model='mlp',
    task='digits',
    num_clients=3,
    clients_per_round=3,
    rounds=2,
    local_epochs=2,
    batch_size=64,
    cache_dir=str(tmp_path / 'cache'),
    seed=0,
    output_dir=str(tmp_path / 'unused'),
  )
  config = experiment.ExperimentConfig(**base)
  data = experiment.load_data(config)
  keras_model_fn = experiment.model_fn_for(
    'fedcka',
    'mlp',
    data.num_classes,
    data.input_shape,
    config.hyperparameters(3),
  )
  weights = []
  for with_index in (True, False):
    batches = datasets.LocalBatches(64, local_epochs=2, with_index=with_index)
    process = methods.build_method_for_client_ids(
      'fedcka',
      keras_model_fn,
      datasets.round_dataset_computation(data.client_data, batches),
      batches.element_spec(data.client_data.element_type_structure),
      config.hyperparameters(3),
    )
    state = process.set_model_weights(
      process.initialize(), model_lib.initial_weights(keras_model_fn, 0)
    )
    for round_num in (1, 2):  # Round 2 reads the previous models too.
      state = process.next(
        state,
        [
          client_keys.client_key(c, round_num)
          for c in data.client_data.client_ids
        ],
      ).state
    weights.append(model_lib.flat_trainable(process.get_model_weights(state)))
  # The experiment indexes FedCKA's examples when they are passed twice.
  assert methods.wants_example_index('fedcka', local_epochs=2)
  assert not methods.wants_example_index('fedcka', local_epochs=1)
  assert not methods.wants_example_index('fedprox', local_epochs=5)
  np.testing.assert_allclose(weights[0], weights[1], rtol=1e-5, atol=1e-6)


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
