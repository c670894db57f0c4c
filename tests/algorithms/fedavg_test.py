"""The project's FedAvg family computes what TFF's own builder computes.

`methods` builds `fedavg`, `fedavgm`, `fedadam` and `fedyogi` with the
shared local-training loop (faster than TFF's builder: README, "Benchmark");
`tff_fedavg` is TFF's `build_weighted_fed_avg` itself.
"""

import functools
import sys

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_methods.algorithms import fedavg
from tff_methods.algorithms import hyperparameters
from tff_methods.algorithms import methods
from tff_methods.templates import model_lib
from tff_methods.templates import optimizers
from tff_methods_tasks import datasets

pytestmark = pytest.mark.usefixtures('tff_worker')

HPARAMS = dict(client_learning_rate=0.1, client_momentum=0.9, weight_decay=1e-3)


@pytest.fixture(scope='module')
def setup(digits_task, small_model_fn):
  client_data = digits_task.client_data.preprocess(
    datasets.LocalBatches(batch_size=16, local_epochs=2, seed=0)
  )
  return dict(
    client_data=client_data,
    spec=client_data.element_type_structure,
    ids=client_data.client_ids[:3],
    initial=model_lib.initial_weights(small_model_fn, seed=0),
  )


def _run(setup, process, rounds=2):
  process = tff.simulation.compose_dataset_computation_with_learning_process(
    setup['client_data'].dataset_computation, process
  )
  state = process.set_model_weights(process.initialize(), setup['initial'])
  for _ in range(rounds):
    output = process.next(state, setup['ids'])
    state = output.state
  return (
    model_lib.flat_trainable(process.get_model_weights(state)),
    output.metrics['client_work']['train'],
  )


@pytest.mark.parametrize(
  'name, server',
  [
    ('fedavg', 'sgd'),  # Plain averaging (server SGD, learning rate 1).
    ('fedadam', 'adam'),  # A server optimizer with state across rounds.
  ],
)
def test_projects_fedavg_gives_tffs_weights_and_metrics(
  name, server, setup, small_model_fn
):
  hparams = hyperparameters.Hyperparameters(**HPARAMS)
  ours, our_metrics = _run(
    setup, methods.build_method(name, small_model_fn, setup['spec'], hparams)
  )
  theirs, their_metrics = _run(
    setup,
    fedavg.build_tff_fedavg(
      small_model_fn,
      setup['spec'],
      client_optimizer_fn=hparams.client_optimizer(),
      server_optimizer_fn=hparams.server_optimizer(server),
    ),
  )
  start = model_lib.flat_trainable(setup['initial'])
  assert np.linalg.norm(theirs - start) > 1e-2  # Both trained.
  np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
  assert our_metrics['num_examples'] == their_metrics['num_examples']
  assert np.isclose(our_metrics['loss'], their_metrics['loss'], rtol=1e-5)
  assert np.isclose(
    our_metrics['sparse_categorical_accuracy'],
    their_metrics['sparse_categorical_accuracy'],
  )


def _l2_regularized_mlp(l2):
  regularizer = tf.keras.regularizers.l2(l2) if l2 else None
  return tf.keras.Sequential(
    [
      tf.keras.Input((8, 8, 1)),
      tf.keras.layers.Flatten(),
      tf.keras.layers.Dense(
        16, activation='relu', kernel_regularizer=regularizer
      ),
      tf.keras.layers.Dense(10, kernel_regularizer=regularizer),
    ]
  )


def test_a_models_own_l2_trains_as_in_tffs_fedavg(setup):
  # Keras' `model.losses` (TFF's ResNets carry L2 on each layer) are part
  # of what TFF's `from_keras_model` trains on: the project's loop must add
  # them too. The strength is large enough to move the weights visibly.
  runs = {}
  for l2 in (0.0, 0.05):
    model_fn = functools.partial(_l2_regularized_mlp, l2)
    initial = model_lib.initial_weights(model_fn, seed=0)
    optimizer = optimizers.build_client_sgd(0.1)
    for name, build in (
      ('ours', fedavg.build_fedavg),
      ('theirs', fedavg.build_tff_fedavg),
    ):
      if (name, l2) == ('ours', 0.0):
        continue
      process = build(model_fn, setup['spec'], client_optimizer_fn=optimizer)
      runs[name, l2] = _run(dict(setup, initial=initial), process)[0]
  assert np.abs(runs['theirs', 0.05] - runs['theirs', 0.0]).max() > 1e-3
  np.testing.assert_allclose(
    runs['ours', 0.05], runs['theirs', 0.05], rtol=1e-5, atol=1e-6
  )


def test_clients_making_their_batches_train_as_composed_processes(
  setup, small_model_fn
):
  # With a dataset computation, each client makes its batches inside its own
  # computation; the weights are those of TFF's composition, which makes
  # them in one computation and passes them to the next.
  hparams = hyperparameters.Hyperparameters(**HPARAMS)
  composed, composed_metrics = _run(
    setup,
    methods.build_method('fedavg', small_model_fn, setup['spec'], hparams),
  )
  process = methods.build_method(
    'fedavg',
    small_model_fn,
    setup['spec'],
    hparams,
    dataset_computation=setup['client_data'].dataset_computation,
  )
  assert process.next.type_signature.parameter[1].member == tff.TensorType(
    np.str_
  )
  state = process.set_model_weights(process.initialize(), setup['initial'])
  for _ in range(2):
    output = process.next(state, setup['ids'])
    state = output.state
  np.testing.assert_allclose(
    model_lib.flat_trainable(process.get_model_weights(state)),
    composed,
    rtol=1e-6,
    atol=1e-7,
  )
  metrics = output.metrics['client_work']['train']
  assert metrics['num_examples'] == composed_metrics['num_examples']
  assert np.isclose(metrics['loss'], composed_metrics['loss'], rtol=1e-6)


def test_a_dataset_computation_of_other_batches_is_refused(
  setup, small_model_fn
):
  other = tff.tensorflow.computation(
    lambda key: tf.data.Dataset.range(3), np.str_
  )
  with pytest.raises(
    TypeError, match='makes int64\\*, but the process ' 'trains on'
  ):
    fedavg.build_fedavg(
      small_model_fn,
      setup['spec'],
      client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1),
      dataset_computation=other,
    )


def test_tff_fedavg_is_tffs_builder_and_stands_alone(setup, small_model_fn):
  hparams = hyperparameters.Hyperparameters(**HPARAMS)
  theirs = methods.build_method(
    'tff_fedavg', small_model_fn, setup['spec'], hparams
  ).next.type_signature
  ours = methods.build_method(
    'fedavg', small_model_fn, setup['spec'], hparams
  ).next.type_signature
  tffs = tff.learning.algorithms.build_weighted_fed_avg(
    model_lib.tff_model_fn(small_model_fn, setup['spec']),
    client_optimizer_fn=hparams.client_optimizer(),
    server_optimizer_fn=hparams.server_optimizer('sgd'),
  ).next.type_signature
  assert str(theirs) == str(tffs)
  # The project's client work reports the objective and the dropped
  # (non-finite) clients beside TFF's metrics.
  assert 'num_non_finite_clients' not in str(theirs.result)
  assert 'num_non_finite_clients' in str(ours.result)
  with pytest.raises(ValueError, match='tff_fedavg cannot be combined'):
    methods.parse_method('tff_fedavg+fedprox')


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
