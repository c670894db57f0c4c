"""Each method against its reference loop: the benchmark's PyTorch twins.

A method's twin (`pytorch_methods`) trains the same network on the same
clients with the same settings as the reference code does, its state in
memory. `time_twins` times every twin of a pass's methods; `combine`
puts the passes together with the project's times of the same passes, as
the ratio of the project's seconds per round to the twin's (below 1: the
project is faster), each pass's ratio taken within the pass, since a
machine's load moves both.
"""

import dataclasses
import functools
from typing import Any, Optional, Sequence

import numpy as np

from tff_methods.algorithms import hyperparameters
from tff_methods.algorithms import methods as methods_lib
from tff_methods.templates import model_lib
from tff_methods_tasks import datasets
from tff_methods_tasks import models as task_models
from tff_methods_tooling import benchmark_processes
from tff_methods_tooling import plain_loops
from tff_methods_tooling import pytorch_loop
from tff_methods_tooling import pytorch_methods
from tff_methods_tooling import pytorch_models


def twin_methods(model_name: str, method_names: Sequence[str]) -> list[str]:
  """The methods of `method_names` that have a twin on `model_name`: none
  on a model that is not a chain the PyTorch loop builds (a ResNet)."""
  try:
    pytorch_models.layer_plan(
      task_models.get_model(model_name, 10, (32, 32, 3))
    )
  except ValueError:
    return []
  return [m for m in method_names if m in pytorch_methods.TWINS]


def time_twins(
  python: str,
  model_name: str,
  method_names: Sequence[str],
  data: datasets.FederatedData,
  hparams: hyperparameters.Hyperparameters,
  local_epochs: int,
  batch_size: int,
  repeats: int,
  seed: int = 0,
) -> dict[str, dict[str, Any]]:
  """Seconds per round of each method's twin on `data` (every client in
  every round), from the initial weights the project's processes start
  from, after one untimed round; by method: `seconds` and `median`."""
  model_fn = functools.partial(
    task_models.get_model,
    model_name,
    data.num_classes,
    data.input_shape,
    **benchmark_processes.model_kwargs(model_name),
  )
  plan = pytorch_models.layer_plan(model_fn())
  initial = [
    np.array(w) for w in model_lib.initial_weights(model_fn, seed).trainable
  ]
  clients = plain_loops.client_arrays(data)
  timings = {}
  for name in method_names:
    settings = hparams.settings_of(methods_lib.REGISTRY[name])
    seconds, _ = pytorch_loop.run_in(
      python,
      clients,
      plan,
      local_epochs,
      batch_size,
      hparams.client_learning_rate,
      hparams.client_momentum,
      repeats=repeats,
      seed=seed,
      initial_weights=initial,
      method=name,
      method_settings=dataclasses.asdict(settings),
    )
    timings[name] = dict(
      seconds=seconds, median=benchmark_processes.median(seconds)
    )
  return timings


def combine(
  project_passes: Sequence[dict[str, dict[str, Any]]],
  twin_passes: Sequence[dict[str, dict[str, Any]]],
) -> dict[str, dict[str, Any]]:
  """The passes' twins beside the project's methods (`time_methods`' results
  of the same passes), by method: the twin's `median` seconds (over the
  passes' medians), `ratio` (the median over the passes of the project's
  median over the twin's) and `pass_ratios`."""
  combined = {}
  for name in twin_passes[0]:
    ratios = [
      project[name]['median'] / twins[name]['median']
      for project, twins in zip(project_passes, twin_passes)
    ]
    combined[name] = dict(
      seconds=[s for twins in twin_passes for s in twins[name]['seconds']],
      median=benchmark_processes.median(
        [twins[name]['median'] for twins in twin_passes]
      ),
      ratio=benchmark_processes.median(ratios),
      pass_ratios=ratios,
    )
  return combined


def target(name: str, examples_per_client: int) -> float:
  """The ratio to its twin a method should stay under: 1 (faster than the
  reference code); FedAvg 0.7 at small clients (20 examples or fewer),
  where TFF's fixed cost per client is what is left to beat."""
  return 0.7 if name == 'fedavg' and examples_per_client <= 20 else 1.0


def twin_note(error: Optional[str]) -> str:
  """What the report says when no twin was timed."""
  return f'not measured: {error or "no method has a twin on this model"}'


def arithmetic_seconds(
  model: dict, num_clients: int, matmul_flops_per_second: Optional[float]
) -> Optional[float]:
  """The least time a round's training can take in any loop: its
  arithmetic (the model's FLOPs an example, over the round's examples) at
  the machine's matmul rate; None where either was not measured."""
  per_example = model.get('training_flops_per_example')
  if not per_example or not matmul_flops_per_second:
    return None
  work = (
    per_example
    * model['examples_per_client']
    * model['local_epochs']
    * num_clients
  )
  return work / matmul_flops_per_second


def miss_note(
  name: str,
  model: dict,
  num_clients: int,
  matmul_flops_per_second: Optional[float],
) -> str:
  """What a method missing its twin's target measured, against the floor
  of the round's arithmetic."""
  ours = model['methods'][name]['median']
  twin = model['twins'][name]['median']
  allowed = target(name, model['examples_per_client']) * twin
  note = (
    f'{name} misses its target: {ours:.2f} s a round '
    f'({1000 * ours / num_clients:.1f} ms a client) against the '
    f"twin's {twin:.2f} s, where the target allows {allowed:.2f} s."
  )
  floor = arithmetic_seconds(model, num_clients, matmul_flops_per_second)
  if floor is not None:
    note += (
      " The round's training arithmetic at this machine's matmul rate "
      f'takes {floor:.2f} s (the floor of any loop), so the target leaves '
      f'{1000 * (allowed - floor) / num_clients:.1f} ms a client for '
      'everything else (calls, data, set-up); the project took '
      f'{1000 * (ours - floor) / num_clients:.1f} ms.'
    )
  return note


def report_lines(
  model: dict,
  num_clients: int,
  matmul_flops_per_second: Optional[float] = None,
) -> list[str]:
  """The benchmark report's table of a model's methods against their twins
  (`model`: one of the results' models), and what each miss measured."""
  twins = model.get('twins')
  if not twins:
    return []
  if 'note' in twins:
    return ['', f"Each method against its PyTorch twin: {twins['note']}."]
  in_process = model.get('in_process') or {}
  header = ['method', 'project s/round', 'twin s/round', 'ratio']
  if in_process:
    header[2:2] = ['in-process s/round']
    header += ['in-process ratio']
  lines = [
    '',
    "Each method against its PyTorch twin (its reference code's loop on "
    'the same network, batches and settings, state in memory; '
    '`tff_methods_tooling.pytorch_methods`), seconds per round; the ratio '
    "is the project's time over the twin's, each pass's taken within the "
    'pass'
    + (
      "; in this process's rounds against the passes' median twin; a target"
      ' is met on whichever path is faster:'
      if in_process
      else ':'
    ),
    '',
    '| ' + ' | '.join(header + ['target', 'met']) + ' |',
    '|' + '---|' * (len(header) + 2),
  ]
  missed = []
  for name, twin in twins.items():
    limit = target(name, model['examples_per_client'])
    cells = [
      name,
      f"{model['methods'][name]['median']:.2f}",
      f"{twin['median']:.2f}",
      benchmark_processes.ratio_cell(twin),
    ]
    best = twin['ratio']
    if in_process:
      here = in_process.get(name, {}).get('median')
      cells[2:2] = [f'{here:.2f}' if here else '']
      cells.append(f"{here / twin['median']:.2f}" if here else '')
      best = min(best, here / twin['median']) if here else best
    met = best < limit
    if not met:
      missed.append(name)
    cells += [f'< {limit}', 'yes' if met else '**no**']
    lines.append('| ' + ' | '.join(cells) + ' |')
  for name in missed:
    lines += ['', miss_note(name, model, num_clients, matmul_flops_per_second)]
  return lines
