"""The federated training loop: sampling, evaluation, metrics, checkpoints.

`run_training` drives any `tff.learning.templates.LearningProcess` whose
`next` takes client ids (see `tff.simulation.
compose_dataset_computation_with_learning_process`), the way
`tff.simulation.run_training_process` does, plus what experiments need:

- Clients are sampled per round by `tff_methods_tasks.datasets.sample_clients`,
  from `numpy.random.default_rng([seed, round])`, so a round's cohort does not
  depend on whether the run resumed.
- Program state (the process state and the round number) is saved with
  `tff.program.FileProgramStateManager`; a rerun on the same output
  directory resumes from the latest saved round, and a larger `total_rounds`
  extends a finished run.
- Metrics go through TFF's release managers: a CSV file
  (`metrics.csv`, rows past the resumed round are replaced) and TensorBoard.
- A round whose new global weights are not all finite is rejected: the
  state stays as it was (the clients' states too), and the round is
  reported (`rejected_rounds`).
- A process with per-client state (`tff_methods.templates.stateful`) keeps it in
  files by client and round, which a resumed run reads as they were; the
  loop discards a rejected round's versions and prunes the versions no
  checkpoint needs. After each round it checks that every client wrote its
  state and read the version the store holds (`client_states` metrics).
- `experiment.json` records the experiment's settings; an output directory
  that holds a different experiment is refused before any work starts.
"""

import asyncio
import collections
import csv
import errno
import os
import re
import shutil
import time
from typing import Any, Callable, Mapping, Optional, Sequence

from absl import logging
import numpy as np
import tensorflow_federated as tff
import tqdm

from tff_methods.templates import model_lib
from tff_methods_tasks import datasets
from tff_methods_tooling import run_directory

_EVENT_LOOP = None


def _await(coroutine):
  """Runs a TFF program coroutine to completion on a private event loop.

  Not `asyncio.run`: that clears the thread's current event loop, and TFF's
  own `tff.simulation.run_training_process` then fails in the same thread.
  """
  global _EVENT_LOOP
  if _EVENT_LOOP is None or _EVENT_LOOP.is_closed():
    _EVENT_LOOP = asyncio.new_event_loop()
  return _EVENT_LOOP.run_until_complete(coroutine)


class DiskFullError(ValueError):
  """A run stopped because its disk is full; what it saved before is kept."""


_NO_SPACE = 'No space left on device'


def disk_full_error(
  error: BaseException, output_dir: str
) -> Optional[DiskFullError]:
  """`error` as one line if a full disk caused it (else None).

  A full disk shows up as Python's `OSError` (ENOSPC) when this process
  writes, or as a long TFF worker error naming the file when a client's
  state is written. Nothing saved before is lost: checkpoints that did not
  complete are passed over on resumption, and a client state file cut short
  in the failed round is written again when that round reruns.
  """
  if isinstance(error, OSError) and error.errno == errno.ENOSPC:
    path = error.filename or output_dir
  elif _NO_SPACE in str(error):
    found = re.search(r'([^\s\'"]+); ' + _NO_SPACE, str(error))
    path = found.group(1) if found else output_dir
  else:
    return None
  done = saved_round(output_dir)
  return DiskFullError(
    f'No space left on the device writing {path}. Free some space and run '
    'the same command again: it resumes from the last saved round '
    f'({done}), and nothing saved before is lost.'
  )


class ClientStateError(ValueError):
  """A client's stored state can't be read."""


def _explain_client_state_failure(client_states, cohort, round_num) -> None:
  """After a failed round: raises one line naming a client state file that
  does not read, if that was the cause (TFF reports it as a long worker
  error)."""
  if client_states is None:
    return
  bad = client_states.unreadable_files(cohort, round_num)
  if bad:
    raise ClientStateError(
      f'Round {round_num}: the client state file {bad[0]} cannot be read '
      f'(truncated or corrupt{_more(len(bad) - 1)}'
      '). Restore it, or delete it: its client then reads its version '
      'before it, and the run no longer repeats an uninterrupted one.'
    ) from None


def _more(count: int) -> str:
  return f'; {count} more' if count else ''


class CheckpointError(ValueError):
  """No saved program state of the run can be read."""


def _remove_unfinished_saves(root: Optional[str]) -> None:
  """Deletes the temporary directories of saves a kill interrupted (TFF
  writes `<version dir>_tempNNNN`, then renames it): nothing reads them."""
  if not root or not os.path.isdir(root):
    return
  for name in os.listdir(root):
    if re.fullmatch(r'.+_\d+_temp\d+', name):
      shutil.rmtree(os.path.join(root, name), ignore_errors=True)


def _load_newest_readable(state_manager, structure, root):
  """(program state, version) of the newest checkpoint that reads, else
  (None, 0) when there is none. A newer one that does not read (a
  truncated file after a full disk or a crash mid-save) is passed over
  with a warning and set aside as `<its directory>.unreadable` (kept, but
  no longer in the way of saving that round again): the run resumes from
  the one before (the loop keeps two, and the clients' state versions the
  older one needs).

  Raises:
    CheckpointError: no saved checkpoint reads; names the directory.
  """
  _remove_unfinished_saves(root)
  versions = sorted(_await(state_manager.get_versions()) or [], reverse=True)
  errors = []
  for version in versions:
    try:
      return _await(state_manager.load(version, structure)), version
    except Exception as e:
      errors.append(f'round {version}: {type(e).__name__}')
      # TFF's manager names a version's directory; a path it does not parse
      # as a version is left alone by it.
      path = state_manager._get_path_for_version(version)
      if os.path.exists(path):
        os.replace(path, path + '.unreadable')
      logging.warning(
        'The checkpoint of round %d cannot be read (%s: %s); '
        'it is kept as %s.unreadable, and the run resumes '
        'from the one before.',
        version,
        type(e).__name__,
        str(e).splitlines()[0] if str(e) else '',
        os.path.join(root, os.path.basename(path)),
      )
  if errors:
    raise CheckpointError(
      f'No checkpoint in {root} can be read ({"; ".join(errors)}). Delete '
      'that directory to start the run over.'
    )
  return None, 0


def program_state_manager(output_dir: str, **kwargs):
  """TFF's `FileProgramStateManager` of the run in `output_dir`, reaching
  its `program_state` directory by a path TensorFlow reads literally
  (`run_directory.tensorflow_path`)."""
  return tff.program.FileProgramStateManager(
    run_directory.tensorflow_path(os.path.join(output_dir, 'program_state')),
    **kwargs,
  )


def saved_round(output_dir: str) -> int:
  """The round of the newest program state saved in `output_dir` (0: none)."""
  versions = _await(program_state_manager(output_dir).get_versions())
  return max(versions) if versions else 0


def _flatten(metrics: Mapping[str, Any], prefix: str = '') -> dict:
  flat = {}
  for key, value in metrics.items():
    name = f'{prefix}{key}'
    if isinstance(value, Mapping):
      flat.update(_flatten(value, name + '/'))
    else:
      flat[name] = value
  return flat


def train_metrics(metrics: Mapping[str, Any]) -> Mapping[str, Any]:
  """The `train` metrics of a round, wherever the process put them."""
  client_work = metrics.get('client_work', {})
  return client_work.get('train', {})


def progress_postfix(
  train: Mapping[str, Any],
  eval_metrics: Mapping[str, Any],
  evaluated_round: Optional[int],
  seconds: float,
) -> collections.OrderedDict:
  """The progress bar's figures, each named for what it is: the round's
  training loss (the clients' mean over their local steps) and the test
  accuracy of the last evaluation, with the round it evaluated."""
  postfix = collections.OrderedDict()
  if 'loss' in train:  # Not in what a DP run releases.
    postfix['train_loss'] = f"{float(train['loss']):.3f}"
  if eval_metrics:
    postfix['test_acc'] = f"{eval_metrics.get('accuracy', np.nan):.3f}"
    postfix['test_round'] = str(evaluated_round)
  postfix['s_per_round'] = f'{seconds:.2f}'
  return postfix


def _check_client_states(
  metrics, cohort, expected_read_versions, client_states
) -> None:
  """Every client wrote its state, and read the version the store holds."""
  written = int(metrics['client_work']['client_states']['written'])
  if written != len(cohort):
    raise RuntimeError(
      f"{len(cohort) - written} of the round's {len(cohort)} clients did "
      f'not write their state under {client_states.directory}.'
    )
  read = int(metrics['client_work']['client_states']['read_version_sum'])
  if read != sum(expected_read_versions):
    raise RuntimeError(
      f"The round's clients read other versions of their state than "
      f'{client_states.directory} holds (versions summing to {read}, '
      f'expected {sum(expected_read_versions)}): a stale listing of a '
      'shared file system, or another run writing to the same directory.'
    )


def run_training(
  process: tff.learning.templates.LearningProcess,
  client_ids: Sequence[str],
  clients_per_round: int,
  total_rounds: int,
  output_dir: str,
  initial_weights: tff.learning.models.ModelWeights,
  seed: int = 0,
  evaluate_fn: Optional[Callable[[Any], Mapping[str, float]]] = None,
  rounds_per_eval: int = 1,
  rounds_per_checkpoint: int = 1,
  progress: bool = True,
  round_hook: Optional[Callable[[int, Mapping[str, Any]], None]] = None,
  client_key_fn: Optional[Callable[[str, int], Any]] = None,
  round_metrics_fn: Optional[Callable[[int], Mapping[str, Any]]] = None,
  client_sampling: str = 'without_replacement',
  sampling_seed: Optional[int] = None,
  released_metrics_fn: Optional[
    Callable[[Mapping[str, Any]], Mapping[str, Any]]
  ] = None,
) -> dict:
  """Runs (or resumes) federated training and returns the final results.

  Args:
    process: A `LearningProcess` whose `next` takes a list of client ids.
    client_ids: All clients' ids.
    clients_per_round: The cohort size, 1..len(client_ids) (its
      expectation under Poisson sampling).
    total_rounds: Train until this many rounds are done.
    output_dir: Where program state and metrics are written.
    initial_weights: The (seeded) global model of round 0.
    seed: Fixes the clients sampled in each round, unless `sampling_seed`.
    evaluate_fn: Maps global `ModelWeights` to test metrics.
    rounds_per_eval: Evaluate every this many rounds (and after the last).
    rounds_per_checkpoint: Save program state every this many rounds (and
      after the last).
    progress: Show a progress bar.
    round_hook: Called after every round with its number and metrics;
      an exception raised there stops the run (as an interruption would).
    client_key_fn: (client id, round) -> what `process.next` takes for that
      client (e.g. `tff_methods.clients.client_keys.client_key`, for data
      that depends on the round); by default the client id itself.
    round_metrics_fn: Round number -> more metrics of that round, recorded
      with its own (e.g. a DP run's epsilon so far).
    client_sampling: How each round's cohort is drawn, 'without_replacement'
      or 'poisson' (`tff_methods.clients.client_keys.sample_clients`).
    sampling_seed: Fixes the cohorts instead of `seed` (a DP run's secret
      one).
    released_metrics_fn: A round's metrics -> the part of them that is
      written (metrics.csv, TensorBoard), shown and given to `round_hook` (a
      DP run's: what its guarantee covers); all of them by default. The
      loop's own checks read them all.

  Returns:
    A dict with `rounds`, `final_weights`, `final_eval`, `rejected_rounds`
    and `seconds_per_round`.
  """
  if not 1 <= clients_per_round <= len(client_ids):
    raise ValueError(
      f'clients_per_round={clients_per_round} must be in [1, '
      f'{len(client_ids)}] (the number of clients).'
    )
  state = process.initialize()
  state = process.set_model_weights(state, initial_weights)
  program_state = collections.OrderedDict(
    state=state, round_num=0, rejected_rounds=0
  )
  state_manager = program_state_manager(
    output_dir, keep_total=2, keep_first=False
  )
  # Processes with per-client state (`tff_methods.templates.stateful`): their
  # clients' files, written by round.
  client_states = getattr(process, 'client_states', None)
  if client_states is not None and client_key_fn is None:
    raise ValueError(
      'A process with per-client state needs client_key_fn: '
      'its clients are keyed by client and round.'
    )
  loaded, version = _load_newest_readable(
    state_manager, program_state, os.path.join(output_dir, 'program_state')
  )
  if loaded is not None:
    program_state = loaded
    state = loaded['state']
    logging.info('Resuming from round %d of %s.', version, output_dir)
  start_round = int(program_state['round_num'])
  rejected_rounds = int(program_state['rejected_rounds'])
  release_managers = [
    tff.program.CSVFileReleaseManager(
      os.path.join(output_dir, 'metrics.csv'), key_fieldname='round'
    ),
    tff.program.TensorBoardReleaseManager(
      os.path.join(output_dir, 'tensorboard')
    ),
  ]

  def release(metrics, round_num):
    for manager in release_managers:
      _await(manager.release(metrics, key=round_num))

  # Clients whose older state versions may be pruned at the next save: those
  # trained since the save before the last (the older of the two kept
  # checkpoints, which a run falls back to if the newer can't be read).
  trained_since_save, trained_before_save = set(), set()

  def save(round_num):
    if client_states is not None:
      # The clients' states first: a saved checkpoint finds its own.
      client_states.write_to_disk()
    _await(
      state_manager.save(
        collections.OrderedDict(
          state=state, round_num=round_num, rejected_rounds=rejected_rounds
        ),
        version=round_num,
      )
    )
    if client_states is not None:
      oldest_kept = min(_await(state_manager.get_versions()) or [round_num])
      client_states.prune(
        sorted(trained_since_save | trained_before_save), oldest_kept
      )
      trained_before_save.clear()
      trained_before_save.update(trained_since_save)
      trained_since_save.clear()

  bar = tqdm.tqdm(
    total=total_rounds,
    initial=start_round,
    unit='round',
    disable=not progress,
    dynamic_ncols=True,
  )
  eval_metrics, evaluated_round = {}, None
  durations = []
  # The global model of `state`, once fetched (a TFF call per fetch).
  weights = None
  try:
    for round_num in range(start_round + 1, total_rounds + 1):
      cohort = datasets.sample_clients(
        client_ids,
        clients_per_round,
        round_num,
        seed if sampling_seed is None else sampling_seed,
        client_sampling,
      )
      started = time.monotonic()
      keys = (
        cohort
        if client_key_fn is None
        else [client_key_fn(c, round_num) for c in cohort]
      )
      if client_states is not None:
        expected_reads = [
          client_states.expected_read_version(c, round_num) for c in cohort
        ]
      try:
        output = process.next(state, keys)
      except Exception:
        _explain_client_state_failure(client_states, cohort, round_num)
        raise
      seconds = time.monotonic() - started
      durations.append(seconds)
      metrics = collections.OrderedDict(output.metrics)
      if client_states is not None:
        _check_client_states(metrics, cohort, expected_reads, client_states)
        trained_since_save.update(cohort)
      # TFF's finalizer already skips a non-finite averaged update; any other
      # non-finite global model (e.g. from a custom server rule) is caught
      # here. Either way the round is rejected and the model kept.
      finalizer_skipped = bool(
        metrics.get('finalizer', {}).get('update_non_finite', 0)
      )
      new_weights = (
        None if finalizer_skipped else process.get_model_weights(output.state)
      )
      if new_weights is not None and model_lib.all_finite(new_weights):
        state, weights = output.state, new_weights
        metrics['rejected'] = 0
      else:
        rejected_rounds += 1
        metrics['rejected'] = 1
        if client_states is not None:
          # The clients' new states belong to the rejected model.
          client_states.discard(cohort, round_num)
        logging.warning(
          'Round %d: the averaged update is not finite (a diverged '
          'update); the round is rejected and the model kept.',
          round_num,
        )
        bar.write(
          f'round {round_num}: non-finite update rejected, model ' 'kept'
        )
      metrics['seconds'] = seconds
      if round_metrics_fn is not None:
        metrics.update(round_metrics_fn(round_num))
      if evaluate_fn is not None and (
        round_num % rounds_per_eval == 0 or round_num == total_rounds
      ):
        if weights is None:  # No round accepted since the (re)start.
          weights = process.get_model_weights(state)
        eval_metrics = dict(evaluate_fn(weights))
        metrics['eval'] = eval_metrics
        evaluated_round = round_num
      if released_metrics_fn is not None:
        metrics = released_metrics_fn(metrics)
      release(metrics, round_num)
      if round_num % rounds_per_checkpoint == 0 or round_num == total_rounds:
        save(round_num)
      train = train_metrics(metrics)
      postfix = progress_postfix(train, eval_metrics, evaluated_round, seconds)
      bar.set_postfix(postfix, refresh=False)
      bar.update(1)
      if round_hook is not None:
        round_hook(round_num, metrics)
  finally:
    bar.close()
  if weights is None:
    weights = process.get_model_weights(state)
  if evaluate_fn is not None and not eval_metrics:
    eval_metrics = dict(evaluate_fn(weights))
  return dict(
    rounds=total_rounds,
    final_weights=weights,
    final_eval=eval_metrics,
    rejected_rounds=rejected_rounds,
    seconds_per_round=_seconds_per_round(durations, output_dir),
  )


def _seconds_per_round(durations, output_dir) -> Optional[float]:
  """The median round's seconds: this call's rounds, or, when it ran none
  (a finished run read again), those metrics.csv recorded; None if none."""
  if not durations:
    try:
      with open(os.path.join(output_dir, 'metrics.csv')) as f:
        durations = [
          float(row['seconds'])
          for row in csv.DictReader(f)
          if row.get('seconds') not in (None, '')
        ]
    except (OSError, ValueError, csv.Error):
      durations = []
  return float(np.median(durations)) if durations else None
