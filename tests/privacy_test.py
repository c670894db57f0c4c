"""Tests for tff_methods.privacy: a DP run's (epsilon, delta)."""

import sys

import dp_accounting
from dp_accounting import pld
from dp_accounting import rdp
import numpy as np
import pytest

from tff_methods import privacy


def _accounted(accountant, event, delta):
  accountant.compose(event)
  return accountant.get_epsilon(delta)


def test_epsilon_is_dp_accountings_own_at_the_relations_sensitivity():
  # Noise 1.0 x clip, 5 of 20 clients, 3 rounds, delta 1e-5. Poisson
  # cohorts, add-or-remove-one: the sum moves by at most one clip, so
  # dp_accounting's multiplier (noise over l2-sensitivity) is 1.0.
  # Fixed-size cohorts, replace-one: one clipped update replaced by
  # another moves the sum by up to 2 clips: the multiplier is 0.5.
  def rounds_of(sampled):
    return dp_accounting.SelfComposedDpEvent(sampled, 3)

  fixed = rounds_of(
    dp_accounting.SampledWithoutReplacementDpEvent(
      20, 5, dp_accounting.GaussianDpEvent(0.5)
    )
  )
  poisson = rounds_of(
    dp_accounting.PoissonSampledDpEvent(
      0.25, dp_accounting.GaussianDpEvent(1.0)
    )
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
  # The figures: 16.30 (fixed), 4.42 (Poisson, RDP), 3.81 (Poisson, PLD).
  assert [round(v, 2) for v in expected.values()] == [16.30, 4.42, 3.81]


def test_replace_one_counts_the_noise_for_half():
  # 10 of 100 clients, noise 1.0, 100 rounds: the replace-one figure is
  # the figure of noise 0.5 under the unhalved accounting (83.9, not 14.1).
  assert privacy.epsilon(
    1.0, 10, 100, 100, 1e-5, sampling='without_replacement'
  ) == pytest.approx(83.94, abs=0.01)
  assert privacy.accounted_noise_multiplier(1.0, 'without_replacement') == 0.5
  assert privacy.accounted_noise_multiplier(1.0, 'poisson') == 1.0
  # Epsilon 2 there needs twice the noise the unhalved accounting said
  # (4.51).
  assert privacy.calibrate_noise_multiplier(
    2.0, 10, 100, 100, 1e-5, sampling='without_replacement'
  ) == pytest.approx(9.02, abs=0.01)


def test_every_client_every_round_is_the_gaussian_mechanism_by_hand():
  # m = N: no sampling. Replace-one, sensitivity Delta = 2C, noise sigma =
  # zC: RDP alpha Delta^2 / (2 sigma^2) = 2 alpha / z^2 a round; add-or-
  # remove-one (Poisson at q = 1), Delta = C: alpha / (2 z^2).
  z, rounds, delta = 1.1, 60, 1e-5
  orders = np.array(rdp.rdp_privacy_accountant.DEFAULT_RDP_ORDERS)
  for sampling, sensitivity in (('without_replacement', 2.0), ('poisson', 1.0)):
    by_hand = rdp.rdp_privacy_accountant.compute_epsilon(
      orders, rounds * orders * sensitivity**2 / (2 * z**2), delta
    )[0]
    assert privacy.epsilon(
      z, 10, 10, rounds, delta, sampling=sampling, accountant='rdp'
    ) == pytest.approx(by_hand, rel=1e-9)
  # 165.0 replace-one; 57.0 add-or-remove-one.
  assert privacy.epsilon(
    z, 10, 10, rounds, delta, sampling='without_replacement'
  ) == pytest.approx(164.96, abs=0.01)


def test_the_default_is_poisson_sampling_accounted_with_pld():
  assert privacy.epsilon(1.0, 5, 20, 3, 1e-5) == privacy.epsilon(
    1.0, 5, 20, 3, 1e-5, sampling='poisson', accountant='pld'
  )
  assert privacy.default_accountant('without_replacement') == 'rdp'


def test_the_tff_pipeline_docs_dp_run_is_about_epsilon_30():
  # 4 of 4 clients a round (Poisson at q = 1), noise 0.3, 2 rounds.
  assert privacy.epsilon(0.3, 4, 4, 2, 1e-5) == pytest.approx(30.5, abs=0.05)


def test_epsilon_grows_with_rounds_and_falls_with_noise():
  by_rounds = [
    privacy.epsilon(1.0, 5, 20, t, 1e-5, accountant='rdp')
    for t in (0, 1, 3, 10)
  ]
  assert by_rounds[0] == 0.0
  assert by_rounds == sorted(by_rounds) and len(set(by_rounds)) == 4
  by_noise = [
    privacy.epsilon(z, 5, 20, 3, 1e-5, accountant='rdp')
    for z in (0.7, 1.0, 2.0)
  ]
  assert by_noise == sorted(by_noise, reverse=True)


@pytest.mark.parametrize(
  'sampling, accountant, target',
  [
    ('without_replacement', 'rdp', 4.0),
    ('poisson', 'rdp', 2.0),
    ('poisson', 'pld', 2.0),
  ],
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
    (
      dict(sampling='without_replacement', accountant='pld'),
      'PLD accountant has no replace-one',
    ),
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
