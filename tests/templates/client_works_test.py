"""Tests for tff_methods.templates.client_works: the client work around one
client's computation, over data sets (TFF's `ClientWorkProcess`) or keys."""

import sys

import pytest
import tensorflow_federated as tff

from tff_methods.algorithms import moon
from tff_methods.templates import client_works
from tff_methods.templates import composers
from tff_methods.templates import optimizers

pytestmark = pytest.mark.usefixtures('tff_worker')


def test_local_training_is_tffs_client_work_over_data_sets_or_keys(
  digits_rounds,
):
  client_data = digits_rounds['client_data']
  build = lambda **kwargs: client_works.build_local_training_client_work(
    digits_rounds['model_fn'],
    digits_rounds['spec'],
    optimizers.build_client_sgd(0.1),
    **kwargs,
  )
  over_data_sets = build()
  assert isinstance(over_data_sets, tff.learning.templates.ClientWorkProcess)
  over_keys = build(dataset_computation=client_data.dataset_computation)
  assert isinstance(over_keys, composers.KeyedClientWork)
  # The same round, its clients' data given as ids (strings) instead.
  data_type = over_keys.next.type_signature.parameter[2].member
  assert isinstance(data_type, tff.TensorType) and data_type.dtype.kind in (
    'S',
    'U',
    'O',
  )
  assert isinstance(
    over_data_sets.next.type_signature.parameter[2].member, tff.SequenceType
  )
  assert over_keys.next.type_signature.result.measurements == (
    over_data_sets.next.type_signature.result.measurements
  )


def test_clients_that_keep_state_are_refused(digits_rounds):
  with pytest.raises(ValueError, match='needs per-client state'):
    client_works.build_local_training_client_work(
      digits_rounds['model_fn'],
      digits_rounds['spec'],
      optimizers.build_client_sgd(0.1),
      [moon.ModelContrastiveTerm(1.0)],
    )


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
