"""Compare methods: run each with several seeds, then tabulate and plot.

`run_comparison` runs every (arm, seed) pair of one base experiment in its own
output directory, `<output_dir>/<label>/seed<seed>` (a rerun skips finished runs
and resumes unfinished ones: `experiment.run` does both). An arm is a method, or
a labelled method with settings of its own (a preset's row, e.g. FedProx with mu
0.1). `tff_methods_tooling.comparison_report` tabulates and plots the runs from
their own records.
"""

import dataclasses
import json
import multiprocessing
import os
import queue
import signal
import sys
import time
from typing import Any, Callable, Mapping, Optional, Sequence, Union

from absl import logging

from tff_methods.execution import runtime
from tff_methods.execution import workers
from tff_methods_tooling import experiment
from tff_methods_tooling import process_setup


class RunFailedError(RuntimeError):
  """A run of a comparison failed in its job (`run_comparison(jobs > 1)`)."""


@dataclasses.dataclass(frozen=True)
class Arm:
  """One line of a comparison: a label, its method and its own settings."""

  label: str
  method: str
  settings: Mapping[str, Any] = dataclasses.field(default_factory=dict)


# Reference rows: the pooled data on one client (centralized training for
# the same number of passes, or with --local_steps the same examples a
# round: `plan`), and FedAvg on an IID partition.
REFERENCE_ROWS = {
  'centralized': dict(num_clients=1, clients_per_round=1, partition='iid'),
  'fedavg_iid': dict(partition='iid'),
}


def arms(
  methods: Sequence[str],
  settings: Optional[Mapping[str, Mapping[str, Any]]] = None,
  reference_rows: bool = False,
) -> list[Arm]:
  """The arms of a comparison: each method with its own settings.

  Args:
    methods: Method names.
    settings: By method, settings of its own (e.g. a tune run's choice,
      `tuning.read_settings`); every method must have an entry.
    reference_rows: Add `REFERENCE_ROWS`, trained as FedAvg with their own
      entry in `settings` (tuned like the methods), or else FedAvg's.

  Raises:
    ValueError: naming the methods `settings` has no entry for.
  """
  if settings is not None:
    missing = [
      m
      for m in [split_arm_name(m)[0] for m in methods]
      + (
        [r for r in REFERENCE_ROWS if 'fedavg' not in settings]
        if reference_rows
        else []
      )
      if m not in settings
    ]
    if missing:
      raise ValueError(
        f'--settings_from has no settings for '
        f'{", ".join(dict.fromkeys(missing))}; tune them, '
        'or leave them out of --methods.'
      )
  own = lambda m: dict((settings or {}).get(m, {}))
  result = [method_arm(m, own(split_arm_name(m)[0])) for m in methods]
  if reference_rows:
    result += [
      Arm(
        label,
        'fedavg',
        dict(own(label) if label in (settings or {}) else own('fedavg'), **row),
      )
      for label, row in REFERENCE_ROWS.items()
    ]
  return result


def split_arm_name(name: str) -> tuple[str, Optional[str]]:
  """`'fedcka@dp'` -> ('fedcka', 'dp'); `'fedcka'` -> ('fedcka', None)."""
  method, at, aggregator = name.partition('@')
  return method, (aggregator if at else None)


def method_arm(name: str, settings: Optional[Mapping[str, Any]] = None) -> Arm:
  """The arm of a method name: `METHOD` or `METHOD@AGGREGATOR`.

  `fedcka@dp` is FedCKA under TFF's DP aggregator (`--aggregator=dp`),
  beside `fedcka` under the shared settings' aggregator.
  """
  method, aggregator = split_arm_name(name)
  settings = dict(settings or {})
  if aggregator is not None:
    settings['aggregator'] = aggregator
  return Arm(name, method, settings)


def as_arm(arm: Union[str, Arm]) -> Arm:
  """A method name is the arm of that method with the shared settings."""
  return arm if isinstance(arm, Arm) else method_arm(arm)


def run_dir(output_dir: str, label: str, seed: int) -> str:
  return os.path.join(output_dir, label.replace('+', '_plus_'), f'seed{seed}')


def _finished(config: experiment.ExperimentConfig) -> bool:
  path = os.path.join(config.output_dir, 'results.json')
  if not os.path.exists(path):
    return False
  with open(path) as f:
    return json.load(f).get('rounds', 0) >= config.rounds


def plan(
  base: experiment.ExperimentConfig,
  arms: Sequence[Union[str, Arm]],
  seeds: Sequence[int],
  output_dir: str,
) -> list[experiment.ExperimentConfig]:
  """The run of each (arm, seed), every setting checked now.

  Args:
    base: The settings every run shares.
    arms: Method names, or `Arm`s with settings of their own.
    seeds: Each arm runs once per seed.
    output_dir: Runs go to `run_dir(output_dir, label, seed)`.

  Raises:
    ValueError: naming every bad setting of every run, before any runs.
  """
  if not arms:
    raise ValueError('--methods is empty: name at least one method.')
  if not seeds:
    raise ValueError('--seeds is empty: name at least one seed.')
  arms = [as_arm(a) for a in arms]
  labels = [a.label for a in arms]
  if len(set(labels)) != len(labels):
    raise ValueError(f'--methods names a method twice: {",".join(labels)}.')
  configs, errors = [], []
  for arm in arms:
    settings = dict(arm.settings)
    if (
      settings.get('num_clients') == 1
      and base.num_clients > 1
      and base.local_steps is not None
      and 'local_steps' not in settings
    ):
      # The pooled data on one client (the centralized row) takes as many
      # steps a round as the round's clients together: the same examples.
      settings['local_steps'] = base.local_steps * base.clients_per_round
    for seed in seeds:
      try:
        config = dataclasses.replace(
          base,
          **settings,
          method=arm.method,
          seed=seed,
          output_dir=run_dir(output_dir, arm.label, seed),
        )
        experiment.validate(config)
      except (TypeError, ValueError) as e:
        errors.append(f'{arm.label} (seed {seed}): {e}')
        continue
      configs.append(config)
  if errors:
    raise ValueError('\n'.join(errors))
  return configs


def run_comparison(
  configs: Sequence[experiment.ExperimentConfig],
  progress: bool = True,
  on_run: Optional[Callable[[str], None]] = None,
  jobs: int = 1,
  max_concurrent_clients: int = 2,
) -> None:
  """Runs every planned run that has not finished yet.

  Args:
    configs: The runs (`plan`).
    progress: Show a progress bar per run (with `jobs` 1).
    on_run: Called with a run's label when it starts (with `jobs` 1), or
      with a line saying it finished (with `jobs` > 1).
    jobs: Runs at once, each job in a process of its own with its own local
      TFF worker (`runtime.set_local_execution_context`). A run's result does
      not depend on the job that trains it; a small model leaves the cores
      idle between TFF calls, which a second job fills (digits: 1.5x the
      runs per minute on 2 cores). With 1, the runs train in this process,
      in TFF's current context.
    max_concurrent_clients: Each job's worker's client concurrency.

  Raises:
    ValueError: for `jobs` < 1, or when a run's directory holds a run saved
      with other settings (finished or not), before any run starts.
  """
  if jobs < 1:
    raise ValueError(f'jobs must be >= 1, got {jobs}.')
  changed = [
    f'{config.output_dir}: ' + '; '.join(differences)
    for config in configs
    if (differences := experiment.saved_settings_differences(config))
  ]
  if changed:
    raise ValueError(
      'These runs were saved with other settings; nothing was run. Delete '
      'them to run them again with the new settings, or give another '
      '--output_dir:\n  ' + '\n  '.join(changed)
    )
  pending = []
  for config in configs:
    if _finished(config):
      logging.info('%s: finished before, skipped.', _label(config))
    else:
      pending.append(config)
  if not pending:
    return
  if jobs == 1:
    for config in pending:
      if on_run:
        on_run(_label(config))
      experiment.run(config, progress=progress)
    return
  _run_in_jobs(pending, jobs, max_concurrent_clients, on_run)


def _label(config: experiment.ExperimentConfig) -> str:
  arm_dir = os.path.dirname(config.output_dir)
  label = os.path.basename(arm_dir)
  method_dir = os.path.basename(os.path.dirname(arm_dir))
  if method_dir.replace('_plus_', '+') == config.method:  # a tuning grid
    label = f'{method_dir}/{label}'
  return f"{label.replace('_plus_', '+')} seed {config.seed}"


def _run_in_jobs(configs, jobs, max_concurrent_clients, on_run):
  # Spawned, not forked: a job starts its own TFF worker and TensorFlow from
  # a clean interpreter, and `runtime` ends that worker when the job exits.
  # Each job takes the next run when it is free: no job idles while the
  # other still has several runs to go.
  context = multiprocessing.get_context('spawn')
  pending, done = context.Queue(), context.Queue()
  num_jobs = min(jobs, len(configs))
  for config in list(configs) + [None] * num_jobs:  # None: no runs left
    pending.put(config)
  processes = [
    context.Process(
      target=_job,
      args=(pending, max_concurrent_clients, done, os.getpid()),
    )
    for _ in range(num_jobs)
  ]
  for process in processes:
    process.start()
  try:
    for count in range(1, len(configs) + 1):
      label, accuracy, seconds, error = _next_result(done, processes)
      if error:
        raise RunFailedError(f'{label} failed: {error}')
      if on_run:
        on_run(
          f'[{count}/{len(configs)}] {label}: final accuracy '
          f'{accuracy * 100:.2f}% ({seconds:.0f} s)'
        )
  except BaseException:
    # A failed run or an interruption: the other jobs stop too. SIGTERM ends
    # their workers first; a job still alive after a grace period (in a long
    # C++ call, or on a queue lock a killed job held) is killed, and its
    # worker with it (`workers` starts workers with PDEATHSIG).
    pending.cancel_join_thread()  # No reader may be left for its last items.
    stop_jobs(processes)
    raise
  finally:
    for process in processes:
      process.join()


def stop_jobs(processes, grace_seconds: float = 10.0) -> None:
  """SIGTERM to every job, then SIGKILL to those alive after the grace."""
  for process in processes:
    process.terminate()
  deadline = time.monotonic() + grace_seconds
  for process in processes:
    process.join(max(0.0, deadline - time.monotonic()))
    if process.exitcode is None:
      process.kill()
      process.join()


# How often the parent looks at its jobs while it waits for a result.
_JOB_POLL_SECONDS = 1.0


def _next_result(done, processes):
  """The next finished run's report; raises if a job ended without one.

  A job killed (by the out-of-memory killer, a SIGKILL, or a SIGINT that
  reached only the jobs) never reports its run: waiting on the queue alone
  would wait for ever.
  """
  while True:
    try:
      return done.get(timeout=_JOB_POLL_SECONDS)
    except queue.Empty:
      pass
    ended = [p for p in processes if p.exitcode not in (None, 0)]
    if ended:
      how = ', '.join(_exit_description(p.exitcode) for p in ended)
      raise RunFailedError(
        f'{len(ended)} of the {len(processes)} jobs ended before reporting '
        f'their run ({how}); the other jobs were stopped. Rerun the same '
        'command: finished runs are kept, unfinished ones resume.'
      )
    if not any(p.is_alive() for p in processes):
      try:  # The last reports may still be in flight.
        return done.get(timeout=_JOB_POLL_SECONDS)
      except queue.Empty:
        raise RunFailedError(
          'Every job ended, but not every run was ' 'reported.'
        ) from None


def _exit_description(exitcode: int) -> str:
  if exitcode < 0:
    try:
      return f'killed by {signal.Signals(-exitcode).name}'
    except ValueError:
      return f'killed by signal {-exitcode}'
  return f'exit code {exitcode}'


def _job(pending, max_concurrent_clients, done, parent_pid):
  """Runs from `pending` until a None, in a process of its own.

  It ends with the comparison: SIGTERM (which ends its worker first) when
  the parent dies, even by SIGKILL; a Ctrl-C, which reaches every job, ends
  it quietly, the parent saying it once.
  """
  process_setup.configure_process()
  workers.end_with_parent(signal.SIGTERM)
  if os.getppid() != parent_pid:  # The parent died before the line above.
    return
  process_setup.exit_when_orphaned(parent_pid)
  try:
    _train_runs(pending, max_concurrent_clients, done)
  except (KeyboardInterrupt, workers.WorkerEndedBySignalError):
    sys.exit(130)  # As a shell reports a SIGINT.


def _train_runs(pending, max_concurrent_clients, done):
  def start_worker():
    runtime.set_local_execution_context(
      max_concurrent_clients=max_concurrent_clients
    )

  start_worker()
  for config in iter(pending.get, None):
    start = time.monotonic()
    try:
      # A job started by a library user's script has not read the argv.
      process_setup.import_modules(config.method_modules())
      results = run_restarting_worker(config, start_worker, progress=False)
    except workers.WorkerEndedBySignalError:
      raise  # The job's interruption (`_job`), not the run's failure.
    except Exception as e:
      done.put((_label(config), 0.0, 0.0, f'{type(e).__name__}: {e}'))
      return
    final_eval = results.get('final_eval') or {}
    done.put(
      (
        _label(config),
        final_eval.get('accuracy', float('nan')),
        time.monotonic() - start,
        None,
      )
    )


def run_restarting_worker(
  config: experiment.ExperimentConfig,
  start_worker: Callable[[], None],
  **run_kwargs,
) -> dict[str, Any]:
  """`experiment.run`, once more on a new worker if the worker died.

  TFF's C++ worker has crashed (SIGSEGV) once in a few hundred runs of a
  tuning grid, in a job that had trained dozens of runs; the run itself
  trained normally on a fresh worker. So a run whose worker died resumes
  from its last checkpoint on a new one (`start_worker`, which sets a new
  execution context); a second death is an error.
  """
  try:
    return experiment.run(config, **run_kwargs)
  except workers.WorkerExitedError as e:
    logging.warning(
      '%s: %s Starting a new worker; the run resumes from its '
      'last checkpoint.',
      _label(config),
      e,
    )
    start_worker()
    return experiment.run(config, **run_kwargs)
