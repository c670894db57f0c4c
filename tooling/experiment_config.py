"""Every setting of one experiment, `ExperimentConfig`: the one source of
the binaries' flags (`binaries/experiment_flags.py` defines a flag per
field, with its default and help).
"""

import dataclasses
import hashlib
import os
import re
import typing
from typing import Any, Mapping, Optional

from tff_methods import privacy
from tff_methods.algorithms import hyperparameters
from tff_methods.algorithms import methods
from tff_methods_tasks import datasets
from tff_methods_tasks import tff_baselines
from tff_methods_tooling import dp_runs

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
# Settings named otherwise now (a method's own, `--<method>_<setting>`): a
# run saved under the old name resumes, and the old flag still works.
RENAMED_SETTINGS = {
  'beta': 'fedmax_beta',
  'temperature': 'moon_temperature',
  'cka_layers': 'fedcka_layers',
  'similarity': 'fedcka_similarity',
}


def _setting(default: Any, help_text: str) -> Any:
  """A config field with its help text (the flag's help)."""
  return dataclasses.field(default=default, metadata={'help': help_text})


# The library's own defaults for the settings a method's builder takes:
# the experiment's are the same values, defined once (`methods`).
_METHOD_DEFAULTS = {
  f.name: f.default for f in dataclasses.fields(hyperparameters.Hyperparameters)
}


def _method_setting(name: str, help_text: str) -> Any:
  """A config field for `hyperparameters.Hyperparameters.<name>`, at its
  default."""
  return _setting(_METHOD_DEFAULTS[name], help_text)


@dataclasses.dataclass
class _SharedSettings:
  """Every setting of one federated training run.

  The single source of the settings: each field's default and help (its
  metadata) are the binaries' flags (`binaries/experiment_flags.py` defines
  one flag per field).
  """

  method: str = _setting(
    'fedavg',
    f'One of {", ".join(methods.METHOD_NAMES)}; or components joined by + '
    '(a server rule fedavg/fedavgm/fedadam/fedyogi with any of fedprox, '
    'fedmax, fedcos, moon, fedcka); or a method a --method_module '
    'registers.',
  )
  method_module: Optional[str] = _setting(
    None,
    'Modules to import first (comma-separated, on the command line), each '
    'registering methods of its own with '
    'tff_methods.algorithms.methods.register: '
    '--method then names them and their settings are flags '
    '(docs/methods.md, "Combinations").',
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
    "The strength of every named method's term without a strength of its "
    'own (--fedprox_mu, --moon_mu, ...); by default each its own.',
  )
  client_state_dir: Optional[str] = _setting(
    None,
    'moon/fedcka/scaffold: where the client state files go (default: '
    '<output_dir>/client_states); given, each run keeps its states in a '
    'directory of its own under it. TFF workers must see it.',
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
    'dp: a fixed L2 clipping norm; by default adaptive clipping (the '
    'query of tff.learning.dp_aggregator).',
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
  dp_accountant: Optional[str] = _setting(
    None,
    "dp: the accountant of the run's epsilon, rdp or pld (dp_accounting's; "
    'pld is tighter and needs Poisson sampling); by default pld for Poisson '
    'sampling, rdp otherwise.',
  )
  client_sampling: Optional[str] = _setting(
    None,
    'How each round draws its clients: without_replacement (exactly '
    '--clients_per_round clients; the default without DP) or poisson (each '
    'client with probability --clients_per_round / N, independently: the '
    'cohort size varies; the default under --aggregator=dp, whose epsilon '
    'is then add-or-remove-one and tighter).',
  )
  dp_release_non_private: bool = _setting(
    False,
    'dp: also write what the guarantee does not cover, un-noised: the '
    "rounds' training metrics (the clients' loss, accuracy and counts) to "
    'metrics.csv and TensorBoard, and the partition report (each '
    "client's class counts).",
  )
  sampling_seed: Optional[int] = _setting(
    None,
    "Fixes the rounds' cohorts; by default --seed, except under "
    "--aggregator=dp, where it is drawn from the operating system's "
    'entropy and kept, for resuming, in <output_dir>/sampling_seed.secret '
    'only (amplification by sampling assumes secret cohorts: do not '
    'publish that file); a fixed one is for debugging.',
  )
  restart_client_states: bool = _setting(
    False,
    'moon/fedcka/scaffold: resume a run whose client states are gone with '
    "every client's state started over (refused otherwise).",
  )
  seed: int = _setting(
    0,
    'Fixes partition, init, batches and (unless --sampling_seed, or under '
    '--aggregator=dp) the cohorts.',
  )
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

  def method_modules(self) -> list[str]:
    """The modules `method_module` names."""
    return [
      m.strip() for m in (self.method_module or '').split(',') if m.strip()
    ]

  def sampling(self) -> str:
    """How the rounds draw their clients: `--client_sampling`, or Poisson
    under DP (`privacy.DEFAULT_SAMPLING`) and without replacement
    otherwise."""
    if self.client_sampling is not None:
      return self.client_sampling
    if self.aggregator == 'dp':
      return privacy.DEFAULT_SAMPLING
    return 'without_replacement'

  def accountant(self) -> str:
    """`--dp_accountant`, or the tightest one for the sampling."""
    return self.dp_accountant or privacy.default_accountant(self.sampling())

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
    """Whether the task is one of TFF's
    (`tff_methods_tasks.tff_baselines`)."""
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
    """What a client trains on in a round
    (`tff_methods_tasks.datasets.LocalBatches`)."""
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
  ) -> hyperparameters.Hyperparameters:
    shared = {
      name: getattr(self, name)
      for name in _METHOD_DEFAULTS
      if name in _SHARED_FIELDS
    }
    if self.aggregator == 'dp':  # --dp_target_epsilon's noise, if given.
      shared['dp_noise_multiplier'] = dp_runs.noise_multiplier(
        self, num_clients or self.num_clients
      )
    return hyperparameters.Hyperparameters(
      **{
        **shared,
        'method_settings': self.method_settings(),
        'num_clients': num_clients or self.num_clients,
        # Kept with the run, so that it resumes exactly.
        'client_state_dir': self.client_state_directory(),
      }
    )

  def method_settings(self) -> dict[str, dict[str, Any]]:
    """Each method's own settings given (None: left to `--mu` or the
    method's default), by method and setting name."""
    # A method registered after this config's class was made has no
    # fields here: its defaults.
    return {
      spec.name: {
        field.name: getattr(self, spec.flag(field.name))
        for field in dataclasses.fields(spec.settings)
        if getattr(self, spec.flag(field.name), None) is not None
      }
      for spec in methods.REGISTRY.values()
    }

  def settings_of(self, method: str) -> Any:
    """Method `method`'s own settings in this run (its module's
    `Settings`, e.g. `settings_of('fed2').groups`)."""
    return self.hyperparameters().settings_of(methods.REGISTRY[method])


_SHARED_FIELDS = {f.name for f in dataclasses.fields(_SharedSettings)}


def method_fields(registry: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
  """The config fields of the methods' own settings, `--<method>_<name>`:
  each with its declared default and help (a strength named mu defaults to
  None: `--mu`, else the method's own default)."""
  fields = []
  for spec in registry.values():
    for field in dataclasses.fields(spec.settings):
      kind = field.type
      if typing.get_origin(kind) is typing.Union:  # Optional[X]
        (kind,) = [a for a in typing.get_args(kind) if a is not type(None)]
      help_text = f'{spec.name}: {_lowered(field.metadata["help"])}'
      if field.name == 'mu':
        default = None
        help_text += f' (default {field.default:g}, or --mu)'
      else:
        default = field.default
      fields.append(
        (
          spec.flag(field.name),
          Optional[kind],
          dataclasses.field(default=default, metadata={'help': help_text}),
        )
      )
  return fields


def upgrade_saved_settings(saved: Mapping[str, Any]) -> dict[str, Any]:
  """A saved experiment.json's settings under today's names: renamed ones
  (`RENAMED_SETTINGS`) under their new names, and a method's setting saved
  as None (its default) as that default."""
  upgraded = {RENAMED_SETTINGS.get(k, k): v for k, v in saved.items()}
  # Sampling and accountant were saved by name before they defaulted by
  # the aggregator: a saved name that the default now gives is the default.
  default = _SharedSettings(aggregator=upgraded.get('aggregator', 'mean'))
  if upgraded.get('client_sampling') == default.sampling():
    upgraded['client_sampling'] = None
  default.client_sampling = upgraded.get('client_sampling')
  if upgraded.get('dp_accountant') == default.accountant():
    upgraded['dp_accountant'] = None
  for name, _, field in method_fields(methods.REGISTRY):
    if upgraded.get(name, field.default) is None and field.default is not None:
      upgraded[name] = field.default
  return upgraded


def config_class(registry: Mapping[str, Any]) -> type:
  """The experiment's settings: the shared ones, then the own settings of
  every method in `registry`."""
  config = dataclasses.make_dataclass(
    'ExperimentConfig', method_fields(registry), bases=(_SharedSettings,)
  )
  config.__module__ = __name__
  config.__doc__ = _SharedSettings.__doc__
  return config


def method_settings_table(registry: Mapping[str, Any]) -> str:
  """The docs' table of the methods' own settings (docs/flags.md), one row
  per setting, from the methods' declarations."""
  rows = [
    '| flag | method | default | meaning | declared in |',
    '|---|---|---|---|---|',
  ]
  for spec in registry.values():
    declared = spec.settings.__module__.replace('.', '/') + '.py'
    for field in dataclasses.fields(spec.settings):
      meaning = field.metadata['help'].replace('|', '\\|')
      if field.metadata.get('choices'):
        names = ', '.join(f'`{c}`' for c in field.metadata['choices'])
        meaning += f' One of {names}.'
      if field.name == 'mu':
        meaning += ' `--mu` sets it when this flag is not given.'
      rows.append(
        f'| `--{spec.flag(field.name)}` | {spec.display_name} | '
        f'`{field.default}` | {meaning} | `{declared}`: '
        f'`{spec.settings.__name__}.{field.name}` |'
      )
  return '\n'.join(rows) + '\n'


def _lowered(text: str) -> str:
  """'The strength ...' as 'the strength ...' (not 'M: ...')."""
  if len(text) > 1 and text[0].isupper() and text[1].islower():
    return text[0].lower() + text[1:]
  return text


# The shared settings, then every registered method's own.
ExperimentConfig = config_class(methods.REGISTRY)
