"""How every binary runs: absl's `app.run`, with a `--help` of its own.

absl's `--help` lists only the flags of the file run as `__main__` (so a
binary's shared flags are missing, and from an installed console script,
`tff-methods-NAME`, so are its docstring and own flags), and exits 1.
`run` prints the binary's docstring and every flag the project defines
for it, and exits 0.
"""

import signal
import sys
from typing import Callable

from absl import app
from absl import flags

from tff_methods.execution import workers

# absl's help flags; `run` answers them itself.
_HELP_FLAGS = ('--help', '-help', '-h', '-?', '--helpshort')


def help_text(module) -> str:
  """A binary's `--help`: its docstring, then every flag the project
  defines for it (its own module's and the shared flag modules')."""
  # absl names the flags of the file run as `__main__` by its path.
  own = {module.__name__, getattr(module, '__file__', None)}
  ours = [
    name
    for name in flags.FLAGS.flags_by_module_dict()
    if name in own or name.split('.')[0] in ('binaries', 'tff_methods_binaries')
  ]
  parts = [(module.__doc__ or '').strip(), '', 'flags:']
  for name in sorted(ours, key=lambda n: n not in own):
    parts.append(flags.FLAGS.module_help(name))
  return '\n'.join(parts)


# A Ctrl-C's exit status, as a shell reports a process SIGINT ended.
INTERRUPTED_EXIT_CODE = 130


def _interrupted() -> int:
  print(
    'interrupted: what was saved is kept; run the same command again '
    'to resume.',
    file=sys.stderr,
  )
  return INTERRUPTED_EXIT_CODE


def run(main: Callable[[list[str]], int], module_name: str) -> None:
  """Runs a binary's `main` with absl; `--help` prints `help_text` and
  exits 0. (absl's own help lists only the flags of the file run as
  `__main__`, none from a console script, and exits 1.) A Ctrl-C ends it
  with one line instead of a traceback: what was saved is kept; so does the
  worker's end by this process's SIGINT/SIGTERM handler met in TFF's
  thread (`workers.WorkerEndedBySignalError`), with the signal's status."""
  if any(argument in _HELP_FLAGS for argument in sys.argv[1:]):
    print(help_text(sys.modules[module_name]))
    sys.exit(0)

  def main_or_interrupted(argv):
    try:
      return main(argv)
    except KeyboardInterrupt:
      return _interrupted()
    except workers.WorkerEndedBySignalError as e:
      if e.signum == signal.SIGINT:
        return _interrupted()
      return 128 + e.signum  # As the SIGTERM handler's SystemExit.

  app.run(main_or_interrupted)
