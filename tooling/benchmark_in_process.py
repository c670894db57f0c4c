"""The benchmark's in-process figures: each method's seconds per round on
TFF's worker and in this process (`tff_methods.execution.in_process`), the
clients each device trains a second, the ratio to FedAvg in this process,
and their targets: in-process FedAvg against the worker's, and each method
against in-process FedAvg."""

import collections
import re
from typing import Mapping, Optional

from tff_methods.execution import devices
from tff_methods_tooling import benchmark_floors
from tff_methods_tooling import benchmark_processes
from tff_methods_tooling import benchmark_twins

# Up to this many examples a client a round is mostly per-client costs,
# which the in-process path (many clients a call) must do better than the
# worker.
SMALL_CLIENTS = 20


# The kernels of a model's arithmetic (convolutions, matmuls, pooling,
# activations, losses, elementwise); a client's other ops are its data and
# state (the host's: `devices.is_host_op`) or the framework's (control flow,
# variables, shapes, constants).
ARITHMETIC_OP = re.compile(
  r'Conv|MatMul|Pool|Relu|Softmax|Xent|BiasAdd|Mul|Add|Sub|Sum|Mean|Square|'
  r'Sqrt|Exp|Log|Neg|Div|Max|Min|Prod|L2Loss|Rsqrt|Tanh|Sigmoid|Pow'
)


def op_time_shares(op_micros: Mapping[str, float]) -> dict[str, float]:
  """The shares of op time (`{op type: time}`) by part: 'data and state',
  'arithmetic', 'framework'."""
  parts = collections.Counter()
  for op, micros in op_micros.items():
    if devices.is_host_op(op):
      parts['data and state'] += micros
    elif ARITHMETIC_OP.search(op):
      parts['arithmetic'] += micros
    else:
      parts['framework'] += micros
  total = sum(parts.values())
  return {part: micros / total for part, micros in parts.items()}


def fedavg_op_time_shares(
  context, model_name: str, data, hparams, local_epochs, batch_size, seed
) -> dict[str, float]:
  """The shares of a traced in-process FedAvg round's op time by part
  (`op_time_shares`), its devices' summed; run in `context` (installed),
  after a warm-up round. A traced round runs its devices one at a time."""
  client_ids = list(data.client_data.client_ids)
  process, _ = benchmark_processes.benchmark_process(
    'fedavg', model_name, data, hparams, local_epochs, batch_size, seed
  )
  state = process.initialize()
  state = process.next(state, benchmark_processes.keys(client_ids, 1)).state
  context.trace = True
  try:
    process.next(state, benchmark_processes.keys(client_ids, 2))
  finally:
    context.trace = False
  round_fn = getattr(process.next, '_computation', process.next)
  summed = collections.Counter()
  for op_micros in context.op_micros(round_fn).values():
    summed.update(op_micros)
  return op_time_shares(summed)


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
  shares = model['in_process']['fedavg'].get('op_time_shares')
  if shares:
    arithmetic = shares.get('arithmetic', 0.0)
    note += (
      f' A traced round in this process spent {arithmetic:.0%} of its op '
      "time in the arithmetic's kernels (convolutions, matmuls, "
      f"elementwise; {shares.get('data and state', 0.0):.0%} data and state, "
      f"{shares.get('framework', 0.0):.0%} the framework's ops): at that "
      f'share, {arithmetic * ours:.2f} s of this round, '
      f"{arithmetic * ours / model['methods']['fedavg']['median']:.2f} of "
      f"the worker's time, against the {limit:.2f} the target allows."
    )
  return note
