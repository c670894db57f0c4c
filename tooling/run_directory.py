"""A run's output directory: held by one run at a time, the settings it
was started with (`experiment.json`), which a resumption must match, and a
path to it that TensorFlow can read whatever its name (`tensorflow_path`).
"""

import contextlib
import fcntl
import hashlib
import json
import os
import tempfile
from typing import Any, Callable, Mapping, Optional

# Settings that may change between a run and its resumption.
RESUMABLE_KEYS = (
  'rounds',
  'verbosity',
  'progress',
  'max_concurrent_clients',
  'output_dir',
  'data_dir',
  'cache_dir',
  'restart_client_states',
)
CONFIG_FILE = 'experiment.json'


# The file a run holds locked while it writes to its output directory.
LOCK_FILE = '.lock'

# Characters TensorFlow's checkpoint reader takes for a file pattern's.
_GLOB_CHARACTERS = frozenset('[]*?')


def tensorflow_path(directory: str) -> str:
  """`directory`, or a path to it that TensorFlow reads literally.

  TensorFlow reads a checkpoint's path as a file pattern (its
  TensorSliceReader globs it), so a saved program state under `runs/a[1]`
  is not found again. For a directory whose path holds `[ ] * ?`, this
  makes the directory and returns a symbolic link to it under the
  temporary directory, named by a hash of its absolute path: the same run
  finds the same link when it resumes, and everything written through it
  lands in `directory`.
  """
  if not _GLOB_CHARACTERS & set(directory):
    return directory
  real = os.path.abspath(directory)
  os.makedirs(real, exist_ok=True)
  links = os.path.join(tempfile.gettempdir(), 'tff_methods_paths')
  os.makedirs(links, exist_ok=True)
  link = os.path.join(links, hashlib.sha256(real.encode()).hexdigest()[:20])
  if os.path.realpath(link) != os.path.realpath(real):
    if os.path.lexists(link):
      os.remove(link)  # A link of an earlier directory of that name.
    try:
      os.symlink(real, link)
    except FileExistsError:
      pass  # Another process of the same run made it.
  return link


class OutputDirInUseError(ValueError):
  """Another process is running on the output directory."""


def make_output_dir(output_dir: str) -> str:
  """Creates `output_dir` if needed, and checks it can be written.

  Raises:
    ValueError: naming the directory and why (a file, read-only, ...).
  """
  try:
    os.makedirs(output_dir, exist_ok=True)
    with tempfile.TemporaryFile(dir=output_dir):
      pass
  except OSError as e:
    raise ValueError(
      f'--output_dir={output_dir} cannot be written: ' f'{e.strerror or e}.'
    ) from None
  return output_dir


@contextlib.contextmanager
def output_dir_lock(output_dir: str):
  """Holds `output_dir` for this process while the block runs.

  An exclusive `flock` on `<output_dir>/.lock`: a second run on the same
  directory is refused at once (two runs would interleave their rows of
  `metrics.csv` and their checkpoints). The kernel releases the lock when
  the process ends, SIGKILL included, so a dead run never blocks the next.

  Raises:
    OutputDirInUseError: naming the directory and the process that holds it.
  """
  make_output_dir(output_dir)
  try:
    lock = open(os.path.join(output_dir, LOCK_FILE), 'a+')
  except OSError as e:
    raise ValueError(
      f'--output_dir={output_dir} cannot be written: ' f'{e.strerror or e}.'
    ) from None
  try:
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:
    lock.seek(0)
    holder = lock.read().strip() or 'another process'
    lock.close()
    raise OutputDirInUseError(
      f'--output_dir={output_dir} is in use by another run (process '
      f'{holder}); wait for it to end, or use another output '
      'directory.'
    ) from None
  try:
    lock.seek(0)
    lock.truncate()
    lock.write(str(os.getpid()))
    lock.flush()
    yield
  finally:
    fcntl.flock(lock, fcntl.LOCK_UN)
    lock.close()


def experiment_config_differences(
  output_dir: str,
  config: Mapping[str, Any],
  defaults: Optional[Mapping[str, Any]] = None,
  retired: Optional[Mapping[str, Any]] = None,
  upgrade: Optional[Callable[[Mapping[str, Any]], Mapping[str, Any]]] = None,
) -> list[str]:
  """Each setting in which `config` differs from the one saved in `output_dir`.

  The saved settings are first put in today's terms by `upgrade` (renamed
  settings under their new names, ...). A setting the saved config does not
  record (one that did not exist when it was written) is taken at its value
  in `defaults`. A saved setting that no longer exists matches if it holds
  its value in `retired` (the one that did what the code does now).
  Settings a resumption may change (`RESUMABLE_KEYS`) are not compared.
  Empty when nothing is saved there.
  """
  path = os.path.join(output_dir, CONFIG_FILE)
  if not os.path.exists(path):
    return []
  config = json.loads(json.dumps(dict(config), default=str))
  saved = _read_saved_config(path)
  if upgrade is not None:
    saved = dict(upgrade(saved))
  defaults = json.loads(json.dumps(dict(defaults or {}), default=str))
  saved = {**{k: v for k, v in defaults.items() if k in config}, **saved}
  for key, value in (retired or {}).items():
    if key not in config and saved.get(key) == value:
      del saved[key]
  keys = (set(saved) | set(config)) - set(RESUMABLE_KEYS)
  return [
    f'{k}: saved {saved.get(k)!r}, now {config.get(k)!r}'
    for k in sorted(keys)
    if saved.get(k) != config.get(k)
  ]


def saved_setting(output_dir: str, name: str) -> Any:
  """The setting `name` of the run saved in `output_dir`, or None."""
  path = os.path.join(output_dir, CONFIG_FILE)
  if not os.path.exists(path):
    return None
  return _read_saved_config(path).get(name)


def _read_saved_config(path: str) -> dict:
  """A run's saved settings; a ValueError naming the file if unreadable."""
  try:
    with open(path) as f:
      saved = json.load(f)
    problem = None if isinstance(saved, dict) else 'not a JSON object'
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    saved, problem = None, str(e)
  if problem:
    raise ValueError(
      f"{path} is not a run's settings ({problem}): restore it, or give "
      'another output directory (or delete this one) to start over.'
    )
  return saved


def check_experiment_config(
  output_dir: str,
  config: Mapping[str, Any],
  defaults: Optional[Mapping[str, Any]] = None,
  retired: Optional[Mapping[str, Any]] = None,
  upgrade: Optional[Callable[[Mapping[str, Any]], Mapping[str, Any]]] = None,
) -> None:
  """Writes `config` to `output_dir`, or checks it matches the one there.

  Raises:
    ValueError: when `output_dir` holds a different experiment: names each
      setting that differs, with both values
      (`experiment_config_differences`).
  """
  os.makedirs(output_dir, exist_ok=True)
  differences = experiment_config_differences(
    output_dir, config, defaults, retired, upgrade
  )
  if differences:
    raise ValueError(
      f'--output_dir={output_dir} holds a checkpoint of a different '
      'experiment (' + '; '.join(differences) + '). Use a new '
      'output directory, or the same settings to resume.'
    )
  with open(os.path.join(output_dir, CONFIG_FILE), 'w') as f:
    json.dump(
      json.loads(json.dumps(dict(config), default=str)),
      f,
      indent=2,
      sort_keys=True,
    )
