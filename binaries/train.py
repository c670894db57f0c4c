r"""Trains one federated method on one task.

As installed (`make setup` puts the commands in .venv/bin; in a checkout,
`python -m binaries.train` from the root is the same):

  tff-methods-train --method=fedprox --mu=0.01 --task=digits \
      --partition=dirichlet --alpha=0.5 --num_clients=10 --rounds=20 \
      --output_dir=runs/digits_fedprox

Or one row of a paper's experiment (`tff-methods-presets` lists
them; the paper's own method unless `--method` names another row):

  tff-methods-train --preset=fedcka_table1_cifar10 --method=moon

Rerunning with the same flags resumes from the last saved round; a larger
`--rounds` extends a finished run. Every flag is checked before any work starts.
The logic lives in `tff_methods_tooling.experiment`.
"""

import sys

from absl import app
from absl import flags

from tff_methods_binaries import binary_main
from tff_methods_tooling import process_setup

# Before TensorFlow is first imported (by the modules below).
process_setup.configure_process(process_setup.verbosity_from_argv(sys.argv))
process_setup.import_method_modules(sys.argv)

from tff_methods_binaries import expected_errors
from tff_methods_binaries import experiment_flags
from tff_methods_binaries import runtime_flags
from tff_methods_tooling import comparison
from tff_methods_tooling import experiment
from tff_methods_tooling import presets

flags.DEFINE_bool('progress', True, 'Show a progress bar.')
# --verbosity is absl's own flag: 1 or more shows TensorFlow/TFF logs.
FLAGS = flags.FLAGS


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  process_setup.quiet(FLAGS.verbosity)
  error = runtime_flags.prepare_devices()  # Before TensorFlow runs an op.
  if error:
    return expected_errors.usage_error(error)
  try:
    if FLAGS.preset:
      preset = presets.get(FLAGS.preset)
      row = preset.row(FLAGS.method if FLAGS['method'].present else None)
      # A preset's runs sit where `compare --preset` looks for them.
      config = experiment_flags.config_from_flags(
        preset,
        row.key,
        method=row.method,
        output_dir=FLAGS.output_dir
        or comparison.run_dir(f'runs/{preset.name}', row.key, FLAGS.seed),
      )
    else:
      config = experiment_flags.config_from_flags()
    experiment.validate(config)
  except ValueError as e:
    return expected_errors.usage_error(str(e))
  error = runtime_flags.start(experiment.model_parameters(config))
  if error:
    return expected_errors.usage_error(error)
  try:
    results = experiment.run(config, progress=FLAGS.progress)
  except ValueError as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  evals = results['final_eval']
  split = 'validation' if config.validation_fraction else 'test'
  rejected = (
    f" ({results['rejected_rounds']} of {results['rounds']} "
    'rounds rejected as non-finite: the model is the one before '
    'them)'
    if results['rejected_rounds']
    else ''
  )
  print(
    f"{config.method} on {config.task}: round {results['rounds']}"
    f'{rejected}, '
    f"{split} accuracy {evals.get('accuracy', float('nan')):.4f}, "
    + (f"macro-F1 {evals['macro_f1']:.4f}, " if 'macro_f1' in evals else '')
    + (
      f"{results['seconds_per_round']:.2f} s/round; "
      if results['seconds_per_round'] is not None
      else ''
    )
    + f'results in {config.output_dir}'
  )
  dp = results.get('dp')
  if dp is not None:
    print(
      'client-level DP: '
      + (
        f"(epsilon, delta) = ({dp['epsilon']:.2f}, {dp['delta']:.2g})"
        if dp['epsilon'] is not None
        else 'no guarantee (no noise)'
      )
      + f" over {dp['rounds']} rounds of {dp['clients_per_round']} of "
      f"{dp['num_clients']} clients"
      + (
        ' drawn without replacement'
        if dp['sampling'] == 'without_replacement'
        else ' expected, Poisson-sampled'
      )
      + f", noise multiplier {dp['noise_multiplier']:.4g}"
      + (
        f" (calibrated for epsilon {dp['target_epsilon']:g})"
        if 'target_epsilon' in dp
        else ''
      )
      + f" ({dp['accountant']}, {dp['adjacency']} adjacency); cohorts "
      + dp['cohorts']
    )
  return 0


def run():
  """The `tff-methods-train` command."""
  binary_main.run(expected_errors.one_line_errors(main), __name__)


if __name__ == '__main__':
  run()
