"""One federated experiment from a config: the logic behind `binaries/train`.

`ExperimentConfig` holds every setting of a run; `validate` checks them all
before any work starts and names each bad value and what is allowed; `run` loads
the task, builds the method, and trains with
`tff_methods_tooling.training_loop.run_training`, writing to
`config.output_dir`:

  experiment.json      the settings (a rerun must match them to resume)
  partition.txt/.png   examples per client and class
  metrics.csv          one row per round (train metrics, eval, seconds)
  tensorboard/         the same metrics for TensorBoard
  program_state/       TFF program state, for resuming
  results.json         final test metrics and seconds per round
"""

import dataclasses
import functools
import json
import os
from typing import Any, Callable, Mapping, Optional, Sequence, Union

from absl import logging
import numpy as np

from tff_methods.algorithms import hyperparameters
from tff_methods.algorithms import methods
from tff_methods.clients import client_keys
from tff_methods.clients import state_files
from tff_methods.execution import in_process
from tff_methods.templates import model_lib
from tff_methods_tasks import datasets
from tff_methods_tasks import models as task_models
from tff_methods_tasks import report
from tff_methods_tasks import tff_baselines
from tff_methods_tooling import dp_runs
from tff_methods_tooling import evaluation
from tff_methods_tooling import experiment_checks
from tff_methods_tooling import experiment_config
from tff_methods_tooling import run_directory
from tff_methods_tooling import training_loop

# The settings, and their checks, in modules of their own.
DEFAULT_MODELS = experiment_config.DEFAULT_MODELS
RETIRED_SETTINGS = experiment_config.RETIRED_SETTINGS
RENAMED_SETTINGS = experiment_config.RENAMED_SETTINGS
ExperimentConfig = experiment_config.ExperimentConfig
validate = experiment_checks.validate


def model_parameters(config: ExperimentConfig) -> Optional[int]:
  """The parameter count of the model `config` trains, from the task's
  shapes (no data is read); None for a model only Fed2's grouping builds.

  It sets the local TFF worker's threads per client
  (`workers.threads_per_client`). An image folder's classes are not known
  before its data is read: counted with 10 (classes don't move a model
  across `workers.LARGE_MODEL_PARAMETERS`).
  """
  if config.is_tff_baseline():
    return tff_baselines.parameter_count(config.task, config.model_name())
  input_shape, num_classes = datasets.TASK_SHAPES[config.task]
  if config.task == 'image_folder':
    input_shape, num_classes = (config.image_size, config.image_size, 3), 10
  return task_models.parameter_count(
    config.model_name(), num_classes, input_shape
  )


def model_fn_for(
  name: str,
  model_name: str,
  num_classes: int,
  input_shape: Sequence[int],
  hparams: hyperparameters.Hyperparameters,
  **model_kwargs,
) -> model_lib.KerasModelFn:
  """The Keras model factory method `name` trains on a task-zoo model.

  The zoo's model (`tff_methods_tasks.models`, with `model_kwargs` such as a
  ResNet's `projection_dim`), or the form a method trains of it (its
  declared `model_fn`: Fed2's grouped model, from the model's layer plan).

  Raises:
    ValueError: for a bad model or method setting, before any work starts.
  """
  own_form = methods.model_fn(
    name,
    hparams,
    lambda: task_models.fed2_plan(model_name, input_shape),
    num_classes,
    input_shape,
  )
  if own_form is not None:
    return own_form
  return functools.partial(
    task_models.get_model,
    model_name,
    num_classes,
    tuple(input_shape),
    **model_kwargs,
  )


TaskData = Union[datasets.FederatedData, tff_baselines.BaselineTask]


def build_process(config: ExperimentConfig, data: TaskData):
  """The method's process over client ids, and the Keras model factory.

  On a task of the project's zoo, the zoo's model and batches; on one of
  TFF's baseline tasks, the task's model, batches and loss (and its own
  `VariableModel` for TFF's algorithms).
  """
  hparams = dataclasses.replace(
    config.hyperparameters(len(data.client_data.client_ids)),
    # Run in this process (`--execution=in_process`): the clients' states
    # stay in its memory and reach the directory with each checkpoint.
    client_states_in_memory=in_process.is_current(),
  )
  loss_fn = tff_model_fn = None
  if isinstance(data, tff_baselines.BaselineTask):
    keras_model_fn, batches = data.keras_model_fn, data.batches
    loss_fn, tff_model_fn = data.loss_fn, data.tff_model_fn
  else:
    model_kwargs = (
      {'projection_dim': config.projection_dim} if config.projection_dim else {}
    )
    keras_model_fn = model_fn_for(
      config.method,
      config.model_name(),
      data.num_classes,
      data.input_shape,
      hparams,
      **model_kwargs,
    )
    batches = config.local_batches()
  for note in methods.notes(config.method, hparams):
    logging.warning(note)
  if methods.is_stateful(config.method):
    state_files.claim_directory(
      hparams.client_state_dir, os.path.abspath(config.output_dir)
    )
  process = methods.build_method_for_client_ids(
    config.method,
    keras_model_fn,
    datasets.round_dataset_computation(data.client_data, batches),
    batches.element_spec(data.client_data.element_type_structure),
    hparams,
    loss_fn=loss_fn,
    tff_model_fn=tff_model_fn,
  )
  methods.prepare_clients(
    config.method,
    process,
    hparams,
    data.client_data.client_ids,
    keras_model_fn,
    config.seed,
  )
  return process, keras_model_fn


def load_data(config: ExperimentConfig) -> TaskData:
  """Loads and partitions the config's task (checks the cohort size)."""
  if config.is_tff_baseline():
    data = tff_baselines.load(
      config.task,
      batch_size=config.batch_size,
      local_epochs=config.local_epochs,
      max_elements=config.max_elements,
      model=config.model,
      seed=config.seed,
      use_synthetic_data=config.use_synthetic_data,
      cache_dir=config.data_dir,
      validation_fraction=config.validation_fraction,
    )
    _check_cohort(config, data.client_data.client_ids)
    return data
  kwargs = dict(
    alpha=config.alpha,
    min_size=config.min_size,
    classes_per_client=config.classes_per_client,
    shards_per_client=config.shards_per_client,
    non_iid_fraction=config.non_iid_fraction,
  )
  if config.partition != 'dirichlet':
    kwargs.pop('alpha')
    kwargs.pop('min_size')
  for key, used_by in (
    ('classes_per_client', 'pathological'),
    ('shards_per_client', 'shards'),
    ('non_iid_fraction', 'mixed'),
  ):
    if config.partition != used_by:
      kwargs.pop(key)
  data = datasets.load_task(
    config.task,
    config.num_clients,
    config.partition,
    config.seed,
    data_dir=config.data_dir,
    cache_dir=config.cache_dir,
    synthetic_alpha=config.synthetic_alpha,
    synthetic_beta=config.synthetic_beta,
    image_size=config.image_size,
    validation_fraction=config.validation_fraction,
    **kwargs,
  )
  _check_cohort(config, data.client_data.client_ids)
  return data


def _check_cohort(config: ExperimentConfig, client_ids) -> None:
  if config.clients_per_round > len(client_ids):
    raise ValueError(
      f'--clients_per_round={config.clients_per_round} is '
      f"more than the task's {len(client_ids)} clients."
    )


def saved_settings_differences(config: ExperimentConfig) -> list[str]:
  """How `config` differs from the run saved in its output directory, if any."""
  return run_directory.experiment_config_differences(
    config.output_dir,
    dataclasses.asdict(config),
    defaults=dataclasses.asdict(ExperimentConfig()),
    retired=RETIRED_SETTINGS,
    upgrade=experiment_config.upgrade_saved_settings,
  )


def run(
  config: ExperimentConfig,
  progress: bool = True,
  round_hook: Optional[Callable[[int, Mapping[str, Any]], None]] = None,
  data: Optional[datasets.FederatedData] = None,
) -> dict:
  """Runs (or resumes) the experiment; see the module docstring.

  Needs a TFF execution context (`tff_methods.execution.runtime`).

  Args:
    config: The experiment.
    progress: Show a progress bar.
    round_hook: Called after every round with (round, metrics).
    data: The task's data; loaded from `config` when None (tests and
      benchmarks pass `datasets.generated_like` data of the task's shape).

  Returns:
    `training_loop.run_training`'s results.
  """
  validate(config)
  with run_directory.output_dir_lock(config.output_dir):
    try:
      return _run_locked(config, progress, round_hook, data)
    except Exception as e:
      disk_full = training_loop.disk_full_error(e, config.output_dir)
      if disk_full is None:
        raise
      raise disk_full from None


def warn_of_untrained_classes(class_counts: np.ndarray) -> None:
  """Warns when classes have no training example on any client (e.g. an
  image folder of one image a class, whose image went to the test split)."""
  untrained = np.flatnonzero(np.asarray(class_counts).sum(0) == 0)
  if untrained.size:
    logging.warning(
      '%d of the %d classes have no training example on any client '
      '(classes %s): the model never trains on them, and their test '
      'examples count as errors.',
      untrained.size,
      np.shape(class_counts)[1],
      ', '.join(map(str, untrained[:10]))
      + (', ...' if untrained.size > 10 else ''),
    )


def _run_locked(config, progress, round_hook, data) -> dict:
  """`run`, holding the output directory."""
  done = training_loop.saved_round(config.output_dir)
  if done > config.rounds:
    raise ValueError(
      f'--output_dir={config.output_dir} holds a run already at round '
      f'{done}, past --rounds={config.rounds}; nothing was changed. Give '
      f'--rounds={done} or more to read or extend it, or another output '
      'directory.'
    )
  if done and not os.path.exists(
    os.path.join(config.output_dir, run_directory.CONFIG_FILE)
  ):
    raise ValueError(
      f'--output_dir={config.output_dir} holds a checkpoint at round {done} '
      f'but no {run_directory.CONFIG_FILE}: the settings it was trained with '
      'are unknown, so it is not resumed. Restore that file, or give another '
      'output directory (or delete this one) to start over.'
    )
  if done and config.dp_target_epsilon is not None:
    saved_rounds = run_directory.saved_setting(config.output_dir, 'rounds')
    if saved_rounds not in (None, config.rounds):
      raise ValueError(
        f'--output_dir={config.output_dir} holds a run whose noise was '
        f'calibrated for --dp_target_epsilon={config.dp_target_epsilon} over '
        f'--rounds={saved_rounds}; with --rounds={config.rounds} its rounds so '
        'far would have needed other noise. Give --rounds='
        f'{saved_rounds}, or start the longer run in a new --output_dir.'
      )
  if done and methods.is_stateful(config.method):
    states = config.client_state_directory()
    if not state_files.has_client_states(states):
      if not config.restart_client_states:
        raise ValueError(
          f'--output_dir={config.output_dir} holds a run at round {done}, '
          f'but its client states ({states}) are gone: resuming would '
          'start every client over in silence. Restore them, or pass '
          '--restart_client_states to start them over on purpose.'
        )
      logging.warning(
        "Resuming at round %d with every client's state "
        'started over (%s held none).',
        done,
        states,
      )

  def check_and_save_settings():
    run_directory.check_experiment_config(
      config.output_dir,
      dataclasses.asdict(config),
      defaults=dataclasses.asdict(ExperimentConfig()),
      retired=RETIRED_SETTINGS,
      upgrade=experiment_config.upgrade_saved_settings,
    )

  if saved_settings_differences(config):
    check_and_save_settings()  # Refuses another experiment's directory.
  # Settings only the data can refuse (too many clients for it, ...) are
  # refused before experiment.json is written: the corrected rerun is then
  # not taken for another experiment.
  data = data or load_data(config)
  client_ids = data.client_data.client_ids
  if config.dp_target_epsilon is not None and config.is_tff_baseline():
    # The task's population is known now: the target's noise, checked.
    refused = dp_runs.check(config, len(client_ids))
    if refused:
      raise ValueError('Bad settings:\n  ' + '\n  '.join(refused))
  check_and_save_settings()
  private = config.aggregator == 'dp' and not config.dp_release_non_private
  if private:
    logging.info(
      "A DP run: no partition report (each client's class counts), and "
      'only the figures its guarantee covers in metrics.csv '
      '(--dp_release_non_private writes the others).'
    )
  if getattr(data, 'train_labels', None) is not None and not private:
    warn_of_untrained_classes(data.class_counts())
    report.write_partition_report(
      data.class_counts(),
      config.output_dir,
      f'{config.task}, {config.partition}, {len(client_ids)} clients',
    )
  process, keras_model_fn = build_process(config, data)

  def dp_metrics(round_num):
    # PLD costs ~0.1 s a call (RDP's per-round epsilon is cached): under
    # PLD the evaluated rounds carry it.
    if (
      config.accountant() == 'pld'
      and round_num % config.rounds_per_eval
      and round_num != config.rounds
    ):
      return {}
    epsilon = dp_runs.guarantee(config, len(client_ids), round_num)['epsilon']
    # NaN without noise: no guarantee.
    return dict(dp=dict(epsilon=float('nan') if epsilon is None else epsilon))

  results = training_loop.run_training(
    process,
    client_ids,
    config.clients_per_round,
    config.rounds,
    config.output_dir,
    initial_weights=model_lib.initial_weights(keras_model_fn, config.seed),
    seed=config.seed,
    evaluate_fn=(
      data.evaluator
      if isinstance(data, tff_baselines.BaselineTask)
      else evaluation.Evaluator(keras_model_fn, data.test_x, data.test_y)
    ),
    rounds_per_eval=config.rounds_per_eval,
    rounds_per_checkpoint=config.rounds_per_checkpoint,
    progress=progress,
    round_hook=round_hook,
    client_key_fn=client_keys.client_key,
    client_sampling=config.sampling(),
    sampling_seed=dp_runs.sampling_seed(config),
    round_metrics_fn=None if config.aggregator != 'dp' else dp_metrics,
    released_metrics_fn=dp_runs.released_metrics_fn(config),
  )
  summary = dict(
    method=config.method,
    task=config.task,
    rounds=results['rounds'],
    final_eval=results['final_eval'],
    rejected_rounds=results['rejected_rounds'],
    seconds_per_round=results['seconds_per_round'],
  )
  guarantee = dp_runs.guarantee(config, len(client_ids), results['rounds'])
  if guarantee is not None:
    summary['dp'] = results['dp'] = guarantee
  with open(os.path.join(config.output_dir, 'results.json'), 'w') as f:
    json.dump(summary, f, indent=2, default=float)
  np.savez(
    os.path.join(config.output_dir, 'final_weights.npz'),
    **model_lib.weights_to_dict(results['final_weights']),
  )
  return results
