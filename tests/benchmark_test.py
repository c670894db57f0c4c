"""Tests for tff_methods_tooling.benchmark (the harness; its figures are not
asserted: speed targets are reported by binaries/benchmark.py)."""

import contextlib
import os
import subprocess
import sys

import pytest
import tensorflow as tf

from tff_methods.algorithms import hyperparameters
from tff_methods.execution import in_process
from tff_methods.execution import workers
from tff_methods_tasks import models as task_models
from tff_methods_tooling import benchmark
from tff_methods_tooling import benchmark_processes
from tff_methods_tooling import benchmark_run
from tff_methods_tooling import plain_loops

pytestmark = pytest.mark.usefixtures('tff_worker')


@pytest.mark.slow
def test_only_methods_that_read_z_need_a_projection_head():
  # MOON reads the projection head `z`; FedCKA the first layers, which the
  # MLP has.
  assert benchmark_processes.needing_projection(
    ['fedavg', 'moon', 'fedcka', 'moon+fedcos'], 'mlp'
  ) == ['moon', 'moon+fedcos']
  assert benchmark_processes.needing_projection(['moon'], 'fedcka_cnn') == []


def test_benchmark_rejects_a_python_without_torch_before_any_work(tmp_path):
  output_dir = tmp_path / 'bench'
  result = subprocess.run(
    [
      sys.executable,
      '-m',
      'binaries.benchmark',
      '--pytorch_python=/nonexistent/python',
      f'--output_dir={output_dir}',
    ],
    cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    capture_output=True,
    text=True,
    timeout=300,
    check=False,
  )
  assert result.returncode == 2
  assert (
    '--pytorch_python=/nonexistent/python: /nonexistent/python does ' 'not run'
  ) in result.stderr
  assert not output_dir.exists()


def test_time_methods_interleaves_and_divides_by_fedavg(tiny_cifar):
  hparams = hyperparameters.Hyperparameters(client_learning_rate=0.01)
  order = []
  tff_fedavg = benchmark_processes.TFF_FEDAVG
  timings = benchmark.time_methods(
    'fedcka_cnn',
    ['fedavg', tff_fedavg, 'fedprox'],
    tiny_cifar,
    hparams,
    local_epochs=1,
    batch_size=8,
    repeats=2,
    on_round=lambda m, s: order.append(m),
  )
  assert order == ['fedavg', tff_fedavg, 'fedprox'] * 2
  assert timings['fedavg']['ratio'] == 1.0
  assert timings[tff_fedavg]['ratio_to_tff_fedavg'] == 1.0
  for timing in timings.values():
    assert len(timing['seconds']) == 2 and timing['median'] > 0
  assert timings['fedprox']['ratio'] == pytest.approx(
    timings['fedprox']['median'] / timings['fedavg']['median']
  )
  assert timings['fedprox']['ratio_to_tff_fedavg'] == pytest.approx(
    timings['fedprox']['median'] / timings[tff_fedavg]['median']
  )


def test_loopback_workers_are_timed_and_stopped(tiny_cifar):
  hparams = hyperparameters.Hyperparameters(client_learning_rate=0.01)
  before = set(workers.worker_pids())
  by_count = benchmark.loopback_worker_throughput(
    tiny_cifar,
    'mlp',
    hparams,
    local_epochs=1,
    batch_size=8,
    worker_counts=(1, 2),
    repeats=1,
  )
  assert sorted(by_count) == [1, 2]
  for timing in by_count.values():
    assert timing['clients_per_second'] == pytest.approx(3 / timing['median'])
  assert set(workers.worker_pids()) == before  # Every worker it started ended.


def test_training_flops_are_counted_by_hand():
  inputs = tf.keras.Input((8, 8, 1))
  x = tf.keras.layers.Conv2D(4, 3)(inputs)  # 6x6x4 outputs, 9 MACs each.
  x = tf.keras.layers.SeparableConv2D(2, 3)(x)  # 4x4: 36 + 8 MACs each.
  x = tf.keras.layers.Flatten()(x)
  logits = tf.keras.layers.Dense(3)(x)  # 32 x 3 MACs.
  model = tf.keras.Model(inputs, logits)
  forward_macs = 6 * 6 * 4 * 9 + 4 * 4 * (9 * 4 + 4 * 2) + 32 * 3
  # 2 FLOPs a multiply-add; backward twice the forward.
  assert plain_loops.training_flops_per_example(model) == 3 * 2 * forward_macs
  # The FedCKA CNN: about 14 MFLOP an example, as the issue counted it.
  cnn = task_models.get_model('fedcka_cnn', 10, (32, 32, 3))
  assert 13e6 < plain_loops.training_flops_per_example(cnn) < 15e6


def test_fed2_is_timed_only_on_groupable_models():
  assert 'fed2' in benchmark_processes.applicable_methods('fedcka_cnn')
  assert 'fed2' not in benchmark_processes.applicable_methods('resnet18')


def test_scaling_reports_tffs_cost_per_client(tmp_path):
  hparams = hyperparameters.Hyperparameters(client_learning_rate=0.01)
  context = in_process.InProcessExecutionContext(['cpu:0'], fallback_fn=None)
  by_count = benchmark.scaling(
    [2, 4],
    'mlp',
    3,
    8,
    hparams,
    str(tmp_path),
    repeats=1,
    in_process_context=context,
  )
  assert sorted(by_count) == [2, 4]
  for count, row in by_count.items():
    assert row['overhead_ms_per_client'] == pytest.approx(
      1000 * (row['fedavg_seconds'] - row['plain_tf_seconds']) / count
    )
    assert row['fedavg_in_process_seconds'] > 0
  assert context.on_fallback == []


def _run_settings(**kwargs):
  return benchmark_run.Settings(
    **{
      **dict(
        output_dir='',
        models=(),
        methods=(),
        num_clients=2,
        examples_per_client=1,
        resnet_examples_per_client=1,
        batch_size=1,
        local_epochs=1,
        repeats=1,
        passes=3,
        seed=0,
        client_learning_rate=0.1,
        client_momentum=0.0,
        max_concurrent_clients=2,
      ),
      **kwargs,
    }
  )


@pytest.mark.parametrize('remote', [False, True])
def test_every_pass_after_the_first_runs_on_a_new_local_worker(
  remote, monkeypatch
):
  events = []
  monkeypatch.setattr(workers, 'stop_workers', lambda: events.append('stop'))
  passes = benchmark_run._Passes(
    _run_settings(remote_workers=remote),
    lambda parameters: events.append(('start', parameters)),
    None,
  )
  # A pass sees the events before it: none, then a stop and a start each.
  assert passes.on_worker(lambda: len(events)) == (
    [0, 0, 0] if remote else [0, 2, 4]
  )
  events.clear()
  # A large model gets every core: a worker of its own, started for it
  # (where that is another number of threads than a small model's).
  large = workers.LARGE_MODEL_PARAMETERS
  threads = workers.threads_per_client(large, 2)
  assert passes.use_worker_for(large) == threads
  restarted = threads != workers.threads_per_client(None, 2) and not remote
  assert events == (['stop', ('start', large)] if restarted else [])
  events.clear()
  assert passes.use_worker_for(large) == threads and not events


def test_each_pass_times_in_process_right_after_the_worker(monkeypatch):
  events = []
  monkeypatch.setattr(workers, 'stop_workers', lambda: events.append('stop'))

  class Context:
    def close(self):
      events.append('close')

  passes = benchmark_run._Passes(
    _run_settings(), lambda parameters: events.append('start'), Context()
  )
  monkeypatch.setattr(
    benchmark_run.tff.framework,
    'get_context_stack',
    lambda: type(
      'Stack', (), {'install': lambda self, c: contextlib.nullcontext()}
    )(),
  )
  worker, ours = passes.on_both(
    lambda: events.append('worker') or len(events),
    lambda: events.append('in') or len(events),
  )
  # worker, in-process (its sessions closed), then a new worker: pass 2.
  assert events[:6] == ['worker', 'in', 'close', 'stop', 'start', 'worker']
  assert len(worker) == len(ours) == 3
  # In-process over the worker within each pass, then their median.
  timing = lambda s: {'fedavg': dict(median=s, ratio=1.0, seconds=[s])}
  combined = benchmark_run._over_worker(
    {'fedavg': {}},
    [timing(0.4), timing(0.5), timing(0.4)],
    [timing(0.2), timing(0.45), timing(0.3)],
  )
  assert combined['fedavg']['over_worker_passes'] == pytest.approx(
    [0.5, 0.9, 0.75]
  )
  assert combined['fedavg']['over_worker'] == pytest.approx(0.75)


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
