r"""Draws the papers' analysis figures from a fresh short run of a method.

  tff-methods-analyze --method=fedprox --task=digits --rounds=5 \
      --output_dir=runs/analysis_fedprox

Takes the experiment flags of `train.py`. Writes, each as PNG and CSV:
layer-wise CKA of local vs global and local vs local models (FedCKA Fig. 2),
activation divergence per round (FedMAX Fig. 2), angles of client updates
(FedCos Figs. 3, 12), the partition heatmap (FedCKA Fig. 4) and the per-layer
feature total variance (Fed2). The logic lives in
`tff_methods_tooling.analysis`.
"""

import sys

from absl import app
from absl import flags

from tff_methods_binaries import binary_main
from tff_methods_tooling import process_setup

# Before TensorFlow is first imported (by the modules below).
process_setup.configure_process(process_setup.verbosity_from_argv(sys.argv))

from tff_methods_binaries import expected_errors
from tff_methods_binaries import experiment_flags
from tff_methods_binaries import runtime_flags
from tff_methods_tooling import analysis
from tff_methods_tooling import run_directory

flags.DEFINE_integer(
  'analysis_clients', 5, "How many clients' local models are probed."
)
FLAGS = flags.FLAGS


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  process_setup.quiet(FLAGS.verbosity)
  error = runtime_flags.prepare_devices()  # Before TensorFlow runs an op.
  if error:
    return expected_errors.usage_error(error)
  output_dir = FLAGS.output_dir or f'runs/analysis_{FLAGS.method}'
  config = experiment_flags.config_from_flags(output_dir=output_dir)
  if FLAGS.analysis_clients < 2:
    return expected_errors.usage_error(
      f'--analysis_clients={FLAGS.analysis_clients} must be >= 2.'
    )
  try:
    analysis.experiment.validate(config)
    run_directory.make_output_dir(output_dir)
  except ValueError as e:
    return expected_errors.usage_error(str(e))
  error = runtime_flags.start()
  if error:
    return expected_errors.usage_error(error)
  paths = analysis.analyze(config, output_dir, FLAGS.analysis_clients)
  for name, path in paths.items():
    print(f'{name}: {path}')
  return 0


def run():
  """The `tff-methods-analyze` command."""
  binary_main.run(expected_errors.one_line_errors(main), __name__)


if __name__ == '__main__':
  run()
