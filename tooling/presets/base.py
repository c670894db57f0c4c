"""The preset types: a paper's table column (`Preset`) and its rows (`Row`).

Each paper's module (`fedcka`, `fedmax`, `fedcos`, `fed2`) lists its presets
with `add`; `tff_methods_tooling.presets` collects them.
"""

import dataclasses
from typing import Any, Mapping, Optional, Sequence

from tff_methods_tooling import experiment


@dataclasses.dataclass(frozen=True)
class Row:
  """One method of a table.

  Attributes:
    key: Short name, unique in its preset (used for `--method` with a
      preset, and as its run directory).
    label: The row's name in the paper, e.g. 'FedProx(0.1)+FedCos(0.02)'.
    method: The method it runs (`tff_methods.algorithms.methods` name).
    settings: `ExperimentConfig` fields of this row only.
    reported: The paper's numbers, in percent: `accuracy` (final), and
      where given `accuracy_std`, `best_accuracy`, `seconds_per_round`.
    note: Why `reported` is empty, when it is (by default, the row is a
      point of a figure).
  """

  key: str
  label: str
  method: str
  settings: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  reported: Mapping[str, float] = dataclasses.field(default_factory=dict)
  note: str = 'not given (a figure)'


@dataclasses.dataclass(frozen=True)
class Preset:
  """One column of a paper's table: shared settings and its rows.

  Attributes:
    name: The preset's name (`--preset=NAME`).
    paper: Which paper.
    table: Which table and column.
    settings: `ExperimentConfig` fields shared by every row.
    rows: The methods of the table.
    main: The key of the paper's own method (`train.py`'s default row).
    notes: Settings the paper leaves out, or that differ here, and why.
    references: Published numbers of methods the project does not
      implement (e.g. FedMA beside Fed2), shown beside the table's rows and
      never run (their `method` is empty).
  """

  name: str
  paper: str
  table: str
  settings: Mapping[str, Any]
  rows: tuple[Row, ...]
  main: str
  notes: tuple[str, ...] = ()
  references: tuple[Row, ...] = ()

  def row(self, key: Optional[str] = None) -> Row:
    """The row `key` (or `main`); raises naming the preset's rows."""
    key = self.main if key is None else key
    for row in self.rows:
      if row.key == key:
        return row
    raise ValueError(
      f'Preset {self.name!r} has no row {key!r}; choose one '
      f'of {", ".join(r.key for r in self.rows)}.'
    )

  def shared_config(self, **overrides) -> experiment.ExperimentConfig:
    """The settings every row shares (no row's own), `overrides` last."""
    values = dict(self.settings, method=self.row().method)
    values.update(overrides)
    return experiment.ExperimentConfig(**values)

  def config(
    self, key: Optional[str] = None, **overrides
  ) -> experiment.ExperimentConfig:
    """The `ExperimentConfig` of row `key`, with `overrides` applied last."""
    row = self.row(key)
    values = dict(self.settings)
    values.update(row.settings)
    values['method'] = row.method
    values.setdefault('output_dir', f'runs/{self.name}/{row.key}')
    values.update(overrides)
    return experiment.ExperimentConfig(**values)


def rows(
  table: Sequence[tuple],
  columns: Sequence[str],
  column: int,
  std: Optional[Sequence[tuple]] = None,
) -> tuple[Row, ...]:
  """Rows for one column of a table given as (key, label, method, settings,
  value per column) tuples; `std` the same with standard deviations."""
  rows = []
  for i, (key, label, method, settings, *values) in enumerate(table):
    assert len(values) == len(columns), (key, values, columns)
    value = values[column]
    reported = dict(value) if isinstance(value, dict) else {'accuracy': value}
    if std is not None:
      reported['accuracy_std'] = std[i][column]
    rows.append(Row(key, label, method, settings, reported))
  return tuple(rows)


def add(presets: list[Preset], preset: Preset) -> None:
  """Appends `preset` to a paper's list, checking its main row exists."""
  preset.row()
  presets.append(preset)


def _format_reported(row: Row) -> str:
  reported = row.reported
  if not reported:
    return row.note
  parts = []
  if 'best_accuracy' in reported:
    parts.append(f'best {reported["best_accuracy"]:.2f}')
  text = f'{reported["accuracy"]:.2f}'
  if 'accuracy_std' in reported:
    text += f' ± {reported["accuracy_std"]:.2f}'
  parts.append(('last ' if 'best_accuracy' in reported else '') + text)
  if 'seconds_per_round' in reported:
    parts.append(f'{reported["seconds_per_round"]:.2f} s/round')
  return ', '.join(parts)


def describe(preset: Preset, settings: bool = False) -> str:
  """The preset as text: its table, rows with the paper's numbers, notes."""
  lines = [f'{preset.name}: {preset.paper}, {preset.table}']
  width = max(len(r.key) for r in preset.rows)
  for row in preset.rows:
    mark = '*' if row.key == preset.main else ' '
    lines.append(
      f'  {mark} {row.key:<{width}}  {row.label:<28} paper: '
      f'{_format_reported(row)}'
    )
  for row in preset.references:
    lines.append(
      f'    {row.key:<{width}}  {row.label:<28} paper: '
      f'{_format_reported(row)} (reference: not run '
      'here)'
    )
  if settings:
    lines.append(
      '  settings: '
      + ' '.join(f'--{k}={v}' for k, v in preset.settings.items())
    )
    for row in preset.rows:
      if row.settings:
        lines.append(
          f'    {row.key}: --method={row.method} '
          + ' '.join(f'--{k}={v}' for k, v in row.settings.items())
        )
    for note in preset.notes:
      lines.append(f'  note: {note}')
  return '\n'.join(lines)
