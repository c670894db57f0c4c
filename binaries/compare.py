r"""Compares federated methods on one task, with several seeds.

  tff-methods-compare --methods=fedavg,fedprox,moon,fedcka \
      --seeds=0,1 --task=digits --rounds=20 --output_dir=runs/compare

Every method runs with the same settings (the experiment flags of
`train.py`), each (method, seed) in `<output_dir>/<method>/seed<seed>`; a
rerun skips finished runs and resumes unfinished ones. Writes
`comparison.md`, `comparison.csv` and `accuracy.png` to `--output_dir`.

A paper's table in one command (`tff-methods-presets` lists them):

  tff-methods-compare --preset=fedcos_table1_totally --seeds=0,1,2

runs every row of the table with the paper's settings (flags given on the
command line still win, e.g. `--rounds=5` for a trial) to `runs/<preset>/`, and
the table gets the paper's number beside each row; `--methods` then picks rows
by key. The logic lives in `tff_methods_tooling.comparison` and
`tff_methods_tooling.presets`.
"""

import sys

from absl import app
from absl import flags

from tff_methods_binaries import binary_main
from tff_methods_tooling import process_setup

# Before TensorFlow is first imported (by the modules below).
process_setup.configure_process(process_setup.verbosity_from_argv(sys.argv))
process_setup.import_method_modules(sys.argv)

from tff_methods.algorithms import methods
from tff_methods_binaries import expected_errors
from tff_methods_binaries import experiment_flags
from tff_methods_binaries import runtime_flags
from tff_methods_tooling import comparison
from tff_methods_tooling import comparison_report
from tff_methods_tooling import presets
from tff_methods_tooling import tuning

flags.DEFINE_list(
  'methods',
  [m for m in methods.SINGLE_METHODS if m not in methods.TFF_ALGORITHMS],
  "Methods to compare (default: every single method but TFF's own "
  'tff_fedavg, tff_fedavgm, tff_fedadam, tff_fedyogi, which train as '
  'fedavg, fedavgm, fedadam, fedyogi do; add '
  'combinations such as fedprox+fedcos by name). '
  "METHOD@AGGREGATOR runs a method under one of TFF's "
  'aggregators (fedcka@dp beside fedcka; see --aggregator).',
)
flags.DEFINE_list('seeds', ['0'], 'Seeds; each method runs once per seed.')
flags.DEFINE_float(
  'target_accuracy', 0.8, 'The table reports the first round reaching this.'
)
flags.DEFINE_string(
  'settings_from',
  None,
  "A tune run's tuning.json: each "
  'method runs with the learning rates chosen for it '
  '(binaries/tune.py).',
)
flags.DEFINE_bool(
  'reference_rows',
  False,
  'Add two reference rows: '
  'centralized (FedAvg on one client holding all the '
  'training data: the same number of passes, pooled) and '
  'fedavg_iid (FedAvg on an IID partition).',
)
flags.DEFINE_bool('progress', True, 'Show a progress bar per run.')
experiment_flags.define_last_rounds_flag()
runtime_flags.define_jobs_flag()
FLAGS = flags.FLAGS


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  process_setup.quiet(FLAGS.verbosity)
  error = runtime_flags.prepare_devices()  # Before TensorFlow runs an op.
  if error:
    return expected_errors.usage_error(error)
  try:
    seeds = experiment_flags.numbers('seeds')
  except ValueError as e:
    return expected_errors.usage_error(str(e))
  if FLAGS.last_rounds < 1:
    return expected_errors.usage_error(
      f'--last_rounds={FLAGS.last_rounds} must be >= 1.'
    )
  if not 0 < FLAGS.target_accuracy <= 1:
    return expected_errors.usage_error(
      f'--target_accuracy={FLAGS.target_accuracy} must be in (0, 1].'
    )
  reported = labels = None
  references = ()
  try:
    if FLAGS.preset:
      preset = presets.get(FLAGS.preset)
      output_dir = FLAGS.output_dir or f'runs/{preset.name}'
      rows = [
        preset.row(key)
        for key in (
          FLAGS.methods
          if FLAGS['methods'].present
          else [r.key for r in preset.rows]
        )
      ]
      # A row's own settings apply unless the command line sets them.
      explicit = experiment_flags.explicit_flags()
      arms = [
        comparison.Arm(
          row.key,
          row.method,
          {k: v for k, v in row.settings.items() if k not in explicit},
        )
        for row in rows
      ]
      reported = {row.key: row.reported for row in rows}
      labels = {row.key: row.label for row in rows}
      references = preset.references
      base = experiment_flags.config_from_flags(preset, output_dir=output_dir)
      title = f'{preset.paper}: {preset.table}'
    else:
      output_dir = FLAGS.output_dir or f'runs/compare_{FLAGS.task}'
      tuned = (
        tuning.read_settings(FLAGS.settings_from)
        if FLAGS.settings_from
        else None
      )
      arms = comparison.arms(FLAGS.methods, tuned, FLAGS.reference_rows)
      base = experiment_flags.config_from_flags(output_dir=output_dir)
      title = base.data_description()
    configs = comparison.plan(base, arms, seeds, output_dir)
  except ValueError as e:
    return expected_errors.usage_error(str(e))
  error = runtime_flags.start_for_runs()
  if error:
    return expected_errors.usage_error(error)
  try:
    comparison.run_comparison(
      configs,
      progress=FLAGS.progress,
      on_run=lambda label: print(f'== {label}', flush=True),
      jobs=FLAGS.jobs,
      max_concurrent_clients=FLAGS.max_concurrent_clients,
    )
  except ValueError as e:  # A run refused (locked, finished, or changed).
    print(f'error: {e}', file=sys.stderr)
    return 2
  arm_labels = [comparison.as_arm(a).label for a in arms]
  try:
    summaries = comparison_report.summarize(
      output_dir, arm_labels, seeds, FLAGS.target_accuracy, FLAGS.last_rounds
    )
  except ValueError as e:  # A run's records disagree.
    print(f'error: {e}', file=sys.stderr)
    return 2
  if not FLAGS.preset:  # The rounds the runs trained, from their records.
    title = f'{title}, {comparison_report.rounds_run(summaries)}'
  paths = comparison_report.write_report(
    summaries,
    output_dir,
    FLAGS.target_accuracy,
    title,
    reported,
    labels,
    references,
    comparison_report.arm_settings(output_dir, arm_labels, seeds),
  )
  comparison_report.plot_accuracy(output_dir, arm_labels, seeds, title)
  with open(paths['markdown']) as f:
    print(f.read())
  print(
    f'Written to {output_dir}: comparison.md, comparison.csv, ' 'accuracy.png'
  )
  return 0


def run():
  """The `tff-methods-compare` command."""
  binary_main.run(expected_errors.one_line_errors(main), __name__)


if __name__ == '__main__':
  run()
