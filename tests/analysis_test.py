"""Tests for tff_methods_tooling.analysis."""

import csv
import os
import sys

import numpy as np
import pytest

from tff_methods_tooling import analysis
from tff_methods_tooling import experiment

pytestmark = pytest.mark.usefixtures('tff_worker')


def test_angle_by_hand():
  assert np.isclose(
    analysis.angle_degrees(np.array([1.0, 0.0]), np.array([1.0, 1.0])), 45.0
  )
  assert np.isclose(
    analysis.angle_degrees(np.array([1.0, 0.0]), np.array([-2.0, 0.0])), 180.0
  )
  assert np.isnan(analysis.angle_degrees(np.zeros(2), np.ones(2)))


def test_activation_kl_by_hand():
  local = np.array([[1.0, 3.0], [1.0, 3.0]])  # mean -> (1/4, 3/4)
  global_ = np.array([[2.0, 2.0]])  # mean -> (1/2, 1/2)
  expected = 0.25 * np.log(0.5) + 0.75 * np.log(1.5)
  assert np.isclose(analysis.activation_kl(local, global_), expected, rtol=1e-6)
  assert np.isclose(analysis.activation_kl(local, local), 0.0, atol=1e-9)


def test_analysis_writes_every_figure(tmp_path):
  config = experiment.ExperimentConfig(
    method='fedprox',
    task='digits',
    model='mlp',
    num_clients=4,
    clients_per_round=4,
    rounds=2,
    output_dir=str(tmp_path / 'out'),
    cache_dir=str(tmp_path / 'cache'),
  )
  paths = analysis.analyze(config, str(tmp_path / 'out'), max_clients=3)
  assert set(paths) == {
    'cka_layers',
    'activation_divergence',
    'update_angles',
    'partition',
    'total_variance',
  }
  for path in paths.values():
    assert open(path, 'rb').read(4) == b'\x89PNG'
  with open(tmp_path / 'out' / 'update_angles.csv') as f:
    rows = list(csv.DictReader(f))
  # No global move before round 1; from round 2 on, angles in (0, 180).
  assert rows[0]['to_global_direction_deg'] == 'nan'
  assert 0 < float(rows[1]['to_global_direction_deg']) < 180
  with open(tmp_path / 'out' / 'cka_layers.csv') as f:
    cka = [float(r['cka_local_global']) for r in csv.DictReader(f)]
  assert len(cka) == 2 * 2 and all(0 < c <= 1.0001 for c in cka)
  assert os.path.exists(tmp_path / 'out' / 'total_variance.csv')


def test_layer_wise_cka_covers_every_layer_of_the_fedcka_cnn(tmp_path):
  config = experiment.ExperimentConfig(
    method='fedavg',
    task='digits',
    model='fedcka_cnn',
    num_clients=3,
    clients_per_round=3,
    rounds=1,
    output_dir=str(tmp_path / 'out'),
    cache_dir=str(tmp_path / 'cache'),
  )
  analysis.analyze(config, str(tmp_path / 'out'), max_clients=2)
  with open(tmp_path / 'out' / 'cka_layers.csv') as f:
    layers = [r['layer'] for r in csv.DictReader(f)]
  assert layers == [f'layer_{k}' for k in range(1, 8)]


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
