r"""Compares federated methods on one task, with several seeds.

  python -m binaries.compare --methods=fedavg,fedprox,moon,fedcka \
      --seeds=0,1 --task=digits --rounds=20 --output_dir=runs/compare

Every method runs with the same settings (the experiment flags of
`train.py`), each (method, seed) in `<output_dir>/<method>/seed<seed>`; a
rerun skips finished runs and resumes unfinished ones. Writes
`comparison.md`, `comparison.csv` and `accuracy.png` to `--output_dir`.
The logic lives in `tff_methods.comparison`.
"""

import sys

from absl import app
from absl import flags

from tff_methods import runtime

# Before TensorFlow is first imported (by the modules below).
runtime.quiet(runtime.verbosity_from_argv(sys.argv))

# pylint: disable=g-import-not-at-top,g-bad-import-order
from binaries import experiment_flags
from tff_methods import comparison
from tff_methods import methods
# pylint: enable=g-import-not-at-top,g-bad-import-order

flags.DEFINE_list('methods', list(methods.SINGLE_METHODS),
                  'Methods to compare (default: every single method; add '
                  'combinations such as fedprox+fedcos by name).')
flags.DEFINE_list('seeds', ['0'], 'Seeds; each method runs once per seed.')
flags.DEFINE_float('target_accuracy', 0.8,
                   'The table reports the first round reaching this.')
flags.DEFINE_bool('progress', True, 'Show a progress bar per run.')
FLAGS = flags.FLAGS


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  runtime.quiet(FLAGS.verbosity)
  output_dir = FLAGS.output_dir or f'runs/compare_{FLAGS.task}'
  try:
    seeds = [int(s) for s in FLAGS.seeds]
  except ValueError:
    return experiment_flags.usage_error(
        f'--seeds={",".join(FLAGS.seeds)} must be integers.')
  if not 0 < FLAGS.target_accuracy <= 1:
    return experiment_flags.usage_error(
        f'--target_accuracy={FLAGS.target_accuracy} must be in (0, 1].')
  base = experiment_flags.config_from_flags(output_dir=output_dir)
  try:
    configs = comparison.plan(base, FLAGS.methods, seeds, output_dir)
  except ValueError as e:
    return experiment_flags.usage_error(str(e))
  runtime.set_local_execution_context(FLAGS.max_concurrent_clients)
  comparison.run_comparison(
      configs, progress=FLAGS.progress,
      on_run=lambda label: print(f'== {label}', flush=True))
  title = (f'{FLAGS.task}, {FLAGS.partition} partition, '
           f'{FLAGS.num_clients} clients, {FLAGS.rounds} rounds')
  summaries = comparison.summarize(output_dir, FLAGS.methods, seeds,
                                   FLAGS.target_accuracy)
  paths = comparison.write_report(summaries, output_dir,
                                  FLAGS.target_accuracy, title)
  comparison.plot_accuracy(output_dir, FLAGS.methods, seeds, title)
  with open(paths['markdown']) as f:
    print(f.read())
  print(f'Written to {output_dir}: comparison.md, comparison.csv, '
        'accuracy.png')
  return 0


if __name__ == '__main__':
  app.run(main)
