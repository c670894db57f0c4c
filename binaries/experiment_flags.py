"""The flags that describe one experiment, shared by the binaries.

`train.py` and `compare.py` define the same settings with the same names;
`config_from_flags()` turns them into a `tooling.experiment.
ExperimentConfig`. Importing this module imports TensorFlow, so binaries
call `runtime.configure_process(...)` first.
"""

import dataclasses
import functools
import sys
from typing import Callable, Optional

from absl import flags

from tasks import datasets
from tff_methods import methods
from tff_methods import runtime
from tooling import comparison
from tooling import experiment
from tooling import presets

flags.DEFINE_string(
    'method', 'fedavg',
    f'One of {", ".join(methods.METHOD_NAMES)}; or components joined by + '
    '(a server rule fedavg/fedavgm/fedadam/fedyogi with any of fedprox, '
    'fedmax, fedcos, moon, fedcka).')
flags.DEFINE_string(
    'task', 'digits', 'digits (offline), cifar10, cifar100, fmnist, mnist, '
    'emnist, shakespeare, synthetic or image_folder.')
flags.DEFINE_string('model', None, 'fedcka_cnn, fedmax_cnn, lenet, mlp, mlp1, '
                    'resnet18, resnet50, vgg9, mobilenet, shakespeare_lstm, '
                    'shakespeare_lstm100 (and vgg16 for fed2); '
                    "by default the task's usual model.")
flags.DEFINE_integer('projection_dim', 0, 'resnet18/resnet50: width of a '
                     "MOON projection head 'z' (0: none; MOON needs one).")
flags.DEFINE_string('partition', 'dirichlet',
                    'iid, dirichlet, pathological, shards or mixed.')
flags.DEFINE_float('alpha', 0.5, 'Dirichlet concentration (> 0).')
flags.DEFINE_integer('min_size', 10, 'Dirichlet: fewest examples per client.')
flags.DEFINE_integer('classes_per_client', 2, 'pathological: classes each.')
flags.DEFINE_integer('shards_per_client', 2, 'shards: shards each.')
flags.DEFINE_float('non_iid_fraction', 1.0,
                   'mixed: share of each client kept label-sorted.')
flags.DEFINE_float('synthetic_alpha', 1.0, 'synthetic(alpha, beta): alpha.')
flags.DEFINE_float('synthetic_beta', 1.0, 'synthetic(alpha, beta): beta.')
flags.DEFINE_integer('image_size', 32, 'image_folder: images resized to this.')
flags.DEFINE_integer('num_clients', 10, 'Clients to split the data into.')
flags.DEFINE_integer('clients_per_round', 10, 'Clients sampled per round.')
flags.DEFINE_integer('rounds', 10, 'Total communication rounds.')
flags.DEFINE_integer('local_epochs', 1, 'Local epochs per round.')
flags.DEFINE_integer('local_steps', None,
                     'Local steps per round (instead of epochs).')
flags.DEFINE_integer('batch_size', 32, 'Local batch size.')
flags.DEFINE_bool('drop_last', False, "Drop each pass's last batch when it "
                  'is partial (the MOON repo); by default it is kept, as '
                  "PyTorch's DataLoader does.")
flags.DEFINE_float('client_learning_rate', 0.05, 'Client SGD learning rate.')
flags.DEFINE_float('client_momentum', 0.9, 'Client SGD momentum (not used by '
                   'scaffold, which trains with plain SGD).')
flags.DEFINE_float('weight_decay', 0.0, 'Client L2 weight decay.')
flags.DEFINE_float('server_learning_rate', None,
                   'Server learning rate (default: 1.0 for averaging, 0.01 '
                   'for fedadam/fedyogi).')
flags.DEFINE_float('server_momentum', 0.9, 'fedavgm: server momentum.')
flags.DEFINE_string('server_momentum_form', 'heavy_ball', 'fedavgm: '
                    'heavy_ball (TFF: m = beta m + delta) or ema (the FedCos '
                    'code: m = beta m + (1 - beta) delta).')
flags.DEFINE_string('scaffold_weighting', 'uniform', 'scaffold: the model '
                    'average, uniform (the paper) or num_examples '
                    '(NIID-Bench).')
flags.DEFINE_bool('scaffold_momentum', False, 'scaffold: clients use '
                  '--client_momentum (NIID-Bench, the MOON repo); by '
                  'default plain SGD (the paper).')
flags.DEFINE_float('mu', None, "The strength of the method's term(s) "
                   '(default: fedprox 0.01, moon 1, fedcka 3, fedcos 0.02).')
flags.DEFINE_float('fedprox_mu', None, "FedProx's mu in a combination "
                   '(overrides --mu).')
flags.DEFINE_float('fedcos_mu', None, "FedCos's mu in a combination "
                   '(overrides --mu).')
flags.DEFINE_string('fedcos_direction', 'global_move', "fedcos: d, the "
                    "global model's last move (global_move, the paper) or "
                    'the mean client update before the server optimizer '
                    '(mean_client_update, the FedCos code).')
flags.DEFINE_float('beta', None, "fedmax: the prior's strength (default "
                   '1000, the paper\'s CIFAR value).')
flags.DEFINE_float('temperature', 0.5, "moon: the contrastive temperature.")
flags.DEFINE_string('moon_first_round', 'skip', 'moon: a client first taking '
                    'part after round 1 skips the term (skip, the paper) or '
                    'contrasts against its own initial model (initial_model, '
                    'the MOON repo).')
flags.DEFINE_integer('cka_layers', 2, 'fedcka: M, the first M layers '
                     'regularized.')
flags.DEFINE_string('similarity', 'linear_cka', 'fedcka: linear_cka, '
                    'kernel_cka, frobenius (||a1 - a2||^2), cosine (the '
                    'inner product), normalized_cosine or '
                    'normalized_frobenius.')
flags.DEFINE_string('client_state_dir', None, 'moon/fedcka/scaffold: the '
                    'directory of the client state files (default: a '
                    'temporary one); TFF workers must see it.')
flags.DEFINE_integer('fed2_groups', 10, 'fed2: G, the number of groups.')
flags.DEFINE_integer('fed2_decouple_depth', None, 'fed2: how many final '
                     'layers are grouped (default: 6 for VGG, 4 for the '
                     'FedCKA CNN).')
flags.DEFINE_string('fed2_pairing', 'uniform', 'fed2: uniform (the paper: '
                    'group g averaged with group g, by examples) or '
                    'class_weighted (group g weighted by examples of its '
                    'classes; unstable under strong label skew).')
flags.DEFINE_integer('seed', 0, 'Fixes partition, sampling and init.')
flags.DEFINE_integer('rounds_per_eval', 1, 'Evaluate every N rounds.')
flags.DEFINE_integer('rounds_per_checkpoint', 1, 'Save state every N rounds.')
flags.DEFINE_string('output_dir', None,
                    'Where results go (default runs/<task>_<method>_s<seed>).')
flags.DEFINE_string('data_dir', None, 'tensorflow_datasets data directory, '
                    'or the image folder for --task=image_folder.')
flags.DEFINE_float('validation_fraction', 0.0, 'If > 0, hold out this share '
                   'of the training data and evaluate on it instead of the '
                   'test set (for tuning; binaries/tune.py sets it).')
flags.DEFINE_string('cache_dir', None, "Clients' data files "
                    '(default ~/.cache/tff_methods).')

flags.DEFINE_string('preset', None, 'A paper experiment by name (list them '
                    'with python -m binaries.presets): sets every flag above '
                    'that the command line does not set.')

FLAGS = flags.FLAGS


def define_last_rounds_flag() -> None:
  """`--last_rounds`, for the binaries that tabulate many runs."""
  flags.DEFINE_integer(
      'last_rounds', 1, "The final accuracy is the mean of the last N "
      "rounds' evaluations (an oscillating run is judged by its level, not "
      'by where its last round fell).')


# Failures a user can fix, which end in one line rather than a traceback:
# data that can't be had offline, a computation several workers can't run,
# a run of a comparison that failed in its own job.
EXPECTED_ERRORS = (datasets.DataUnavailableError, runtime.NotMergeableError,
                   comparison.RunFailedError)


def one_line_errors(main: Callable[[list[str]], int]
                    ) -> Callable[[list[str]], int]:
  """Wraps a binary's `main`: an expected failure prints one line, exits 1."""

  @functools.wraps(main)
  def wrapped(argv):
    try:
      return main(argv)
    except EXPECTED_ERRORS as e:
      print(f'{type(e).__name__}: {e}', file=sys.stderr)
      return 1

  return wrapped


def usage_error(message: str) -> int:
  """Prints a bad-input message and returns the exit status 2.

  For errors found before any TFF computation runs.
  """
  runtime.discard_default_context()
  print(message, file=sys.stderr)
  return 2


def numbers(name: str, kind: type = int) -> list:
  """The list flag `name` as numbers of `kind`.

  Raises:
    ValueError: naming the flag and its value.
  """
  values = FLAGS[name].value
  try:
    return [kind(v) for v in values]
  except ValueError:
    noun = 'integers' if kind is int else 'numbers'
    raise ValueError(f'--{name}={",".join(values)} must be {noun}.') from None


def explicit_flags() -> set[str]:
  """The experiment flags set on the command line."""
  fields = {f.name for f in dataclasses.fields(experiment.ExperimentConfig)}
  return {name for name in fields if name in FLAGS and FLAGS[name].present}


def config_from_flags(preset: Optional[presets.Preset] = None,
                      row: Optional[str] = None,
                      **overrides) -> experiment.ExperimentConfig:
  """The experiment the flags describe, with `overrides` applied.

  With a `preset`, its settings (and row `row`'s, if given) replace the
  flags' defaults; flags set on the command line win.
  """
  fields = {f.name for f in dataclasses.fields(experiment.ExperimentConfig)}
  values = {name: FLAGS[name].value for name in fields if name in FLAGS}
  if preset is not None:
    explicit = explicit_flags()
    chosen = (preset.shared_config() if row is None
              else preset.config(row))
    for name in fields:
      if name not in explicit and name != 'output_dir':
        values[name] = getattr(chosen, name)
  values.update(overrides)
  if not values.get('output_dir'):
    values['output_dir'] = (f"runs/{values['task']}_{values['method']}_s"
                            f"{values['seed']}")
  return experiment.ExperimentConfig(**values)
