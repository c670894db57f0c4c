"""Where a TFF worker listens: loopback unless asked otherwise.

TFF's `worker_binary` listens on `[::]:PORT`, every interface, and has no
authentication and no flag to choose its address. It takes glibc's `bind`
from the shared library, so a small library preloaded into it
(`bind_address.c`, `LD_PRELOAD`) binds the any-address to a host of our
choosing instead: 127.0.0.1 for the workers the binaries start for
themselves, and `binaries.worker --host` for a worker other hosts use. The
library is compiled on first use with the system's C compiler and kept in
the user's cache; without a compiler, workers listen on every interface as
TFF's do, and `environment` says so in a warning.
"""

import hashlib
import ipaddress
import os
import shutil
import subprocess
import tempfile
from typing import Optional

from absl import logging

LOOPBACK = '127.0.0.1'
_SOURCE = os.path.join(
  os.path.dirname(os.path.abspath(__file__)), 'bind_address.c'
)
_HOST_VARIABLE = 'TFF_METHODS_BIND_HOST'
_warned = False


def is_any_address(host: str) -> bool:
  """Whether `host` means every interface (0.0.0.0, ::, or [::])."""
  try:
    return ipaddress.ip_address(host.strip('[]')).is_unspecified
  except ValueError:
    return False


def check_host(host: str) -> str:
  """`host`, without brackets, if it is an IP address (v4 or v6).

  Raises:
    ValueError: naming the host and what is allowed.
  """
  try:
    ipaddress.ip_address(host.strip('[]'))
  except ValueError:
    raise ValueError(
      f'{host!r} is not an IP address; give one of this host '
      f'(e.g. {LOOPBACK}, or 0.0.0.0 for every interface).'
    ) from None
  return host.strip('[]')


def _cache_directory() -> str:
  base = os.environ.get('XDG_CACHE_HOME') or os.path.expanduser('~/.cache')
  return os.path.join(base, 'tff_methods')


def library() -> Optional[str]:
  """The compiled preload library, or None where it can't be built."""
  with open(_SOURCE, 'rb') as f:
    digest = hashlib.sha256(f.read()).hexdigest()[:16]
  compiler = shutil.which('cc') or shutil.which('gcc')
  for directory in (_cache_directory(), tempfile.gettempdir()):
    path = os.path.join(directory, f'bind_address-{digest}.so')
    if os.path.exists(path):
      return path
    if compiler is None:
      return None
    partial = None
    try:
      os.makedirs(directory, exist_ok=True)
      # Built beside its place, then moved in: processes starting workers at
      # once never load a half-written library.
      fd, partial = tempfile.mkstemp(suffix='.so', dir=directory)
      os.close(fd)
      subprocess.run(
        [compiler, '-shared', '-fPIC', '-O2', '-o', partial, _SOURCE, '-ldl'],
        check=True,
        capture_output=True,
        timeout=120,
      )
      os.replace(partial, path)
      return path
    except (OSError, subprocess.SubprocessError):
      if partial and os.path.exists(partial):
        os.remove(partial)
  return None


def held_to_host(env: dict[str, str]) -> bool:
  """Whether a worker started with `env` listens on one host only."""
  return _HOST_VARIABLE in env


def environment(host: str, env: dict[str, str]) -> dict[str, str]:
  """`env` for a worker that listens on `host` only.

  For the any-address, `env` unchanged; else the preload library and the
  host added, or, where the library can't be built, `env` unchanged and a
  warning (once a process) that the worker listens on every interface.
  """
  if is_any_address(host):
    return env
  path = library()
  if path is None:
    global _warned
    if not _warned:
      _warned = True
      logging.warning(
        'No C compiler to build %s: TFF workers listen on every interface '
        '(TFF fixes their address), not only on %s.',
        _SOURCE,
        host,
      )
    return env
  env = dict(env)
  preloaded = env.get('LD_PRELOAD')
  env['LD_PRELOAD'] = f'{path}:{preloaded}' if preloaded else path
  env[_HOST_VARIABLE] = host
  return env
