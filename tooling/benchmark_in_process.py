"""The benchmark's in-process figures: each method's seconds per round on
TFF's worker and in this process (`tff_methods.execution.in_process`), its ratio
to FedAvg in this process, and, at small clients, the stateful methods' targets
there, where their client states stay in memory."""

from typing import Optional

from tff_methods_tooling import benchmark_floors
from tff_methods_tooling import benchmark_processes

# The in-process targets apply at this many examples a client or fewer:
# there a round is mostly per-client costs, the state's among them.
SMALL_CLIENTS = 20

# Ratio to FedAvg in this process. MOON and FedCKA: their floors against
# FedAvg in this process + `benchmark_floors.TARGET_ABOVE_FLOOR`.
TARGET_RATIO = {'scaffold': 1.15}


def target(name: str, model: dict, num_clients: int) -> Optional[float]:
  """The in-process ratio `name` must stay within, if it has a target."""
  if model['examples_per_client'] > SMALL_CLIENTS:
    return None
  if name in TARGET_RATIO:
    return TARGET_RATIO[name]
  extra = model.get(f'{name}_extra')
  if name in benchmark_floors.JUDGED_ON_FLOOR and extra:
    return benchmark_floors.floor_target(
      extra, model['in_process']['fedavg']['median'], num_clients
    )
  return None


def report_lines(model: dict, num_clients: int, devices: str) -> list[str]:
  """The report's in-process table for one of the results' models, and
  each floor against FedAvg in this process where a target applies."""
  ours = model.get('in_process')
  if not ours:
    return []
  lines = [
    '',
    f'In this process, on {devices} (`tff_methods.execution.in_process`), '
    'the same rounds as the table above; the ratio is to FedAvg in this '
    f'process, and at {SMALL_CLIENTS} examples a client or fewer the stateful '
    'methods (their client states in memory here) have targets:',
    '',
    '| method | worker s/round | in-process s/round | in-process / worker '
    '| ratio to FedAvg in-process | target | met |',
    '|---|---|---|---|---|---|---|',
  ]
  floors = []
  for name, timing in ours.items():
    on_worker = model['methods'][name]['median']
    limit = target(name, model, num_clients)
    cell, met = '', ''
    if limit is not None:
      on_floor = name not in TARGET_RATIO
      cell = f'<= {limit:.2f}' + (
        f' (floor + {benchmark_floors.TARGET_ABOVE_FLOOR})' if on_floor else ''
      )
      met = 'yes' if timing['ratio'] <= limit else '**no**'
      if model.get(f'{name}_extra'):
        floors.append(name)
    lines.append(
      f"| {name} | {on_worker:.2f} | {timing['median']:.2f} | "
      f"{timing['median'] / on_worker:.2f} | "
      f'{benchmark_processes.ratio_cell(timing)} | '
      f'{cell} | {met} |'
    )
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
