"""Tests for tff_methods_tasks.partition."""

import sys

import numpy as np
import pytest

from tff_methods_tasks import partition

LABELS = np.repeat(np.arange(10), 100)  # 1000 examples, 10 balanced classes.


def _assert_is_partition(parts, n):
  joined = np.concatenate(parts)
  assert len(joined) == n
  assert np.array_equal(np.sort(joined), np.arange(n))


@pytest.mark.parametrize(
  'fn, kwargs',
  [
    (partition.iid, {}),
    (partition.dirichlet, dict(alpha=0.5)),
    (partition.pathological, dict(classes_per_client=2)),
    (partition.shards, dict(shards_per_client=2)),
    (partition.mixed, dict(non_iid_fraction=0.5)),
  ],
)
def test_every_scheme_is_a_deterministic_partition(fn, kwargs):
  parts = fn(LABELS, 10, seed=3, **kwargs)
  _assert_is_partition(parts, LABELS.size)
  again = fn(LABELS, 10, seed=3, **kwargs)
  assert all(np.array_equal(a, b) for a, b in zip(parts, again))
  other = fn(LABELS, 10, seed=4, **kwargs)
  assert any(not np.array_equal(a, b) for a, b in zip(parts, other))


def test_iid_sizes_are_near_equal():
  sizes = [len(p) for p in partition.iid(LABELS, 7)]
  assert max(sizes) - min(sizes) <= 1


def test_dirichlet_skew_grows_as_alpha_falls():
  def mean_classes_held(alpha):
    counts = partition.class_counts(
      LABELS, partition.dirichlet(LABELS, 10, alpha, min_size=1, seed=0), 10
    )
    return np.mean((counts > 0).sum(1))

  assert mean_classes_held(100.0) == 10
  assert mean_classes_held(0.1) < 5


def test_dirichlet_caps_clients_at_an_equal_share_as_niid_bench():
  # A client that holds N / num_clients = 100 examples takes no more, so no
  # client ends above 100 + one class (100). Without the cap, alpha=0.1
  # gives clients of 219, 243 and 249 examples at these seeds.
  for seed in range(10):
    parts = partition.dirichlet(LABELS, 10, alpha=0.1, min_size=1, seed=seed)
    assert max(len(p) for p in parts) <= 200, seed


def test_dirichlet_meets_min_size_and_finishes_at_tiny_alpha():
  parts = partition.dirichlet(LABELS, 10, alpha=0.01, min_size=10, seed=0)
  assert min(len(p) for p in parts) >= 10


def test_dirichlet_errors_name_the_bad_value():
  with pytest.raises(ValueError, match='alpha must be > 0, got 0'):
    partition.dirichlet(LABELS, 10, alpha=0)
  with pytest.raises(ValueError, match='min_size=200'):
    partition.dirichlet(LABELS, 10, alpha=0.5, min_size=200)
  # One class at alpha=0.001: one client takes nearly all of it, every draw.
  with pytest.raises(ValueError, match='in each of 1000 draws'):
    partition.dirichlet(np.zeros(1000, int), 10, alpha=0.001, min_size=5)


def test_pathological_is_niid_benchs_k_classes_per_client():
  parts = partition.pathological(LABELS, 20, classes_per_client=2, seed=1)
  counts = partition.class_counts(LABELS, parts, 10)
  assert np.all((counts > 0).sum(1) == 2)
  # Client i holds class i mod C.
  assert all(counts[i, i % 10] > 0 for i in range(20))
  # Each class is split evenly among the clients that hold it.
  for c in range(10):
    held = counts[:, c][counts[:, c] > 0]
    assert held.sum() == 100 and held.max() - held.min() <= 1
  with pytest.raises(
    ValueError, match=r'classes_per_client must be in \[1, 10\]'
  ):
    partition.pathological(LABELS, 10, classes_per_client=11)


@pytest.mark.parametrize(
  'num_clients, k, num_classes, fewest_sets',
  [(100, 2, 10, 25), (10, 2, 10, 8), (100, 20, 100, 90)],
)
def test_pathological_clients_are_not_blocks_of_identical_clients(
  num_clients, k, num_classes, fewest_sets
):
  labels = np.repeat(np.arange(num_classes), 20 * k)
  parts = partition.pathological(labels, num_clients, k, seed=0)
  held = partition.class_counts(labels, parts, num_classes) > 0
  class_sets = {tuple(np.flatnonzero(row)) for row in held}
  assert len(class_sets) >= fewest_sets
  assert held.any(0).all()  # Every class is used.


def test_shards_are_label_sorted_slices():
  parts = partition.shards(LABELS, 10, shards_per_client=1, seed=0)
  counts = partition.class_counts(LABELS, parts, 10)
  # One 100-example shard each, from a label-sorted order: one class each.
  assert np.all(counts.max(1) == 100)
  parts = partition.shards(LABELS, 10, shards_per_client=2, seed=0)
  assert all(len(p) == 100 for p in parts)
  assert np.all((partition.class_counts(LABELS, parts, 10) > 0).sum(1) <= 2)


def test_mixed_interpolates_between_shards_and_iid():
  sorted_counts = partition.class_counts(
    LABELS, partition.mixed(LABELS, 10, 1.0, seed=0), 10
  )
  assert np.all(sorted_counts.max(1) == 100)
  iid_counts = partition.class_counts(
    LABELS, partition.mixed(LABELS, 10, 0.0, seed=0), 10
  )
  assert np.all((iid_counts > 0).sum(1) >= 8)
  half = partition.class_counts(
    LABELS, partition.mixed(LABELS, 10, 0.5, seed=0), 10
  )
  # Each client keeps 50 of its own class and gets ~5 more from the pool.
  assert np.all(half.max(1) >= 50) and np.all(half.max(1) < 80)
  with pytest.raises(ValueError, match='non_iid_fraction must be in'):
    partition.mixed(LABELS, 10, 1.5)


def test_more_clients_than_examples_is_refused():
  with pytest.raises(ValueError, match='num_clients=5 is more than the 3'):
    partition.iid(np.array([0, 1, 2]), 5)


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
