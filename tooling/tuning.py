"""Fair settings for a comparison: each method's learning rates by grid search.

Every method gets the learning rates that serve it best, chosen on data held out
from the training set (`ExperimentConfig.validation_fraction`), never on the
test set: the client learning rate over a grid, and for methods with a server
optimizer other than plain averaging (FedAvgM, FedAdam, FedYogi, and their
combinations) the server learning rate over a second grid. Each (method, grid
point, seed) is one run of `tff_methods_tooling.comparison`, so a search resumes
where it stopped and a finished one is read back. The choice is the grid point
with the best final validation accuracy, averaged over the tuning seeds (the
lower learning rate on a tie).

A plain grid, not TFF's `train_model_with_vizier`: the spaces here are one
or two discrete learning rates with a handful of values each, which an
exhaustive grid covers in the same number of runs a Bayesian search would
spend, deterministically and resumably, with no study service to run.

`plan` lays out the runs; `choose` reads them back and picks; `write_report`
writes `tuning.json` (the choice, which `binaries/compare.py
--settings_from` reads), `tuning.md` and one validation-curve figure per
method.
"""

import dataclasses
import json
import os
from typing import Any, Mapping, Optional, Sequence

from tff_methods.algorithms import methods as methods_lib
from tff_methods_tooling import comparison
from tff_methods_tooling import comparison_report
from tff_methods_tooling import experiment
from tff_methods_tooling import experiment_config

VALIDATION_FRACTION = 0.2


def tunes_server_learning_rate(method: str) -> bool:
  """Whether a component brings a server rule with a learning rate to tune
  (FedAvgM's, FedAdam's, FedYogi's; plain averaging keeps 1)."""
  return any(
    methods_lib.REGISTRY[p].server_optimizer not in (None, 'sgd')
    for p in methods_lib.parse_method(method)
  )


@dataclasses.dataclass(frozen=True)
class GridPoint:
  """One setting of a row's learning rates, as a comparison arm.

  `method` is the row's name: a method, or a reference row of
  `comparison.REFERENCE_ROWS` (trained as FedAvg with the row's settings).
  """

  method: str
  client_learning_rate: float
  server_learning_rate: float = None

  @property
  def label(self) -> str:
    label = f'{self.method}/clr{self.client_learning_rate:g}'
    if self.server_learning_rate is not None:
      label += f'_slr{self.server_learning_rate:g}'
    return label

  def settings(self) -> dict[str, float]:
    chosen = dict(client_learning_rate=self.client_learning_rate)
    if self.server_learning_rate is not None:
      chosen['server_learning_rate'] = self.server_learning_rate
    return chosen

  def arm(self) -> comparison.Arm:
    if self.method in comparison.REFERENCE_ROWS:
      return comparison.Arm(
        self.label,
        'fedavg',
        dict(comparison.REFERENCE_ROWS[self.method], **self.settings()),
      )
    return comparison.Arm(self.label, self.method, self.settings())


def grid(
  methods: Sequence[str],
  client_learning_rates: Sequence[float],
  server_learning_rates: Sequence[float],
) -> list[GridPoint]:
  """Every row's grid points, in order (reference rows by their names)."""
  if not client_learning_rates:
    raise ValueError('--client_learning_rates is empty: name at least one.')
  points = []
  for method in methods:
    server = (
      server_learning_rates
      if method not in comparison.REFERENCE_ROWS
      and tunes_server_learning_rate(method)
      else [None]
    )
    if not server:
      raise ValueError(
        f'{method} tunes its server learning rate: '
        '--server_learning_rates is empty.'
      )
    for client_lr in client_learning_rates:
      for server_lr in server:
        points.append(GridPoint(method, client_lr, server_lr))
  return points


def plan(
  base: experiment.ExperimentConfig,
  points: Sequence[GridPoint],
  seeds: Sequence[int],
  output_dir: str,
) -> list[experiment.ExperimentConfig]:
  """The runs of the search, evaluated on held-out training data.

  Raises:
    ValueError: naming every bad setting, before any run starts.
  """
  if not base.validation_fraction:
    base = dataclasses.replace(base, validation_fraction=VALIDATION_FRACTION)
  return comparison.plan(base, [p.arm() for p in points], seeds, output_dir)


def choose(
  output_dir: str,
  points: Sequence[GridPoint],
  seeds: Sequence[int],
  last_rounds: int = 1,
  shared_settings: Optional[Mapping[str, Any]] = None,
) -> dict[str, dict[str, Any]]:
  """By method: its best grid point's settings and validation accuracy.

  The accuracy is the final one, averaged over the last `last_rounds`
  evaluations (`comparison_report.summarize`): with more than one, a
  setting that oscillates from round to round loses to a steady one.
  `shared_settings` (e.g. the client momentum every run of the search
  used) are recorded with each choice, so that `compare --settings_from`
  trains as the search did even where a comparison's own flags differ.
  """
  summaries = {
    s.method: s
    for s in comparison_report.summarize(
      output_dir,
      [p.label for p in points],
      seeds,
      target_accuracy=1.0,
      last_rounds=last_rounds,
    )
  }
  chosen = {}
  for point in points:
    accuracy = summaries[point.label].final_accuracy[0]
    best = chosen.get(point.method)
    if best is None or accuracy > best['validation_accuracy']:
      chosen[point.method] = dict(
        shared_settings or {}, **point.settings(), validation_accuracy=accuracy
      )
  return chosen


def write_report(
  output_dir: str,
  points: Sequence[GridPoint],
  seeds: Sequence[int],
  chosen: Mapping[str, Mapping[str, Any]],
  title: str,
  last_rounds: int = 1,
) -> dict[str, str]:
  """tuning.json, tuning.md and `validation_<method>.png`; their paths.

  The table's heading is `title`, then the rounds the runs trained, from
  their own records.
  """
  os.makedirs(output_dir, exist_ok=True)
  paths = dict(
    json=os.path.join(output_dir, 'tuning.json'),
    markdown=os.path.join(output_dir, 'tuning.md'),
  )
  with open(paths['json'], 'w') as f:
    json.dump(dict(chosen), f, indent=2, sort_keys=True)
  summaries = {
    s.method: s
    for s in comparison_report.summarize(
      output_dir,
      [p.label for p in points],
      seeds,
      target_accuracy=1.0,
      last_rounds=last_rounds,
    )
  }
  final = (
    'Final validation accuracy'
    if last_rounds == 1
    else f'Validation accuracy over the last {last_rounds} rounds'
  )
  lines = [
    f'# {title}, {comparison_report.rounds_run(list(summaries.values()))}: '
    'learning rates on held-out data',
    '',
    f'{final} (%), mean over seeds '
    f'{", ".join(map(str, seeds))}; chosen settings in bold.',
    '',
    '| method | client lr | server lr | validation accuracy (%) |',
    '|---|---|---|---|',
  ]
  for point in points:
    accuracy = summaries[point.label].final_accuracy[0] * 100
    best = chosen[point.method]
    mark = (
      '**' if all(best.get(k) == v for k, v in point.settings().items()) else ''
    )
    server = (
      ''
      if point.server_learning_rate is None
      else f'{mark}{point.server_learning_rate:g}{mark}'
    )
    lines.append(
      f'| {point.method} | {mark}{point.client_learning_rate:g}'
      f'{mark} | {server} | {accuracy:.2f} |'
    )
  with open(paths['markdown'], 'w') as f:
    f.write('\n'.join(lines) + '\n')
  for method in dict.fromkeys(p.method for p in points):
    labels = [p.label for p in points if p.method == method]
    figure = comparison_report.plot_accuracy(
      output_dir, labels, seeds, f'{method}: validation accuracy'
    )
    name = method.replace('+', '_plus_')
    paths[f'curves_{method}'] = os.path.join(
      output_dir, f'validation_{name}.png'
    )
    os.replace(figure, paths[f'curves_{method}'])
  return paths


def read_settings(path: str) -> dict[str, dict[str, Any]]:
  """A tuning.json: by method, the settings it was given (no accuracy).

  Raises:
    ValueError: naming the file (`--settings_from`) and what is wrong with
      it: missing, unreadable, not JSON, or not {method: {setting: value}}.
  """
  try:
    with open(path) as f:
      chosen = json.load(f)
  except OSError as e:
    raise ValueError(f'--settings_from={path}: {e.strerror or e}.') from None
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise ValueError(
      f'--settings_from={path} is not JSON ({e}); give a '
      "tune run's tuning.json."
    ) from None
  if not isinstance(chosen, dict) or not all(
    isinstance(settings, dict) for settings in chosen.values()
  ):
    raise ValueError(
      f"--settings_from={path} is not a tune run's "
      'tuning.json ({method: {setting: value}}).'
    )
  settings_by_method = {
    method: {
      experiment_config.RENAMED_SETTINGS.get(k, k): v
      for k, v in settings.items()
      if k != 'validation_accuracy'
    }
    for method, settings in chosen.items()
  }
  defaults = {
    f.name: f.default for f in dataclasses.fields(experiment.ExperimentConfig)
  }
  bad = [
    f'{method}: {name}={value!r} ({why})'
    for method, settings in settings_by_method.items()
    for name, value in settings.items()
    if (why := _setting_problem(name, value, defaults))
  ]
  if bad:
    raise ValueError(
      f'--settings_from={path} holds settings no run takes: '
      + '; '.join(bad)
      + '.'
    )
  return settings_by_method


def _setting_problem(name, value, defaults) -> Optional[str]:
  """Why `value` can't be the experiment setting `name`, or None."""
  if name not in defaults:
    return 'not a setting'
  default = defaults[name]
  number = isinstance(value, (int, float)) and not isinstance(value, bool)
  if isinstance(default, bool):
    ok = isinstance(value, bool)
  elif isinstance(default, float):
    ok = number
  elif isinstance(default, int):
    ok = number and float(value).is_integer()
  elif isinstance(default, str):
    ok = isinstance(value, str)
  else:  # None by default: a number or a name
    ok = value is None or number or isinstance(value, str)
  return None if ok else f'expected a value like {default!r}'
