"""Tests for tff_methods_tooling.benchmark_report: each figure judged against
its target on the median of its passes."""

import sys

import numpy as np
import pytest

from tff_methods_tooling import benchmark
from tff_methods_tooling import benchmark_report

pytestmark = pytest.mark.usefixtures('tff_worker')


def test_the_report_gives_each_methods_share_of_the_machine():
  results = dict(
    settings=dict(num_clients=10, repeats=3, batch_size=64),
    matmul_flops_per_second=100e9,
    models={
      'fedcka_cnn': dict(
        examples_per_client=500,
        local_epochs=5,
        peak_mb=1500.0,
        training_flops_per_example=14e6,
        methods={
          'fedavg': dict(median=3.5, ratio=1.0),
          'fedcka': dict(median=7.0, ratio=2.0),
        },
      )
    },
  )
  # 14 MFLOP x 500 x 5 x 10 = 350 GFLOP a round: 100 GFLOP/s in 3.5 s.
  text = benchmark_report.report_markdown(results)
  assert '350 GFLOP a round' in text
  assert 'fedavg 100.0 (100%), fedcka 50.0 (50%)' in text


def test_passes_are_judged_on_their_median_and_show_their_range():
  def one_pass(fedavg, fedcka):
    return {
      'fedavg': dict(seconds=[fedavg], median=fedavg, ratio=1.0),
      'fedcka': dict(
        seconds=[fedcka], median=fedcka, ratio=round(fedcka / fedavg, 4)
      ),
    }

  combined = benchmark.combine_passes(
    [one_pass(2.0, 2.6), one_pass(2.0, 3.6), one_pass(2.2, 2.86)]
  )
  # Ratios 1.3, 1.8, 1.3: the median is 1.3, not the mean (1.47).
  assert combined['fedcka']['ratio'] == 1.3
  assert combined['fedcka']['pass_ratios'] == [1.3, 1.8, 1.3]
  assert combined['fedavg']['median'] == 2.0
  assert combined['fedcka']['seconds'] == [2.6, 3.6, 2.86]
  results = dict(
    settings=dict(num_clients=10, repeats=3, passes=3, batch_size=64),
    models={
      'fedcka_cnn': dict(
        examples_per_client=500,
        local_epochs=5,
        peak_mb=1500.0,
        methods=combined,
      )
    },
  )
  text = benchmark_report.report_markdown(results)
  assert 'over 3 independent passes' in text
  assert '| fedcka | 2.86 | 1.30 (1.30-1.80) |' in text


def test_floor_comparison_is_judged_on_the_median_of_its_passes():
  def one_pass(fedavg, tff_fedavg, plain, pytorch):
    return dict(
      model='fedcka_cnn',
      examples_per_client=20,
      local_epochs=1,
      fedavg_seconds=fedavg,
      fedavg_all=[fedavg],
      tff_fedavg_seconds=tff_fedavg,
      tff_fedavg_all=[tff_fedavg],
      plain_tf_seconds=plain,
      plain_tf_all=[plain],
      pytorch_seconds=pytorch,
      pytorch_all=[pytorch],
    )

  floor = benchmark.combine_floor_passes(
    [
      one_pass(1.0, 5.0, 2.0, 1.25),  # 0.8 of PyTorch's time
      one_pass(1.2, 6.0, 2.0, 1.0),  # 1.2
      one_pass(1.3, 7.0, 2.6, 1.4),  # 0.93
    ]
  )
  # Times: the medians over the passes.
  assert floor['fedavg_seconds'] == 1.2
  assert floor['pytorch_seconds'] == 1.25
  assert floor['fedavg_all'] == [1.0, 1.2, 1.3]
  # Ratios: the median of the passes' ratios (0.93), not the ratio of the
  # medians (1.2 / 1.25 = 0.96).
  over_pytorch = floor['ratios']['fedavg_over_pytorch']
  assert np.isclose(over_pytorch['median'], 1.3 / 1.4)
  assert np.allclose(over_pytorch['pass_ratios'], [0.8, 1.2, 1.3 / 1.4])
  # PyTorch / plain TF: 0.625, 0.5, 0.54: the median is 0.54.
  assert benchmark.comparison_ratio(floor, 'fedavg_over_plain_tf') == 0.5
  results = dict(
    settings=dict(num_clients=100, repeats=3, passes=3, batch_size=20),
    models={},
    floor=floor,
  )
  text = benchmark_report.report_markdown(results)
  assert 'Each loop timed in 3 independent passes' in text
  assert (
    "| PyTorch loop (the reference code's way) | 1.25 | 0.54 (0.50-0.62) |"
  ) in text
  assert "| FedAvg through TFF (the project's `fedavg`) | 1.20 | 0.50 " in text
  assert (
    "Faster than PyTorch (target): the project's FedAvg yes (0.93x "
    "(0.80-1.20) PyTorch's time); TFF's builder 5.00x (4.00-6.00)."
  ) in text
  # One pass, or results written before passes: the ratio of the times.
  del floor['ratios']
  text = benchmark_report.report_markdown(results)
  assert "the project's FedAvg yes (0.96x PyTorch's time)" in text
  assert 'Each loop timed in' not in text


def test_report_marks_each_figure_against_its_target():
  timing = lambda median, ratio: dict(median=median, ratio=ratio)
  results = dict(
    settings=dict(
      num_clients=10,
      repeats=3,
      batch_size=64,
      max_concurrent_clients=2,
      in_process_devices='/device:GPU:0',
    ),
    models={
      'fedcka_cnn': dict(
        examples_per_client=500,
        local_epochs=1,
        peak_mb=1500.0,
        in_process={'fedavg': timing(1.0, 1.0), 'moon': timing(1.6, 1.6)},
        methods={
          'fedavg': timing(2.0, 1.0),
          # Target 1.2: met against the project's FedAvg, not
          # against TFF's builder: judged on the larger.
          'fedcka': dict(median=2.2, ratio=1.1, ratio_to_tff_fedavg=1.25),
          'moon': dict(
            median=2.2,
            ratio=1.1,  # Target 1.2: met.
            ratio_to_tff_fedavg=1.15,
          ),
          'fedmax': timing(2.2, 1.1),
        },
      )
    },  # target 1.05: missed
    floor=dict(
      model='fedcka_cnn',
      examples_per_client=500,
      local_epochs=5,
      fedavg_seconds=2.2,
      plain_tf_seconds=2.0,
      tff_fedavg_seconds=3.0,
    ),
    workers=dict(
      model='fedcka_cnn',
      examples_per_client=500,
      local_epochs=1,
      by_count={
        1: dict(median=4.0, clients_per_second=2.5),
        2: dict(median=5.0, clients_per_second=2.0),
      },
    ),
    memory=dict(
      model='mlp',
      rss_mb=[100.0] * 20 + [105.0, 120.0],
      after_round=20,
      growth=0.2,
    ),
    scaling=dict(
      model='fedcka_cnn',
      examples_per_client=20,
      by_count={
        100: dict(
          fedavg_seconds=0.5,
          plain_tf_seconds=0.4,
          overhead_ms_per_client=1.0,
          fedavg_in_process_seconds=0.25,
        )
      },
    ),
    cross_device=dict(
      num_clients=3400,
      min_examples=100,
      max_examples=300,
      clients_per_round=100,
      rounds=100,
      model='fedcka_cnn',
      batch_size=20,
      data_seconds=30.0,
      after_round=10,
      methods={
        'fedavg': dict(median=2.0, clients_per_second=50.0, growth=0.02),
        'moon': dict(
          median=4.0,
          clients_per_second=25.0,
          growth=0.15,
          state_store=dict(clients=3400, megabytes=1700.0, load_seconds=6.8),
        ),
      },
    ),
  )
  text = benchmark_report.report_markdown(results)
  # 10 clients, 2.2 s against 2.0: 20 ms per client beyond the plain loop.
  assert (
    "TFF's cost per client beyond the plain loop: 20.0 ms (target <= "
    '3: **no**).'
  ) in text
  assert '| 100 | 0.50 | 5.0 | 0.40 | 4.0 | 1.0 | 0.25 |' in text
  # The in-process column: each method beside its worker time.
  assert 'In this process, on /device:GPU:0' in text
  assert '| fedavg | 2.00 | 1.00 | 0.50 |' in text
  assert '| moon | 2.20 | 1.60 | 0.73 |' in text
  assert "Building the partition and the clients' files: 30.0 s." in text
  assert '| fedavg | 2.00 | 50.0 | +2.0% (yes) | none |  |' in text
  assert (
    '| moon | 4.00 | 25.0 | +15.0% (**no**) | 1700 MB (3400 clients) '
    '| 6.8 s (2.00 ms each) |'
  ) in text
  assert '| fedcka | 2.20 | 1.10 | 1.25 | <= 1.2 | **no** | 1.9 |' in text
  assert '| moon | 2.20 | 1.10 | 1.15 | <= 1.2 | yes | 1.78 |' in text
  assert '| fedmax | 2.20 | 1.10 |  | <= 1.05 | **no** |  |' in text
  assert 'Clients per second (FedAvg): 5.00' in text
  assert "| FedAvg through TFF (the project's `fedavg`) | 2.20 | 1.10 |" in text
  assert (
    "| FedAvg through TFF (TFF's `build_weighted_fed_avg`) | 3.00 | " '1.50 |'
  ) in text
  assert (
    "The project's FedAvg / plain TF: 1.10 (target <= 1.2: yes); "
    "TFF's builder: 1.50."
  ) in text
  assert '| 2 | 5.00 | 2.00 |' in text
  assert 'growth 20.0% (target < 10%: **no**)' in text
  assert (
    "| PyTorch loop (the reference code's way) | not measured: "
    'PyTorch not installed |'
  ) in text
  assert 'Faster than PyTorch' not in text

  results['floor']['pytorch_seconds'] = 2.5
  text = benchmark_report.report_markdown(results)
  assert "| PyTorch loop (the reference code's way) | 2.50 | 1.25 |" in text
  assert (
    "Faster than PyTorch (target): the project's FedAvg yes (0.88x "
    "PyTorch's time); TFF's builder 1.20x."
  ) in text
  results['floor']['fedavg_seconds'] = 2.6
  text = benchmark_report.report_markdown(results)
  assert "The project's FedAvg / plain TF: 1.30 (target <= 1.2: **no**)" in text
  assert "the project's FedAvg **no** (1.04x" in text


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
