"""A command's name as the user can type it, however this process started.

In a checkout the binaries run as `python -m binaries.NAME`; installed, as
the console scripts `tff-methods-NAME` (pyproject.toml). A message that
tells the user to run another binary names it the way this one was run.
"""

import sys

# The binaries' package in a checkout, and installed.
BINARY_PACKAGES = ('binaries', 'tff_methods_binaries')


def command(binary: str) -> str:
  """How to start `binary` ('worker', 'device_check'), e.g. in a message.

  `python -m binaries.worker` when this process is `python -m binaries.X`
  (`tff_methods_binaries` likewise); otherwise (a console script, a test, a
  user's own program) the console script, `tff-methods-worker`.
  """
  spec = getattr(sys.modules.get('__main__'), '__spec__', None)
  package = spec.name.rpartition('.')[0] if spec is not None else ''
  if package in BINARY_PACKAGES:
    return f'python -m {package}.{binary}'
  return 'tff-methods-' + binary.replace('_', '-')
