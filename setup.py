"""Installs the library and its experiment tools under tff_methods* names.

The repository keeps the layout `tff_methods/` (the library), `tasks/` (the
task zoo), `tooling/` (the experiment tools) and `binaries/` (the commands),
which import each other by those names. Installed, generic top-level names
such as `tasks` would collide with other projects' modules, so the wheel
holds them as `tff_methods_tasks`, `tff_methods_tooling` and
`tff_methods_binaries`: the build copies each module and rewrites its
imports of the three (and the `python -m binaries.NAME` commands its
messages print, which become the console scripts `tff-methods-NAME`). The
library, `tff_methods`, is copied unchanged: it imports none of them.
"""

import re

from setuptools import setup
from setuptools.command.build_py import build_py

RENAMED = {
  'tasks': 'tff_methods_tasks',
  'tooling': 'tff_methods_tooling',
  'binaries': 'tff_methods_binaries',
}
_IMPORT = re.compile(
  r'^(\s*)(from|import) (tasks|tooling|binaries)\b', re.MULTILINE
)
_COMMAND = re.compile(r'python -m binaries\.(\w+)')


def rename_imports(source: str) -> str:
  """`source` with the repository's package names replaced by installed ones."""
  source = _IMPORT.sub(lambda m: f'{m[1]}{m[2]} {RENAMED[m[3]]}', source)
  return _COMMAND.sub(lambda m: f'tff-methods-{m[1]}', source)


class BuildPyRenamingImports(build_py):
  """`build_py`, then the imports of the renamed packages rewritten."""

  def build_module(self, module, module_file, package):
    outfile, copied = super().build_module(module, module_file, package)
    package_name = package if isinstance(package, str) else '.'.join(package)
    if package_name.split('.')[0] in RENAMED.values():
      with open(outfile, encoding='utf-8') as f:
        source = f.read()
      with open(outfile, 'w', encoding='utf-8') as f:
        f.write(rename_imports(source))
    return outfile, copied


if __name__ == '__main__':  # pip's build backend runs this file as main.
  setup(cmdclass={'build_py': BuildPyRenamingImports})
