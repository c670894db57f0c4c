"""Tests for tff_methods.templates.distributors: the loop's broadcast, with the
terms' server state."""

import sys

import numpy as np
import pytest
import tensorflow_federated as tff

from tff_methods.algorithms import fedcos
from tff_methods.templates import distributors
from tff_methods.templates import model_lib

pytestmark = pytest.mark.usefixtures('tff_worker')


def _weights(small_model_fn):
  zeros = model_lib.zero_weights(small_model_fn)
  return zeros, model_lib.weights_type_of(zeros)


def test_the_distributor_without_server_state_is_tffs_broadcast(
  small_model_fn,
):
  zeros, weights_type = _weights(small_model_fn)
  distributor = distributors.build_distributor(
    weights_type, [], zeros.trainable
  )
  tffs = tff.learning.templates.build_broadcast_process(weights_type)
  assert distributor.next.type_signature.is_equivalent_to(
    tffs.next.type_signature
  )
  assert not distributor.initialize.type_signature.result.member  # No state.
  received = object()
  assert distributors.split_received(received, has_broadcast=False) == (
    received,
    None,
  )
  assert distributors.split_received(
    dict(model='w', broadcast='b'), has_broadcast=True
  ) == ('w', 'b')


def test_fedcos_direction_is_the_global_models_last_move(small_model_fn):
  # d = w_g^t - w_g^{t-1}: zero in the first round (no previous model),
  # then the move between the weights broadcast in two rounds.
  zeros, weights_type = _weights(small_model_fn)
  distributor = distributors.build_distributor(
    weights_type, [fedcos.DirectionPenalty(0.1)], zeros.trainable
  )
  first = [np.full(z.shape, 1.0, np.float32) for z in zeros.trainable]
  second = [np.full(z.shape, 3.5, np.float32) for z in zeros.trainable]

  # Its state, and what one client receives (its measurements are empty;
  # the client's argument only gives the round one client).
  @tff.federated_computation(
    *distributor.next.type_signature.parameter,
    tff.FederatedType(np.int32, tff.CLIENTS),
  )
  def next_fn(state, weights, one_client):
    del one_client
    output = distributor.next(state, weights)
    return output.state, output.result

  def broadcast(state, trainable):
    return next_fn(state, tff.learning.models.ModelWeights(trainable, []), [0])

  state, received = broadcast(distributor.initialize(), first)
  for d in received['broadcast']['fedcos']:
    assert not np.any(d)
  _, received = broadcast(state, second)
  for d in received['broadcast']['fedcos']:
    np.testing.assert_allclose(d, 2.5)
  np.testing.assert_allclose(received['model'].trainable[0], 3.5)


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
