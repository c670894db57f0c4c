"""Tests for tff_methods_tooling.benchmark_floors: the least time each
method's extra work can take beside FedAvg's."""

import sys

import numpy as np
import pytest

from tff_methods_tooling import benchmark_floors
from tff_methods_tooling import benchmark_report
from tff_methods_tooling import floor_timing
from tff_methods_tooling import floors_on_outputs
from tff_methods_tooling import floors_on_weights

pytestmark = pytest.mark.usefixtures('tff_worker')


def test_fedcka_floor_is_its_extra_work_over_fedavgs_share():
  # 10 clients in a 2 s FedAvg round: 200 ms each; 50 ms more each.
  assert np.isclose(benchmark_floors.floor_ratio(0.05, 2.0, 10), 1.25)
  results = dict(
    settings=dict(
      num_clients=10, repeats=3, batch_size=64, max_concurrent_clients=2
    ),
    models={
      'fedcka_cnn': dict(
        examples_per_client=500,
        local_epochs=5,
        peak_mb=1500.0,
        methods={
          'fedavg': dict(median=2.0, ratio=1.0),
          'fedcka': dict(median=2.6, ratio=1.3),
        },
        fedcka_extra=dict(
          reference_passes_seconds=0.03, grams_seconds=0.02, extra_seconds=0.05
        ),
      )
    },
  )
  text = benchmark_report.report_markdown(results)
  assert (
    "reference passes 30 ms and the Gram products on each batch's rows "
    'of the reference tables 20 ms, against '
    "FedAvg's 200 ms per client: FedCKA cannot go below 1.25 of "
    'FedAvg here. It ran at 1.30: 0.05 above its floor (target <= '
    '0.07 above: yes).'
  ) in text
  # With its floor measured, the table's target is the floor + 0.07.
  assert '| fedcka | 2.60 | 1.30 |  | <= 1.32 (floor + 0.07) | yes |' in text
  # MOON: 10 + 2 ms more per client, 1.06 at best; it ran at 1.2.
  results['models']['fedcka_cnn']['methods']['moon'] = dict(
    median=2.4, ratio=1.2
  )
  results['models']['fedcka_cnn']['moon_extra'] = dict(
    reference_passes_seconds=0.01,
    contrastive_seconds=0.002,
    extra_seconds=0.012,
  )
  text = benchmark_report.report_markdown(results)
  assert (
    "reference passes 10 ms and the contrastive terms on each batch's "
    'rows of the reference tables 2 ms, against '
    "FedAvg's 200 ms per client: MOON cannot go below 1.06 of FedAvg "
    'here. It ran at 1.20: 0.14 above its floor (target <= 0.07 '
    'above: **no**).'
  ) in text
  assert '| moon | 2.40 | 1.20 |  | <= 1.13 (floor + 0.07) | **no** |' in text
  # The table and the sentence judge the same unrounded gap: 1.1301 is
  # 0.0701 above the floor of 1.06.
  results['models']['fedcka_cnn']['methods']['moon']['ratio'] = 1.1301
  text = benchmark_report.report_markdown(results)
  assert '| moon | 2.40 | 1.13 |  | <= 1.13 (floor + 0.07) | **no** |' in text
  assert '0.07 above its floor (target <= 0.07 above: **no**)' in text
  results['models']['fedcka_cnn']['methods']['moon']['ratio'] = 1.03
  assert (
    'It ran at 1.03: 0.03 below its floor, within the noise (target '
    '<= 0.07 above: yes).'
  ) in benchmark_report.report_markdown(results)
  del results['models']['fedcka_cnn']['fedcka_extra']
  assert "FedCKA's floor" not in benchmark_report.report_markdown(results)


def test_fedcka_extra_work_is_timed_on_the_models_shapes():
  # 6 examples in batches of 4: one full step, then one of 2 rows.
  figures = floors_on_outputs.fedcka_extra_seconds(
    'fedcka_cnn',
    10,
    (32, 32, 3),
    examples_per_client=6,
    batch_size=4,
    local_epochs=1,
    repeats=1,
  )
  # Each part timed (0 where it costs no more than a call, which comes off).
  assert figures['reference_passes_seconds'] >= 0
  assert figures['grams_seconds'] >= 0
  assert np.isclose(
    figures['extra_seconds'],
    figures['reference_passes_seconds'] + figures['grams_seconds'],
  )
  # The CNN has seven layers, layer_1 .. layer_7: an eighth is refused.
  with pytest.raises(ValueError, match='layer_8'):
    floors_on_outputs.fedcka_extra_seconds(
      'fedcka_cnn', 10, (32, 32, 3), 6, 4, 1, num_layers=8, repeats=1
    )


def test_the_floors_steps_read_a_new_order_of_the_examples_each_pass():
  # 10 examples in batches of 4, 2 passes: `_per_step_fn` numbers the
  # passes' full steps 0-1 and 2-3, then their last steps (2 rows) 4 and 5.
  rows = floors_on_outputs._step_rows(
    np.random.default_rng(0), 10, 4, 2
  ).numpy()
  assert rows.shape == (6, 4)
  for full, last in (((0, 1), 4), ((2, 3), 5)):
    taken = np.concatenate([rows[s] for s in full] + [rows[last][:2]])
    assert sorted(taken) == list(range(10))
  # A new permutation each pass.
  assert not np.array_equal(rows[:2], rows[2:4])


@pytest.mark.parametrize(
  'method, extra_seconds',
  [
    ('moon', floors_on_outputs.moon_extra_seconds),
    ('scaffold', floors_on_weights.scaffold_extra_seconds),
    ('fedprox', floors_on_weights.fedprox_extra_seconds),
    ('fedcos', floors_on_weights.fedcos_extra_seconds),
    ('fedmax', floors_on_outputs.fedmax_extra_seconds),
  ],
)
def test_extra_work_is_timed_on_the_models_shapes(method, extra_seconds):
  figures = extra_seconds(
    'fedcka_cnn',
    10,
    (32, 32, 3),
    examples_per_client=6,
    batch_size=4,
    local_epochs=2,
    repeats=1,
  )
  # Each part the report names was timed, and the floor is their sum (a
  # part can be 0: a call's own cost comes off, and timings are noisy).
  parts = [key for _, key in benchmark_floors.FLOOR_PARTS[method][1]]
  assert all(figures[key] >= 0 for key in parts)
  assert np.isclose(figures['extra_seconds'], sum(figures[k] for k in parts))


def test_scaffolds_floor_is_printed_beside_its_own_target():
  # 100 clients in a 0.4 s FedAvg round: 4 ms each; SCAFFOLD adds 0.2 +
  # 0.4 ms: 1 + 0.6 / 4 = 1.15 at best. It ran at 1.3.
  results = dict(
    settings=dict(num_clients=100, repeats=3, batch_size=20),
    models={
      'fedcka_cnn': dict(
        examples_per_client=20,
        local_epochs=1,
        peak_mb=900.0,
        methods={
          'fedavg': dict(median=0.4, ratio=1.0),
          'scaffold': dict(median=0.52, ratio=1.3),
        },
        scaffold_extra=dict(
          correction_seconds=0.0002,
          control_update_seconds=0.0004,
          extra_seconds=0.0006,
        ),
      )
    },
  )
  text = benchmark_report.report_markdown(results)
  assert (
    "SCAFFOLD's floor: what it computes beyond FedAvg, timed alone, per "
    "client: the weights' corrections over the round's steps 0.2 ms and the "
    "control variate's update and its sum 0.4 ms, against FedAvg's "
    '4 ms per client: SCAFFOLD cannot go below 1.15 of FedAvg here. It '
    'ran at 1.30: 0.15 above its floor.'
  ) in text
  # Judged on its own target (1.1), not on its floor + 0.07 (1.22).
  assert '| scaffold | 0.52 | 1.30 |  | <= 1.1 | **no** |' in text


def test_every_method_beyond_fedavg_has_a_floor_the_benchmark_measures():
  assert set(benchmark_floors.EXTRA_SECONDS) == set(
    benchmark_floors.FLOOR_PARTS
  )
  assert set(benchmark_floors.EXTRA_SECONDS) == {
    'fedcka',
    'moon',
    'scaffold',
    'fedprox',
    'fedcos',
    'fedmax',
  }


def test_fedcos_floor_steps_by_its_terms_gradient():
  # The floor times the gradient FedCos's term has: autodiff of the term
  # (`fedcos.direction_penalty`) gives the same, tensor by tensor.
  import tensorflow as tf

  from tff_methods.algorithms import fedcos

  rng = np.random.default_rng(0)
  shapes = [(3, 4), (4,), (2, 2, 3)]
  weights, global_weights, direction = (
    [tf.constant(rng.standard_normal(s), tf.float32) for s in shapes]
    for _ in range(3)
  )
  squared_direction = tf.add_n([tf.reduce_sum(d * d) for d in direction])
  with tf.GradientTape() as tape:
    tape.watch(weights)
    term = 0.02 * fedcos.direction_penalty(
      [w - g for w, g in zip(weights, global_weights)], direction
    )
  expected = tape.gradient(term, weights)
  got = floors_on_weights.direction_gradient(
    weights, global_weights, direction, squared_direction, 0.02
  )
  for e, g in zip(expected, got):
    np.testing.assert_allclose(g.numpy(), e.numpy(), rtol=1e-5, atol=1e-7)
  assert max(float(tf.reduce_max(tf.abs(g))) for g in got) > 1e-3


def test_a_calls_own_cost_comes_off_each_part(monkeypatch):
  # Shares as timed (seconds a call): an empty call 0.2 ms; a part 0.5 ms
  # keeps 0.3 ms; a part cheaper than the empty call (timing noise) is 0.
  import tensorflow as tf

  one = tf.constant(1.0)
  part, cheap = tf.function(lambda: one * 2.0), tf.function(lambda: one - 1.0)
  timed = {part: 5e-4, cheap: 1e-4}
  monkeypatch.setattr(
    floor_timing,
    'share_of_one_call',
    lambda fn, repeats, concurrent_clients: timed.get(fn, 2e-4),
  )
  figures = floor_timing.least_shares({'part': part, 'cheap': cheap}, 5, 2)
  assert figures['part'] == pytest.approx(3e-4)
  assert figures['cheap'] == 0.0
  assert figures['extra_seconds'] == pytest.approx(3e-4)


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
