"""The cross-device run: EMNIST-shaped clients of varied sizes, a cohort
sampled per round, seconds per round, memory growth, and the client-state
store's size and read time for the stateful methods."""

import dataclasses
import os
import shutil
import time
from typing import Any, Callable, Optional, Sequence

from tff_methods.algorithms import hyperparameters
from tff_methods.templates import model_lib
from tff_methods_tasks import datasets

# Targets of issue 8: ratio of seconds per round to FedAvg's.
from tff_methods_tooling import benchmark_memory
from tff_methods_tooling import benchmark_processes

# The cross-device run's task: EMNIST's writers (3,400 of 100 to 300
# examples, 62 classes) in generated form.
CROSS_DEVICE_TASK = 'emnist'


def cross_device(
  method_names: Sequence[str],
  *,
  num_clients: int,
  min_examples: int,
  max_examples: int,
  clients_per_round: int,
  rounds: int,
  model_name: str,
  batch_size: int,
  hparams: hyperparameters.Hyperparameters,
  output_dir: str,
  seed: int = 0,
  on_round: Optional[Callable[[str, int, float], None]] = None,
) -> dict[str, Any]:
  """A cross-device federation: many small clients, a sample per round.

  Generated EMNIST-shaped data (`num_clients` clients of `min_examples` to
  `max_examples`), `clients_per_round` sampled per round as
  `tff_methods_tooling.training_loop` samples them, one local epoch. For each
  method: seconds per round, clients per second, and resident memory (Python +
  TFF worker) after every round. For methods with per-client state, after the
  rounds: every client is given a state (those never sampled get one
  written from Python), and the store's size on disk and the time to read
  every client's state back are measured.

  Returns:
    The settings, `data_seconds` (building the partition and writing the
    clients' files), and under `methods`, by method: `seconds` per round,
    `median`, `clients_per_second`, `rss_mb` per round, `growth` (from
    round 10 to the last), and for stateful methods `state_store`
    (`clients`, `megabytes`, `load_seconds`).
  """
  cache_dir = os.path.join(output_dir, 'cache')
  shutil.rmtree(cache_dir, ignore_errors=True)  # Timed from scratch.
  start = time.perf_counter()
  data = datasets.generated_like(
    CROSS_DEVICE_TASK,
    num_clients,
    min_examples,
    cache_dir,
    seed=seed,
    max_examples_per_client=max_examples,
  )
  after_round = min(10, rounds)
  results = dict(
    num_clients=num_clients,
    min_examples=min_examples,
    max_examples=max_examples,
    clients_per_round=clients_per_round,
    rounds=rounds,
    model=model_name,
    batch_size=batch_size,
    data_seconds=time.perf_counter() - start,
    after_round=after_round,
    methods={},
  )
  client_ids = list(data.client_data.client_ids)
  for name in method_names:
    state_dir = os.path.join(output_dir, 'client_states', name)
    shutil.rmtree(state_dir, ignore_errors=True)
    method_hparams = dataclasses.replace(
      hparams, num_clients=num_clients, client_state_dir=state_dir
    )
    process, model_fn = benchmark_processes.benchmark_process(
      name, model_name, data, method_hparams, 1, batch_size, seed
    )
    state = process.set_model_weights(
      process.initialize(), model_lib.initial_weights(model_fn, seed)
    )
    client_states = getattr(process, 'client_states', None)
    seconds, rss = [], []
    for round_num in range(1, rounds + 1):
      cohort = datasets.sample_clients(
        client_ids, clients_per_round, round_num, seed
      )
      begin = time.perf_counter()
      state = process.next(
        state, benchmark_processes.keys(cohort, round_num)
      ).state
      seconds.append(time.perf_counter() - begin)
      if client_states is not None:
        # As the training loop does: only the newest version is kept.
        client_states.prune(cohort, round_num)
      rss.append(benchmark_memory.resident_mb()['total_rss_mb'])
      if on_round:
        on_round(name, round_num, seconds[-1])
    timed = seconds[1:] or seconds  # The first round builds the graphs.
    results['methods'][name] = dict(
      seconds=seconds,
      median=benchmark_processes.median(timed),
      clients_per_second=clients_per_round / benchmark_processes.median(timed),
      rss_mb=rss,
      growth=benchmark_memory.growth(rss, after_round),
    )
    if client_states is not None:
      results['methods'][name]['state_store'] = _fill_and_load_states(
        client_states, client_ids, rounds
      )
  return results


def _fill_and_load_states(
  client_states, client_ids: Sequence[str], rounds: int
) -> dict[str, float]:
  """Size and read time of the store once every client has a state."""
  for client_id in client_ids:
    if client_id not in client_states:
      client_states.put(client_id, client_states.initial_state, rounds)
  size = 0
  for root, _, files in os.walk(client_states.directory):
    size += sum(os.path.getsize(os.path.join(root, f)) for f in files)
  start = time.perf_counter()
  for client_id in client_ids:
    client_states.get(client_id)
  return dict(
    clients=len(client_ids),
    megabytes=size / 2**20,
    load_seconds=time.perf_counter() - start,
  )
