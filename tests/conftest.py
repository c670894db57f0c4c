"""Test set-up: quiet TensorFlow; a local TFF worker for the tests that need it.

Tests that run TFF computations ask for the `tff_worker` fixture (a module's
`pytestmark = pytest.mark.usefixtures('tff_worker')`, or a test's own
mark): the worker starts at the first of them and
`tff_methods.execution.runtime` ends it when the session exits. Any other test
that ran a computation would fail at once, with no worker left behind. Tests
that start binaries or workers of their own are marked `slow`
(`pytest -m "not slow"` skips them; `make test` runs everything).
"""

from tff_methods.execution import runtime
from tff_methods_tooling import process_setup

process_setup.configure_process()
runtime.discard_default_context()


import functools

import pytest
import tensorflow_federated as tff

from tff_methods.algorithms import fedavg
from tff_methods.templates import model_lib
from tff_methods.templates import optimizers
from tff_methods_tasks import datasets
from tff_methods_tasks import models


@pytest.fixture(scope='session')
def tff_worker():
  """TFF's context: one local worker, for the whole session."""
  runtime.set_local_execution_context(max_concurrent_clients=2)


@pytest.fixture(scope='session')
def digits_task(tmp_path_factory):
  """The offline digits task split over 4 clients (label-skewed)."""
  return datasets.load_task(
    'digits',
    num_clients=4,
    partition='dirichlet',
    alpha=0.5,
    seed=0,
    cache_dir=str(tmp_path_factory.mktemp('cache')),
  )


@pytest.fixture(scope='session')
def tiny_cifar(tmp_path_factory):
  """3 clients of 6 CIFAR-shaped generated examples (and 4 test ones)."""
  return datasets.generated_like(
    'cifar10',
    num_clients=3,
    examples_per_client=6,
    cache_dir=str(tmp_path_factory.mktemp('cache')),
    num_test=4,
  )


@pytest.fixture(scope='session')
def small_model_fn():
  """A small MLP for the 8x8 digits: fast to build and train."""
  return functools.partial(models.get_model, 'mlp', 10, (8, 8, 1), hidden=(32,))


@pytest.fixture(scope='session')
def digits_rounds(tff_worker, digits_task, small_model_fn):
  """Three digits clients, the MLP, and `run(process, rounds)`: a few rounds
  of a process from fixed initial weights (the methods' tests)."""
  del tff_worker  # TFF's context, set
  client_data = digits_task.client_data.preprocess(
    datasets.LocalBatches(batch_size=32, local_epochs=1, seed=0)
  )
  setup = dict(
    client_data=client_data,
    model_fn=small_model_fn,
    spec=client_data.element_type_structure,
    ids=client_data.client_ids[:3],
    initial=model_lib.initial_weights(small_model_fn, seed=0),
  )

  def run(process, rounds=3):
    """(final flat trainable weights, each round's train metrics)."""
    process = tff.simulation.compose_dataset_computation_with_learning_process(
      client_data.dataset_computation, process
    )
    state = process.set_model_weights(process.initialize(), setup['initial'])
    outputs = []
    for _ in range(rounds):
      output = process.next(state, setup['ids'])
      state = output.state
      outputs.append(output.metrics['client_work']['train'])
    return (model_lib.flat_trainable(process.get_model_weights(state)), outputs)

  setup['run'] = run
  return setup


@pytest.fixture(scope='session')
def tff_fedavg_weights(digits_rounds):
  """TFF's own FedAvg on `digits_rounds` (client SGD 0.05, momentum 0.9)."""
  return digits_rounds['run'](
    fedavg.build_tff_fedavg(
      digits_rounds['model_fn'],
      digits_rounds['spec'],
      client_optimizer_fn=optimizers.build_client_sgd(0.05, 0.9),
    )
  )[0]
