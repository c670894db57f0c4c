"""How a binary ends on a failure its user can fix: in one line.

`one_line_errors` wraps a binary's `main`: the failures below print one
line (the error's name and message, with what to do where the message
lacks it) and exit 1, instead of a traceback; `usage_error` prints bad
input found before any work starts, and exits 2.
"""

import functools
import sys
from typing import Callable

from tff_methods.execution import runtime
from tff_methods.execution import workers
from tff_methods_binaries import runtime_flags
from tff_methods_tasks import datasets
from tff_methods_tooling import comparison

# Failures a user can fix, which end in one line rather than a traceback:
# data that can't be had offline, a computation several workers can't run,
# a run of a comparison that failed in its own job, a worker that died.
EXPECTED_ERRORS = (
  datasets.DataUnavailableError,
  runtime.NotMergeableError,
  comparison.RunFailedError,
  workers.WorkerExitedError,
  workers.WorkerUnreachableError,
)


def one_line_errors(
  main: Callable[[list[str]], int],
) -> Callable[[list[str]], int]:
  """Wraps a binary's `main`: an expected failure prints one line, exits 1."""

  @functools.wraps(main)
  def wrapped(argv):
    try:
      return main(argv)
    except EXPECTED_ERRORS as e:
      message = str(e)
      if isinstance(e, runtime.NotMergeableError):
        message += (
          ' (Drop --tff_workers; --tff_worker_binary runs another '
          'worker executable locally.)'
        )
      elif isinstance(e, workers.WorkerUnreachableError):
        message = runtime_flags.with_worker_command(e)
      print(f'{type(e).__name__}: {message}', file=sys.stderr)
      return 1

  return wrapped


def usage_error(message: str) -> int:
  """Prints a bad-input message and returns the exit status 2.

  For errors found before any TFF computation runs.
  """
  runtime.discard_default_context()
  print(message, file=sys.stderr)
  return 2
