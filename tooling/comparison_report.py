"""A comparison's tables and plot, from its runs' own records.

`summarize` reads each run's `metrics.csv` (checked against its
`results.json`), and `write_report` writes `comparison.md` and
`comparison.csv`, `plot_accuracy` `accuracy.png`:

  final and best test accuracy (mean +- std over seeds), macro-F1, the
  first round reaching a target accuracy, median seconds per round, a DP
  arm's epsilon, the paper's number where a preset gives one, and the
  rounds and settings the runs recorded where the arms differ in them.
"""

import csv
import dataclasses
import json
import os
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from tff_methods import privacy
from tff_methods_tooling import comparison
from tff_methods_tooling import run_directory


def _read_metrics(run_directory: str) -> list[dict]:
  """A run's metrics.csv rows; a ValueError naming the file if it is
  missing, unreadable or holds no evaluated round."""
  path = os.path.join(run_directory, 'metrics.csv')
  try:
    with open(path, newline='') as f:
      rows = list(csv.DictReader(f))
  except (OSError, UnicodeDecodeError, csv.Error) as e:
    raise ValueError(
      f"{path} can't be read ({e}): restore it, or delete the run's "
      'directory to run it again.'
    ) from None
  if not any(row.get('eval/accuracy') for row in rows):
    raise ValueError(
      f"{path} holds no evaluated round: restore it, or delete the run's "
      'directory to run it again.'
    )
  return rows


def _accuracy_curve(rows):
  rounds, accuracy = [], []
  for row in rows:
    value = row.get('eval/accuracy', '')
    if value not in ('', None):
      rounds.append(int(row['round']))
      accuracy.append(float(value))
  return np.asarray(rounds), np.asarray(accuracy)


def _mean_std(values):
  values = np.asarray(values, float)
  return float(np.mean(values)), float(np.std(values))


@dataclasses.dataclass
class MethodSummary:
  method: str
  seeds: int
  final_accuracy: tuple[float, float]
  best_accuracy: tuple[float, float]
  final_macro_f1: tuple[float, float]
  rounds_to_target: Optional[float]
  reached_target: int
  seconds_per_round: float
  # The final figures are the mean of this many last evaluations.
  last_rounds: int = 1
  # A DP arm's client-level epsilon after its last round (metrics.csv's
  # dp/epsilon); None for other arms.
  epsilon: Optional[float] = None
  # The epsilon of all its runs together (they train on the same data, so
  # publishing every seed's model composes); None for other arms.
  epsilon_all_seeds: Optional[float] = None
  # The neighbouring relation its epsilon is for (results.json's).
  adjacency: Optional[str] = None
  # The fewest and the most rounds its runs trained (their own records).
  rounds: tuple[int, int] = (0, 0)


def rounds_run(summaries: Sequence[MethodSummary]) -> str:
  """'N rounds', or 'N-M rounds' when the runs trained different counts."""
  low = min(s.rounds[0] for s in summaries)
  high = max(s.rounds[1] for s in summaries)
  if low == high:
    return f'{low} round' + ('' if low == 1 else 's')
  return f'{low}-{high} rounds'


# Settings every run differs in by construction, or that do not change
# what a run computes.
_NOT_ARM_SETTINGS = frozenset(
  {'method', 'seed', 'output_dir', 'cache_dir', 'data_dir', 'rounds'}
  | set(run_directory.RESUMABLE_KEYS)
)


def arm_settings(
  output_dir: str, labels: Sequence[str], seeds: Sequence[int]
) -> dict[str, dict[str, Any]]:
  """By arm, the settings its runs recorded (experiment.json) in which
  the arms differ: what each arm actually ran with."""
  recorded = {}
  for label in labels:
    path = os.path.join(
      comparison.run_dir(output_dir, label, seeds[0]), 'experiment.json'
    )
    try:
      with open(path) as f:
        recorded[label] = json.load(f)
    except (OSError, ValueError):
      recorded[label] = {}
  names = set().union(*(r.keys() for r in recorded.values())) - (
    _NOT_ARM_SETTINGS
  )
  differing = sorted(
    n
    for n in names
    if len({json.dumps(r.get(n)) for r in recorded.values()}) > 1
  )
  return {
    label: {n: recorded[label].get(n) for n in differing} for label in labels
  }


def _rounds_of_run(run_directory: str, rows: Sequence[Mapping[str, str]]):
  """The rounds a run trained, its metrics.csv checked against its
  results.json (a truncated metrics.csv would misstate its figures)."""
  last = int(rows[-1]['round']) if rows else 0
  if [int(row['round']) for row in rows] != list(range(1, last + 1)):
    raise ValueError(
      f'{os.path.join(run_directory, "metrics.csv")} does not hold rounds '
      f'1-{last} once each (deleted or cut, then the run resumed?): restore '
      "it, or delete the run's directory to run it again."
    )
  path = os.path.join(run_directory, 'results.json')
  if os.path.exists(path):
    with open(path) as f:
      recorded = json.load(f).get('rounds', last)
    if recorded != last:
      raise ValueError(
        f'{os.path.join(run_directory, "metrics.csv")} ends at round {last}, '
        f'but {path} says the run trained {recorded}: metrics.csv is '
        'incomplete. Restore it, or delete the run\'s directory to run it '
        'again.'
      )
  return last


def summarize(
  output_dir: str,
  labels: Sequence[str],
  seeds: Sequence[int],
  target_accuracy: float,
  last_rounds: int = 1,
) -> list[MethodSummary]:
  """One summary per arm (by label) from its runs' metrics.

  Args:
    output_dir: The comparison's directory.
    labels: The arms' labels.
    seeds: The seeds each arm ran with.
    target_accuracy: The accuracy whose first round is reported.
    last_rounds: The final accuracy and macro-F1 are the mean of the last
      `last_rounds` evaluations: a run that oscillates from round to round
      is then judged by its level, not by where its last round fell.
  """
  if last_rounds < 1:
    raise ValueError(f'last_rounds must be >= 1, got {last_rounds}.')
  summaries = []
  for method in labels:
    finals, bests, f1s, to_target, seconds = [], [], [], [], []
    epsilons, trained, evaluations, guarantees = [], [], [], []
    for seed in seeds:
      guarantees.append(
        _guarantee(comparison.run_dir(output_dir, method, seed))
      )
      rows = _read_metrics(comparison.run_dir(output_dir, method, seed))
      trained.append(
        _rounds_of_run(comparison.run_dir(output_dir, method, seed), rows)
      )
      if rows and rows[-1].get('dp/epsilon'):
        epsilons.append(float(rows[-1]['dp/epsilon']))
      rounds, accuracy = _accuracy_curve(rows)
      evaluations.append(len(accuracy))
      finals.append(np.mean(accuracy[-last_rounds:]))
      bests.append(accuracy.max())
      f1 = [float(r['eval/macro_f1']) for r in rows if r.get('eval/macro_f1')]
      # TFF's baseline tasks report their own metrics, without macro-F1.
      f1s.append(float(np.mean(f1[-last_rounds:])) if f1 else float('nan'))
      reached = np.flatnonzero(accuracy >= target_accuracy)
      if reached.size:
        to_target.append(rounds[reached[0]])
      seconds.append(np.median([float(r['seconds']) for r in rows]))
    summaries.append(
      MethodSummary(
        method,
        len(seeds),
        _mean_std(finals),
        _mean_std(bests),
        _mean_std(f1s),
        float(np.mean(to_target)) if len(to_target) == len(seeds) else None,
        len(to_target),
        float(np.median(seconds)),
        min([last_rounds] + evaluations),  # what the mean really took
        float(np.mean(epsilons)) if epsilons else None,
        _composed_epsilon(guarantees),
        _adjacency(guarantees),
        (min(trained), max(trained)),
      )
    )
  return summaries


def _guarantee(run_dir: str) -> Optional[dict]:
  """A run's results.json `dp` (its guarantee's settings), or None."""
  try:
    with open(os.path.join(run_dir, 'results.json')) as f:
      return json.load(f).get('dp')
  except (OSError, ValueError):
    return None


def _composed_epsilon(guarantees: Sequence[Optional[dict]]) -> Optional[float]:
  """The epsilon of publishing every run of an arm, or None where a run is
  not private (or recorded no guarantee this can compose)."""
  if not guarantees or any(
    g is None or g.get('epsilon') is None for g in guarantees
  ):
    return None
  accountant = guarantees[0].get('accountant')
  if accountant not in privacy.ACCOUNTANTS:
    return None  # Recorded before the accountant was saved by name.
  try:
    return privacy.composed_epsilon(
      guarantees, guarantees[0]['delta'], accountant
    )
  except (KeyError, ValueError):
    return None


def _adjacency(guarantees: Sequence[Optional[dict]]) -> Optional[str]:
  relations = {g.get('adjacency') for g in guarantees if g}
  return relations.pop() if len(relations) == 1 else None


def _pm(pair, seeds, scale=100.0):
  if np.isnan(pair[0]):
    return 'n/a'  # Not measured (macro-F1 on TFF's baseline tasks).
  # One seed has no spread: `-`, not a misleading 0.00.
  spread = f'{pair[1] * scale:.2f}' if seeds > 1 else '-'
  return f'{pair[0] * scale:.2f} ± {spread}'


def _relations(summaries: Sequence[MethodSummary]) -> str:
  """' under X adjacency' for the private arms' relations, by arm if they
  differ."""
  private = [s for s in summaries if s.epsilon is not None and s.adjacency]
  relations = {s.adjacency for s in private}
  if len(relations) == 1:
    return f' under {relations.pop()} adjacency'
  return ''.join(f'; {s.method}: {s.adjacency} adjacency' for s in private)


def _epsilons(summary: MethodSummary) -> str:
  """An arm's epsilon per run, and of all its seeds' runs together."""
  cell = _epsilon(summary.epsilon)
  if summary.seeds > 1 and summary.epsilon_all_seeds is not None:
    cell += f' ({summary.epsilon_all_seeds:.2f} for all {summary.seeds})'
  return cell


def _epsilon(epsilon: Optional[float]) -> str:
  if epsilon is None:
    return ''
  return 'none (no noise)' if np.isnan(epsilon) else f'{epsilon:.2f}'


def _paper_figure(reported: Optional[Mapping[str, float]]) -> str:
  if not reported:
    return ''
  text = f'{reported["accuracy"]:.2f}'
  if 'accuracy_std' in reported:
    text += f' ± {reported["accuracy_std"]:.2f}'
  if 'best_accuracy' in reported:
    text = f'{text} (best {reported["best_accuracy"]:.2f})'
  return text


def write_report(
  summaries: Sequence[MethodSummary],
  output_dir: str,
  target_accuracy: float,
  title: str,
  reported: Optional[Mapping[str, Mapping[str, float]]] = None,
  labels: Optional[Mapping[str, str]] = None,
  references: Sequence[Any] = (),
  settings: Optional[Mapping[str, Mapping[str, Any]]] = None,
) -> dict:
  """Writes comparison.md and comparison.csv; returns their paths.

  Args:
    summaries: From `summarize`.
    output_dir: Where to write.
    target_accuracy: The accuracy whose first round is reported.
    title: The table's heading.
    reported: By arm label, the paper's numbers (`presets.Row.reported`,
      in percent); adds a "paper" column.
    labels: By arm label, the name shown (e.g. the paper's row name).
    references: Published rows of methods not run here
      (`presets.Preset.references`): their paper figure, beside the table.
    settings: By arm label, the settings in which the arms differ
      (`arm_settings`), listed under the table.
  """
  os.makedirs(output_dir, exist_ok=True)
  reported = reported or {}
  labels = labels or {}
  ranked = sorted(summaries, key=lambda s: -s.final_accuracy[0])
  target = f'rounds to {target_accuracy:.0%}'
  paper = ' paper final accuracy (%) |' if reported else ''
  private = any(s.epsilon is not None for s in summaries)
  dp = ' DP epsilon |' if private else ''
  lines = [
    f'# {title}',
    '',
    f'| method | final accuracy (%) | best accuracy (%) | macro-F1 (%) '
    f'| {target} | s/round |{dp}{paper}',
    '|---|---|---|---|---|---|'
    + ('---|' if private else '')
    + ('---|' if reported else ''),
  ]
  for s in ranked:
    rounds = (
      f'{s.rounds_to_target:.1f}'
      if s.rounds_to_target is not None
      else f'not reached ({s.reached_target}/{s.seeds} seeds)'
    )
    name = labels.get(s.method, s.method)
    lines.append(
      f'| {name} | {_pm(s.final_accuracy, s.seeds)} | '
      f'{_pm(s.best_accuracy, s.seeds)} | '
      f'{_pm(s.final_macro_f1, s.seeds)} | '
      f'{rounds} | {s.seconds_per_round:.2f} |'
      + (f' {_epsilons(s)} |' if private else '')
      + (f' {_paper_figure(reported.get(s.method))} |' if reported else '')
    )
  for row in references:
    lines.append(
      f'| {row.label} (paper only, not run here) | | | | | |'
      + (' |' if private else '')
      + f' {_paper_figure(row.reported)} |'
    )
  last = ranked[0].last_rounds
  when = (
    'after the last round'
    if last == 1
    else f"(final: the mean of the last {last} rounds' evaluations)"
  )
  if (
    len({s.rounds for s in ranked}) > 1
    or ranked[0].rounds[0] != (ranked[0].rounds[1])
  ):
    lines += [
      '',
      'Rounds trained differ: '
      + ', '.join(
        f'{labels.get(s.method, s.method)} '
        + '-'.join(str(r) for r in sorted(set(s.rounds)))
        for s in ranked
      )
      + '.',
    ]
  differing = [
    f'{labels.get(s.method, s.method)} '
    + ', '.join(f'{k}={v}' for k, v in settings[s.method].items())
    for s in ranked
    if settings and settings.get(s.method)
  ]
  if differing:
    lines += ['', 'Settings in which the arms differ: ' + '; '.join(differing)]
  lines += [
    '',
    f'Mean ± std over {ranked[0].seeds} seed(s); accuracy and '
    f'macro-F1 on the central test set {when}.'
    + (
      ' DP epsilon: client-level'
      + _relations(summaries)
      + ", after the last round, at the delta of each run's results.json: "
      "one run's, and in brackets all the arm's "
      'runs together (they train on the same data: publishing every '
      "seed's model composes their guarantees)."
      if private
      else ''
    ),
  ]
  md_path = os.path.join(output_dir, 'comparison.md')
  with open(md_path, 'w') as f:
    f.write('\n'.join(lines) + '\n')
  csv_path = os.path.join(output_dir, 'comparison.csv')
  with open(csv_path, 'w', newline='') as f:
    writer = csv.writer(f)
    writer.writerow(
      [
        'method',
        'seeds',
        'final_accuracy_mean',
        'final_accuracy_std',
        'best_accuracy_mean',
        'best_accuracy_std',
        'final_macro_f1_mean',
        'final_macro_f1_std',
        'rounds_to_target',
        'seconds_per_round',
        'paper_accuracy',
        'dp_epsilon',
        'dp_epsilon_all_seeds',
      ]
    )
    for s in ranked:
      writer.writerow(
        [
          s.method,
          s.seeds,
          *s.final_accuracy,
          *s.best_accuracy,
          *s.final_macro_f1,
          '' if s.rounds_to_target is None else s.rounds_to_target,
          s.seconds_per_round,
          reported.get(s.method, {}).get('accuracy', ''),
          '' if s.epsilon is None else s.epsilon,
          '' if s.epsilon_all_seeds is None else s.epsilon_all_seeds,
        ]
      )
  return dict(markdown=md_path, csv=csv_path)


def plot_accuracy(
  output_dir: str, methods: Sequence[str], seeds: Sequence[int], title: str
) -> str:
  """Test accuracy against round: the mean over seeds, the std shaded."""
  import matplotlib

  matplotlib.use('Agg')
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(7, 4.5))
  styles = ['-', '--', ':', '-.']
  for i, method in enumerate(methods):
    curves = [
      _accuracy_curve(_read_metrics(comparison.run_dir(output_dir, method, s)))
      for s in seeds
    ]
    length = min(len(c[1]) for c in curves)
    values = np.asarray([c[1][:length] for c in curves]) * 100
    mean, std = values.mean(axis=0), values.std(axis=0)
    rounds = curves[0][0][:length]
    color = plt.cm.tab10(i % 10)
    ax.plot(
      rounds, mean, label=method, color=color, linestyle=styles[(i // 10) % 4]
    )
    if len(curves) > 1:
      ax.fill_between(
        rounds, mean - std, mean + std, color=color, alpha=0.15, linewidth=0
      )
  ax.set_xlabel('round')
  ax.set_ylabel('test accuracy (%)')
  ax.set_title(title)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7, ncol=2)
  fig.tight_layout()
  path = os.path.join(output_dir, 'accuracy.png')
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path
