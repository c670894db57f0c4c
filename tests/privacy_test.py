"""Tests for tff_methods.privacy: a DP run's (epsilon, delta)."""

import sys

import dp_accounting
from dp_accounting import pld
from dp_accounting import rdp
import pytest

from tff_methods import privacy


def _accounted(accountant, event, delta):
  accountant.compose(event)
  return accountant.get_epsilon(delta)


def test_epsilon_is_dp_accountings_own_for_the_sampling_used():
  # Noise 1.0, 5 of 20 clients, 3 rounds, delta 1e-5: fixed-size cohorts
  # under replace-one adjacency (RDP), Poisson under add-or-remove-one.
  gaussian = dp_accounting.GaussianDpEvent(1.0)
  fixed = dp_accounting.SelfComposedDpEvent(
    dp_accounting.SampledWithoutReplacementDpEvent(20, 5, gaussian), 3
  )
  poisson = dp_accounting.SelfComposedDpEvent(
    dp_accounting.PoissonSampledDpEvent(0.25, gaussian), 3
  )
  expected = {
    ('without_replacement', 'rdp'): _accounted(
      rdp.RdpAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE
      ),
      fixed,
      1e-5,
    ),
    ('poisson', 'rdp'): _accounted(rdp.RdpAccountant(), poisson, 1e-5),
    ('poisson', 'pld'): _accounted(pld.PLDAccountant(), poisson, 1e-5),
  }
  for (sampling, accountant), value in expected.items():
    ours = privacy.epsilon(
      1.0, 5, 20, 3, 1e-5, sampling=sampling, accountant=accountant
    )
    if accountant == 'rdp':
      assert ours == pytest.approx(value, rel=1e-9)
    else:  # A coarser loss discretization: as pessimistic, within 1e-5.
      assert value <= ours == pytest.approx(value, rel=1e-5)
  # The figures: 5.25 (fixed), 4.42 (Poisson, RDP), 3.81 (Poisson, PLD).
  assert [round(v, 2) for v in expected.values()] == [5.25, 4.42, 3.81]


def test_the_readme_quick_starts_dp_run_is_about_epsilon_43():
  # 4 of 4 clients a round, noise 0.3, 3 rounds, delta 1e-5.
  assert privacy.epsilon(0.3, 4, 4, 3, 1e-5) == pytest.approx(42.8, abs=0.05)


def test_epsilon_grows_with_rounds_and_falls_with_noise():
  by_rounds = [privacy.epsilon(1.0, 5, 20, t, 1e-5) for t in (0, 1, 3, 10)]
  assert by_rounds[0] == 0.0
  assert by_rounds == sorted(by_rounds) and len(set(by_rounds)) == 4
  by_noise = [privacy.epsilon(z, 5, 20, 3, 1e-5) for z in (0.7, 1.0, 2.0)]
  assert by_noise == sorted(by_noise, reverse=True)


@pytest.mark.parametrize(
  'sampling, accountant, target',
  [('without_replacement', 'rdp', 4.0), ('poisson', 'rdp', 2.0)],
)
def test_calibration_meets_the_target_within_one_percent_and_never_above(
  sampling, accountant, target
):
  z = privacy.calibrate_noise_multiplier(
    target, 5, 20, 3, 1e-5, sampling=sampling, accountant=accountant
  )
  reached = privacy.epsilon(
    z, 5, 20, 3, 1e-5, sampling=sampling, accountant=accountant
  )
  assert 0.99 * target <= reached <= target


def test_tffs_adaptive_clip_noise_split_by_hand():
  # 10 clients: clipped-count noise 0.5 (0.05 x 10); for z = 0.5 the
  # updates get (0.5^-2 - (2 x 0.5)^-2)^-1/2 = (4 - 1)^-1/2 = 1/sqrt(3).
  assert privacy.value_noise_multiplier(0.5, 10) == pytest.approx(
    3**-0.5, rel=1e-12
  )
  assert privacy.value_noise_multiplier(0.0, 10) == 0.0
  with pytest.raises(ValueError, match='clipped-count noise above 0.25'):
    privacy.value_noise_multiplier(0.5, 5)


@pytest.mark.parametrize(
  'kwargs, match',
  [
    (dict(sampling='uniform'), "sampling 'uniform' is unknown"),
    (dict(accountant='prv'), "accountant 'prv' is unknown"),
    (dict(accountant='pld'), 'PLD accountant has no replace-one'),
    (dict(noise_multiplier=0.0), 'must be > 0'),
    (dict(clients_per_round=30), r'must be in \[1, 20\]'),
    (dict(delta=2.0), r'delta 2.0 must be in \(0, 1\)'),
  ],
)
def test_bad_settings_are_named(kwargs, match):
  settings = dict(
    noise_multiplier=1.0,
    clients_per_round=5,
    num_clients=20,
    rounds=3,
    delta=1e-5,
  )
  settings.update(kwargs)
  with pytest.raises(ValueError, match=match):
    privacy.epsilon(**settings)


def test_the_default_delta_is_below_one_over_the_population():
  assert privacy.default_delta(100) == pytest.approx(100**-1.1)
  assert privacy.default_delta(100) < 1 / 100


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
