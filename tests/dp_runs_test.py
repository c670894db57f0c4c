"""Tests for tff_methods_tooling.dp_runs: what a DP run releases, its
secret cohorts and the guarantee it records."""

import collections
import dataclasses
import os
import stat
import sys

import pytest

from tff_methods import privacy
from tff_methods_tooling import dp_runs
from tff_methods_tooling import experiment


def _config(tmp_path, **settings):
  return experiment.ExperimentConfig(
    **{
      'task': 'digits',
      'num_clients': 20,
      'clients_per_round': 5,
      'aggregator': 'dp',
      'dp_clip': 1.0,
      'dp_noise_multiplier': 1.0,
      'output_dir': str(tmp_path / 'run'),
      **settings,
    }
  )


def _round_metrics():
  # A round's metrics as a process and the loop give them.
  return collections.OrderedDict(
    distributor=collections.OrderedDict(),
    client_work=collections.OrderedDict(
      train=collections.OrderedDict(loss=1.5, num_examples=250),
      client_states=collections.OrderedDict(written=5),
    ),
    aggregator=collections.OrderedDict(
      dp_query_metrics=collections.OrderedDict(clip=0.3),
      dp=(),
      zeroed_count=1,
    ),
    finalizer=collections.OrderedDict(update_non_finite=0),
    rejected=0,
    seconds=0.2,
    dp=collections.OrderedDict(epsilon=3.0),
    eval=collections.OrderedDict(accuracy=0.5),
  )


def test_a_dp_round_releases_the_noised_figures_only():
  released = dp_runs.released_metrics(_round_metrics())
  assert released == collections.OrderedDict(
    rejected=0,
    seconds=0.2,
    dp=collections.OrderedDict(epsilon=3.0),
    eval=collections.OrderedDict(accuracy=0.5),
    aggregator=collections.OrderedDict(
      dp_query_metrics=collections.OrderedDict(clip=0.3)
    ),
  )


def test_only_a_private_dp_run_filters_its_metrics(tmp_path):
  assert dp_runs.released_metrics_fn(_config(tmp_path)) is not None
  for settings in (dict(aggregator='mean'), dict(dp_release_non_private=True)):
    assert dp_runs.released_metrics_fn(_config(tmp_path, **settings)) is None


def test_a_dp_run_draws_a_secret_sampling_seed_once_and_keeps_it(tmp_path):
  config = _config(tmp_path)
  seed = dp_runs.sampling_seed(config)
  path = os.path.join(config.output_dir, dp_runs.SAMPLING_SEED_FILE)
  assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
  assert dp_runs.sampling_seed(config) == seed  # a resumed run's cohorts
  other = _config(tmp_path, output_dir=str(tmp_path / 'other'))
  assert dp_runs.sampling_seed(other) != seed
  assert 'secret seed' in dp_runs.cohorts(config)
  fixed = dataclasses.replace(config, sampling_seed=7)
  assert dp_runs.sampling_seed(fixed) == 7
  assert 'voids' in dp_runs.cohorts(fixed)
  plain = _config(tmp_path / 'plain', aggregator='mean')
  assert dp_runs.sampling_seed(plain) is None  # --seed's cohorts
  assert not os.path.exists(plain.output_dir)


def test_a_dp_run_samples_poisson_and_accounts_with_pld_by_default(tmp_path):
  config = _config(tmp_path)
  assert (config.sampling(), config.accountant()) == ('poisson', 'pld')
  assert _config(tmp_path, aggregator='mean').sampling() == (
    'without_replacement'
  )
  guarantee = dp_runs.guarantee(config, 20, 3)
  assert guarantee['epsilon'] == privacy.epsilon(1.0, 5, 20, 3, 20**-1.1)
  assert (guarantee['adjacency'], guarantee['accountant']) == (
    'add-or-remove-one',
    'pld',
  )


def test_fixed_size_cohorts_are_accounted_replace_one_at_half_the_noise(
  tmp_path,
):
  config = _config(tmp_path, client_sampling='without_replacement')
  guarantee = dp_runs.guarantee(config, 20, 3)
  assert guarantee['epsilon'] == privacy.epsilon(
    1.0, 5, 20, 3, 20**-1.1, 'without_replacement'
  )
  assert (
    guarantee['epsilon']
    > dp_runs.guarantee(_config(tmp_path), 20, 3)['epsilon']
  )
  assert (guarantee['adjacency'], guarantee['accountant']) == (
    'replace-one',
    'rdp',
  )


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
