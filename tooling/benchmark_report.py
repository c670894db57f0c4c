"""The benchmark's figures beside their targets and the FedCKA paper's
Table 4 ratios, as Markdown (`report_markdown`)."""

from typing import Optional

from tff_methods_tooling import benchmark
from tff_methods_tooling import benchmark_floors
from tff_methods_tooling import benchmark_in_process
from tff_methods_tooling import benchmark_processes
from tff_methods_tooling import benchmark_twins
from tff_methods_tooling import client_profile
from tff_methods_tooling import plain_loops

# Ratio of seconds per round to FedAvg's.
TARGET_RATIO = {
  'fedcka_cnn': {
    'fedcka': 1.2,
    'moon': 1.2,
    'fedprox': 1.1,
    'scaffold': 1.1,
    'fedcos': 1.1,
    'fedmax': 1.05,
    'fed2': 1.1,
  },
  'resnet18': dict.fromkeys(
    ('fedprox', 'scaffold', 'moon', 'fedcka', 'fedmax', 'fedcos', 'fed2'), 1.3
  ),
}


# FedCKA paper, Table 4: local training time relative to FedAvg (the 7-layer
# CNN, and ResNet-50).
PAPER_RATIO = {
  'fedcka_cnn': {
    'fedcka': 1.90,
    'moon': 1.78,
    'fedprox': 1.04,
    'scaffold': 1.04,
  },
  'resnet50': {'fedcka': 1.18, 'moon': 2.64, 'fedprox': 1.35, 'scaffold': 1.51},
}


# The project's FedAvg through TFF against the plain TF loop at 5 local
# epochs; memory growth.
TARGET_TFF_OVER_FLOOR = 1.2


TARGET_MEMORY_GROWTH = 0.10


# What TFF adds per client beyond the plain loop's arithmetic.
TARGET_OVERHEAD_MS_PER_CLIENT = 3.0


def _format(value: Optional[float]) -> str:
  return '' if value is None else f'{value:.2f}'


def _mark(value: float, target: float) -> str:
  return 'yes' if value <= target else '**no**'


def _floor_pass_ratios(floor: dict, name: str) -> list[float]:
  """A `FLOOR_RATIOS` ratio in each pass of the floor comparison."""
  return floor.get('ratios', {}).get(name, {}).get('pass_ratios', [])


def _comparison_ratio_cell(floor: dict, name: str, unit: str = '') -> str:
  """A floor ratio, with its range over the passes when several ran."""
  return benchmark_processes.ratio_with_range(
    benchmark.comparison_ratio(floor, name),
    _floor_pass_ratios(floor, name),
    unit,
  )


def _flops_lines(results: dict, model: dict) -> list[str]:
  """Each method's training arithmetic per second, against the machine's."""
  machine = results.get('matmul_flops_per_second')
  per_example = model.get('training_flops_per_example')
  if not machine or not per_example:
    return []
  work = (
    per_example
    * model['examples_per_client']
    * model['local_epochs']
    * results['settings']['num_clients']
  )
  achieved = ', '.join(
    f'{name} {work / t["median"] / 1e9:.1f} '
    f'({work / t["median"] / machine:.0%})'
    for name, t in model['methods'].items()
  )
  size = plain_loops.MATMUL_SIZE
  return [
    f'Arithmetic: training the model is {per_example / 1e6:.1f} MFLOP an '
    f'example (its convolutions and dense layers, forward and backward), '
    f'{work / 1e9:.0f} GFLOP a round. A {size}x{size} '
    f'float32 matmul runs at {machine / 1e9:.1f} GFLOP/s on this '
    "machine's cores. GFLOP/s a round achieves (FedAvg's arithmetic over "
    f"the method's time) and its share of the matmul's: {achieved}.",
    '',
  ]


def _judged_ratio(timing: dict) -> float:
  """The ratio a target is judged on: the larger of the two FedAvgs'.

  TFF's builder is slower than the project's FedAvg, so a ratio to it alone
  would credit a method with the shared loop's speed-up rather than its own
  cost.
  """
  return max(timing['ratio'], timing.get('ratio_to_tff_fedavg', 0.0))


def _pytorch_cell(floor: dict) -> str:
  if floor.get('pytorch_seconds'):
    return f"{floor['pytorch_seconds']:.2f}"
  return f"not measured: {floor.get('pytorch_note', 'PyTorch not installed')}"


def report_markdown(results: dict) -> str:
  """The benchmark's figures beside their targets, as Markdown."""
  lines = [
    '# Benchmark',
    '',
    f"{results['settings']['num_clients']} clients, all taking part, "
    'CIFAR-shaped generated data; seconds per round are medians of '
    f"{results['settings']['repeats']} interleaved rounds after a "
    'warm-up round'
    + (
      f", over {results['settings']['passes']} independent passes (each "
      'in a new worker; ratios are the medians of the passes\' ratios, '
      'their range in brackets)'
      if results['settings'].get('passes', 1) > 1
      else ''
    )
    + '.',
    '',
  ]
  for model_name, model in results['models'].items():
    lines += [
      f"## {model_name}: {model['examples_per_client']} examples per "
      f"client, batch {results['settings']['batch_size']}, "
      f"{model['local_epochs']} local epoch(s)",
      '',
      '| method | s/round | ratio to FedAvg | '
      "ratio to TFF's FedAvg | target | met | "
      'FedCKA paper (Table 4) |',
      '|---|---|---|---|---|---|---|',
    ]
    targets = TARGET_RATIO.get(model_name, {})
    paper = PAPER_RATIO.get(model_name, {})
    fedavg = model['methods']['fedavg']['median']
    num_clients = results['settings']['num_clients']
    for name, timing in model['methods'].items():
      target = targets.get(name)
      judged = _judged_ratio(timing)
      extra = model.get(f'{name}_extra')
      cell = '' if target is None else f'<= {target}'
      if extra and name in benchmark_floors.JUDGED_ON_FLOOR:
        # With its floor measured, a method is judged against the floor.
        target = benchmark_floors.floor_target(extra, fedavg, num_clients)
        judged = timing['ratio']
        cell = (
          f'<= {target:.2f} (floor + {benchmark_floors.TARGET_ABOVE_FLOOR})'
        )
      lines.append(
        f"| {name} | {timing['median']:.2f} | "
        f'{benchmark_processes.ratio_cell(timing)} | '
        f"{_format(timing.get('ratio_to_tff_fedavg'))} | {cell} | "
        f"{'' if target is None else _mark(judged, target)}"
        f" | {paper.get(name, '')} |"
      )
    for method in benchmark_floors.FLOOR_PARTS:
      extra = model.get(f'{method}_extra')
      if extra:
        measured = model['methods'].get(method)
        lines += [
          '',
          benchmark_floors.floor_note(
            method,
            extra,
            fedavg,
            num_clients,
            measured['ratio'] if measured else None,
          ),
        ]
    lines += [
      '',
      "FedAvg is the project's `fedavg`, the local-training "
      'loop every other method shares, with no regularizer: the '
      "ratio to it is what a method's own computation costs. "
      f'`{benchmark_processes.TFF_FEDAVG}` is '
      "TFF's `build_weighted_fed_avg`, which "
      'computes the same weights. A target is met when both ratios '
      "are within it; MOON's and FedCKA's, when their floors are "
      f'measured, are their floors + {benchmark_floors.TARGET_ABOVE_FLOOR}, '
      'judged on '
      'the ratio to FedAvg.',
    ]
    lines += benchmark_twins.report_lines(
      model, num_clients, results.get('matmul_flops_per_second')
    )
    lines += benchmark_in_process.report_lines(
      model,
      num_clients,
      results['settings'].get('in_process_devices', ''),
      TARGET_RATIO.get(model_name, {}),
      results.get('matmul_flops_per_second'),
    )
    lines += [
      '',
      f"Clients per second (FedAvg): "
      f"{results['settings']['num_clients'] / fedavg:.2f}. Peak "
      f"resident memory: {model['peak_mb']:.0f} MB (Python + TFF "
      'worker).',
      '',
    ]
    empty = [
      f'{name} {timing["empty_round_seconds"]:.2f} s'
      for name, timing in model['methods'].items()
      if 'empty_round_seconds' in timing
    ]
    if empty:
      lines += [
        'A round with no clients (the fixed cost of a round: the server '
        'state to the worker and back): ' + ', '.join(empty) + '.',
        '',
      ]
    lines += _flops_lines(results, model)
  if results.get('client_profile'):
    lines += client_profile.report_markdown(results['client_profile']).split(
      '\n'
    )
  floor = results.get('floor')
  if floor:
    plain = floor['plain_tf_seconds']
    overhead = benchmark.overhead_ms(
      floor['fedavg_seconds'], plain, results['settings']['num_clients']
    )
    ratio = benchmark.comparison_ratio(floor, 'fedavg_over_plain_tf')
    floor_passes = len(_floor_pass_ratios(floor, 'fedavg_over_plain_tf'))
    lines += [
      f"## FedAvg through TFF against a plain TF loop "
      f"({floor['model']}, {floor['examples_per_client']} examples "
      f"per client, {floor['local_epochs']} local epochs)",
      '',
    ]
    if floor_passes > 1:
      lines += [
        f'Each loop timed in {floor_passes} independent passes: seconds '
        "are the passes' medians, ratios the medians of the passes' "
        'ratios (their range in brackets).',
        '',
      ]
    lines += [
      '| | s/round | / plain TF |',
      '|---|---|---|',
      f"| FedAvg through TFF (the project's `fedavg`) | "
      f"{floor['fedavg_seconds']:.2f} | "
      f"{_comparison_ratio_cell(floor, 'fedavg_over_plain_tf')} |",
      f"| FedAvg through TFF (TFF's `build_weighted_fed_avg`) | "
      f"{floor['tff_fedavg_seconds']:.2f} | "
      f"{_comparison_ratio_cell(floor, 'tff_fedavg_over_plain_tf')} |",
      f'| plain TF loop (the floor) | {plain:.2f} | 1.00 |',
      f"| PyTorch loop (the reference code's way) | "
      f'{_pytorch_cell(floor)} | '
      + (
        _comparison_ratio_cell(floor, 'pytorch_over_plain_tf')
        if floor.get('pytorch_seconds')
        else ''
      )
      + ' |',
      '',
      f"The project's FedAvg / plain TF: {ratio:.2f} (target <= "
      f'{TARGET_TFF_OVER_FLOOR}: '
      f"{_mark(ratio, TARGET_TFF_OVER_FLOOR)}); TFF's builder: "
      f"{benchmark.comparison_ratio(floor, 'tff_fedavg_over_plain_tf'):.2f}.",
      "TFF's cost per client beyond the plain loop: "
      f'{overhead:.1f} ms (target <= '
      f'{TARGET_OVERHEAD_MS_PER_CLIENT:.0f}: '
      f'{_mark(overhead, TARGET_OVERHEAD_MS_PER_CLIENT)}).',
    ]
    over_pytorch = benchmark.comparison_ratio(floor, 'fedavg_over_pytorch')
    if over_pytorch is not None:
      lines.append(
        f"Faster than PyTorch (target): the project's FedAvg "
        f'{_mark(over_pytorch, 1.0)} '
        f"({_comparison_ratio_cell(floor, 'fedavg_over_pytorch', 'x')} "
        "PyTorch's time); TFF's builder "
        f"{_comparison_ratio_cell(floor, 'tff_fedavg_over_pytorch', 'x')}."
      )
    lines.append('')
  workers = results.get('workers')
  if workers:
    lines += [
      f"## FedAvg over loopback TFF workers ({workers['model']}, "
      f"{workers['examples_per_client']} examples per client, "
      f"{workers['local_epochs']} local epoch(s))",
      '',
      '| workers | s/round | clients/s |',
      '|---|---|---|',
    ]
    for count, timing in workers['by_count'].items():
      lines.append(
        f"| {count} | {timing['median']:.2f} | "
        f"{timing['clients_per_second']:.2f} |"
      )
    lines += [
      '',
      'Every worker on this machine (loopback), each running '
      f"{results['settings']['max_concurrent_clients']} client "
      'computations at once: the figures show the runtime\'s '
      'overhead of splitting a round, not a second machine\'s '
      'speed-up.',
      '',
    ]
  scaling_results = results.get('scaling')
  if scaling_results:
    lines += [
      f"## Clients per round ({scaling_results['model']}, "
      f"{scaling_results['examples_per_client']} examples per "
      'client, one local epoch, all taking part)',
      '',
      '| clients | FedAvg s/round | ms/client | plain TF s/round | '
      "ms/client | TFF's cost per client (ms) | FedAvg in-process s/round |",
      '|---|---|---|---|---|---|---|',
    ]
    for count, row in scaling_results['by_count'].items():
      count = int(count)
      in_process = row.get('fedavg_in_process_seconds')
      lines.append(
        f"| {count} | {row['fedavg_seconds']:.2f} | "
        f"{1000 * row['fedavg_seconds'] / count:.1f} | "
        f"{row['plain_tf_seconds']:.2f} | "
        f"{1000 * row['plain_tf_seconds'] / count:.1f} | "
        f"{row['overhead_ms_per_client']:.1f} | "
        f'{_format(in_process)} |'
      )
    lines.append('')
  device = results.get('cross_device')
  if device:
    lines += [
      f"## Cross-device: {device['num_clients']} EMNIST-shaped "
      f"clients of {device['min_examples']} to "
      f"{device['max_examples']} examples, "
      f"{device['clients_per_round']} per round "
      f"({device['model']}, batch {device['batch_size']}, one local "
      'epoch)',
      '',
      f"Building the partition and the clients' files: "
      f"{device['data_seconds']:.1f} s.",
      '',
      '| method | s/round | clients/s | memory growth | '
      'client states on disk | reading every state |',
      '|---|---|---|---|---|---|',
    ]
    for name, run in device['methods'].items():
      store = run.get('state_store')
      store_cells = (
        f"{store['megabytes']:.0f} MB ({store['clients']} clients) | "
        f"{store['load_seconds']:.1f} s "
        f"({1000 * store['load_seconds'] / store['clients']:.2f} ms each)"
        if store
        else 'none | '
      )
      lines.append(
        f"| {name} | {run['median']:.2f} | "
        f"{run['clients_per_second']:.1f} | "
        f"{100 * run['growth']:+.1f}% "
        f"({_mark(run['growth'], TARGET_MEMORY_GROWTH)}) | {store_cells} |"
      )
    lines += [
      '',
      'Seconds per round: median over the rounds after the '
      'first. Memory growth: resident memory (Python + TFF worker) '
      f"from round {device['after_round']} to the last, target < "
      f"{100 * TARGET_MEMORY_GROWTH:.0f}%. The state store is "
      'measured once every client has a state (clients never '
      'sampled get one written), read back from Python.',
      '',
    ]
  memory = results.get('memory')
  if memory:
    lines += [
      f"## Memory over {len(memory['rss_mb'])} rounds " f"({memory['model']})",
      '',
      f"Resident memory after round {memory['after_round']}: "
      f"{memory['rss_mb'][memory['after_round'] - 1]:.0f} MB; after "
      f"the last: {memory['rss_mb'][-1]:.0f} MB; growth "
      f"{100 * memory['growth']:.1f}% (target < "
      f"{100 * TARGET_MEMORY_GROWTH:.0f}%: "
      f"{_mark(memory['growth'], TARGET_MEMORY_GROWTH)}).",
      '',
    ]
  return '\n'.join(lines)
