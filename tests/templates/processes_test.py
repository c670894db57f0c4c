"""Tests for tff_methods.templates.processes: one builder of the shared loop,
whose client work follows from its terms."""

import sys

import numpy as np
import pytest
import tensorflow_federated as tff

from tff_methods.algorithms import fedprox
from tff_methods.algorithms import moon
from tff_methods.templates import optimizers
from tff_methods.templates import processes
from tff_methods.templates import stateful
from tff_methods_tasks import datasets
from tff_methods_tasks import models

pytestmark = pytest.mark.usefixtures('tff_worker')


def test_without_terms_the_process_computes_tffs_fedavg(
  digits_rounds, tff_fedavg_weights
):
  process = processes.build_local_training_process(
    digits_rounds['model_fn'],
    digits_rounds['spec'],
    optimizers.build_client_sgd(0.05, 0.9),
  )
  # TFF's own composer builds it: nothing of the project's around it.
  assert type(process) is tff.learning.templates.LearningProcess
  weights, _ = digits_rounds['run'](process)
  np.testing.assert_allclose(weights, tff_fedavg_weights, rtol=1e-5, atol=1e-6)


def test_a_term_that_keeps_client_state_makes_clients_with_state(
  digits_task, tmp_path
):
  model_fn = lambda: models.get_model('fedcka_cnn', 10, (8, 8, 1))
  batches = datasets.LocalBatches(batch_size=32, local_epochs=1)
  by_key = datasets.round_dataset_computation(digits_task.client_data, batches)
  spec = batches.element_spec(digits_task.client_data.element_type_structure)
  sgd = optimizers.build_client_sgd(0.05)
  stateless = processes.build_local_training_process(
    model_fn,
    spec,
    sgd,
    regularizers=[fedprox.ProximalTerm(0.1)],
    dataset_computation=by_key,
  )
  assert not isinstance(stateless, stateful.StatefulClientsLearningProcess)
  with_state = processes.build_local_training_process(
    model_fn,
    spec,
    sgd,
    regularizers=[fedprox.ProximalTerm(0.1), moon.ModelContrastiveTerm(1.0)],
    dataset_computation=by_key,
    client_state_dir=str(tmp_path / 'states'),
  )
  assert isinstance(with_state, stateful.StatefulClientsLearningProcess)
  assert with_state.client_states.directory == str(tmp_path / 'states')
  # Such clients are keys: without a computation of their batches, refused
  # in one line before anything is built.
  with pytest.raises(ValueError, match='give a dataset_computation'):
    processes.build_local_training_process(
      model_fn, spec, sgd, regularizers=[moon.ModelContrastiveTerm(1.0)]
    )


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
