"""Tests for tff_methods.clients.client_keys: a client's key for a round, the
seeded client sampling, and the program's data source of keys."""

import sys

import numpy as np
import pytest
import tensorflow as tf

from tff_methods.clients import client_keys

pytestmark = pytest.mark.usefixtures('tff_worker')


def test_sampling_is_seeded_per_round():
  ids = [f'c{i}' for i in range(10)]
  a = client_keys.sample_clients(ids, 3, round_num=5, seed=1)
  assert a == client_keys.sample_clients(ids, 3, round_num=5, seed=1)
  assert a != client_keys.sample_clients(ids, 3, round_num=6, seed=1)
  assert len(set(a)) == 3


def test_poisson_sampling_takes_each_client_with_the_expected_probability():
  ids = [f'c{i}' for i in range(20)]
  cohorts = [
    client_keys.sample_clients(ids, 2, round_num=r, seed=3, sampling='poisson')
    for r in range(1, 2001)
  ]
  assert cohorts[4] == client_keys.sample_clients(ids, 2, 5, 3, 'poisson')
  sizes = np.array([len(c) for c in cohorts])
  # Binomial(20, 0.1): mean 2, variance 1.8, P(empty) = 0.9^20 = 0.12.
  assert abs(sizes.mean() - 2) < 4 * np.sqrt(1.8 / 2000)
  assert abs(sizes.var() - 1.8) < 0.25
  assert abs((sizes == 0).mean() - 0.9**20) < 0.03
  # Every client equally likely.
  counts = np.array([sum(i in c for c in cohorts) for i in ids])
  assert counts.min() > 150 and counts.max() < 250  # 200 expected
  with pytest.raises(ValueError, match="sampling 'uniform' is unknown"):
    client_keys.sample_clients(ids, 2, 1, 0, 'uniform')


def test_data_source_iterator_survives_program_state(tmp_path):
  source = client_keys.ClientRoundDataSource(['a', 'b', 'c', 'd'], seed=1)
  iterator = source.iterator()
  first = iterator.select(2)
  assert [k[1] for k in first] == [b'1', b'1']
  restored = type(iterator).from_bytes(iterator.to_bytes())
  assert restored == iterator
  np.testing.assert_array_equal(restored.select(2), iterator.select(2))
  assert iterator.round_num == 2
  with pytest.raises(ValueError, match=r'select takes k in \[1, 4\]'):
    iterator.select(5)
  # Poisson cohorts (k expected): the sampling is kept with the state.
  poisson = client_keys.ClientRoundDataSource(
    [f'c{i}' for i in range(40)], seed=1, sampling='poisson'
  ).iterator()
  poisson.select(2)
  restored = type(poisson).from_bytes(poisson.to_bytes())
  sizes = {len(restored.select(2)) for _ in range(30)}
  assert len(sizes) > 2  # not a fixed size
  with pytest.raises(ValueError, match="sampling 'with_replacement'"):
    client_keys.ClientRoundDataSource(['a'], sampling='with_replacement')


def test_a_key_names_its_client_and_round():
  key = client_keys.client_key('client/7', 12)
  assert key.tolist() == [b'client/7', b'12']
  client_id, round_num = client_keys.split_client_key(tf.constant(key))
  assert client_id.numpy() == b'client/7'
  assert round_num.numpy() == 12
  assert client_keys.round_of_key(key) == 12
  # A client id alone (what TFF's ClientIdDataSource gives) names the
  # source that gives keys.
  with pytest.raises(TypeError, match='ClientRoundDataSource'):
    client_keys.round_of_key('client/7')


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
