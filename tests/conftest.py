"""Test set-up: quiet TensorFlow, and one local TFF worker for the session.

The worker is started by `tff_methods.runtime`, which also ends it when the
test process exits.
"""

from tff_methods import runtime

runtime.configure_process()
runtime.set_local_execution_context(max_concurrent_clients=2)


import functools  # pylint: disable=g-import-not-at-top,g-bad-import-order

import pytest  # pylint: disable=g-import-not-at-top,g-bad-import-order

from tasks import datasets  # pylint: disable=g-import-not-at-top
from tasks import models  # pylint: disable=g-import-not-at-top


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
