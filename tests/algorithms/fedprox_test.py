"""Tests for FedProx and the shared local-training client work.

TFF computations are built once per module (module-scoped fixtures).
"""

import collections
import sys

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_methods.algorithms import fedavg
from tff_methods.algorithms import fedprox
from tff_methods.clients import batches_in_memory
from tff_methods.templates import model_lib
from tff_methods.templates import optimizers
from tff_methods.templates import regularizers
from tff_methods_tasks import datasets

pytestmark = pytest.mark.usefixtures('tff_worker')


@pytest.fixture(scope='module')
def setup(digits_task, small_model_fn):
  client_data = digits_task.client_data.preprocess(
    datasets.LocalBatches(batch_size=16, local_epochs=2, seed=0)
  )
  spec = client_data.element_type_structure
  optimizer = optimizers.build_client_sgd(0.1, momentum=0.9, weight_decay=1e-3)

  def by_id(process):
    return tff.simulation.compose_dataset_computation_with_learning_process(
      client_data.dataset_computation, process
    )

  return dict(
    client_ids=client_data.client_ids[:3],
    by_id=by_id,
    spec=spec,
    optimizer=optimizer,
    initial=model_lib.initial_weights(small_model_fn, seed=0),
  )


def _run(process, initial, client_ids, rounds):
  state = process.set_model_weights(process.initialize(), initial)
  for _ in range(rounds):
    output = process.next(state, client_ids)
    state = output.state
  return process.get_model_weights(state), output.metrics


@pytest.mark.parametrize(
  'max_mb',
  [
    1.0,  # Every batch fits: all read into memory first.
    60 / 2**20,  # 60 bytes: 3 batches of 4 int32 pairs, the rest streamed.
    0.0,
  ],
)  # Nothing fits: all streamed.
def test_reduce_over_batches_is_dataset_reduce_in_order(max_mb):
  dataset = tf.data.Dataset.from_tensor_slices(
    collections.OrderedDict(
      x=np.arange(30, dtype=np.int32), y=np.arange(30, dtype=np.int32) % 7
    )
  ).batch(4)

  def reduce_fn(state, batch):
    # Order-sensitive: a different order or a missed/repeated batch changes
    # the result.
    total, count = state
    return total * 3 + tf.reduce_sum(batch['x'] - batch['y']), count + 1

  expected = dataset.reduce(
    (tf.constant(0, tf.int64), 0),
    lambda s, b: (
      s[0] * 3 + tf.cast(tf.reduce_sum(b['x'] - b['y']), tf.int64),
      s[1] + 1,
    ),
  )
  got = tf.function(
    lambda: batches_in_memory.reduce_over_batches(
      dataset,
      (tf.constant(0, tf.int64), tf.constant(0)),
      lambda s, b: (
        s[0] * 3 + tf.cast(tf.reduce_sum(b['x'] - b['y']), tf.int64),
        s[1] + 1,
      ),
      max_mb=max_mb,
    )
  )()
  assert int(got[0]) == int(expected[0]) and int(got[1]) == 8
  del reduce_fn


def test_proximal_term_by_hand():
  w = [tf.Variable([1.0, 2.0]), tf.Variable([[3.0]])]
  w_g = [tf.constant([0.0, 0.0]), tf.constant([[1.0]])]
  step = regularizers.LocalStep(w, w_g, {}, None)
  # (mu/2) * (1 + 4 + 4) with mu = 0.5.
  assert np.isclose(fedprox.ProximalTerm(0.5)(step).numpy(), 0.25 * 9)
  with tf.GradientTape() as tape:
    value = fedprox.ProximalTerm(0.5)(step)
  grads = tape.gradient(value, w)
  # The gradient mu * (w - w_g) points away from w_g, so descent pulls
  # the weights towards it.
  np.testing.assert_allclose(grads[0].numpy(), [0.5, 1.0])
  np.testing.assert_allclose(grads[1].numpy(), [[1.0]])


def test_negative_mu_is_refused():
  with pytest.raises(
    ValueError, match='FedProx mu must be a number >= 0, ' 'got -1'
  ):
    fedprox.ProximalTerm(-1)


@pytest.fixture(scope='module')
def trained(setup, small_model_fn):
  results = {}
  results['fedavg'] = _run(
    setup['by_id'](
      fedavg.build_tff_fedavg(
        small_model_fn, setup['spec'], client_optimizer_fn=setup['optimizer']
      )
    ),
    setup['initial'],
    setup['client_ids'],
    rounds=2,
  )
  for mu in (0.0, 1.0, 10.0):
    results[mu] = _run(
      setup['by_id'](
        fedprox.build_fedprox(
          small_model_fn,
          setup['spec'],
          client_optimizer_fn=setup['optimizer'],
          mu=mu,
        )
      ),
      setup['initial'],
      setup['client_ids'],
      rounds=1 if mu else 2,
    )
  return results


def test_mu_zero_gives_tffs_fedavg_weights(trained):
  fedavg_weights, fedavg_metrics = trained['fedavg']
  prox_weights, prox_metrics = trained[0.0]
  np.testing.assert_allclose(
    model_lib.flat_trainable(prox_weights),
    model_lib.flat_trainable(fedavg_weights),
    rtol=1e-5,
    atol=1e-6,
  )
  ours = prox_metrics['client_work']['train']
  theirs = fedavg_metrics['client_work']['train']
  assert ours['num_examples'] == theirs['num_examples']
  assert np.isclose(ours['loss'], theirs['loss'], rtol=1e-5)
  assert np.isclose(
    ours['sparse_categorical_accuracy'], theirs['sparse_categorical_accuracy']
  )


def test_update_shrinks_as_mu_grows(setup, trained, small_model_fn):
  start = model_lib.flat_trainable(setup['initial'])
  one_round_mu0 = _run(
    setup['by_id'](
      fedprox.build_fedprox(
        small_model_fn,
        setup['spec'],
        client_optimizer_fn=setup['optimizer'],
        mu=0.0,
      )
    ),
    setup['initial'],
    setup['client_ids'],
    rounds=1,
  )[0]
  norms = [
    np.linalg.norm(model_lib.flat_trainable(w) - start)
    for w in (one_round_mu0, trained[1.0][0], trained[10.0][0])
  ]
  assert norms[0] > norms[1] > norms[2] > 0
  # TFF 0.87's fed_prox grows instead (sign error): at mu = 10 its update
  # would be far larger than FedAvg's.
  assert norms[2] < 0.5 * norms[0]
  objective = trained[10.0][1]['client_work']['train']
  assert objective['objective'] > objective['loss']


def test_diverged_clients_get_zero_weight(setup, small_model_fn):
  process = setup['by_id'](
    fedprox.build_fedprox(
      small_model_fn,
      setup['spec'],
      client_optimizer_fn=optimizers.build_client_sgd(1e30),
      mu=0.0,
    )
  )
  state = process.set_model_weights(process.initialize(), setup['initial'])
  output = process.next(state, setup['client_ids'])
  train = output.metrics['client_work']['train']
  assert train['num_non_finite_clients'] == 3
  assert train['num_examples'] == 0


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
