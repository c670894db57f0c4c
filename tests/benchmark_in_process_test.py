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


_WORKER_TARGETS = {'fedprox': 1.1, 'scaffold': 1.1, 'moon': 1.2}


def test_each_method_is_judged_on_its_floor_or_its_worker_target():
  model = _model(20)
  # SCAFFOLD's and MOON's floors against FedAvg in this process (8 ms a
  # client): 1 + 0.8 / 8 and 1 + 4 / 8, each + 0.07.
  target = benchmark_in_process.target
  assert target('scaffold', model, 100, _WORKER_TARGETS) == pytest.approx(1.17)
  assert target('moon', model, 100, _WORKER_TARGETS) == pytest.approx(1.57)
  # No floor measured: the method's target on the worker.
  assert target('fedprox', model, 100, _WORKER_TARGETS) == 1.1
  assert target('fedmax', model, 100, _WORKER_TARGETS) is None
  lines = benchmark_in_process.report_lines(
    model, 100, 'cpu:0, cpu:1', _WORKER_TARGETS
  )
  # FedAvg: in-process over the worker, 0.8 / 0.4, against 0.7 at 20
  # examples; 100 clients / 0.8 s / 2 devices a second per device.
  assert '| fedavg | 0.40 | 0.80 | 2.00 | 62.5 | 1.00 | <= 0.70 | **no** |' in (
    lines
  )
  assert (
    '| scaffold | 0.52 | 1.00 | 1.92 | 50 | 1.25 (1.20-1.50) | '
    '<= 1.17 (floor + 0.07) | **no** |'
  ) in lines
  assert (
    '| moon | 0.60 | 1.20 | 2.00 | 41.7 | 1.50 | <= 1.57 (floor + 0.07) | yes |'
  ) in lines
  assert (
    '| fedprox | 0.40 | 0.80 | 2.00 | 62.5 | 1.00 | <= 1.10 | yes |' in lines
  )
  # The miss says what it measured against the floor of the arithmetic:
  # 1e7 FLOP x 20 examples x 100 clients at 1e11 FLOP/s = 0.2 s; 0.7 of
  # the worker's 0.4 s leaves (0.28 - 0.2) / 100 = 0.8 ms a client.
  model.update(training_flops_per_example=1e7)
  miss = benchmark_in_process.report_lines(
    model, 100, 'cpu:0, cpu:1', _WORKER_TARGETS, 1e11
  )
  assert (
    'In-process FedAvg misses its target: 0.80 s a round (8.0 ms a client) '
    "against the worker's 0.40 s, where the target allows 0.28 s. The "
    "round's training arithmetic at this machine's matmul rate takes 0.20 s "
    '(the floor of any loop); beyond it the target leaves 0.8 ms a client, '
    'and in-process FedAvg took 6.0 ms.'
  ) in miss
  # Where a floor is the target, it says what the method computes more.
  assert (
    "against in-process FedAvg's 8 ms per client: SCAFFOLD cannot go "
    'below 1.10 of in-process FedAvg here. It ran at 1.25: 0.15 above its '
    'floor'
  ) in ' '.join(lines)
  assert (
    'MOON cannot go below 1.50 of in-process FedAvg here. It ran at 1.50: '
    '0.00 above its floor (target <= 0.07 above: yes).'
  ) in ' '.join(lines)


def test_op_time_is_split_into_data_arithmetic_and_framework():
  shares = benchmark_in_process.op_time_shares(
    {
      '_MklNativeFusedConv2D': 50,
      'MatMul': 20,
      'AddV2': 10,
      'ReadFile': 6,
      'ParseExampleV2': 4,
      'Merge': 7,
      'AssignVariableOp': 3,
    }
  )
  assert shares == pytest.approx(
    {'arithmetic': 0.8, 'data and state': 0.1, 'framework': 0.1}
  )


def test_a_miss_says_how_much_of_the_worker_time_the_kernels_took():
  model = _model(20)
  # Of in-process FedAvg's 0.8 s, 75% in the kernels: 0.6 s, 1.5 of the
  # worker's 0.4 s, where the target allows 0.7.
  model['in_process']['fedavg']['op_time_shares'] = {
    'arithmetic': 0.75,
    'data and state': 0.05,
    'framework': 0.2,
  }
  note = ' '.join(
    benchmark_in_process.report_lines(
      model, 100, 'cpu:0, cpu:1', _WORKER_TARGETS
    )
  )
  assert (
    'A traced round in this process spent 75% of its op time in the '
    "arithmetic's kernels (convolutions, matmuls, elementwise; 5% data and "
    "state, 20% the framework's ops): at that share, 0.60 s of this round, "
    "1.50 of the worker's time, against the 0.70 the target allows."
  ) in note


def test_a_traced_fedavg_round_in_process_is_mostly_its_arithmetic(
  tmp_path,
):
  import tensorflow_federated as tff

  from tff_methods.algorithms import hyperparameters
  from tff_methods.execution import in_process
  from tff_methods_tasks import datasets

  context = in_process.InProcessExecutionContext(['cpu:0'], fallback_fn=None)
  data = datasets.generated_like('cifar10', 2, 8, str(tmp_path), seed=0)
  with tff.framework.get_context_stack().install(context):
    shares = benchmark_in_process.fedavg_op_time_shares(
      context,
      'fedcka_cnn',
      data,
      hyperparameters.Hyperparameters(num_clients=2),
      1,
      8,
      0,
    )
  context.close()
  assert sum(shares.values()) == pytest.approx(1.0)
  # The CNN's convolutions dominate; the clients' files are read too.
  assert shares['arithmetic'] > 0.5
  assert shares['data and state'] > 0
  assert not context.trace


def test_in_process_over_the_worker_is_the_median_of_the_passes_own():
  model = _model(20)
  # The medians over the passes give 0.8 / 0.4; within each pass the paths
  # ran at 0.6, 0.65 and 0.9 of each other: the target judges 0.65.
  model['in_process']['fedavg'].update(
    over_worker=0.65, over_worker_passes=[0.6, 0.65, 0.9]
  )
  lines = benchmark_in_process.report_lines(
    model, 100, 'cpu:0, cpu:1', _WORKER_TARGETS
  )
  assert (
    '| fedavg | 0.40 | 0.80 | 0.65 (0.60-0.90) | 62.5 | 1.00 | <= 0.70 | yes |'
  ) in lines


def test_at_large_clients_in_process_fedavg_has_only_to_match_the_worker():
  model = _model(500)
  model['in_process']['fedavg'] = _timing(0.38, 1.0)
  lines = benchmark_in_process.report_lines(
    model, 100, 'cpu:0', _WORKER_TARGETS
  )
  assert '| fedavg | 0.40 | 0.38 | 0.95 | 263 | 1.00 | <= 1.00 | yes |' in (
    lines
  )


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
    '| scaffold | 0.52 | 1.00 | 1.92 | 100 | 1.25 (1.20-1.50) | <= 1.17 '
    '(floor + 0.07) | **no** |' in text
  )
  del results['models']['fedcka_cnn']['in_process']
  assert 'In this process' not in benchmark_report.report_markdown(results)


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
