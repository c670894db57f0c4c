"""Tests for tff_methods_tooling.benchmark_twins: each method against its
PyTorch twin, judged on the median of the passes' own ratios."""

import sys

import pytest

from tff_methods_tooling import benchmark_report
from tff_methods_tooling import benchmark_twins


def _timing(median, ratio=1.0):
  return dict(median=median, seconds=[median], ratio=ratio)


def test_ratios_are_taken_within_each_pass_then_their_median():
  # Pass 2 ran on a loaded machine: both sides slowed, its ratio did not.
  project = [
    {'fedavg': _timing(1.0), 'moon': _timing(3.0)},
    {'fedavg': _timing(4.0), 'moon': _timing(12.0)},
    {'fedavg': _timing(1.0), 'moon': _timing(1.5)},
  ]
  twins = [
    {'fedavg': _timing(2.0), 'moon': _timing(2.0)},
    {'fedavg': _timing(8.0), 'moon': _timing(8.0)},
    {'fedavg': _timing(2.5), 'moon': _timing(3.0)},
  ]
  combined = benchmark_twins.combine(project, twins)
  assert combined['fedavg']['pass_ratios'] == [0.5, 0.5, 0.4]
  assert combined['fedavg']['ratio'] == 0.5
  assert combined['moon']['pass_ratios'] == [1.5, 1.5, 0.5]
  assert combined['moon']['ratio'] == 1.5
  # The twin's own time: the median of the passes' medians.
  assert combined['moon']['median'] == 3.0
  assert combined['moon']['seconds'] == [2.0, 8.0, 3.0]


def test_fedavg_must_beat_its_twin_by_more_at_small_clients():
  assert benchmark_twins.target('fedavg', 20) == 0.7
  assert benchmark_twins.target('fedavg', 500) == 1.0
  assert benchmark_twins.target('scaffold', 20) == 1.0


def test_the_report_judges_each_method_against_its_twin():
  model = dict(
    examples_per_client=20,
    methods={'fedavg': _timing(0.8), 'scaffold': _timing(0.9)},
    twins=benchmark_twins.combine(
      [{'fedavg': _timing(0.8), 'scaffold': _timing(0.9)}],
      [{'fedavg': _timing(1.0), 'scaffold': _timing(1.0)}],
    ),
  )
  lines = benchmark_twins.report_lines(model, 100)
  # FedAvg at 0.8 misses 0.7 at 20 examples; SCAFFOLD at 0.9 beats 1.
  assert '| fedavg | 0.80 | 1.00 | 0.80 | < 0.7 | **no** |' in lines
  assert '| scaffold | 0.90 | 1.00 | 0.90 | < 1.0 | yes |' in lines
  # The miss says what it measured: 100 clients, 8 ms each, where 0.7 of
  # the twin's 1 s allows 0.7 s.
  assert lines[-1] == (
    'fedavg misses its target: 0.80 s a round (8.0 ms a client) against '
    "the twin's 1.00 s, where the target allows 0.70 s."
  )
  assert not any(line.startswith('scaffold misses') for line in lines)
  # In this process FedAvg took 0.6 s: the faster path meets 0.7.
  model['in_process'] = {'fedavg': _timing(0.6)}
  lines = benchmark_twins.report_lines(model, 100)
  assert '| fedavg | 0.80 | 0.60 | 1.00 | 0.80 | 0.60 | < 0.7 | yes |' in lines
  assert '| scaffold | 0.90 |  | 1.00 | 0.90 |  | < 1.0 | yes |' in lines
  assert not any(line.startswith('fedavg misses') for line in lines)
  del model['in_process']
  # With the machine's matmul rate, the floor of the round's arithmetic:
  # 10 MFLOP x 20 examples x 100 clients at 100 GFLOP/s = 0.2 s; the
  # target leaves (0.7 - 0.2) / 100 = 5 ms a client beyond it.
  model.update(local_epochs=1, training_flops_per_example=1e7)
  assert benchmark_twins.report_lines(model, 100, 1e11)[-1].endswith(
    "The round's training arithmetic at this machine's matmul rate takes "
    '0.20 s (the floor of any loop), so the target leaves 5.0 ms a client '
    'for everything else (calls, data, set-up); the project took 6.0 ms.'
  )
  results = dict(
    settings=dict(num_clients=100, repeats=1, batch_size=20),
    models={'fedcka_cnn': dict(model, local_epochs=1, peak_mb=900.0)},
  )
  assert '| scaffold | 0.90 | 1.00 | 0.90 | < 1.0 | yes |' in (
    benchmark_report.report_markdown(results)
  )


def test_without_twins_the_report_says_why():
  model = dict(twins=dict(note=benchmark_twins.twin_note('no torch here')))
  assert benchmark_twins.report_lines(model, 10) == [
    '',
    'Each method against its PyTorch twin: not measured: no torch here.',
  ]


def test_only_chains_have_twins():
  assert benchmark_twins.twin_methods(
    'fedcka_cnn', ['fedavg', 'tff_fedavg', 'moon', 'fed2']
  ) == ['fedavg', 'moon']
  assert benchmark_twins.twin_methods('resnet18', ['fedavg']) == []


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
