"""The benchmark's in-process figures: each method's seconds per round on
TFF's worker and in this process (`tff_methods.execution.in_process`), the
clients each device trains a second, the ratio to FedAvg in this process,
and their targets: in-process FedAvg against the worker's, and each method
against in-process FedAvg."""

from typing import Optional

from tff_methods_tooling import benchmark_floors
from tff_methods_tooling import benchmark_processes
from tff_methods_tooling import benchmark_twins

# Up to this many examples a client a round is mostly per-client costs,
# which the in-process path (many clients a call) must do better than the
# worker.
SMALL_CLIENTS = 20


def fedavg_target(model: dict) -> float:
  """In-process FedAvg's seconds over the worker's, at most: 0.7 at small
  clients, 1.0 (as fast) above."""
  return 0.7 if model['examples_per_client'] <= SMALL_CLIENTS else 1.0


def target(
  name: str, model: dict, num_clients: int, worker_targets: dict
) -> Optional[float]:
  """The ratio to in-process FedAvg `name` must stay within: its floor
  (`benchmark_floors`, when measured: every method but FedAvg's
  variants) + `TARGET_ABOVE_FLOOR`, else its target on the worker
  (`worker_targets`, by method)."""
  extra = model.get(f'{name}_extra')
  if extra and name in benchmark_floors.FLOOR_PARTS:
    return benchmark_floors.floor_target(
      extra, model['in_process']['fedavg']['median'], num_clients
    )
  return worker_targets.get(name)


def report_lines(
  model: dict,
  num_clients: int,
  devices: str,
  worker_targets: dict,
  matmul_flops_per_second: Optional[float] = None,
) -> list[str]:
  """The report's in-process table for one of the results' models, and
  each floor against FedAvg in this process where a target applies."""
  ours = model.get('in_process')
  if not ours:
    return []
  device_count = len(devices.split(','))
  lines = [
    '',
    f'In this process, on {devices} (`tff_methods.execution.in_process`), '
    'the same rounds as the table above; in-process / worker is the '
    "median of the passes' own (each pass times both paths); clients a "
    "second per device; the ratio is to FedAvg in this process. FedAvg's "
    'target is on '
    "in-process / worker, the others' on the ratio (their floor + "
    f'{benchmark_floors.TARGET_ABOVE_FLOOR} where it is measured):',
    '',
    '| method | worker s/round | in-process s/round | in-process / worker '
    '| clients/s per device | ratio to FedAvg in-process | target | met |',
    '|---|---|---|---|---|---|---|---|',
  ]
  floors, notes = [], []
  for name, timing in ours.items():
    on_worker = model['methods'][name]['median']
    # Within each pass where both paths ran in it (`benchmark_run`).
    over_worker = timing.get('over_worker', timing['median'] / on_worker)
    spread = timing.get('over_worker_passes') or []
    over_cell = f'{over_worker:.2f}' + (
      f' ({min(spread):.2f}-{max(spread):.2f})' if len(spread) > 1 else ''
    )
    if name == 'fedavg':
      limit, judged, floor = fedavg_target(model), over_worker, False
    else:
      limit = target(name, model, num_clients, worker_targets)
      judged = timing['ratio']
      floor = bool(model.get(f'{name}_extra')) and limit is not None
    cell, met = '', ''
    if limit is not None:
      cell = f'<= {limit:.2f}' + (
        f' (floor + {benchmark_floors.TARGET_ABOVE_FLOOR})' if floor else ''
      )
      met = 'yes' if judged <= limit else '**no**'
      if name == 'fedavg' and judged > limit:
        notes.append(
          _fedavg_miss(model, num_clients, limit, matmul_flops_per_second)
        )
      if floor:
        floors.append(name)
    per_device = num_clients / timing['median'] / device_count
    lines.append(
      f"| {name} | {on_worker:.2f} | {timing['median']:.2f} | "
      f'{over_cell} | {per_device:.3g} | '
      f'{benchmark_processes.ratio_cell(timing)} | {cell} | {met} |'
    )
  for note in notes:
    lines += ['', note]
  for name in floors:
    lines += [
      '',
      benchmark_floors.floor_note(
        name,
        model[f'{name}_extra'],
        ours['fedavg']['median'],
        num_clients,
        ours[name]['ratio'],
        fedavg_name='in-process FedAvg',
      ),
    ]
  return lines


def _fedavg_miss(model, num_clients, limit, matmul_flops_per_second) -> str:
  """What in-process FedAvg measured where it misses its target against
  the worker, beside the floor of the round's arithmetic."""
  ours = model['in_process']['fedavg']['median']
  allowed = limit * model['methods']['fedavg']['median']
  note = (
    f'In-process FedAvg misses its target: {ours:.2f} s a round '
    f'({1000 * ours / num_clients:.1f} ms a client) against the worker\'s '
    f"{model['methods']['fedavg']['median']:.2f} s, where the target allows "
    f'{allowed:.2f} s.'
  )
  floor = benchmark_twins.arithmetic_seconds(
    model, num_clients, matmul_flops_per_second
  )
  if floor is not None:
    note += (
      " The round's training arithmetic at this machine's matmul rate "
      f'takes {floor:.2f} s (the floor of any loop); beyond it the target '
      f'leaves {1000 * (allowed - floor) / num_clients:.1f} ms a client, '
      f'and in-process FedAvg took {1000 * (ours - floor) / num_clients:.1f}'
      ' ms.'
    )
  return note
