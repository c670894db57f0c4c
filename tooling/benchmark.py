"""Speed and memory of the methods: the logic behind `binaries/benchmark`.

All figures come from one process on CIFAR-shaped data generated with a fixed
seed (`tff_methods_tasks.datasets.generated_like`), every client taking part:

- `time_methods`: seconds per round of each method at the same settings,
  measured interleaved (one round of each method in turn, `repeats` times,
  after one untimed warm-up round each) so that every method sees the same
  machine state; the median, and its ratio to FedAvg's median (the
  project's `fedavg`, the loop every method shares) and to TFF's own
  `build_weighted_fed_avg`'s (`tff_fedavg`).
- `scaling`: FedAvg's seconds per round as the cohort grows, against the
  plain loop; `loopback_worker_throughput`: FedAvg over 1..N local
  workers; `profile_methods`: each method's client op by op.

The other jobs have modules of their own: the processes every part builds
(`benchmark_processes`), the floors of the methods that compute more than
FedAvg (`benchmark_floors`), the plain TensorFlow loop and the machine's FLOP/s
(`plain_loops`), memory (`benchmark_memory`), the cross-device run
(`cross_device`), each method's PyTorch twin (`benchmark_twins`), the
in-process table (`benchmark_in_process`) and the report beside the targets
(`benchmark_report`).
"""

import time
from typing import Any, Callable, Optional, Sequence

import tensorflow_federated as tff

from tff_methods.algorithms import hyperparameters
from tff_methods.execution import runtime
from tff_methods.execution import workers
from tff_methods.templates import model_lib
from tff_methods_tasks import datasets

# Targets of issue 8: ratio of seconds per round to FedAvg's.
from tff_methods_tooling import benchmark_processes
from tff_methods_tooling import client_profile
from tff_methods_tooling import plain_loops


def time_methods(
  model_name: str,
  method_names: Sequence[str],
  data: datasets.FederatedData,
  hparams: hyperparameters.Hyperparameters,
  local_epochs: int,
  batch_size: int,
  repeats: int = 3,
  seed: int = 0,
  on_round: Optional[Callable[[str, float], None]] = None,
) -> dict[str, dict[str, Any]]:
  """Seconds per round of each method, interleaved; ratios to FedAvg.

  FedAvg is the project's (`fedavg`), the local-training loop every method
  shares with no regularizer, so a ratio to it is what a method's own
  computation costs.

  Args:
    model_name: A `tff_methods_tasks.models` model (Fed2 uses its grouped form).
    method_names: Methods to time; must include 'fedavg'.
    data: The clients' data; every client takes part in every round.
    hparams: Shared optimizer settings and strengths.
    local_epochs: Local epochs per round.
    batch_size: Local batch size.
    repeats: Timed rounds of each method.
    seed: Initial weights.
    on_round: Called with (method, seconds) after every round.

  Returns:
    By method: `seconds` (each timed round), `median`, `ratio` (to FedAvg's
    median), `ratio_to_tff_fedavg` (when `tff_fedavg` is timed),
    `build_seconds`, `first_round_seconds`, and `empty_round_seconds`: the
    median of three rounds with no clients, after the timed ones (a round's
    fixed cost: the server state's trip to the worker and back).
  """
  if 'fedavg' not in method_names:
    raise ValueError('time_methods needs fedavg, the reference.')
  client_ids = list(data.client_data.client_ids)
  runs = {}
  for name in method_names:
    start = time.perf_counter()
    process, model_fn = benchmark_processes.benchmark_process(
      name, model_name, data, hparams, local_epochs, batch_size, seed
    )
    state = process.initialize()
    state = process.set_model_weights(
      state, model_lib.initial_weights(model_fn, seed)
    )
    build = time.perf_counter() - start
    start = time.perf_counter()
    # Warm-up, round 1: not timed.
    state = process.next(state, benchmark_processes.keys(client_ids, 1)).state
    first = time.perf_counter() - start
    runs[name] = dict(
      process=process,
      state=state,
      seconds=[],
      build_seconds=build,
      first_round_seconds=first,
    )
  for round_num in range(2, repeats + 2):
    for name in method_names:
      run = runs[name]
      start = time.perf_counter()
      run['state'] = (
        run['process']
        .next(run['state'], benchmark_processes.keys(client_ids, round_num))
        .state
      )
      seconds = time.perf_counter() - start
      run['seconds'].append(seconds)
      if on_round:
        on_round(name, seconds)
  for run in runs.values():
    empty = []
    for _ in range(3):
      start = time.perf_counter()
      run['process'].next(run['state'], [])
      empty.append(time.perf_counter() - start)
    run['empty_round_seconds'] = benchmark_processes.median(empty)
  reference = benchmark_processes.median(runs['fedavg']['seconds'])
  timings = {
    name: dict(
      seconds=run['seconds'],
      median=benchmark_processes.median(run['seconds']),
      ratio=benchmark_processes.median(run['seconds']) / reference,
      build_seconds=run['build_seconds'],
      first_round_seconds=run['first_round_seconds'],
      empty_round_seconds=run['empty_round_seconds'],
    )
    for name, run in runs.items()
  }
  if benchmark_processes.TFF_FEDAVG in timings:
    tff_fedavg = timings[benchmark_processes.TFF_FEDAVG]['median']
    for timing in timings.values():
      timing['ratio_to_tff_fedavg'] = timing['median'] / tff_fedavg
  return timings


def profile_methods(
  model_name: str,
  method_names: Sequence[str],
  data: datasets.FederatedData,
  examples_per_client: int,
  hparams: hyperparameters.Hyperparameters,
  local_epochs: int,
  batch_size: int,
  rounds: int = 3,
  traced_clients: int = 8,
  seed: int = 0,
) -> dict[str, Any]:
  """Each method's client computation op by op (`client_profile`), built
  as `time_methods` builds it, on `data`'s clients (of
  `examples_per_client` examples, as the report says).

  Returns:
    The report's `client_profile`: the settings and, by method,
    `client_profile.profile_clients`' figures.
  """
  client_ids = list(data.client_data.client_ids)
  sessions = {}
  try:
    for name in method_names:
      process, model_fn = benchmark_processes.benchmark_process(
        name, model_name, data, hparams, local_epochs, batch_size, seed
      )
      sessions[name] = client_profile.ClientSession(
        process, model_lib.initial_weights(model_fn, seed)
      )
    profiles = client_profile.profile_clients(
      sessions,
      client_ids,
      rounds=rounds,
      traced_clients=min(traced_clients, len(client_ids)),
    )
  finally:
    for session in sessions.values():
      session.close()
  return dict(
    model=model_name,
    examples_per_client=examples_per_client,
    local_epochs=local_epochs,
    batch_size=batch_size,
    methods=profiles,
  )


def loopback_worker_throughput(
  data: datasets.FederatedData,
  model_name: str,
  hparams: hyperparameters.Hyperparameters,
  local_epochs: int,
  batch_size: int,
  worker_counts: Sequence[int] = (1, 2),
  repeats: int = 3,
  max_concurrent_clients: int = 2,
  seed: int = 0,
) -> dict[int, dict]:
  """FedAvg clients per second with N TFF workers on 127.0.0.1.

  For each N, starts N packaged workers, runs rounds through
  `runtime.create_remote_execution_context` (TFF's mergeable context, each
  worker training a contiguous part of the clients), and stops them.

  Returns:
    By N: `seconds` (each timed round after a warm-up), `median` and
    `clients_per_second`.
  """
  from tensorflow_federated.python.core.impl.context_stack import (
    context_stack_impl,
  )

  client_ids = list(data.client_data.client_ids)
  process, model_fn = benchmark_processes.benchmark_process(
    'fedavg', model_name, data, hparams, local_epochs, batch_size, seed
  )
  results = {}
  for count in worker_counts:
    started = [
      workers.start_worker(
        max_concurrent_computation_calls=max_concurrent_clients
      )
      for _ in range(count)
    ]
    try:
      context = runtime.create_remote_execution_context(
        [f'127.0.0.1:{port}' for _, port in started]
      )
      with context_stack_impl.context_stack.install(context):
        state = process.set_model_weights(
          process.initialize(), model_lib.initial_weights(model_fn, seed)
        )
        state = process.next(
          state, benchmark_processes.keys(client_ids, 1)
        ).state  # Warm-up.
        seconds = []
        for round_num in range(2, repeats + 2):
          start = time.perf_counter()
          state = process.next(
            state, benchmark_processes.keys(client_ids, round_num)
          ).state
          seconds.append(time.perf_counter() - start)
    finally:
      for worker, _ in started:
        worker.kill()
        worker.wait()
    results[count] = dict(
      seconds=seconds,
      median=benchmark_processes.median(seconds),
      clients_per_second=len(client_ids) / benchmark_processes.median(seconds),
    )
  return results


def scaling(
  client_counts: Sequence[int],
  model_name: str,
  examples_per_client: int,
  batch_size: int,
  hparams: hyperparameters.Hyperparameters,
  cache_dir: str,
  repeats: int = 3,
  seed: int = 0,
  in_process_context=None,
) -> dict[int, dict[str, Any]]:
  """FedAvg's seconds per round as the cohort grows, against the plain loop.

  For each N of `client_counts`: N generated CIFAR-shaped clients of
  `examples_per_client` examples, all taking part, one local epoch; the
  project's FedAvg through TFF and `PlainTFFedAvg` at the same settings,
  and FedAvg in `in_process_context` when one is given.

  Returns:
    By N: `fedavg_seconds`, `plain_tf_seconds` (medians),
    `overhead_ms_per_client`: what TFF adds per client beyond the plain
    loop's arithmetic, and `fedavg_in_process_seconds`.
  """
  results = {}
  for count in client_counts:
    data = datasets.generated_like(
      'cifar10', count, examples_per_client, cache_dir, seed=seed
    )
    fedavg = time_methods(
      model_name, ['fedavg'], data, hparams, 1, batch_size, repeats, seed
    )['fedavg']['median']
    plain = benchmark_processes.median(
      plain_loops.plain_tf_round_seconds(
        model_name,
        plain_loops.client_arrays(data),
        data.num_classes,
        1,
        batch_size,
        hparams.client_learning_rate,
        hparams.client_momentum,
        repeats,
        seed,
      )
    )
    results[count] = dict(
      fedavg_seconds=fedavg,
      plain_tf_seconds=plain,
      overhead_ms_per_client=overhead_ms(fedavg, plain, count),
    )
    if in_process_context is not None:
      with tff.framework.get_context_stack().install(in_process_context):
        results[count]['fedavg_in_process_seconds'] = time_methods(
          model_name, ['fedavg'], data, hparams, 1, batch_size, repeats, seed
        )['fedavg']['median']
      in_process_context.close()
  return results


def overhead_ms(
  fedavg_seconds: float, plain_seconds: float, num_clients: int
) -> float:
  return 1000 * (fedavg_seconds - plain_seconds) / num_clients


def combine_passes(passes: Sequence[dict[str, dict[str, Any]]]) -> dict:
  """`time_methods`' results of independent passes, as one result.

  Each method's `median` and `ratio` (and `ratio_to_tff_fedavg`) are the
  medians over the passes of each pass's own; `pass_ratios` lists the
  passes' ratios, whose range is the spread a single pass can show.
  """
  combined = {}
  for name in passes[0]:
    timings = [p[name] for p in passes]
    entry = dict(
      seconds=[s for t in timings for s in t['seconds']],
      median=benchmark_processes.median([t['median'] for t in timings]),
      ratio=benchmark_processes.median([t['ratio'] for t in timings]),
      pass_ratios=[t['ratio'] for t in timings],
    )
    if 'empty_round_seconds' in timings[0]:
      entry['empty_round_seconds'] = benchmark_processes.median(
        [t['empty_round_seconds'] for t in timings]
      )
    if 'ratio_to_tff_fedavg' in timings[0]:
      entry['ratio_to_tff_fedavg'] = benchmark_processes.median(
        [t['ratio_to_tff_fedavg'] for t in timings]
      )
    combined[name] = entry
  return combined


# The floor comparison's ratios: name -> (numerator, denominator) seconds.
FLOOR_RATIOS = {
  'fedavg_over_plain_tf': ('fedavg_seconds', 'plain_tf_seconds'),
  'tff_fedavg_over_plain_tf': ('tff_fedavg_seconds', 'plain_tf_seconds'),
  'pytorch_over_plain_tf': ('pytorch_seconds', 'plain_tf_seconds'),
  'fedavg_over_pytorch': ('fedavg_seconds', 'pytorch_seconds'),
  'tff_fedavg_over_pytorch': ('tff_fedavg_seconds', 'pytorch_seconds'),
}


def combine_floor_passes(passes: Sequence[dict[str, Any]]) -> dict:
  """The floor comparison's independent passes, as one result.

  Each pass times FedAvg through TFF, TFF's builder, the plain TF loop and
  (when measured) the PyTorch loop one after the other. Each time is the
  median over the passes, each ratio (`FLOOR_RATIOS`) the median of the
  passes' own ratios, with `pass_ratios` for their spread: a machine's
  load moves the loops apart within a pass, so a ratio is judged on its
  median, as the methods' are (`combine_passes`).
  """
  combined = dict(passes[0])
  for key in ('fedavg', 'tff_fedavg', 'plain_tf', 'pytorch'):
    values = [p[f'{key}_seconds'] for p in passes if p.get(f'{key}_seconds')]
    if values:
      combined[f'{key}_seconds'] = benchmark_processes.median(values)
      combined[f'{key}_all'] = [s for p in passes for s in p[f'{key}_all']]
  combined['ratios'] = {}
  for name, (numerator, denominator) in FLOOR_RATIOS.items():
    ratios = [
      p[numerator] / p[denominator]
      for p in passes
      if p.get(numerator) and p.get(denominator)
    ]
    if ratios:
      combined['ratios'][name] = dict(
        median=benchmark_processes.median(ratios), pass_ratios=ratios
      )
  return combined


def comparison_ratio(floor: dict, name: str) -> Optional[float]:
  """A `FLOOR_RATIOS` ratio of the floor comparison: the median over its
  passes, or (one pass, or results written before passes) the ratio of
  its times; None when one of them was not measured."""
  if name in floor.get('ratios', {}):
    return floor['ratios'][name]['median']
  numerator, denominator = FLOOR_RATIOS[name]
  if not floor.get(numerator) or not floor.get(denominator):
    return None
  return floor[numerator] / floor[denominator]
