"""Tests for tff_methods_tooling.cross_device: many sampled clients a round, the
state store filling up."""

import os
import sys

import numpy as np
import pytest

from tff_methods.algorithms import hyperparameters
from tff_methods.templates import reference_outputs
from tff_methods_tooling import cross_device
from tff_methods_tooling import experiment

pytestmark = pytest.mark.usefixtures('tff_worker')


def test_cross_device_samples_clients_and_fills_the_state_store(tmp_path):
  hparams = hyperparameters.Hyperparameters(client_learning_rate=0.01)
  rounds_seen = []
  results = cross_device.cross_device(
    ['fedavg', 'moon'],
    num_clients=8,
    min_examples=2,
    max_examples=6,
    clients_per_round=3,
    rounds=2,
    model_name='fedcka_cnn',
    batch_size=4,
    hparams=hparams,
    output_dir=str(tmp_path),
    on_round=lambda m, r, s: rounds_seen.append((m, r)),
  )
  assert rounds_seen == [('fedavg', 1), ('fedavg', 2), ('moon', 1), ('moon', 2)]
  assert 'state_store' not in results['methods']['fedavg']
  store = results['methods']['moon']['state_store']
  # Every one of the 8 clients has exactly one stored state (MOON's previous
  # model up to z, all but the classifier), sampled or not.
  state_dirs = [
    d
    for d in os.listdir(tmp_path / 'client_states' / 'moon')
    if d != 'initial.state'
  ]
  assert store['clients'] == 8 and len(state_dirs) == 8
  assert all(
    len(os.listdir(tmp_path / 'client_states' / 'moon' / d)) == 1
    for d in state_dirs
  )
  model_fn = experiment.model_fn_for(
    'moon', 'fedcka_cnn', 62, (28, 28, 1), hparams
  )
  kept = reference_outputs.ReferenceView(model_fn, ('z',)).model
  assert len(kept.trainable_weights) == len(model_fn().trainable_weights) - 2
  state_bytes = sum(int(np.prod(w.shape)) * 4 for w in kept.trainable_weights)
  assert store['megabytes'] * 2**20 >= 8 * state_bytes
  for run in results['methods'].values():
    assert run['clients_per_second'] == pytest.approx(3 / run['median'])


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
