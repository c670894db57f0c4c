"""Resident memory (this process and its TFF workers) and its growth over a
long FedAvg run of a small model."""

import os
from typing import Any, Optional, Sequence

from tff_methods.algorithms import hyperparameters
from tff_methods.algorithms import methods as methods_lib
from tff_methods.execution import workers
from tff_methods.templates import model_lib
from tff_methods_tasks import datasets

# Targets of issue 8: ratio of seconds per round to FedAvg's.
from tff_methods_tooling import benchmark_processes
from tff_methods_tooling import experiment


def _status_kb(pid: int, field: str) -> int:
  try:
    with open(f'/proc/{pid}/status') as f:
      for line in f:
        if line.startswith(field + ':'):
          return int(line.split()[1])
  except OSError:
    pass
  return 0


def resident_mb() -> dict[str, float]:
  """Resident and peak resident memory (MB) of this process and workers."""
  pids = {'python': os.getpid()}
  pids.update({f'worker_{i}': p for i, p in enumerate(workers.worker_pids())})
  figures = {}
  for name, pid in pids.items():
    figures[f'{name}_rss_mb'] = _status_kb(pid, 'VmRSS') / 1024
    figures[f'{name}_peak_mb'] = _status_kb(pid, 'VmHWM') / 1024
  figures['total_rss_mb'] = sum(
    v for k, v in figures.items() if k.endswith('_rss_mb')
  )
  figures['total_peak_mb'] = sum(
    v for k, v in figures.items() if k.endswith('_peak_mb')
  )
  return figures


def reset_peak_memory() -> None:
  """Restarts the peak-resident counters (Linux `clear_refs` 5), if allowed."""
  for pid in [os.getpid()] + workers.worker_pids():
    try:
      with open(f'/proc/{pid}/clear_refs', 'w') as f:
        f.write('5')
    except OSError:
      pass


def memory_growth(
  data: datasets.FederatedData,
  model_name: str,
  rounds: int,
  hparams: hyperparameters.Hyperparameters,
  batch_size: int = 32,
  after_round: int = 20,
  model_options: Optional[dict] = None,
) -> dict[str, Any]:
  """Resident memory over `rounds` FedAvg rounds of a small model.

  Returns:
    `rss_mb` per round (this process + workers), and `growth`: the relative
    increase from round `after_round` to the last.
  """
  model_fn = experiment.model_fn_for(
    'fedavg',
    model_name,
    data.num_classes,
    data.input_shape,
    hparams,
    **(model_options or {}),
  )
  process = methods_lib.build_method_for_client_ids(
    'fedavg',
    model_fn,
    *benchmark_processes.round_datasets(
      data, datasets.LocalBatches(batch_size)
    ),
    hparams,
  )
  state = process.set_model_weights(
    process.initialize(), model_lib.initial_weights(model_fn, 0)
  )
  client_ids = list(data.client_data.client_ids)
  rss = []
  for round_num in range(1, rounds + 1):
    state = process.next(
      state, benchmark_processes.keys(client_ids, round_num)
    ).state
    rss.append(resident_mb()['total_rss_mb'])
  return dict(
    rss_mb=rss, after_round=after_round, growth=growth(rss, after_round)
  )


def growth(rss_mb: Sequence[float], after_round: int) -> float:
  """Relative growth of resident memory from `after_round` to the last."""
  base = rss_mb[min(after_round, len(rss_mb)) - 1]
  return (rss_mb[-1] - base) / base
