"""`validate`: every check of an `ExperimentConfig` that needs no data,
run before any work starts; one ValueError names every bad value and what
is allowed.
"""

import os
from typing import Sequence

from tff_methods.algorithms import method_spec
from tff_methods.algorithms import methods
from tff_methods.templates import aggregation
from tff_methods.templates import model_checks
from tff_methods.templates import optimizers
from tff_methods_tasks import datasets
from tff_methods_tasks import models as task_models
from tff_methods_tasks import partition as partition_lib
from tff_methods_tasks import tff_baselines
from tff_methods_tooling import dp_runs
from tff_methods_tooling import experiment_config


def validate(config: experiment_config.ExperimentConfig) -> None:
  """Checks every setting; raises one ValueError naming all bad values."""
  try:
    parts = methods.parse_method(config.method)
    errors = []
  except ValueError as e:
    parts = []
    errors = [f'--method={config.method!r}: {e}']
  errors += _task_problems(config, parts)
  errors += _partition_problems(config)
  errors += _training_problems(config)
  errors += _method_settings_problems(config)
  errors += _aggregation_problems(config, parts)
  errors += _model_output_problems(config)
  errors += _run_problems(config)
  if errors:
    raise ValueError('Bad settings:\n  ' + '\n  '.join(errors))


def _failed(checks: Sequence[tuple[bool, str]]) -> list[str]:
  """The messages of the checks that failed, in order."""
  return [message for ok, message in checks if not ok]


def _task_problems(config, parts) -> list[str]:
  """The task, and what is for some tasks only."""
  found = _failed(
    [
      (
        config.task in datasets.TASK_NAMES + tff_baselines.TASK_NAMES,
        f'--task={config.task!r} is unknown; choose one of '
        f'{", ".join(datasets.TASK_NAMES + tff_baselines.TASK_NAMES)}',
      )
    ]
  )
  if config.is_tff_baseline():
    _validate_tff_baseline(
      config, parts, lambda ok, message: found.extend(_failed([(ok, message)]))
    )
    return found
  found += _failed(
    [
      (
        config.model_name()
        in task_models.MODEL_NAMES + task_models.FED2_MODELS,
        f'--model={config.model!r} is unknown; choose one of '
        f'{", ".join(task_models.MODEL_NAMES)}',
      ),
      *(
        (
          not getattr(config, flag),
          f'--{flag}={getattr(config, flag)} is for the tff_baselines '
          f'tasks, not --task={config.task}',
        )
        for flag in ('use_synthetic_data', 'max_elements')
      ),
    ]
  )
  return found


def _partition_problems(config) -> list[str]:
  """How the data is split over clients, and how many take part."""
  return _failed(
    [
      (
        config.partition in partition_lib.PARTITIONERS,
        f'--partition={config.partition!r} is unknown; choose one of '
        f'{", ".join(partition_lib.PARTITIONERS)}',
      ),
      (config.alpha > 0, f'--alpha={config.alpha} must be > 0'),
      (config.min_size >= 0, f'--min_size={config.min_size} must be >= 0'),
      (
        config.classes_per_client >= 1,
        f'--classes_per_client={config.classes_per_client} must be >= 1',
      ),
      (
        config.shards_per_client >= 1,
        f'--shards_per_client={config.shards_per_client} must be >= 1',
      ),
      (
        0 <= config.non_iid_fraction <= 1,
        f'--non_iid_fraction={config.non_iid_fraction} must be in [0, 1]',
      ),
      (
        config.num_clients >= 1,
        f'--num_clients={config.num_clients} must be >= 1',
      ),
      (
        1 <= config.clients_per_round <= config.num_clients
        or config.task in ('emnist', 'shakespeare')
        or config.is_tff_baseline(),
        f'--clients_per_round={config.clients_per_round} must be in [1, '
        f'--num_clients={config.num_clients}]',
      ),
    ]
  )


def _training_problems(config) -> list[str]:
  """Rounds, local training and the optimizers."""
  return _failed(
    [
      (config.rounds >= 1, f'--rounds={config.rounds} must be >= 1'),
      (
        config.local_epochs >= 1,
        f'--local_epochs={config.local_epochs} must be >= 1',
      ),
      (
        config.local_steps is None or config.local_steps >= 1,
        f'--local_steps={config.local_steps} must be >= 1',
      ),
      (
        config.batch_size >= 1,
        f'--batch_size={config.batch_size} must be >= 1',
      ),
      (
        config.client_learning_rate > 0,
        f'--client_learning_rate={config.client_learning_rate} must be > 0',
      ),
      (
        0 <= config.client_momentum < 1,
        f'--client_momentum={config.client_momentum} must be in [0, 1)',
      ),
      (
        config.weight_decay >= 0,
        f'--weight_decay={config.weight_decay} must be >= 0',
      ),
      (
        config.server_learning_rate is None or config.server_learning_rate > 0,
        f'--server_learning_rate={config.server_learning_rate} must be > 0',
      ),
      (
        0 <= config.server_momentum < 1,
        f'--server_momentum={config.server_momentum} must be in [0, 1)',
      ),
      (
        config.server_epsilon > 0,
        f'--server_epsilon={config.server_epsilon} must be > 0',
      ),
      (
        config.server_momentum_form in optimizers.MOMENTUM_FORMS,
        f'--server_momentum_form={config.server_momentum_form!r} is '
        f'unknown; choose one of {", ".join(optimizers.MOMENTUM_FORMS)}',
      ),
    ]
  )


def _method_settings_problems(config) -> list[str]:
  """Each method's own settings, by what its module declares they take."""
  found = _failed(
    [
      (
        config.mu is None or config.mu >= 0,
        f'--mu={config.mu} must be >= 0 (a strength)',
      )
    ]
  )
  given = config.method_settings()
  for spec in methods.REGISTRY.values():
    settings = spec.settings(**given[spec.name])
    found.extend(p.rstrip('.') for p in method_spec.problems(spec, settings))
  return found


def _own_weightings(config, parts) -> list[tuple[str, str]]:
  """(flag, value) of each named method's own client weighting: a method
  with a process of its own may weigh clients by a setting of its own
  (SCAFFOLD's), which is checked as --client_weighting is."""
  given = config.method_settings()
  found = []
  for spec in (methods.REGISTRY[p] for p in parts):
    if spec.weighting_setting is not None:
      settings = spec.settings(**given[spec.name])
      found.append(
        (
          f'--{spec.flag(spec.weighting_setting)}',
          getattr(settings, spec.weighting_setting),
        )
      )
  return found


def _aggregation_problems(config, parts) -> list[str]:
  """Client weighting, the aggregator, and what DP allows."""
  own_weightings = _own_weightings(config, parts)
  found = _failed(
    [
      (
        config.client_weighting in aggregation.CLIENT_WEIGHTINGS,
        f'--client_weighting={config.client_weighting!r} is unknown; '
        f'choose one of {", ".join(aggregation.CLIENT_WEIGHTINGS)}',
      ),
      (
        config.aggregator != 'dp'
        or config.client_weighting in ('num_examples', 'uniform'),
        f'--client_weighting={config.client_weighting} with '
        '--aggregator=dp: DP weighs clients uniformly; give '
        '--client_weighting=uniform',
      ),
      *(
        (
          value != 'num_tokens' or config.task in tff_baselines.TEXT_TASK_NAMES,
          f'{flag}=num_tokens is for the text tasks '
          f'({", ".join(tff_baselines.TEXT_TASK_NAMES)}), not '
          f'--task={config.task}',
        )
        for flag, value in [('--client_weighting', config.client_weighting)]
        + own_weightings
      ),
      (
        config.aggregator in aggregation.AGGREGATORS,
        f'--aggregator={config.aggregator!r} is unknown; choose one of '
        f'{", ".join(aggregation.AGGREGATORS)}',
      ),
    ]
  )
  found += dp_runs.check(
    config, None if config.is_tff_baseline() else config.num_clients
  )
  reports = methods.client_reports('+'.join(parts)) if parts else ()
  found += _failed(
    [
      *(
        (
          config.aggregator != 'dp',
          f'--method={config.method} with --aggregator=dp: {report} reach '
          'the server summed without clip or noise, so the guarantee would '
          'not cover them; run it without DP, or a method that sends only '
          'its model update',
        )
        for report in reports
      ),
      *(
        (
          config.aggregator != 'dp' or value == 'uniform',
          f'--aggregator=dp averages clients uniformly; it needs '
          f'{flag}=uniform',
        )
        for flag, value in own_weightings
      ),
    ]
  )
  return found


def _model_output_problems(config) -> list[str]:
  """The projection head, and what the method reads of a zoo model."""
  tff_task = config.is_tff_baseline()
  model_name = config.model_name()
  found = _failed(
    [
      (
        config.projection_dim >= 0
        and (
          config.projection_dim == 0
          or (not tff_task and model_name in task_models.TAKES_PROJECTION_DIM)
        ),
        f'--projection_dim={config.projection_dim} must be >= 0, and is for '
        f'--model={"/".join(task_models.TAKES_PROJECTION_DIM)} only',
      )
    ]
  )
  if not tff_task and model_name in task_models.MODEL_NAMES:
    found += _model_problems(
      config,
      task_models.output_names(model_name, config.projection_dim),
      f'--model={model_name}',
      has_layer_plan=model_name in task_models.FED2_MODELS,
    )
  return found


def _run_problems(config) -> list[str]:
  """Evaluation, seeds, checkpoints, validation and the data's place."""
  return _failed(
    [
      (
        config.rounds_per_eval >= 1,
        f'--rounds_per_eval={config.rounds_per_eval} must be >= 1',
      ),
      (
        0 <= config.seed < 2**31,
        f'--seed={config.seed} must be in [0, 2^31 - 1]',
      ),
      (
        config.rounds_per_checkpoint >= 1,
        f'--rounds_per_checkpoint={config.rounds_per_checkpoint} must be '
        '>= 1',
      ),
      (
        0 <= config.validation_fraction < 1
        and (
          config.validation_fraction == 0
          or config.task not in datasets.NATURAL_TASKS
        ),
        f'--validation_fraction={config.validation_fraction} must be in '
        '[0, 1), and 0 for tasks with natural clients '
        f'({", ".join(datasets.NATURAL_TASKS)}; TFF\'s baseline tasks hold '
        'out whole clients)',
      ),
      (
        config.image_size >= 8,
        f'--image_size={config.image_size} must be >= 8',
      ),
      (
        config.task != 'image_folder'
        or (bool(config.data_dir) and os.path.isdir(config.data_dir)),
        f'--data_dir={config.data_dir!r} must be a directory of class '
        'sub-directories for --task=image_folder',
      ),
    ]
  )


def _validate_tff_baseline(
  config: experiment_config.ExperimentConfig, parts, need
) -> None:
  """The checks of a run on one of TFF's baseline tasks."""
  if config.task not in tff_baselines.TASK_NAMES:
    return  # Named unknown by `validate`.
  task_models_ids = tff_baselines.models(config.task)
  model_name = config.model_name()
  need(
    model_name in task_models_ids,
    f'--model={config.model!r} is not a model of {config.task}; TFF builds '
    f'{", ".join(task_models_ids)}',
  )
  if parts and model_name in task_models_ids:
    for problem in _model_problems(
      config,
      tff_baselines.output_names(config.task, model_name),
      f"TFF's {model_name} model of {config.task}",
      has_layer_plan=False,
    ):
      need(False, problem)
  need(
    config.local_steps is None,
    f"--local_steps={config.local_steps}: TFF's preprocessing of "
    f'{config.task} trains whole epochs (--local_epochs, --max_elements)',
  )
  need(
    not config.drop_last,
    f"--drop_last: TFF's preprocessing of {config.task} keeps each "
    "client's last, partial batch",
  )
  need(
    config.max_elements is None or config.max_elements >= 1,
    f'--max_elements={config.max_elements} must be >= 1',
  )


def _model_problems(
  config: experiment_config.ExperimentConfig,
  outputs: Sequence[str],
  described: str,
  has_layer_plan: bool,
) -> list[str]:
  """What the method needs of the model that the model (`described`, with
  named `outputs`) lacks: an output its terms read (as each term declares
  them), or a layer plan for a method that trains its own form of it."""
  try:
    own_form = methods.trains_own_form(config.method)
    terms = methods.local_terms(config.method, config.hyperparameters())
  except ValueError:
    return []  # A bad method or setting, named by its own check.
  problems = []
  if own_form and not has_layer_plan:
    problems.append(
      f'--method={config.method} trains its own form of the model, made '
      f'from its layer plan: {described} has none (models with one: '
      f'{"/".join(task_models.FED2_MODELS)})'
    )
  needed = model_checks.needed_outputs(terms)
  missing = model_checks.missing_output(needed, outputs)
  if missing is not None:
    readers = ', '.join(needed[missing])
    what = model_checks.describe_output(missing)
    if missing.startswith('layer_'):
      has = sum(1 for name in outputs if name.startswith('layer_'))
      problems.append(
        f'--method={config.method}: {readers} reads the first '
        f'{missing.split("_")[1]} layers of the model, more than the {has} '
        f'{described} has'
      )
    else:
      hint = _OUTPUT_HINTS.get(missing, '')
      problems.append(
        f"--method={config.method}: {readers} reads the model's "
        f'{missing!r} output ({what}), which {described} does not '
        f'have{hint}'
      )
  return problems


# Where the task zoo has an output a method may read.
_OUTPUT_HINTS = {
  'z': (
    f': use {", ".join(task_models.PROJECTION_BUILT_IN)}, or '
    f'{"/".join(task_models.TAKES_PROJECTION_DIM)} with --projection_dim > 0'
  ),
}
