"""How the binaries set up their own process, before TensorFlow loads.

The library changes nothing in the importing process; these are the
binaries' choices (and a comparison's jobs', which are binaries' children):

- TensorFlow's oneDNN CPU kernels on (TensorFlow 2.14 turns them on by
  default only on the newest Intel CPUs);
- gRPC's fork handlers off: workers are started by fork + exec while gRPC
  threads run, and the handlers would only log "skipping fork() handlers";
- TensorFlow's and TFF's info logs, and Python's deprecation and user
  warnings, silenced unless `--verbosity` > 0;
- SIGINT and SIGTERM end the TFF workers first
  (`workers.install_signal_handlers`);
- the user's method modules (`--method_module`) imported before the flags
  are defined, so that their methods get flags and `--method` names
  (`import_method_modules`).
"""

import importlib
import logging as py_logging
import os
import signal
import sys
import threading
import time
from typing import Optional, Sequence

from absl import logging

from tff_methods.execution import workers


def verbosity_from_argv(argv: list[str]) -> int:
  """absl's `--verbosity`/`-v` value in `argv`, read before flags are parsed.

  TensorFlow reads its C++ log level once, when imported, and a binary must
  import TensorFlow before `absl.app.run` (importing it inside `main` breaks
  Keras' functional API in TF 2.14), so the level is read from argv early.
  """
  for i, arg in enumerate(argv):
    for name in ('--verbosity', '-v'):
      if arg.startswith(name + '='):
        value = arg.split('=', 1)[1]
      elif arg == name and i + 1 < len(argv):
        value = argv[i + 1]
      else:
        continue
      try:
        return int(value)
      except ValueError:
        return 0
  return 0


def configure_process(verbosity: int = 0) -> None:
  """Sets up this process as the module docstring says; binaries call it
  first thing.

  Call it before TensorFlow and gRPC are imported: both read these settings
  once, when they initialize. The caller's own environment settings win.
  A library user who skips it still gets workers with oneDNN on
  (`workers.start_worker`), and their own process as they set it.
  """
  problem = thread_settings_problem(os.environ)
  if problem:
    print(f'error: {problem}', file=sys.stderr)
    sys.exit(2)
  configure_environment()
  quiet(verbosity)
  if threading.current_thread() is threading.main_thread():
    workers.install_signal_handlers()


def method_modules_from_argv(argv: Sequence[str]) -> list[str]:
  """The modules `--method_module` names in `argv` (comma-separated; the
  flag may repeat), read before the flags are parsed: their methods must be
  registered before the experiment's flags are defined."""
  names = []
  for i, arg in enumerate(argv):
    if arg.startswith('--method_module='):
      value = arg.split('=', 1)[1]
    elif arg == '--method_module' and i + 1 < len(argv):
      value = argv[i + 1]
    else:
      continue
    names += [name.strip() for name in value.split(',') if name.strip()]
  return names


def import_modules(names: Sequence[str]) -> None:
  """Imports each of `names` (once: a module imported before is kept), each
  registering its methods with `tff_methods.algorithms.methods.register`.

  Raises:
    ValueError: naming the module that can't be imported, and why.
  """
  for name in names:
    try:
      importlib.import_module(name)
    except ImportError as e:
      raise ValueError(
        f'--method_module={name}: {e}; give a module importable from here '
        '(on PYTHONPATH or installed), e.g. --method_module=mypkg.pull.'
      ) from None


def import_method_modules(argv: Sequence[str]) -> None:
  """Imports the modules `--method_module` names in `argv`; a binary calls
  it after `configure_process`, before it imports its flags. A module that
  can't be imported ends the process with one line (exit status 2)."""
  try:
    import_modules(method_modules_from_argv(argv))
  except ValueError as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(2)


def thread_settings_problem(environ) -> Optional[str]:
  """What is wrong with the environment's TensorFlow thread counts, which
  TensorFlow aborts on (negative) or silently ignores (not a number)."""
  for name in ('TF_NUM_INTRAOP_THREADS', 'TF_NUM_INTEROP_THREADS'):
    value = environ.get(name)
    if value is not None and not value.strip().isdigit():
      return (
        f'{name}={value!r} must be a whole number >= 0 (0: TensorFlow '
        'chooses); set it so, or unset it.'
      )
  return None


def configure_environment() -> None:
  """`configure_process`'s environment settings alone (no TensorFlow)."""
  os.environ.setdefault(*workers.ONEDNN)
  os.environ.setdefault('GRPC_ENABLE_FORK_SUPPORT', '0')


def quiet(verbosity: int = 0) -> None:
  """Silences TensorFlow's and TFF's info logs unless `verbosity` > 0.

  Call before TensorFlow is imported for TensorFlow's C++ logs to follow.
  """
  if verbosity > 0:
    os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '0')
    logging.set_verbosity(logging.DEBUG if verbosity > 1 else logging.INFO)
    return
  os.environ['TF_CPP_MIN_LOG_LEVEL'] = '3'
  logging.set_verbosity(logging.WARNING)
  os.environ.setdefault('GRPC_VERBOSITY', 'ERROR')
  import warnings

  warnings.filterwarnings('ignore', category=DeprecationWarning)
  warnings.filterwarnings('ignore', category=UserWarning)
  import tensorflow as tf

  tf.get_logger().setLevel(py_logging.ERROR)
  tf.autograph.set_verbosity(0)


# How long a job whose parent died may take to end by its SIGTERM handler
# before it is ended without it.
ORPHAN_GRACE_SECONDS = 5.0


def exit_when_orphaned(
  parent_pid: int, grace_seconds: float = ORPHAN_GRACE_SECONDS
) -> None:
  """Ends this process `grace_seconds` after `parent_pid` stops being its
  parent, whatever its main thread is doing.

  The backstop of `PR_SET_PDEATHSIG`'s SIGTERM, whose handler
  (`workers.install_signal_handlers`) runs only when the main thread
  returns to the interpreter: a job blocked in a native call would outlive
  the comparison with its worker. A watching thread `os._exit`s instead;
  the job's workers, started with PDEATHSIG, end with it.
  """

  def watch():
    while os.getppid() == parent_pid:
      time.sleep(0.5)
    time.sleep(grace_seconds)
    os._exit(128 + signal.SIGTERM)

  threading.Thread(target=watch, name='exit_when_orphaned', daemon=True).start()
