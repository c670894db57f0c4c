r"""Chooses each method's learning rates on held-out training data.

  tff-methods-tune --methods=fedavg,fedadam,moon --task=digits \
      --client_learning_rates=0.01,0.03,0.1 \
      --server_learning_rates=0.003,0.01,0.03 --output_dir=runs/tune

Every method runs with the experiment flags of `train.py` at each grid point
(the server grid only for FedAvgM/FedAdam/FedYogi and their combinations),
evaluated on `--validation_fraction` of the training data (0.2 unless given),
never on the test set. Each run lives in `<output_dir>/<method>/<grid
point>/seed<seed>`; a rerun skips finished runs and resumes unfinished ones.
Writes `tuning.json` (the choice per method, for `compare.py --settings_from`),
`tuning.md` and one `validation_<method>.png` per method. The logic lives in
`tff_methods_tooling.tuning`.
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
from tff_methods_tooling import tuning

flags.DEFINE_list(
  'methods',
  [m for m in methods.SINGLE_METHODS if m not in methods.TFF_ALGORITHMS],
  "Methods to tune (default: every single method but TFF's own "
  'tff_fedavg, tff_fedavgm, tff_fedadam, tff_fedyogi).',
)
flags.DEFINE_list('seeds', ['0'], 'Seeds; the choice averages over them.')
flags.DEFINE_list(
  'client_learning_rates',
  ['0.01', '0.03', '0.1', '0.3'],
  'The client learning rates tried.',
)
flags.DEFINE_list(
  'server_learning_rates',
  ['0.01', '0.03', '0.1', '0.3', '1.0'],
  'The server learning rates tried (FedAvgM, FedAdam, '
  'FedYogi and their combinations).',
)
flags.DEFINE_bool(
  'reference_rows',
  False,
  'Tune the reference rows of '
  'compare.py --reference_rows too (centralized, '
  'fedavg_iid).',
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
  output_dir = FLAGS.output_dir or f'runs/tune_{FLAGS.task}'
  try:
    if FLAGS.last_rounds < 1:
      raise ValueError(f'--last_rounds={FLAGS.last_rounds} must be >= 1.')
    seeds = experiment_flags.numbers('seeds')
    rows = list(FLAGS.methods) + (
      list(comparison.REFERENCE_ROWS) if FLAGS.reference_rows else []
    )
    points = tuning.grid(
      rows,
      experiment_flags.numbers('client_learning_rates', float),
      experiment_flags.numbers('server_learning_rates', float),
    )
    base = experiment_flags.config_from_flags(output_dir=output_dir)
    configs = tuning.plan(base, points, seeds, output_dir)
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
  try:
    chosen = tuning.choose(
      output_dir,
      points,
      seeds,
      FLAGS.last_rounds,
      dict(client_momentum=FLAGS.client_momentum),
    )
    paths = tuning.write_report(
      output_dir,
      points,
      seeds,
      chosen,
      base.data_description(),
      FLAGS.last_rounds,
    )
  except ValueError as e:  # A run's records are unreadable or disagree.
    print(f'error: {e}', file=sys.stderr)
    return 2
  with open(paths['markdown']) as f:
    print(f.read())
  print(
    f'Written to {output_dir}: tuning.json, tuning.md, '
    'validation_<method>.png'
  )
  return 0


def run():
  """The `tff-methods-tune` command."""
  binary_main.run(expected_errors.one_line_errors(main), __name__)


if __name__ == '__main__':
  run()
