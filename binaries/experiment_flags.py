"""The flags that describe one experiment, shared by the binaries.

One flag per field of `tff_methods_tooling.experiment.ExperimentConfig`, with
the field's default and help: the config is the single source of every setting.
`config_from_flags()` turns the flags back into a config. Importing this module
imports TensorFlow, so binaries call `process_setup.configure_process(...)`
first.
"""

import dataclasses
import typing
from typing import Optional

from absl import flags

from tff_methods_tooling import commands
from tff_methods_tooling import experiment
from tff_methods_tooling import presets


def define_config_flags(
  flag_values: flags.FlagValues = flags.FLAGS,
  config_class: type = experiment.ExperimentConfig,
) -> None:
  """One absl flag per field of `config_class`, of the field's type."""
  define = {
    str: flags.DEFINE_string,
    int: flags.DEFINE_integer,
    float: flags.DEFINE_float,
    bool: flags.DEFINE_bool,
  }
  for field in dataclasses.fields(config_class):
    kind = field.type
    if typing.get_origin(kind) is typing.Union:  # Optional[X]
      (kind,) = [a for a in typing.get_args(kind) if a is not type(None)]
    # Without --output_dir a binary names the run after its settings.
    default = None if field.name == 'output_dir' else field.default
    define[kind](
      field.name, default, field.metadata['help'], flag_values=flag_values
    )


define_config_flags()
# Today's names of renamed settings are the flags; the old ones still work.
for _old, _new in experiment.RENAMED_SETTINGS.items():
  flags.DEFINE_alias(_old, _new)
flags.DEFINE_string(
  'preset',
  None,
  'A paper experiment by name (list them '
  f"with {commands.command('presets')}): sets every flag above "
  'that the command line does not set.',
)

FLAGS = flags.FLAGS


def define_last_rounds_flag() -> None:
  """`--last_rounds`, for the binaries that tabulate many runs."""
  flags.DEFINE_integer(
    'last_rounds',
    1,
    'The final accuracy is the mean of the last N '
    "rounds' evaluations (an oscillating run is judged by its level, not "
    'by where its last round fell).',
  )


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


def config_from_flags(
  preset: Optional[presets.Preset] = None,
  row: Optional[str] = None,
  **overrides,
) -> experiment.ExperimentConfig:
  """The experiment the flags describe, with `overrides` applied.

  With a `preset`, its settings (and row `row`'s, if given) replace the
  flags' defaults; flags set on the command line win.
  """
  fields = {f.name for f in dataclasses.fields(experiment.ExperimentConfig)}
  values = {name: FLAGS[name].value for name in fields if name in FLAGS}
  if preset is not None:
    explicit = explicit_flags()
    chosen = preset.shared_config() if row is None else preset.config(row)
    for name in fields:
      if name not in explicit and name != 'output_dir':
        values[name] = getattr(chosen, name)
  values.update(overrides)
  if not values.get('output_dir'):
    values['output_dir'] = (
      f"runs/{values['task']}_{values['method']}_s" f"{values['seed']}"
    )
  return experiment.ExperimentConfig(**values)
