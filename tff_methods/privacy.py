"""Client-level differential privacy: the (epsilon, delta) of a DP run.

Under TFF's DP aggregators (`tff.learning.dp_aggregator`, adaptive clip;
`tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed`, fixed clip)
each round is a Gaussian mechanism on the sum of the sampled clients'
clipped updates (norm at most C), with noise of standard deviation
`noise_multiplier` x C: the unit of privacy is one client's whole data.
`epsilon` accounts for `rounds` such rounds with `dp_accounting` (Google's
accountants, a TFF dependency), whose Gaussian noise multiplier is the
noise's standard deviation over the query's l2-sensitivity. That
sensitivity depends on the neighbouring relation, which the sampling
fixes:

- 'poisson' (the binaries' default under DP): each client takes part with
  probability clients_per_round / num_clients. Accounted under
  add-or-remove-one adjacency (one client's data present or absent), where
  the sum's sensitivity is C: the accounted multiplier is
  `noise_multiplier`, with the RDP or the PLD accountant (PLD is tighter).
  This is DP-FedAvg's analysis (McMahan et al., "Learning Differentially
  Private Recurrent Language Models", ICLR 2018,
  https://arxiv.org/abs/1710.06963).
- 'without_replacement': a fixed number of clients each round, drawn without
  replacement. Accounted with the RDP accountant under replace-one
  adjacency (one client's data replaced by another's; the population size
  is public), the only relation `dp_accounting` supports for this
  sampling. Replacing one clipped update by another moves the sum by up to
  2C, so the accounted multiplier is `noise_multiplier / 2`
  (`SENSITIVITY_IN_CLIPS`). With every client in every round (m = N) this
  is the plain Gaussian mechanism: RDP alpha (2C)^2 / (2 (zC)^2) a round.

Amplification by sampling assumes the cohorts are secret: the binaries
draw a DP run's sampling seed from the operating system's entropy unless
the user fixes it.

With TFF's adaptive clip part of the budget goes to the clipped-count query
(Andrew et al., "Differentially Private Learning with Adaptive Clipping",
NeurIPS 2021, https://arxiv.org/abs/1905.03871): TFF noises the updates
with the larger `value_noise_multiplier` so that the whole round's
effective noise multiplier is the `noise_multiplier` asked for, which is
the one to account. The count query's sensitivity doubles under replace-one
as the sum's does (a client's -1/2 becomes +1/2), so the same halving holds
for the round as a whole.
"""

import functools
from typing import Any, Mapping, Optional, Sequence

import dp_accounting
from dp_accounting import pld
from dp_accounting import rdp
import numpy as np

from tff_methods.clients import client_keys

ACCOUNTANTS = ('rdp', 'pld')
# What a DP run samples and accounts with unless told otherwise: Poisson
# sampling under add-or-remove-one, DP-FedAvg's analysis, with the tighter
# of dp_accounting's accountants.
DEFAULT_SAMPLING = 'poisson'


def default_accountant(sampling: str) -> str:
  """PLD where dp_accounting has it for `sampling` (Poisson), else RDP."""
  return 'pld' if sampling == 'poisson' else 'rdp'


# The l2-sensitivity of a round's noised sum, in clips, under each
# sampling's neighbouring relation.
SENSITIVITY_IN_CLIPS = {'poisson': 1.0, 'without_replacement': 2.0}


def adjacency(sampling: str) -> str:
  """The neighbouring relation `epsilon` accounts `sampling` under."""
  if sampling == 'without_replacement':
    return 'replace-one'
  return 'add-or-remove-one'


def accounted_noise_multiplier(noise_multiplier: float, sampling: str) -> float:
  """The multiplier `dp_accounting` is given: the noise's standard deviation
  over the sensitivity of the round's sum under `sampling`'s relation
  (`noise_multiplier / 2` under replace-one)."""
  return noise_multiplier / SENSITIVITY_IN_CLIPS[sampling]


def default_delta(num_clients: int) -> float:
  """1 / num_clients^1.1: a delta must be well below 1 / N for a guarantee
  over N clients to protect each of them; N^-1.1 is a common convention."""
  return 1.0 / num_clients**1.1


def value_noise_multiplier(
  noise_multiplier: float,
  clients_per_round: int,
  clipped_count_stddev: Optional[float] = None,
) -> float:
  """The noise TFF's adaptive clip puts on the updates (over the clip).

  Andrew et al.'s split, as TFF computes it: the clipped-count query has
  noise `clipped_count_stddev` (0.05 x clients_per_round by default) on a
  sensitivity of 1/2, and `(z_v^-2 + (2 sigma_b)^-2)^-1/2 = z`.

  Raises:
    ValueError: a clipped-count noise too small for `noise_multiplier`
      (TFF refuses it too).
  """
  if noise_multiplier == 0:
    return 0.0
  if clipped_count_stddev is None:
    clipped_count_stddev = 0.05 * clients_per_round
  if noise_multiplier >= 2 * clipped_count_stddev:
    raise ValueError(
      f'noise multiplier {noise_multiplier} needs a clipped-count noise '
      f'above {noise_multiplier / 2:g}, got {clipped_count_stddev:g}.'
    )
  return (noise_multiplier**-2 - (2 * clipped_count_stddev) ** -2) ** -0.5


def _event(noise_multiplier, clients_per_round, num_clients, rounds, sampling):
  gaussian = dp_accounting.GaussianDpEvent(
    accounted_noise_multiplier(noise_multiplier, sampling)
  )
  if sampling == 'poisson':
    sampled = dp_accounting.PoissonSampledDpEvent(
      clients_per_round / num_clients, gaussian
    )
  else:
    sampled = dp_accounting.SampledWithoutReplacementDpEvent(
      num_clients, clients_per_round, gaussian
    )
  return dp_accounting.SelfComposedDpEvent(sampled, rounds)


def check_settings(
  noise_multiplier: float,
  clients_per_round: int,
  num_clients: int,
  rounds: int,
  delta: float,
  sampling: str,
  accountant: str,
) -> None:
  """Raises ValueError naming a bad setting and what is allowed."""
  client_keys.check_sampling(sampling)
  if accountant not in ACCOUNTANTS:
    raise ValueError(
      f'accountant {accountant!r} is unknown; choose one of '
      f'{", ".join(ACCOUNTANTS)}.'
    )
  if sampling == 'without_replacement' and accountant == 'pld':
    raise ValueError(
      "dp_accounting's PLD accountant has no replace-one adjacency, which "
      'sampling without replacement needs: use the RDP accountant, or '
      'Poisson sampling.'
    )
  if not noise_multiplier > 0:
    raise ValueError(
      f'noise multiplier {noise_multiplier} gives no privacy guarantee; '
      'it must be > 0.'
    )
  if not 1 <= clients_per_round <= num_clients:
    raise ValueError(
      f'clients per round {clients_per_round} must be in [1, {num_clients}] '
      '(the number of clients).'
    )
  if rounds < 0:
    raise ValueError(f'rounds {rounds} must be >= 0.')
  if not 0 < delta < 1:
    raise ValueError(f'delta {delta} must be in (0, 1).')


def epsilon(
  noise_multiplier: float,
  clients_per_round: int,
  num_clients: int,
  rounds: int,
  delta: Optional[float] = None,
  sampling: str = DEFAULT_SAMPLING,
  accountant: Optional[str] = None,
) -> float:
  """The client-level epsilon of `rounds` DP rounds, at `delta`.

  Args:
    noise_multiplier: The (effective) noise over the clip, as given to TFF's
      DP aggregator.
    clients_per_round: The clients sampled each round (expected, Poisson).
    num_clients: The population they are sampled from.
    rounds: Rounds run so far.
    delta: `default_delta(num_clients)` when None.
    sampling: 'poisson' (add-or-remove-one) or 'without_replacement'
      (fixed-size cohorts, replace-one: the noise counts for half).
    accountant: 'rdp' or 'pld' (Poisson only); None for
      `default_accountant(sampling)`.

  Raises:
    ValueError: a bad setting (`check_settings`).
  """
  delta = default_delta(num_clients) if delta is None else delta
  accountant = accountant or default_accountant(sampling)
  check_settings(
    noise_multiplier,
    clients_per_round,
    num_clients,
    rounds,
    delta,
    sampling,
    accountant,
  )
  if rounds == 0:
    return 0.0
  if accountant == 'pld':
    privacy_accountant = _new_accountant('pld', sampling)
    privacy_accountant.compose(
      _event(noise_multiplier, clients_per_round, num_clients, rounds, sampling)
    )
    return float(privacy_accountant.get_epsilon(delta))
  orders, one_round = _one_round_rdp(
    noise_multiplier, clients_per_round, num_clients, sampling
  )
  return float(
    rdp.rdp_privacy_accountant.compute_epsilon(
      orders, rounds * one_round, delta
    )[0]
  )


def composed_epsilon(
  runs: Sequence[Mapping[str, Any]],
  delta: float,
  accountant: Optional[str] = None,
) -> float:
  """The client-level epsilon of publishing every one of `runs`, at `delta`.

  Runs on the same clients (an arm of a comparison over seeds) compose:
  together they tell more of a client than any one does. Each run is a
  mapping with `epsilon`'s arguments (noise_multiplier, clients_per_round,
  num_clients, rounds, sampling), as a run's results.json records them.

  Raises:
    ValueError: runs of different samplings (their relations differ), no
      runs, or a bad setting.
  """
  samplings = {run['sampling'] for run in runs}
  if len(samplings) != 1:
    raise ValueError(
      'runs to compose must share one sampling (one neighbouring '
      f'relation), got {sorted(samplings) or "no runs"}.'
    )
  (sampling,) = samplings
  accountant = accountant or default_accountant(sampling)
  events = []
  for run in runs:
    check_settings(
      run['noise_multiplier'],
      run['clients_per_round'],
      run['num_clients'],
      run['rounds'],
      delta,
      sampling,
      accountant,
    )
    events.append(
      _event(
        run['noise_multiplier'],
        run['clients_per_round'],
        run['num_clients'],
        run['rounds'],
        sampling,
      )
    )
  composer = _new_accountant(accountant, sampling)
  composer.compose(dp_accounting.ComposedDpEvent(events))
  return float(composer.get_epsilon(delta))


def _new_accountant(accountant: str, sampling: str):
  """An empty dp_accounting accountant of `accountant`'s kind, under
  `sampling`'s neighbouring relation."""
  if accountant == 'pld':
    return pld.PLDAccountant(value_discretization_interval=_PLD_DISCRETIZATION)
  return rdp.RdpAccountant(
    neighboring_relation=(
      dp_accounting.NeighboringRelation.REPLACE_ONE
      if sampling == 'without_replacement'
      else dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
    )
  )


# PLD's loss discretization: 1e-3 gives the epsilon of TFF's default 1e-4
# to four decimals here (a pessimistic estimate either way), ten times
# faster.
_PLD_DISCRETIZATION = 1e-3


@functools.lru_cache(maxsize=64)
def _one_round_rdp(noise_multiplier, clients_per_round, num_clients, sampling):
  """The RDP of one round at the accountant's orders: `rounds` rounds have
  `rounds` times it (composition), so a run's epsilon round by round costs
  one RDP computation, not one a round."""
  accountant = _new_accountant('rdp', sampling)
  accountant.compose(
    _event(noise_multiplier, clients_per_round, num_clients, 1, sampling)
  )
  # dp_accounting 0.4.3 (pinned) keeps the orders and their RDP here.
  return tuple(accountant._orders), np.asarray(accountant._rdp)  # pylint: disable=protected-access


def calibrate_noise_multiplier(
  target_epsilon: float,
  clients_per_round: int,
  num_clients: int,
  rounds: int,
  delta: Optional[float] = None,
  sampling: str = DEFAULT_SAMPLING,
  accountant: Optional[str] = None,
  tolerance: float = 1e-3,
) -> float:
  """The smallest noise multiplier (within `tolerance`, relative) whose
  `epsilon` is at most `target_epsilon`: a bisection from above, so the
  result never exceeds the target.

  Raises:
    ValueError: a bad setting, or a target no noise below 1e4 meets.
  """
  if not target_epsilon > 0:
    raise ValueError(f'target epsilon {target_epsilon} must be > 0.')

  def eps(z):
    return epsilon(
      z, clients_per_round, num_clients, rounds, delta, sampling, accountant
    )

  high, low = 1.0, 0.0
  while eps(high) > target_epsilon:
    high, low = 2 * high, high
    if high > 1e4:
      raise ValueError(
        f'no noise multiplier up to 1e4 meets epsilon {target_epsilon} over '
        f'{rounds} rounds of {clients_per_round} of {num_clients} clients: '
        'raise the target, or run fewer rounds.'
      )
  # epsilon falls as the noise grows: bisect between a noise that misses
  # the target (or 0) and one that meets it, keeping the one that meets it.
  while high - low > tolerance * high:
    middle = (low + high) / 2
    if eps(middle) <= target_epsilon:
      high = middle
    else:
      low = middle
  return high
