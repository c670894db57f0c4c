"""A `--aggregator=dp` run's privacy settings: checks, calibrated noise and
the client-level (epsilon, delta) it reports (`tff_methods.privacy`).

The settings are an `experiment.ExperimentConfig`'s `dp_*` fields,
`clients_per_round` and `client_sampling`. A run with `dp_target_epsilon`
trains with the smallest noise multiplier whose epsilon after `rounds`
rounds meets the target (found before any work); otherwise with
`dp_noise_multiplier`.

What a DP run releases is what its guarantee covers: the model (and its
evaluations on test data, which are not the clients' training data), the
epsilon, the adaptive clip (itself noised), and whether a round was
rejected; not the clients' un-noised training metrics nor the
aggregator's un-noised counts (`released_metrics`), nor the partition
report's per-client class counts, unless `dp_release_non_private` says
so. Its cohorts are drawn from a secret seed (`sampling_seed`), as
amplification by sampling assumes.
"""

import collections
import functools
import os
import secrets
from typing import Any, Mapping, Optional

from tff_methods import privacy
from tff_methods.algorithms import hyperparameters
from tff_methods.clients import client_keys
from tff_methods.templates import aggregation

_DEFAULT_NOISE = hyperparameters.Hyperparameters.dp_noise_multiplier


def check(config: Any, num_clients: Optional[int]) -> list[str]:
  """Each bad DP setting of `config`, as a line naming the flag to change.

  Args:
    config: An `experiment.ExperimentConfig`.
    num_clients: The population, or None when only the data tells it (the
      noise for a target epsilon is then checked when the run starts).
  """
  errors = []

  def need(ok, message):
    if not ok:
      errors.append(message)

  need(
    config.sampling() in client_keys.SAMPLINGS,
    f'--client_sampling={config.client_sampling!r} is unknown; choose one '
    f'of {", ".join(client_keys.SAMPLINGS)}',
  )
  need(
    config.accountant() in privacy.ACCOUNTANTS,
    f'--dp_accountant={config.dp_accountant!r} is unknown; choose one of '
    f'{", ".join(privacy.ACCOUNTANTS)}',
  )
  need(
    not (
      config.accountant() == 'pld'
      and config.sampling() == 'without_replacement'
    ),
    "--dp_accountant=pld needs --client_sampling=poisson: dp_accounting's "
    'PLD accountant has no replace-one adjacency, which sampling without '
    'replacement needs',
  )
  need(
    config.dp_noise_multiplier >= 0,
    f'--dp_noise_multiplier={config.dp_noise_multiplier} must be >= 0',
  )
  need(
    config.dp_clip is None or config.dp_clip > 0,
    f'--dp_clip={config.dp_clip} must be > 0',
  )
  need(
    config.dp_delta is None or 0 < config.dp_delta < 1,
    f'--dp_delta={config.dp_delta} must be in (0, 1)',
  )
  need(
    config.dp_clipped_count_stddev is None
    or config.dp_clipped_count_stddev > 0,
    f'--dp_clipped_count_stddev={config.dp_clipped_count_stddev} must be > 0',
  )
  need(
    0 < config.dp_target_quantile < 1,
    f'--dp_target_quantile={config.dp_target_quantile} must be in (0, 1)',
  )
  target = config.dp_target_epsilon
  if target is not None:
    need(target > 0, f'--dp_target_epsilon={target} must be > 0')
    need(
      config.aggregator == 'dp',
      f'--dp_target_epsilon={target} needs --aggregator=dp',
    )
    need(
      config.dp_noise_multiplier == _DEFAULT_NOISE,
      f'--dp_target_epsilon={target} sets the noise multiplier; drop '
      f'--dp_noise_multiplier={config.dp_noise_multiplier}',
    )
  if errors or config.aggregator != 'dp':
    return errors
  if target is not None and num_clients is None:
    return errors  # The noise is known once the data is.
  try:
    noise = noise_multiplier(config, num_clients)
  except ValueError as e:
    return [f'--dp_target_epsilon={target}: {e}']
  try:  # TFF's own checks of the DP settings, before any work.
    aggregation.build_model_aggregator(
      'dp',
      noise_multiplier=noise,
      clients_per_round=config.clients_per_round,
      clip=config.dp_clip,
      clipped_count_stddev=config.dp_clipped_count_stddev,
      target_unclipped_quantile=config.dp_target_quantile,
    )
  except ValueError as e:
    if target is None:
      errors.append(
        f'--aggregator=dp with --dp_noise_multiplier={noise} and '
        f'--clients_per_round={config.clients_per_round}: '
        + str(e)
        .replace('clients_per_round', '--clients_per_round')
        .replace('clipped_count_stddev', '--dp_clipped_count_stddev')
        .replace('lower noise_multiplier', 'lower --dp_noise_multiplier')
        .replace('(clip=...)', '(--dp_clip)')
      )
    else:
      errors.append(
        f'--dp_target_epsilon={target} over --rounds={config.rounds} needs '
        f'noise multiplier {noise:.4g}, which adaptive clipping with '
        f"--clients_per_round={config.clients_per_round} can't take ("
        + str(e).split(' needs ', 1)[1].split(':', 1)[0]
        + '): raise --clients_per_round or --dp_clipped_count_stddev, fix '
        'the clip (--dp_clip), run fewer --rounds, or raise '
        '--dp_target_epsilon'
      )
  return errors


def noise_multiplier(config: Any, num_clients: Optional[int]) -> float:
  """The noise multiplier the run trains with.

  Raises:
    ValueError: a target epsilon no noise multiplier meets, or another
      bad setting (`privacy.check_settings`).
  """
  if config.dp_target_epsilon is None:
    return config.dp_noise_multiplier
  return _calibrated(
    config.dp_target_epsilon,
    config.clients_per_round,
    num_clients,
    config.rounds,
    delta(config, num_clients),
    config.sampling(),
    config.accountant(),
  )


@functools.lru_cache(maxsize=64)
def _calibrated(target, clients_per_round, num_clients, rounds, *args):
  return privacy.calibrate_noise_multiplier(
    target, clients_per_round, num_clients, rounds, *args
  )


def delta(config: Any, num_clients: int) -> float:
  """`--dp_delta`, or `privacy.default_delta` of the population."""
  return config.dp_delta or privacy.default_delta(num_clients)


def guarantee(config: Any, num_clients: int, rounds: int) -> Optional[dict]:
  """A DP run's client-level (epsilon, delta) after `rounds`, for the way
  its clients are drawn (`--client_sampling`) and its accountant; None for
  other aggregators. Without noise there is no guarantee: epsilon is None.
  """
  if config.aggregator != 'dp':
    return None
  noise = noise_multiplier(config, num_clients)
  at_delta = delta(config, num_clients)
  reported = dict(
    epsilon=(
      privacy.epsilon(
        noise,
        config.clients_per_round,
        num_clients,
        rounds,
        at_delta,
        config.sampling(),
        config.accountant(),
      )
      if noise > 0
      else None
    ),
    delta=at_delta,
    noise_multiplier=noise,
    clients_per_round=config.clients_per_round,
    num_clients=num_clients,
    rounds=rounds,
    sampling=config.sampling(),
    adjacency=privacy.adjacency(config.sampling()),
    accountant=config.accountant(),
    cohorts=cohorts(config),
  )
  if config.dp_target_epsilon is not None:
    reported['target_epsilon'] = config.dp_target_epsilon
  return reported


# The round metrics a DP run writes: the evaluation, the guarantee, the
# round's time and whether it was rejected (both functions of the noised
# model), and the DP query's own measurements (TFF's adaptive clip, from
# a noised count).
_RELEASED = ('eval', 'dp', 'seconds', 'rejected')
_DP_QUERY_METRICS = 'dp_query_metrics'


def released_metrics(metrics: Mapping[str, Any]) -> collections.OrderedDict:
  """The part of a DP round's metrics its guarantee covers (`_RELEASED`
  and every `dp_query_metrics` entry, wherever the process nests it)."""

  def dp_query_parts(tree):
    found = collections.OrderedDict()
    for key, value in tree.items():
      if key == _DP_QUERY_METRICS:
        found[key] = value
      elif isinstance(value, Mapping):
        inner = dp_query_parts(value)
        if inner:
          found[key] = inner
    return found

  released = collections.OrderedDict(
    (k, v) for k, v in metrics.items() if k in _RELEASED
  )
  released.update(
    dp_query_parts({k: v for k, v in metrics.items() if k not in _RELEASED})
  )
  return released


def released_metrics_fn(config: Any):
  """`training_loop.run_training`'s filter for `config`'s run: None (all
  metrics) unless it is a DP run that keeps its training metrics private."""
  if config.aggregator != 'dp' or config.dp_release_non_private:
    return None
  return released_metrics


SAMPLING_SEED_FILE = 'sampling_seed.secret'


def sampling_seed(config: Any) -> Optional[int]:
  """The seed of the run's cohorts, if not `config.seed`.

  `--sampling_seed` when given. A DP run otherwise draws one from the
  operating system's entropy when it starts and keeps it in
  `<output_dir>/sampling_seed.secret` (readable by its owner only), which a
  resumed run reads: published with the run, it would void the
  amplification by sampling its epsilon counts on.
  """
  if config.sampling_seed is not None:
    return config.sampling_seed
  if config.aggregator != 'dp':
    return None
  path = os.path.join(config.output_dir, SAMPLING_SEED_FILE)
  if os.path.exists(path):
    with open(path) as f:
      return int(f.read())
  seed = secrets.randbits(63)
  os.makedirs(config.output_dir, exist_ok=True)
  descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
  with os.fdopen(descriptor, 'w') as f:
    f.write(str(seed))
  return seed


def cohorts(config: Any) -> str:
  """What a DP run's guarantee assumes of its cohorts, in words."""
  if config.sampling_seed is None:
    return (
      f'drawn from a secret seed ({SAMPLING_SEED_FILE} in the output '
      'directory: do not publish it)'
    )
  return (
    f'fixed by --sampling_seed={config.sampling_seed}: the epsilon assumes '
    'the cohorts are secret, which a known seed voids'
  )
