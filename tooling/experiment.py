"""One federated experiment from a config: the logic behind `binaries/train`.

`ExperimentConfig` holds every setting of a run; `validate` checks them all
before any work starts and names each bad value and what is allowed; `run`
loads the task, builds the method, and trains with
`tooling.training_loop.run_training`, writing to `config.output_dir`:

  experiment.json      the settings (a rerun must match them to resume)
  partition.txt/.png   examples per client and class
  metrics.csv          one row per round (train metrics, eval, seconds)
  tensorboard/         the same metrics for TensorBoard
  program_state/       TFF program state, for resuming
  results.json         final test metrics and seconds per round
"""

import dataclasses
import functools
import hashlib
import json
import os
import re
from typing import Any, Callable, Mapping, Optional, Sequence, Union

from absl import logging
import numpy as np

from tasks import datasets
from tasks import models as task_models
from tasks import partition as partition_lib
from tasks import report
from tff_methods import aggregation
from tff_methods import client_keys
from tff_methods import client_states
from tff_methods import fed2
from tff_methods import fedcos
from tff_methods import methods
from tff_methods import model_lib
from tff_methods import moon
from tff_methods import optimizers
from tff_methods import similarity as similarity_lib
from tooling import dp_runs
from tooling import evaluation
from tooling import run_directory
from tooling import tff_baselines
from tooling import training_loop

DEFAULT_MODELS = {
  'digits': 'fedcka_cnn',
  'cifar10': 'fedcka_cnn',
  'cifar100': 'fedcka_cnn',
  'fmnist': 'fedcka_cnn',
  'mnist': 'fedcka_cnn',
  'emnist': 'fedmax_cnn',
  'shakespeare': 'shakespeare_lstm',
  'synthetic': 'mlp',
  'image_folder': 'resnet18',
}


# Settings that no longer exist, with the value that did what the code does
# now: a run saved with it still resumes (with another, it is refused).
RETIRED_SETTINGS = {
  # Fed2's class-weighted pairing was removed: the paper pairs by examples.
  'fed2_pairing': 'uniform',
}


def _setting(default: Any, help_text: str) -> Any:
  """A config field with its help text (the flag's help)."""
  return dataclasses.field(default=default, metadata={'help': help_text})


# The library's own defaults for the settings a method's builder takes:
# the experiment's are the same values, defined once (`methods`).
_METHOD_DEFAULTS = {
  f.name: f.default for f in dataclasses.fields(methods.Hyperparameters)
}


def _method_setting(name: str, help_text: str) -> Any:
  """A config field for `methods.Hyperparameters.<name>`, at its default."""
  return _setting(_METHOD_DEFAULTS[name], help_text)


@dataclasses.dataclass
class ExperimentConfig:
  """Every setting of one federated training run.

  The single source of the settings: each field's default and help (its
  metadata) are the binaries' flags (`binaries/experiment_flags.py` defines
  one flag per field).
  """

  method: str = _setting(
    'fedavg',
    f'One of {", ".join(methods.METHOD_NAMES)}; or components joined by + '
    '(a server rule fedavg/fedavgm/fedadam/fedyogi with any of fedprox, '
    'fedmax, fedcos, moon, fedcka).',
  )
  task: str = _setting(
    'digits',
    'digits (offline), cifar10, cifar100, fmnist, mnist, emnist, '
    "shakespeare, synthetic or image_folder; or one of TFF's baseline "
    f'tasks: {", ".join(tff_baselines.TASK_NAMES)} (docs/tff_baselines.md).',
  )
  model: Optional[str] = _setting(
    None,
    'fedcka_cnn, fedmax_cnn, lenet, mlp, mlp1, resnet18, resnet50, vgg9, '
    'mobilenet, shakespeare_lstm, shakespeare_lstm100 (and vgg16 for '
    "fed2); for a tff_baselines task, one of TFF's models for it; by "
    "default the task's usual model.",
  )
  use_synthetic_data: bool = _setting(
    False,
    "tff_baselines tasks: TFF's synthetic data, offline (a few clients "
    'with a handful of examples: for trying a pipeline, not for results).',
  )
  max_elements: Optional[int] = _setting(
    None,
    "tff_baselines tasks: TFF's cap on a client's examples per round "
    '(ClientSpec.max_elements); by default all of them.',
  )
  projection_dim: int = _setting(
    0,
    "resnet18/resnet50: width of a MOON projection head 'z' (0: none; "
    'MOON needs one).',
  )
  partition: str = _setting(
    'dirichlet', 'iid, dirichlet, pathological, shards or mixed.'
  )
  alpha: float = _setting(0.5, 'Dirichlet concentration (> 0).')
  min_size: int = _setting(10, 'Dirichlet: fewest examples per client.')
  classes_per_client: int = _setting(2, 'pathological: classes each.')
  shards_per_client: int = _setting(2, 'shards: shards each.')
  non_iid_fraction: float = _setting(
    1.0, 'mixed: share of each client kept label-sorted.'
  )
  synthetic_alpha: float = _setting(1.0, 'synthetic(alpha, beta): alpha.')
  synthetic_beta: float = _setting(1.0, 'synthetic(alpha, beta): beta.')
  image_size: int = _setting(32, 'image_folder: images resized to this.')
  num_clients: int = _setting(10, 'Clients to split the data into.')
  clients_per_round: int = _setting(10, 'Clients sampled per round.')
  rounds: int = _setting(10, 'Total communication rounds.')
  local_epochs: int = _setting(1, 'Local epochs per round.')
  local_steps: Optional[int] = _setting(
    None, 'Local steps per round (instead of epochs).'
  )
  batch_size: int = _setting(32, 'Local batch size.')
  drop_last: bool = _setting(
    False,
    "Drop each pass's last batch when it is partial (the MOON repo); by "
    "default it is kept, as PyTorch's DataLoader does.",
  )
  client_learning_rate: float = _method_setting(
    'client_learning_rate', 'Client SGD learning rate.'
  )
  client_momentum: float = _method_setting(
    'client_momentum',
    'Client SGD momentum (not used by scaffold, which trains with plain '
    'SGD).',
  )
  weight_decay: float = _method_setting(
    'weight_decay', 'Client L2 weight decay.'
  )
  server_learning_rate: Optional[float] = _method_setting(
    'server_learning_rate',
    'Server learning rate (default: 1.0 for averaging, 0.01 for '
    'fedadam/fedyogi).',
  )
  server_momentum: float = _method_setting(
    'server_momentum', 'fedavgm: server momentum.'
  )
  server_epsilon: float = _method_setting(
    'server_epsilon',
    'fedadam/fedyogi: the epsilon of the server optimizer (Reddi et al. '
    'tune it per task).',
  )
  mu: Optional[float] = _method_setting(
    'mu',
    "The strength of the method's term(s) (default: fedprox 0.01, moon 1, "
    'fedcka 3, fedcos 0.02).',
  )
  fedprox_mu: Optional[float] = _setting(
    None, "FedProx's mu in a combination (overrides --mu)."
  )
  fedcos_mu: Optional[float] = _setting(
    None, "FedCos's mu in a combination (overrides --mu)."
  )
  beta: Optional[float] = _method_setting(
    'beta',
    "fedmax: the prior's strength (default 1000, the paper's CIFAR value).",
  )
  temperature: float = _method_setting(
    'temperature', 'moon: the contrastive temperature.'
  )
  cka_layers: int = _method_setting(
    'cka_layers', 'fedcka: M, the first M layers regularized.'
  )
  similarity: str = _method_setting(
    'similarity',
    'fedcka: linear_cka, kernel_cka, frobenius (||a1 - a2||^2), cosine '
    '(the inner product), normalized_cosine or normalized_frobenius.',
  )
  client_state_dir: Optional[str] = _setting(
    None,
    'moon/fedcka/scaffold: where the client state files go (default: '
    '<output_dir>/client_states); given, each run keeps its states in a '
    'directory of its own under it. TFF workers must see it.',
  )
  fed2_groups: int = _method_setting(
    'fed2_groups', 'fed2: G, the number of groups.'
  )
  fed2_decouple_depth: Optional[int] = _method_setting(
    'fed2_decouple_depth',
    'fed2: how many final layers are grouped (default: 6 for VGG, 4 for '
    'the FedCKA CNN).',
  )
  server_momentum_form: str = _method_setting(
    'server_momentum_form',
    'fedavgm: heavy_ball (TFF: m = beta m + delta) or ema (the FedCos '
    'code: m = beta m + (1 - beta) delta).',
  )
  client_weighting: str = _method_setting(
    'client_weighting',
    'How client updates are weighted in the mean (every method but '
    "scaffold, which takes --scaffold_weighting): num_examples (TFF's "
    'default), uniform, or num_tokens (the labels that are not padding: '
    "Reddi et al.'s weighting of the text tasks). --aggregator=dp weighs "
    'clients uniformly.',
  )
  scaffold_weighting: str = _method_setting(
    'scaffold_weighting',
    'scaffold: the model average, uniform (the paper), num_examples '
    '(NIID-Bench) or num_tokens.',
  )
  scaffold_momentum: bool = _method_setting(
    'scaffold_momentum',
    'scaffold: clients use --client_momentum (NIID-Bench, the MOON repo); '
    'by default plain SGD (the paper).',
  )
  moon_first_round: str = _setting(
    'skip',
    'moon: a client first taking part after round 1 skips the term (skip, '
    'the paper) or contrasts against its own initial model '
    '(initial_model, the MOON repo).',
  )
  fedcos_direction: str = _method_setting(
    'fedcos_direction',
    "fedcos: d, the global model's last move (global_move, the paper) or "
    'the mean client update before the server optimizer '
    '(mean_client_update, the FedCos code).',
  )
  aggregator: str = _method_setting(
    'aggregator',
    "TFF's model aggregator for every method: mean (the weighted mean), "
    'robust (tff.learning.robust_aggregator: zeroing and adaptive '
    'clipping), dp (differential privacy: noise on clipped updates, '
    'uniform weighting), compression or secure.',
  )
  dp_noise_multiplier: float = _method_setting(
    'dp_noise_multiplier',
    'dp: the Gaussian noise standard deviation over the clip (TFF '
    'needs it below 0.1 x --clients_per_round with adaptive clipping).',
  )
  dp_clip: Optional[float] = _method_setting(
    'dp_clip',
    'dp: a fixed L2 clipping norm; by default adaptive clipping '
    '(tff.learning.dp_aggregator).',
  )
  dp_clipped_count_stddev: Optional[float] = _method_setting(
    'dp_clipped_count_stddev',
    'dp, adaptive clip: the noise on the count of clipped clients; by '
    "default TFF's 0.05 x --clients_per_round. It must exceed half of "
    '--dp_noise_multiplier; the larger it is, the more noise the updates '
    'get for the same privacy (Andrew et al., 2021).',
  )
  dp_target_quantile: float = _method_setting(
    'dp_target_quantile',
    'dp, adaptive clip: the share of clients whose updates the clip aims '
    'to leave unclipped.',
  )
  dp_delta: Optional[float] = _setting(
    None,
    "dp: the delta of the run's reported (epsilon, delta); by default "
    '1 / N^1.1 for N clients.',
  )
  dp_target_epsilon: Optional[float] = _setting(
    None,
    'dp: the client-level epsilon to meet after --rounds at --dp_delta; '
    'the smallest noise multiplier that meets it is found before any '
    'work and replaces --dp_noise_multiplier.',
  )
  dp_accountant: str = _setting(
    'rdp',
    "dp: the accountant of the run's epsilon, rdp or pld (dp_accounting's; "
    'pld is tighter and needs --client_sampling=poisson).',
  )
  client_sampling: str = _setting(
    'without_replacement',
    'How each round draws its clients: without_replacement (exactly '
    '--clients_per_round clients) or poisson (each client with probability '
    '--clients_per_round / N, independently: the cohort size varies; DP '
    'accounting is tighter).',
  )
  restart_client_states: bool = _setting(
    False,
    'moon/fedcka/scaffold: resume a run whose client states are gone with '
    "every client's state started over (refused otherwise).",
  )
  seed: int = _setting(0, 'Fixes partition, sampling and init.')
  rounds_per_eval: int = _setting(1, 'Evaluate every N rounds.')
  rounds_per_checkpoint: int = _setting(1, 'Save state every N rounds.')
  output_dir: str = _setting(
    'runs/experiment',
    'Where results go (the binaries default to '
    'runs/<task>_<method>_s<seed>).',
  )
  data_dir: Optional[str] = _setting(
    None,
    'tensorflow_datasets data directory, the image folder for '
    "--task=image_folder, or TFF's download cache for the tff_baselines "
    'tasks (TFF: ~/.tff).',
  )
  cache_dir: Optional[str] = _setting(
    None, "Clients' data files (default ~/.cache/tff_methods)."
  )
  validation_fraction: float = _setting(
    0.0,
    'If > 0, hold out this share of the training data and evaluate on it '
    "instead of the test set (for tuning; binaries/tune.py sets it); TFF's "
    'baseline tasks hold out this share of their training clients.',
  )

  def client_state_directory(self) -> str:
    """Where this run's clients keep their states (MOON, FedCKA, SCAFFOLD):
    `<output_dir>/client_states`, or under `client_state_dir` a directory
    of the run's own, named after its output directory (runs of a
    comparison may share `--client_state_dir`, never their states)."""
    if not self.client_state_dir:
      return os.path.join(self.output_dir, 'client_states')
    run = os.path.abspath(self.output_dir)
    name = re.sub(
      r'[^A-Za-z0-9_.+@-]',
      '_',
      '_'.join(p for p in run.split(os.sep)[-2:] if p),
    )
    digest = hashlib.sha1(run.encode()).hexdigest()[:8]
    return os.path.join(self.client_state_dir, f'{name}-{digest}')

  def is_tff_baseline(self) -> bool:
    """Whether the task is one of TFF's (`tooling.tff_baselines`)."""
    return tff_baselines.is_baseline_task(self.task)

  def data_description(self) -> str:
    """The task and its clients, for a report's title."""
    if self.is_tff_baseline():
      data = ", TFF's synthetic data" if self.use_synthetic_data else ''
      return f"{self.task} (TFF's clients{data})"
    return (
      f'{self.task}, {self.partition} partition, {self.num_clients} clients'
    )

  def model_name(self) -> str:
    if self.is_tff_baseline() and self.task in tff_baselines.TASK_NAMES:
      return self.model or tff_baselines.models(self.task)[0]
    return self.model or DEFAULT_MODELS.get(self.task, 'fedcka_cnn')

  def local_batches(self) -> datasets.LocalBatches:
    """What a client trains on in a round (`tasks.datasets.LocalBatches`)."""
    return datasets.LocalBatches(
      self.batch_size,
      self.local_epochs,
      self.local_steps,
      drop_last=self.drop_last,
      seed=self.seed,
      with_index=methods.wants_example_index(
        self.method, self.local_epochs, self.local_steps
      ),
    )

  def hyperparameters(
    self, num_clients: Optional[int] = None
  ) -> methods.Hyperparameters:
    strengths = tuple(
      (name, value)
      for name, value in (
        ('fedprox', self.fedprox_mu),
        ('fedcos', self.fedcos_mu),
      )
      if value is not None
    )
    shared = {
      name: getattr(self, name)
      for name in _METHOD_DEFAULTS
      if name in _CONFIG_FIELDS
    }
    if self.aggregator == 'dp':  # --dp_target_epsilon's noise, if given.
      shared['dp_noise_multiplier'] = dp_runs.noise_multiplier(
        self, num_clients or self.num_clients
      )
    return methods.Hyperparameters(
      **{
        **shared,
        'strengths': strengths,
        'num_clients': num_clients or self.num_clients,
        # Kept with the run, so that it resumes exactly.
        'client_state_dir': self.client_state_directory(),
      }
    )


_CONFIG_FIELDS = {f.name for f in dataclasses.fields(ExperimentConfig)}


def validate(config: ExperimentConfig) -> None:
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
  need(
    config.fedcos_direction in fedcos.DIRECTIONS,
    f'--fedcos_direction={config.fedcos_direction!r} is unknown; choose '
    f'one of {", ".join(fedcos.DIRECTIONS)}',
  )
  need(
    config.moon_first_round in moon.FIRST_ROUNDS,
    f'--moon_first_round={config.moon_first_round!r} is unknown; choose '
    f'one of {", ".join(moon.FIRST_ROUNDS)}',
  )
  need(
    config.scaffold_weighting in methods.SCAFFOLD_WEIGHTINGS,
    f'--scaffold_weighting={config.scaffold_weighting!r} is unknown; '
    f'choose one of {", ".join(methods.SCAFFOLD_WEIGHTINGS)}',
  )
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
  need(
    'num_tokens' not in (config.client_weighting, config.scaffold_weighting)
    or config.task in tff_baselines.TEXT_TASK_NAMES,
    f'num_tokens weighting is for the text tasks '
    f'({", ".join(tff_baselines.TEXT_TASK_NAMES)}), not --task={config.task}',
  )
  need(
    config.aggregator in aggregation.AGGREGATORS,
    f'--aggregator={config.aggregator!r} is unknown; choose one of '
    f'{", ".join(aggregation.AGGREGATORS)}',
  )
  errors.extend(dp_runs.check(config, None if tff_task else config.num_clients))
  if config.aggregator == 'dp' and parts == ['scaffold']:
    need(
      config.scaffold_weighting == 'uniform',
      '--aggregator=dp averages clients uniformly; it needs '
      '--scaffold_weighting=uniform',
    )
  for flag in ('mu', 'fedprox_mu', 'fedcos_mu', 'beta'):
    value = getattr(config, flag)
    need(
      value is None or value >= 0, f'--{flag}={value} must be >= 0 (a strength)'
    )
  need(
    config.temperature > 0, f'--temperature={config.temperature} must be > 0'
  )
  need(
    config.cka_layers >= 1, f'--cka_layers={config.cka_layers} must be ' '>= 1'
  )
  need(
    config.similarity in similarity_lib.SIMILARITIES,
    f'--similarity={config.similarity!r} is unknown; choose one of '
    f'{", ".join(similarity_lib.SIMILARITIES)}',
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
  if 'moon' in parts and zoo_model:
    need(
      task_models.has_projection_head(model_name, config.projection_dim),
      f'--method=moon needs a model with a projection head (z): '
      f'{", ".join(task_models.PROJECTION_BUILT_IN)}, or '
      f'{"/".join(task_models.TAKES_PROJECTION_DIM)} with '
      f'--projection_dim > 0, not --model={model_name}',
    )
  if 'fed2' in parts and not tff_task:
    need(
      model_name in task_models.FED2_MODELS,
      '--method=fed2 supports --model='
      f'{"/".join(task_models.FED2_MODELS)}, not {model_name}',
    )
    need(
      config.fed2_groups >= 1,
      f'--fed2_groups={config.fed2_groups} must be >= 1',
    )
  if 'fedcka' in parts and zoo_model:
    need(
      config.cka_layers <= task_models.LAYER_OUTPUTS[model_name],
      f'--cka_layers={config.cka_layers} is more than --model='
      f"{model_name}'s {task_models.LAYER_OUTPUTS[model_name]} layers",
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
  for flag in ('output_dir', 'client_state_dir'):
    path = getattr(config, flag) or ''
    need(
      not set(path) & set('[]*?'),
      f'--{flag}={path!r} holds a character of [ ] * ?, which TensorFlow '
      'reads as a file pattern when it looks for checkpoints: choose a '
      'directory name without them',
    )
  if errors:
    raise ValueError('Bad settings:\n  ' + '\n  '.join(errors))


def _validate_tff_baseline(config: ExperimentConfig, parts, need) -> None:
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
  need(
    'fed2' not in parts,
    f'--method=fed2 groups the layers of the project\'s CNNs and VGGs '
    f'(--model={"/".join(task_models.FED2_MODELS)}); it does not apply to '
    f"TFF's {model_name} model of {config.task}",
  )
  if 'fedcka' in parts and model_name in task_models_ids:
    layers = tff_baselines.layer_outputs(config.task, model_name)
    need(
      config.cka_layers <= layers,
      f'--cka_layers={config.cka_layers} is more than the {layers} layers '
      f"FedCKA can read of TFF's {model_name} model of {config.task}",
    )
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
  hparams: methods.Hyperparameters,
  **model_kwargs,
) -> model_lib.KerasModelFn:
  """The Keras model factory method `name` trains on a task-zoo model.

  The zoo's model (`tasks.models`, with `model_kwargs` such as a ResNet's
  `projection_dim`), or for Fed2 its grouped form.

  Raises:
    ValueError: for a bad model or Fed2 setting, before any work starts.
  """
  if methods.parse_method(name) == ['fed2']:
    return fed2.grouped_model_fn(
      fed2.LayerPlan(**task_models.fed2_plan(model_name, input_shape)),
      num_classes,
      input_shape,
      hparams.fed2_groups,
      hparams.fed2_decouple_depth,
      hparams.seed,
    )
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
  hparams = config.hyperparameters(len(data.client_data.client_ids))
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
  if (
    config.method == 'scaffold'
    and config.client_momentum
    and not config.scaffold_momentum
  ):
    logging.warning(
      'SCAFFOLD trains clients with plain SGD, as the paper '
      'does: --client_momentum=%s is not used (--scaffold_'
      'momentum uses it, as NIID-Bench does).',
      config.client_momentum,
    )
  if methods.is_stateful(config.method):
    client_states.claim_directory(
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
  if 'moon' in methods.parse_method(config.method) and (
    config.moon_first_round == 'initial_model'
  ):
    moon.write_own_initial_models(
      process.client_states,
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
  )


def run(
  config: ExperimentConfig,
  progress: bool = True,
  round_hook: Optional[Callable[[int, Mapping[str, Any]], None]] = None,
  data: Optional[datasets.FederatedData] = None,
) -> dict:
  """Runs (or resumes) the experiment; see the module docstring.

  Needs a TFF execution context (`tff_methods.runtime`).

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
    if not client_states.has_client_states(states):
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
  if getattr(data, 'train_labels', None) is not None:
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
      config.dp_accountant == 'pld'
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
    client_sampling=config.client_sampling,
    round_metrics_fn=None if config.aggregator != 'dp' else dp_metrics,
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
