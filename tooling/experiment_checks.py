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
  errors = []

  def need(ok, message):
    if not ok:
      errors.append(message)

  try:
    parts = methods.parse_method(config.method)
  except ValueError as e:
    parts = []
    errors.append(f'--method={config.method!r}: {e}')
  tff_task = config.is_tff_baseline()
  need(
    config.task in datasets.TASK_NAMES + tff_baselines.TASK_NAMES,
    f'--task={config.task!r} is unknown; choose one of '
    f'{", ".join(datasets.TASK_NAMES + tff_baselines.TASK_NAMES)}',
  )
  if tff_task:
    _validate_tff_baseline(config, parts, need)
  else:
    need(
      config.model_name() in task_models.MODEL_NAMES + task_models.FED2_MODELS,
      f'--model={config.model!r} is unknown; choose one of '
      f'{", ".join(task_models.MODEL_NAMES)}',
    )
    for flag in ('use_synthetic_data', 'max_elements'):
      need(
        not getattr(config, flag),
        f'--{flag}={getattr(config, flag)} is for the tff_baselines tasks, '
        f'not --task={config.task}',
      )
  need(
    config.partition in partition_lib.PARTITIONERS,
    f'--partition={config.partition!r} is unknown; choose one of '
    f'{", ".join(partition_lib.PARTITIONERS)}',
  )
  need(config.alpha > 0, f'--alpha={config.alpha} must be > 0')
  need(config.min_size >= 0, f'--min_size={config.min_size} must be >= 0')
  need(
    config.classes_per_client >= 1,
    f'--classes_per_client={config.classes_per_client} must be >= 1',
  )
  need(
    config.shards_per_client >= 1,
    f'--shards_per_client={config.shards_per_client} must be >= 1',
  )
  need(
    0 <= config.non_iid_fraction <= 1,
    f'--non_iid_fraction={config.non_iid_fraction} must be in [0, 1]',
  )
  need(
    config.num_clients >= 1, f'--num_clients={config.num_clients} must be >= 1'
  )
  need(
    1 <= config.clients_per_round <= config.num_clients
    or config.task in ('emnist', 'shakespeare')
    or tff_task,
    f'--clients_per_round={config.clients_per_round} must be in [1, '
    f'--num_clients={config.num_clients}]',
  )
  need(config.rounds >= 1, f'--rounds={config.rounds} must be >= 1')
  need(
    config.local_epochs >= 1,
    f'--local_epochs={config.local_epochs} must be >= 1',
  )
  need(
    config.local_steps is None or config.local_steps >= 1,
    f'--local_steps={config.local_steps} must be >= 1',
  )
  need(
    config.batch_size >= 1, f'--batch_size={config.batch_size} must be ' '>= 1'
  )
  need(
    config.client_learning_rate > 0,
    f'--client_learning_rate={config.client_learning_rate} must be > 0',
  )
  need(
    0 <= config.client_momentum < 1,
    f'--client_momentum={config.client_momentum} must be in [0, 1)',
  )
  need(
    config.weight_decay >= 0,
    f'--weight_decay={config.weight_decay} must be >= 0',
  )
  need(
    config.server_learning_rate is None or config.server_learning_rate > 0,
    f'--server_learning_rate={config.server_learning_rate} must be > 0',
  )
  need(
    0 <= config.server_momentum < 1,
    f'--server_momentum={config.server_momentum} must be in [0, 1)',
  )
  need(
    config.server_epsilon > 0,
    f'--server_epsilon={config.server_epsilon} must be > 0',
  )
  need(
    config.server_momentum_form in optimizers.MOMENTUM_FORMS,
    f'--server_momentum_form={config.server_momentum_form!r} is unknown; '
    f'choose one of {", ".join(optimizers.MOMENTUM_FORMS)}',
  )
  # Each method's own settings, by what its module declares they take.
  need(
    config.mu is None or config.mu >= 0,
    f'--mu={config.mu} must be >= 0 (a strength)',
  )
  given = config.method_settings()
  for spec in methods.REGISTRY.values():
    settings = spec.settings(**given[spec.name])
    errors.extend(p.rstrip('.') for p in method_spec.problems(spec, settings))
  need(
    config.client_weighting in aggregation.CLIENT_WEIGHTINGS,
    f'--client_weighting={config.client_weighting!r} is unknown; choose one '
    f'of {", ".join(aggregation.CLIENT_WEIGHTINGS)}',
  )
  need(
    config.aggregator != 'dp'
    or config.client_weighting in ('num_examples', 'uniform'),
    f'--client_weighting={config.client_weighting} with --aggregator=dp: DP '
    'weighs clients uniformly; give --client_weighting=uniform',
  )
  # A method with a process of its own may weigh clients by a setting of
  # its own (SCAFFOLD's), which is checked as --client_weighting is.
  own_weightings = []
  for spec in (methods.REGISTRY[p] for p in parts):
    if spec.weighting_setting is not None:
      settings = spec.settings(**given[spec.name])
      own_weightings.append(
        (
          f'--{spec.flag(spec.weighting_setting)}',
          getattr(settings, spec.weighting_setting),
        )
      )
  for flag, value in [('--client_weighting', config.client_weighting)] + (
    own_weightings
  ):
    need(
      value != 'num_tokens' or config.task in tff_baselines.TEXT_TASK_NAMES,
      f'{flag}=num_tokens is for the text tasks '
      f'({", ".join(tff_baselines.TEXT_TASK_NAMES)}), not --task={config.task}',
    )
  need(
    config.aggregator in aggregation.AGGREGATORS,
    f'--aggregator={config.aggregator!r} is unknown; choose one of '
    f'{", ".join(aggregation.AGGREGATORS)}',
  )
  errors.extend(dp_runs.check(config, None if tff_task else config.num_clients))
  for report in methods.client_reports('+'.join(parts)) if parts else ():
    need(
      config.aggregator != 'dp',
      f'--method={config.method} with --aggregator=dp: {report} reach the '
      'server summed without clip or noise, so the guarantee would not '
      'cover them; run it without DP, or a method that sends only its '
      'model update',
    )
  for flag, value in own_weightings:
    need(
      config.aggregator != 'dp' or value == 'uniform',
      f'--aggregator=dp averages clients uniformly; it needs {flag}=uniform',
    )
  model_name = config.model_name()
  zoo_model = not tff_task and model_name in task_models.MODEL_NAMES
  need(
    config.projection_dim >= 0
    and (
      config.projection_dim == 0
      or (not tff_task and model_name in task_models.TAKES_PROJECTION_DIM)
    ),
    f'--projection_dim={config.projection_dim} must be >= 0, and is for '
    f'--model={"/".join(task_models.TAKES_PROJECTION_DIM)} only',
  )
  if zoo_model:
    described = f'--model={model_name}'
    errors.extend(
      _model_problems(
        config,
        task_models.output_names(model_name, config.projection_dim),
        described,
        has_layer_plan=model_name in task_models.FED2_MODELS,
      )
    )
  need(
    config.rounds_per_eval >= 1,
    f'--rounds_per_eval={config.rounds_per_eval} must be >= 1',
  )
  need(
    0 <= config.seed < 2**31,
    f'--seed={config.seed} must be in [0, 2^31 - 1]',
  )
  need(
    config.rounds_per_checkpoint >= 1,
    f'--rounds_per_checkpoint={config.rounds_per_checkpoint} must be >= 1',
  )
  need(
    0 <= config.validation_fraction < 1
    and (
      config.validation_fraction == 0
      or config.task not in datasets.NATURAL_TASKS
    ),
    f'--validation_fraction={config.validation_fraction} must be in '
    '[0, 1), and 0 for tasks with natural clients '
    f'({", ".join(datasets.NATURAL_TASKS)}; TFF\'s baseline tasks hold out '
    'whole clients)',
  )
  need(config.image_size >= 8, f'--image_size={config.image_size} must be >= 8')
  if config.task == 'image_folder':
    need(
      bool(config.data_dir) and os.path.isdir(config.data_dir),
      f'--data_dir={config.data_dir!r} must be a directory of class '
      'sub-directories for --task=image_folder',
    )
  if errors:
    raise ValueError('Bad settings:\n  ' + '\n  '.join(errors))


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
