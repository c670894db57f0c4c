"""Compare methods: run each with several seeds, then tabulate and plot.

`run_comparison` runs every (arm, seed) pair of one base experiment in its
own output directory, `<output_dir>/<label>/seed<seed>` (a rerun skips
finished runs and resumes unfinished ones: `experiment.run` does both). An
arm is a method, or a labelled method with settings of its own (a preset's
row, e.g. FedProx with mu 0.1).
`summarize` reads the runs' `metrics.csv` files back, and `write_report`
writes `comparison.md`, `comparison.csv` and `accuracy.png`:

  final and best test accuracy (mean +- std over seeds), macro-F1, the
  first round reaching a target accuracy, median seconds per round, and the
  paper's number where a preset gives one.
"""

import csv
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
import numpy as np

from tff_methods import runtime
from tff_methods import workers
from tooling import experiment
from tooling import process_setup
from tooling import training_loop


class RunFailedError(RuntimeError):
  """A run of a comparison failed in its job (`run_comparison(jobs > 1)`)."""


@dataclasses.dataclass(frozen=True)
class Arm:
  """One line of a comparison: a label, its method and its own settings."""

  label: str
  method: str
  settings: Mapping[str, Any] = dataclasses.field(default_factory=dict)


# Reference rows: the pooled data on one client (centralized training for
# the same number of passes), and FedAvg on an IID partition.
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
    for seed in seeds:
      try:
        config = dataclasses.replace(
          base,
          **arm.settings,
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
  try:
    _train_runs(pending, max_concurrent_clients, done)
  except KeyboardInterrupt:
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
      results = run_restarting_worker(config, start_worker, progress=False)
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


def _read_metrics(run_directory: str) -> list[dict]:
  """A run's metrics.csv rows; a ValueError naming the file if it is
  missing, unreadable or holds no evaluated round."""
  path = os.path.join(run_directory, 'metrics.csv')
  try:
    with open(path, newline='') as f:
      rows = list(csv.DictReader(f))
  except (OSError, UnicodeDecodeError, csv.Error) as e:
    raise ValueError(
      f"{path} can't be read ({e}): restore it, or delete the run's "
      'directory to run it again.'
    ) from None
  if not any(row.get('eval/accuracy') for row in rows):
    raise ValueError(
      f"{path} holds no evaluated round: restore it, or delete the run's "
      'directory to run it again.'
    )
  return rows


def _accuracy_curve(rows):
  rounds, accuracy = [], []
  for row in rows:
    value = row.get('eval/accuracy', '')
    if value not in ('', None):
      rounds.append(int(row['round']))
      accuracy.append(float(value))
  return np.asarray(rounds), np.asarray(accuracy)


def _mean_std(values):
  values = np.asarray(values, float)
  return float(np.mean(values)), float(np.std(values))


@dataclasses.dataclass
class MethodSummary:
  method: str
  seeds: int
  final_accuracy: tuple[float, float]
  best_accuracy: tuple[float, float]
  final_macro_f1: tuple[float, float]
  rounds_to_target: Optional[float]
  reached_target: int
  seconds_per_round: float
  # The final figures are the mean of this many last evaluations.
  last_rounds: int = 1
  # A DP arm's client-level epsilon after its last round (metrics.csv's
  # dp/epsilon); None for other arms.
  epsilon: Optional[float] = None
  # The fewest and the most rounds its runs trained (their own records).
  rounds: tuple[int, int] = (0, 0)


def rounds_run(summaries: Sequence[MethodSummary]) -> str:
  """'N rounds', or 'N-M rounds' when the runs trained different counts."""
  low = min(s.rounds[0] for s in summaries)
  high = max(s.rounds[1] for s in summaries)
  if low == high:
    return f'{low} round' + ('' if low == 1 else 's')
  return f'{low}-{high} rounds'


# Settings every run differs in by construction, or that do not change
# what a run computes.
_NOT_ARM_SETTINGS = frozenset(
  {'method', 'seed', 'output_dir', 'cache_dir', 'data_dir', 'rounds'}
  | set(training_loop.RESUMABLE_KEYS)
)


def arm_settings(
  output_dir: str, labels: Sequence[str], seeds: Sequence[int]
) -> dict[str, dict[str, Any]]:
  """By arm, the settings its runs recorded (experiment.json) in which
  the arms differ: what each arm actually ran with."""
  recorded = {}
  for label in labels:
    path = os.path.join(run_dir(output_dir, label, seeds[0]), 'experiment.json')
    try:
      with open(path) as f:
        recorded[label] = json.load(f)
    except (OSError, ValueError):
      recorded[label] = {}
  names = set().union(*(r.keys() for r in recorded.values())) - (
    _NOT_ARM_SETTINGS
  )
  differing = sorted(
    n
    for n in names
    if len({json.dumps(r.get(n)) for r in recorded.values()}) > 1
  )
  return {
    label: {n: recorded[label].get(n) for n in differing} for label in labels
  }


def _rounds_of_run(run_directory: str, rows: Sequence[Mapping[str, str]]):
  """The rounds a run trained, its metrics.csv checked against its
  results.json (a truncated metrics.csv would misstate its figures)."""
  last = int(rows[-1]['round']) if rows else 0
  if [int(row['round']) for row in rows] != list(range(1, last + 1)):
    raise ValueError(
      f'{os.path.join(run_directory, "metrics.csv")} does not hold rounds '
      f'1-{last} once each (deleted or cut, then the run resumed?): restore '
      "it, or delete the run's directory to run it again."
    )
  path = os.path.join(run_directory, 'results.json')
  if os.path.exists(path):
    with open(path) as f:
      recorded = json.load(f).get('rounds', last)
    if recorded != last:
      raise ValueError(
        f'{os.path.join(run_directory, "metrics.csv")} ends at round {last}, '
        f'but {path} says the run trained {recorded}: metrics.csv is '
        'incomplete. Restore it, or delete the run\'s directory to run it '
        'again.'
      )
  return last


def summarize(
  output_dir: str,
  labels: Sequence[str],
  seeds: Sequence[int],
  target_accuracy: float,
  last_rounds: int = 1,
) -> list[MethodSummary]:
  """One summary per arm (by label) from its runs' metrics.

  Args:
    output_dir: The comparison's directory.
    labels: The arms' labels.
    seeds: The seeds each arm ran with.
    target_accuracy: The accuracy whose first round is reported.
    last_rounds: The final accuracy and macro-F1 are the mean of the last
      `last_rounds` evaluations: a run that oscillates from round to round
      is then judged by its level, not by where its last round fell.
  """
  if last_rounds < 1:
    raise ValueError(f'last_rounds must be >= 1, got {last_rounds}.')
  summaries = []
  for method in labels:
    finals, bests, f1s, to_target, seconds = [], [], [], [], []
    epsilons, trained, evaluations = [], [], []
    for seed in seeds:
      rows = _read_metrics(run_dir(output_dir, method, seed))
      trained.append(_rounds_of_run(run_dir(output_dir, method, seed), rows))
      if rows and rows[-1].get('dp/epsilon'):
        epsilons.append(float(rows[-1]['dp/epsilon']))
      rounds, accuracy = _accuracy_curve(rows)
      evaluations.append(len(accuracy))
      finals.append(np.mean(accuracy[-last_rounds:]))
      bests.append(accuracy.max())
      f1 = [float(r['eval/macro_f1']) for r in rows if r.get('eval/macro_f1')]
      # TFF's baseline tasks report their own metrics, without macro-F1.
      f1s.append(float(np.mean(f1[-last_rounds:])) if f1 else float('nan'))
      reached = np.flatnonzero(accuracy >= target_accuracy)
      if reached.size:
        to_target.append(rounds[reached[0]])
      seconds.append(np.median([float(r['seconds']) for r in rows]))
    summaries.append(
      MethodSummary(
        method,
        len(seeds),
        _mean_std(finals),
        _mean_std(bests),
        _mean_std(f1s),
        float(np.mean(to_target)) if len(to_target) == len(seeds) else None,
        len(to_target),
        float(np.median(seconds)),
        min([last_rounds] + evaluations),  # what the mean really took
        float(np.mean(epsilons)) if epsilons else None,
        (min(trained), max(trained)),
      )
    )
  return summaries


def _pm(pair, seeds, scale=100.0):
  if np.isnan(pair[0]):
    return 'n/a'  # Not measured (macro-F1 on TFF's baseline tasks).
  # One seed has no spread: `-`, not a misleading 0.00.
  spread = f'{pair[1] * scale:.2f}' if seeds > 1 else '-'
  return f'{pair[0] * scale:.2f} ± {spread}'


def _epsilon(epsilon: Optional[float]) -> str:
  if epsilon is None:
    return ''
  return 'none (no noise)' if np.isnan(epsilon) else f'{epsilon:.2f}'


def _paper_figure(reported: Optional[Mapping[str, float]]) -> str:
  if not reported:
    return ''
  text = f'{reported["accuracy"]:.2f}'
  if 'accuracy_std' in reported:
    text += f' ± {reported["accuracy_std"]:.2f}'
  if 'best_accuracy' in reported:
    text = f'{text} (best {reported["best_accuracy"]:.2f})'
  return text


def write_report(
  summaries: Sequence[MethodSummary],
  output_dir: str,
  target_accuracy: float,
  title: str,
  reported: Optional[Mapping[str, Mapping[str, float]]] = None,
  labels: Optional[Mapping[str, str]] = None,
  references: Sequence[Any] = (),
  settings: Optional[Mapping[str, Mapping[str, Any]]] = None,
) -> dict:
  """Writes comparison.md and comparison.csv; returns their paths.

  Args:
    summaries: From `summarize`.
    output_dir: Where to write.
    target_accuracy: The accuracy whose first round is reported.
    title: The table's heading.
    reported: By arm label, the paper's numbers (`presets.Row.reported`,
      in percent); adds a "paper" column.
    labels: By arm label, the name shown (e.g. the paper's row name).
    references: Published rows of methods not run here
      (`presets.Preset.references`): their paper figure, beside the table.
    settings: By arm label, the settings in which the arms differ
      (`arm_settings`), listed under the table.
  """
  os.makedirs(output_dir, exist_ok=True)
  reported = reported or {}
  labels = labels or {}
  ranked = sorted(summaries, key=lambda s: -s.final_accuracy[0])
  target = f'rounds to {target_accuracy:.0%}'
  paper = ' paper final accuracy (%) |' if reported else ''
  private = any(s.epsilon is not None for s in summaries)
  dp = ' DP epsilon |' if private else ''
  lines = [
    f'# {title}',
    '',
    f'| method | final accuracy (%) | best accuracy (%) | macro-F1 (%) '
    f'| {target} | s/round |{dp}{paper}',
    '|---|---|---|---|---|---|'
    + ('---|' if private else '')
    + ('---|' if reported else ''),
  ]
  for s in ranked:
    rounds = (
      f'{s.rounds_to_target:.1f}'
      if s.rounds_to_target is not None
      else f'not reached ({s.reached_target}/{s.seeds} seeds)'
    )
    name = labels.get(s.method, s.method)
    lines.append(
      f'| {name} | {_pm(s.final_accuracy, s.seeds)} | '
      f'{_pm(s.best_accuracy, s.seeds)} | '
      f'{_pm(s.final_macro_f1, s.seeds)} | '
      f'{rounds} | {s.seconds_per_round:.2f} |'
      + (f' {_epsilon(s.epsilon)} |' if private else '')
      + (f' {_paper_figure(reported.get(s.method))} |' if reported else '')
    )
  for row in references:
    lines.append(
      f'| {row.label} (paper only, not run here) | | | | | |'
      + (' |' if private else '')
      + f' {_paper_figure(row.reported)} |'
    )
  last = ranked[0].last_rounds
  when = (
    'after the last round'
    if last == 1
    else f"(final: the mean of the last {last} rounds' evaluations)"
  )
  if (
    len({s.rounds for s in ranked}) > 1
    or ranked[0].rounds[0] != (ranked[0].rounds[1])
  ):
    lines += [
      '',
      'Rounds trained differ: '
      + ', '.join(
        f'{labels.get(s.method, s.method)} '
        + '-'.join(str(r) for r in sorted(set(s.rounds)))
        for s in ranked
      )
      + '.',
    ]
  differing = [
    f'{labels.get(s.method, s.method)} '
    + ', '.join(f'{k}={v}' for k, v in settings[s.method].items())
    for s in ranked
    if settings and settings.get(s.method)
  ]
  if differing:
    lines += ['', 'Settings in which the arms differ: ' + '; '.join(differing)]
  lines += [
    '',
    f'Mean ± std over {ranked[0].seeds} seed(s); accuracy and '
    f'macro-F1 on the central test set {when}.'
    + (
      ' DP epsilon: client-level, after the last round, at the delta of '
      "each run's results.json."
      if private
      else ''
    ),
  ]
  md_path = os.path.join(output_dir, 'comparison.md')
  with open(md_path, 'w') as f:
    f.write('\n'.join(lines) + '\n')
  csv_path = os.path.join(output_dir, 'comparison.csv')
  with open(csv_path, 'w', newline='') as f:
    writer = csv.writer(f)
    writer.writerow(
      [
        'method',
        'seeds',
        'final_accuracy_mean',
        'final_accuracy_std',
        'best_accuracy_mean',
        'best_accuracy_std',
        'final_macro_f1_mean',
        'final_macro_f1_std',
        'rounds_to_target',
        'seconds_per_round',
        'paper_accuracy',
        'dp_epsilon',
      ]
    )
    for s in ranked:
      writer.writerow(
        [
          s.method,
          s.seeds,
          *s.final_accuracy,
          *s.best_accuracy,
          *s.final_macro_f1,
          '' if s.rounds_to_target is None else s.rounds_to_target,
          s.seconds_per_round,
          reported.get(s.method, {}).get('accuracy', ''),
          '' if s.epsilon is None else s.epsilon,
        ]
      )
  return dict(markdown=md_path, csv=csv_path)


def plot_accuracy(
  output_dir: str, methods: Sequence[str], seeds: Sequence[int], title: str
) -> str:
  """Test accuracy against round: the mean over seeds, the std shaded."""
  import matplotlib

  matplotlib.use('Agg')
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(7, 4.5))
  styles = ['-', '--', ':', '-.']
  for i, method in enumerate(methods):
    curves = [
      _accuracy_curve(_read_metrics(run_dir(output_dir, method, s)))
      for s in seeds
    ]
    length = min(len(c[1]) for c in curves)
    values = np.asarray([c[1][:length] for c in curves]) * 100
    mean, std = values.mean(axis=0), values.std(axis=0)
    rounds = curves[0][0][:length]
    color = plt.cm.tab10(i % 10)
    ax.plot(
      rounds, mean, label=method, color=color, linestyle=styles[(i // 10) % 4]
    )
    if len(curves) > 1:
      ax.fill_between(
        rounds, mean - std, mean + std, color=color, alpha=0.15, linewidth=0
      )
  ax.set_xlabel('round')
  ax.set_ylabel('test accuracy (%)')
  ax.set_title(title)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7, ncol=2)
  fig.tight_layout()
  path = os.path.join(output_dir, 'accuracy.png')
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path
