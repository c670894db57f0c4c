"""Test set-up: quiet TensorFlow; a local TFF worker for the tests that need it.

Tests that run TFF computations ask for the `tff_worker` fixture (a module's
`pytestmark = pytest.mark.usefixtures('tff_worker')`, or a test's own
mark): the worker starts at the first of them and `tff_methods.runtime`
ends it when the session exits. Any other test that ran a computation would
fail at once, with no worker left behind. Tests that start binaries or
workers of their own are marked `slow` (`pytest -m "not slow"` skips them;
`make test` runs everything).
"""

from tff_methods import runtime

runtime.configure_process()
runtime.discard_default_context()


import functools  # pylint: disable=g-import-not-at-top,g-bad-import-order

import pytest  # pylint: disable=g-import-not-at-top,g-bad-import-order

from tasks import datasets  # pylint: disable=g-import-not-at-top
from tasks import models  # pylint: disable=g-import-not-at-top


@pytest.fixture(scope='session')
def tff_worker():
  """TFF's context: one local worker, for the whole session."""
  runtime.set_local_execution_context(max_concurrent_clients=2)


@pytest.fixture(scope='session')
def digits_task(tmp_path_factory):
  """The offline digits task split over 4 clients (label-skewed)."""
  return datasets.load_task(
      'digits', num_clients=4, partition='dirichlet', alpha=0.5, seed=0,
      cache_dir=str(tmp_path_factory.mktemp('cache')))


@pytest.fixture(scope='session')
def small_model_fn():
  """A small MLP for the 8x8 digits: fast to build and train."""
  return functools.partial(models.get_model, 'mlp', 10, (8, 8, 1),
                           hidden=(32,))
