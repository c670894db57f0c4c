"""Tests for tff_methods_tooling.benchmark_in_process: the in-process
table, its ratios to FedAvg in this process and the small clients'
targets."""

import sys

import pytest

from tff_methods_tooling import benchmark_in_process
from tff_methods_tooling import benchmark_report


def _timing(median, ratio, pass_ratios=None):
  return dict(median=median, ratio=ratio, pass_ratios=pass_ratios or [ratio])


def _model(examples_per_client):
  # 100 clients; FedAvg in-process 0.8 s a round (8 ms a client), on the
  # worker 0.4 s (4 ms).
  return dict(
    examples_per_client=examples_per_client,
    local_epochs=1,
    peak_mb=900.0,
    methods={
      'fedavg': _timing(0.4, 1.0),
      'fedprox': _timing(0.4, 1.0),
      'moon': _timing(0.6, 1.5),
      'scaffold': _timing(0.52, 1.3),
    },
    in_process={
      'fedavg': _timing(0.8, 1.0),
      'fedprox': _timing(0.8, 1.0),
      'moon': _timing(1.2, 1.5),
      'scaffold': _timing(1.0, 1.25, [1.2, 1.25, 1.5]),
    },
    # MOON adds 4 ms a client: 1 + 4 / 8 = 1.5 of FedAvg in-process (2.0
    # of the worker's FedAvg). SCAFFOLD adds 0.8 ms: 1.1.
    moon_extra=dict(
      reference_passes_seconds=0.003,
      contrastive_seconds=0.001,
      extra_seconds=0.004,
    ),
    scaffold_extra=dict(
      correction_seconds=0.0003,
      control_update_seconds=0.0005,
      extra_seconds=0.0008,
    ),
  )


def test_small_clients_judge_the_stateful_methods_against_fedavg_in_process():
  model = _model(20)
  assert benchmark_in_process.target('scaffold', model, 100) == 1.15
  # MOON's floor against FedAvg in this process, + 0.07.
  assert benchmark_in_process.target('moon', model, 100) == pytest.approx(1.57)
  assert benchmark_in_process.target('fedprox', model, 100) is None
  lines = benchmark_in_process.report_lines(model, 100, 'cpu:0, cpu:1')
  assert (
    '| scaffold | 0.52 | 1.00 | 1.92 | 1.25 (1.20-1.50) | <= 1.15 | **no** |'
  ) in lines
  assert (
    '| moon | 0.60 | 1.20 | 2.00 | 1.50 | <= 1.57 (floor + 0.07) | yes |'
    in (lines)
  )
  assert '| fedprox | 0.40 | 0.80 | 2.00 | 1.00 |  |  |' in lines
  # Where a target applies, the floor says what the method computes more.
  assert (
    "against in-process FedAvg's 8 ms per client: SCAFFOLD cannot go "
    'below 1.10 of in-process FedAvg here. It ran at 1.25: 0.15 above its '
    'floor.'
  ) in ' '.join(lines)
  assert (
    'MOON cannot go below 1.50 of in-process FedAvg here. It ran at 1.50: '
    '0.00 above its floor (target <= 0.07 above: yes).'
  ) in ' '.join(lines)


def test_large_clients_have_no_in_process_targets():
  model = _model(500)
  assert benchmark_in_process.target('scaffold', model, 100) is None
  assert benchmark_in_process.target('moon', model, 100) is None
  lines = benchmark_in_process.report_lines(model, 100, 'cpu:0')
  assert '| scaffold | 0.52 | 1.00 | 1.92 | 1.25 (1.20-1.50) |  |  |' in lines
  assert 'in-process FedAvg here' not in ' '.join(lines)


def test_the_report_holds_the_in_process_table():
  results = dict(
    settings=dict(
      num_clients=100, repeats=3, batch_size=20, in_process_devices='cpu:0'
    ),
    models={'fedcka_cnn': _model(20)},
  )
  text = benchmark_report.report_markdown(results)
  assert (
    'In this process, on cpu:0 (`tff_methods.execution.in_process`)' in text
  )
  assert (
    '| scaffold | 0.52 | 1.00 | 1.92 | 1.25 (1.20-1.50) | <= 1.15 |' in text
  )
  del results['models']['fedcka_cnn']['in_process']
  assert 'In this process' not in benchmark_report.report_markdown(results)


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
