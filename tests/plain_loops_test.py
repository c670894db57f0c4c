"""Tests for tff_methods_tooling.plain_loops: FedAvg as a plain TF loop, equal
to TFF's."""

import sys

import numpy as np
import pytest

from tff_methods.algorithms import hyperparameters
from tff_methods.algorithms import methods
from tff_methods.templates import model_lib
from tff_methods_tasks import datasets
from tff_methods_tooling import experiment
from tff_methods_tooling import plain_loops

pytestmark = pytest.mark.usefixtures('tff_worker')


def test_plain_tf_loop_computes_tffs_fedavg(tiny_cifar):
  # One batch per client and one epoch: the order of examples inside the
  # batch does not change the mean gradient, so the plain loop and TFF's
  # FedAvg must give the same global weights.
  hparams = hyperparameters.Hyperparameters(
    client_learning_rate=0.1, client_momentum=0.9
  )
  model_fn = experiment.model_fn_for(
    'fedavg', 'fedcka_cnn', 10, (32, 32, 3), hparams
  )
  initial = model_lib.initial_weights(model_fn, 0)
  client_data = tiny_cifar.client_data.preprocess(datasets.LocalBatches(64, 1))
  process = methods.build_method_for_client_ids(
    'fedavg',
    model_fn,
    client_data.dataset_computation,
    client_data.element_type_structure,
    hparams,
  )
  state = process.set_model_weights(process.initialize(), initial)
  state = process.next(state, tiny_cifar.client_data.client_ids).state
  tff_weights = process.get_model_weights(state).trainable

  loop = plain_loops.PlainTFFedAvg(
    'fedcka_cnn',
    plain_loops.client_arrays(tiny_cifar),
    10,
    local_epochs=1,
    batch_size=64,
    learning_rate=0.1,
    momentum=0.9,
    initial_weights=initial.trainable,
  )
  loop.run_round()
  assert len(loop.global_weights) == len(tff_weights)
  moved = 0.0
  for plain, tff, start in zip(
    loop.global_weights, tff_weights, initial.trainable
  ):
    np.testing.assert_allclose(plain, tff, rtol=1e-4, atol=1e-5)
    moved += float(np.abs(plain - start).sum())
  assert moved > 0


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
