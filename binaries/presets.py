r"""Lists the papers' experiments that `--preset` runs, with their numbers.

  tff-methods-presets                      # every preset, a table each
  tff-methods-presets --paper=fedcos       # one paper's
  tff-methods-presets --preset=fedcka_table1_cifar10   # and its flags

Each preset is one column of a paper's table: its rows are the methods (the
paper's own marked *) with the number the paper reports. Run one row with
`tff-methods-train --preset=NAME [--method=ROW]`, the whole column with
`tff-methods-compare --preset=NAME`. The presets live in
`tff_methods_tooling.presets`.
"""

import sys

from absl import app
from absl import flags

from tff_methods.execution import runtime
from tff_methods_binaries import binary_main
from tff_methods_tooling import process_setup

# Before TensorFlow is first imported (by the modules below).
process_setup.configure_process(process_setup.verbosity_from_argv(sys.argv))

from tff_methods_tooling import presets

flags.DEFINE_string('preset', None, 'Show this preset with all its flags.')
flags.DEFINE_string(
  'paper',
  None,
  'Only presets whose name starts with this ' '(fedcka, fedmax, fedcos, fed2).',
)
FLAGS = flags.FLAGS


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  # No computation runs here: drop TFF's import-time context quietly.
  runtime.discard_default_context()
  if FLAGS.preset:
    try:
      chosen = [presets.get(FLAGS.preset)]
    except ValueError as e:
      print(e, file=sys.stderr)
      return 2
  else:
    chosen = [
      p
      for name, p in presets.PRESETS.items()
      if not FLAGS.paper or name.startswith(FLAGS.paper)
    ]
    if not chosen:
      print(
        f'--paper={FLAGS.paper!r} matches no preset; presets start with '
        'fedcka, fedmax, fedcos or fed2.',
        file=sys.stderr,
      )
      return 2
  for preset in chosen:
    print(presets.describe(preset, settings=bool(FLAGS.preset)))
    print()
  if not FLAGS.preset:
    print(
      f"{len(chosen)} presets; * marks the paper's own method. "
      '--preset=NAME shows one with its flags and notes.'
    )
  return 0


def run():
  """The `tff-methods-presets` command."""
  binary_main.run(main, __name__)


if __name__ == '__main__':
  run()
