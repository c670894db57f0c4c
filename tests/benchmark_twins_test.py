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
  lines = benchmark_twins.report_lines(model)
  # FedAvg at 0.8 misses 0.7 at 20 examples; SCAFFOLD at 0.9 beats 1.
  assert '| fedavg | 0.80 | 1.00 | 0.80 | < 0.7 | **no** |' in lines
  assert '| scaffold | 0.90 | 1.00 | 0.90 | < 1.0 | yes |' in lines
  results = dict(
    settings=dict(num_clients=100, repeats=1, batch_size=20),
    models={'fedcka_cnn': dict(model, local_epochs=1, peak_mb=900.0)},
  )
  assert '| scaffold | 0.90 | 1.00 | 0.90 | < 1.0 | yes |' in (
    benchmark_report.report_markdown(results)
  )


def test_without_twins_the_report_says_why():
  model = dict(twins=dict(note=benchmark_twins.twin_note('no torch here')))
  assert benchmark_twins.report_lines(model) == [
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
