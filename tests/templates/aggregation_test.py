"""Tests for tff_methods.templates.aggregation: the methods with TFF's four
aggregator families, on digits (one method of each way a process aggregates).

Each method is built from its own module's builder with TFF's
`model_aggregator` and trained two rounds from the same weights on the same
clients (a user's plain Keras model, named by `model_lib.named_outputs`):

- `tff.learning.robust_aggregator()`: each client's update is clipped to
  the clipping norm (1.0 in the first round) before the mean, so the first
  global move is at most 1.0, while the plain mean moves further.
- DP (unweighted: the process averages uniformly, as TFF's
  `build_unweighted_fed_avg`): with no noise and a huge clip it equals the
  uniform mean; with a small clip the first move is at most the clip, and
  with noise it differs from the same run without noise.
  `tff.learning.dp_aggregator(...)` itself (adaptive clip) runs too.
- `tff.learning.compression_aggregator()` (no clipping or zeroing): the
  weighted mean within its 8-bit quantization of the large tensor.
- `tff.learning.secure_aggregator()` (no clipping or zeroing): the
  weighted mean within its 32-bit quantization, under the project's runtime
  (its secure intrinsics compiled to their plain bodies).
"""

import dataclasses
import sys

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_methods import privacy
from tff_methods.algorithms import fed2
from tff_methods.algorithms import fedavg
from tff_methods.algorithms import fedcos
from tff_methods.algorithms import moon
from tff_methods.algorithms import scaffold
from tff_methods.clients import client_keys
from tff_methods.templates import aggregation
from tff_methods.templates import model_lib
from tff_methods.templates import optimizers
from tff_methods_tasks import datasets
from tff_methods_tooling import experiment

pytestmark = pytest.mark.usefixtures('tff_worker')

NUM_CLIENTS = 3
LEARNING_RATE = 0.3


def _plain_model():
  # 64 x 320 = 20,480 weights: over the 20,000 from which TFF's compression
  # aggregator quantizes a tensor.
  return tf.keras.Sequential(
    [
      tf.keras.Input((8, 8, 1)),
      tf.keras.layers.Flatten(),
      tf.keras.layers.Dense(320, activation='relu', name='hidden'),
      tf.keras.layers.Dense(16, name='projection'),
      tf.keras.layers.Dense(10, name='scores'),
    ]
  )


MODEL_FN = model_lib.named_outputs(
  _plain_model, features='hidden', z='projection', layers=['hidden']
)
FED2_MODEL_FN = fed2.grouped_model_fn(
  fed2.LayerPlan('fed2_mlp', (('fc', 40),), decouple_depth=2),
  10,
  (8, 8, 1),
  num_groups=2,
)


def _optimizer():
  return optimizers.build_client_sgd(LEARNING_RATE)


BUILDERS = {
  'fedavg': lambda fn, spec, data, **kw: fedavg.build_fedavg(
    fn, spec, client_optimizer_fn=_optimizer(), dataset_computation=data, **kw
  ),
  'tff_fedavg': lambda fn, spec, data, **kw: (
    tff.simulation.compose_dataset_computation_with_learning_process(
      data,
      fedavg.build_tff_fedavg(fn, spec, client_optimizer_fn=_optimizer(), **kw),
    )
  ),
  'fedcos': lambda fn, spec, data, **kw: fedcos.build_fedcos(
    fn,
    spec,
    client_optimizer_fn=_optimizer(),
    mu=0.1,
    dataset_computation=data,
    **kw,
  ),
  'scaffold': lambda fn, spec, data, **kw: scaffold.build_scaffold(
    fn,
    spec,
    dataset_computation=data,
    client_learning_rate=LEARNING_RATE,
    num_clients=4,
    **kw,
  ),
  'moon': lambda fn, spec, data, **kw: moon.build_moon(
    fn,
    spec,
    dataset_computation=data,
    client_optimizer_fn=_optimizer(),
    mu=1.0,
    **kw,
  ),
  'fed2': lambda fn, spec, data, **kw: fed2.build_fed2(
    fn,
    spec,
    client_optimizer_fn=_optimizer(),
    num_groups=2,
    dataset_computation=data,
    **kw,
  ),
}


@pytest.fixture(scope='module')
def setup(digits_task):
  batches = datasets.LocalBatches(batch_size=32, local_epochs=1, seed=0)
  client_data = digits_task.client_data
  return dict(
    spec=batches.element_spec(client_data.element_type_structure),
    data=datasets.round_dataset_computation(client_data, batches),
    ids=client_data.client_ids[:NUM_CLIENTS],
  )


def _run(method, setup, rounds=2, **aggregation):
  """Each round's flat trainable weights, the first being the initial."""
  model_fn = FED2_MODEL_FN if method == 'fed2' else MODEL_FN
  process = BUILDERS[method](
    model_fn, setup['spec'], setup['data'], **aggregation
  )
  state = process.set_model_weights(
    process.initialize(), model_lib.initial_weights(model_fn, 0)
  )
  weights = [model_lib.flat_trainable(process.get_model_weights(state))]
  measurements = []
  for round_num in range(1, rounds + 1):
    output = process.next(
      state, [client_keys.client_key(c, round_num) for c in setup['ids']]
    )
    state = output.state
    weights.append(model_lib.flat_trainable(process.get_model_weights(state)))
    measurements.append(output.metrics['aggregator'])
  return weights, measurements


def _first_move(weights):
  return float(np.linalg.norm(weights[1] - weights[0]))


UNIFORM = tff.learning.ClientWeighting.UNIFORM


# The plain mean's runs, by (method, uniform weighting): shared by the tests.
_CACHE = {}


def _mean_run(method, setup, uniform):
  key = (method, uniform)
  if key not in _CACHE:
    _CACHE[key] = _run(
      method, setup, client_weighting=(UNIFORM if uniform else None)
    )[0]
  return _CACHE[key]


# One method of each way a process aggregates: the shared loop without and
# with server state (FedProx, FedMAX: FedAvg's path with another term), the
# stateful loop (FedCKA: MOON's), SCAFFOLD's, Fed2's and TFF's own
# processes.
AGGREGATION_PATHS = [
  'fedavg',
  'fedcos',
  'moon',
  'scaffold',
  'fed2',
  'tff_fedavg',
]


@pytest.mark.parametrize('method', AGGREGATION_PATHS)
def test_robust_aggregator_clips_each_update_to_its_norm(method, setup):
  weights, measurements = _run(
    method, setup, model_aggregator=tff.learning.robust_aggregator()
  )
  mean = _mean_run(method, setup, uniform=False)
  norm = float(measurements[0]['zeroing']['clipping_norm'])
  assert norm == pytest.approx(1.0)  # TFF's initial clipping norm
  assert _first_move(mean) > 1.3 * norm  # the updates are far above it
  assert int(measurements[0]['zeroing']['clipped_count']) > 0
  assert _first_move(weights) <= norm * (1 + 1e-5)
  assert np.all(np.isfinite(weights[-1]))


@pytest.mark.parametrize('method', AGGREGATION_PATHS)
def test_dp_aggregator_without_noise_or_clip_is_the_uniform_mean(method, setup):
  weights, _ = _run(
    method,
    setup,
    model_aggregator=tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed(
      noise_multiplier=0.0, clients_per_round=NUM_CLIENTS, clip=1e6
    ),
  )
  np.testing.assert_allclose(
    weights[-1], _mean_run(method, setup, True)[-1], rtol=1e-5, atol=1e-6
  )


@pytest.mark.parametrize('method', AGGREGATION_PATHS)
def test_dp_aggregator_clip_bounds_the_move_and_noise_changes_it(method, setup):
  clip = 0.05

  def dp(noise):
    return _run(
      method,
      setup,
      model_aggregator=(
        tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed(
          noise_multiplier=noise, clients_per_round=NUM_CLIENTS, clip=clip
        )
      ),
    )[0]

  quiet, noisy = dp(0.0), dp(1.0)
  assert 0 < _first_move(quiet) <= clip * (1 + 1e-5)
  assert np.abs(noisy[-1] - quiet[-1]).max() > 1e-4
  assert np.all(np.isfinite(noisy[-1]))


@pytest.mark.parametrize('method', ['fedavg', 'moon', 'scaffold'])
def test_tff_dp_aggregator_runs_with_uniform_weighting(method, setup):
  weights, measurements = _run(
    method,
    setup,
    model_aggregator=tff.learning.dp_aggregator(
      noise_multiplier=0.1, clients_per_round=NUM_CLIENTS
    ),
  )
  clip = float(measurements[0]['zeroing']['dp_query_metrics']['clip'])
  assert 0 < clip < 1  # TFF's adaptive clip, from 0.1
  assert np.all(np.isfinite(weights[-1]))
  with pytest.raises(ValueError, match='unweighted factory'):
    _run(
      method,
      setup,
      rounds=0,
      model_aggregator=tff.learning.dp_aggregator(0.1, NUM_CLIENTS),
      client_weighting=tff.learning.ClientWeighting.NUM_EXAMPLES,
    )


def test_the_adaptive_clips_knobs_reach_tffs_dp_query():
  # From the experiment's settings, through the method's hyperparameters.
  config = experiment.ExperimentConfig(
    task='digits',
    clients_per_round=10,
    aggregator='dp',
    dp_noise_multiplier=0.3,
    dp_clipped_count_stddev=0.7,
    dp_target_quantile=0.8,
  )
  factory = config.hyperparameters(20).model_aggregator()
  value_type = tff.TensorType(np.float32, [3])
  state = factory.create(value_type).initialize()
  query = state.query_state.numerator_state
  quantile = query.quantile_estimator_state
  assert quantile.target_quantile == pytest.approx(0.8)
  assert quantile.below_estimate_state.numerator_state.stddev == (
    pytest.approx(0.7)
  )
  # The updates' noise is Andrew et al.'s split of the 0.3 asked for.
  assert query.noise_multiplier == pytest.approx(
    privacy.value_noise_multiplier(0.3, 10, 0.7)
  )
  # Set to TFF's own defaults (0.05 x 10 clients, 0.5), the knobs build
  # the query TFF's dp_aggregator builds, behind a fixed zeroing of
  # non-finite norms instead of TFF's noise-free adaptive one.
  at_tff_defaults = dataclasses.replace(
    config, dp_clipped_count_stddev=0.5, dp_target_quantile=0.5
  )
  ours = at_tff_defaults.hyperparameters(20).model_aggregator()
  assert isinstance(ours, aggregation.ZeroingNonFiniteNorms)
  assert str(ours.create(value_type).initialize()) == str(
    tff.learning.dp_aggregator(0.3, 10, zeroing=False)
    .create(value_type)
    .initialize()
  )


@pytest.mark.parametrize('clip', [None, 1.0])
def test_a_dp_round_zeroes_an_update_whose_norm_overflows(clip):
  # Entries of 2e19 are finite; their squares are not. Unzeroed, the clip
  # scales the update by clip / inf: NaN, and the round is void. (TFF's
  # own zeroing_factory, at any finite norm, lets it through in the
  # worker.)
  factory = aggregation.build_model_aggregator(
    'dp', noise_multiplier=0.0, clients_per_round=3, clip=clip
  )
  process = factory.create(tff.TensorType(np.float32, [2]))
  values = [
    np.array([0.3, 0.4], np.float32),
    np.array([2e19, 2e19], np.float32),
    np.array([0.0, 0.1], np.float32),
  ]
  output = process.next(process.initialize(), values)
  assert np.all(np.isfinite(output.result))
  # Without noise: the other two clients' clipped sum over the 3 expected.
  if clip is not None:
    np.testing.assert_allclose(output.result, [0.1, 0.5 / 3], rtol=1e-5)


@pytest.mark.parametrize('method', AGGREGATION_PATHS)
def test_compression_aggregator_is_the_mean_within_quantization(method, setup):
  weights, _ = _run(
    method,
    setup,
    model_aggregator=tff.learning.compression_aggregator(
      zeroing=False, clipping=False, weighted=False
    ),
  )
  mean = _mean_run(method, setup, uniform=True)
  # 8-bit quantization with stochastic rounding of each client's update of
  # the large tensor: the first round's mean is off by less than one step
  # of the update's range (/ 255). (Later rounds train from other weights.)
  step = np.ptp(mean[1] - mean[0]) / 255
  difference = np.abs(weights[1] - mean[1])
  assert difference.max() <= step
  if method != 'fed2':  # its model has no tensor large enough
    assert difference.max() > 0  # something was quantized
  assert np.all(np.isfinite(weights[-1]))


@pytest.mark.parametrize('method', AGGREGATION_PATHS)
def test_secure_aggregator_is_the_mean_within_quantization(method, setup):
  weights, _ = _run(
    method,
    setup,
    model_aggregator=tff.learning.secure_aggregator(
      zeroing=False, clipping=False, weighted=False
    ),
  )
  # Values in [-100, 100] (TFF's initial bound) on 32 bits: steps of 5e-8.
  np.testing.assert_allclose(
    weights[-1], _mean_run(method, setup, uniform=True)[-1], rtol=0, atol=1e-5
  )


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
