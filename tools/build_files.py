"""Writes the Bazel BUILD files from the sources: `make build-files`.

Every Python module is one target, named after it: a `py_test` for
`tests/*_test.py`, a `py_binary` for a program (a module with `def main(`),
else a `py_library` (a package's `__init__.py` with code is the package's
target). Its `deps` are the project's modules it imports and, through
`requirement()`, the packages of its other imports; its `data` are what its
string literals name: a binary a test runs (`'binaries.train'`), a file of
the repository (`'docs/tff_pipeline.md'`) or beside the module
(`'bind_address.c'`). Every test also depends on `tests/conftest.py`.

`tests/build_files_test.py` checks that the BUILD files are what this
writes, so they never drift from the imports.

  python tools/build_files.py           # writes every BUILD file
  python tools/build_files.py --check   # exits 1 naming those that differ
"""

import ast
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A Python package -> its directory (a Bazel package); pyproject.toml maps
# the same names for installation.
DIRECTORIES = {
  'tff_methods': 'tff_methods',
  'tff_methods.execution': 'tff_methods/execution',
  'tff_methods.clients': 'tff_methods/clients',
  'tff_methods.templates': 'tff_methods/templates',
  'tff_methods.algorithms': 'tff_methods/algorithms',
  'tff_methods_tasks': 'tasks',
  'tff_methods_tooling': 'tooling',
  'tff_methods_tooling.presets': 'tooling/presets',
  'tff_methods_binaries': 'binaries',
  'tests': 'tests',
  'tests.execution': 'tests/execution',
  'tests.clients': 'tests/clients',
  'tests.templates': 'tests/templates',
  'tests.algorithms': 'tests/algorithms',
}
# A third-party module -> the package (requirements.txt) that installs it.
REQUIREMENTS = {
  'absl': 'absl-py',
  'dp_accounting': 'dp-accounting',
  'grpc': 'grpcio',
  'matplotlib': 'matplotlib',
  'numpy': 'numpy',
  'portpicker': 'portpicker',
  'pytest': 'pytest',
  'sklearn': 'scikit-learn',
  'tensorflow': 'tensorflow',
  'tensorflow_datasets': 'tensorflow-datasets',
  'tensorflow_federated': 'tensorflow-federated',
  'tqdm': 'tqdm',
}
# Imported only by code that runs under another interpreter (the
# benchmark's PyTorch loop): not a dependency of any target.
OTHER_INTERPRETERS = {'torch'}
# Tests Bazel runs only when named, and why.
MANUAL = {
  'build_files_test': (
    "It reads the repository's BUILD files and sources, which a Bazel\n"
    'sandbox does not hold: pytest runs it (`make test`), Bazel on request.'
  ),
}
HEADER = """load("//third_party/python:requirements.bzl", "requirement")

package(default_visibility = ["//visibility:public"])

licenses(["notice"])
"""


def _sources(directory):
  """The package's modules with code, sorted."""
  names = []
  for name in sorted(os.listdir(os.path.join(REPO, directory))):
    path = os.path.join(REPO, directory, name)
    if name.endswith('.py') and (
      name != '__init__.py' or os.path.getsize(path)
    ):
      names.append(name)
  return names


def _target_name(directory, source):
  if source == '__init__.py':
    return os.path.basename(directory)
  return source[: -len('.py')]


def _module_label(module, name=None):
  """The label of `module` (or of `module.name`), or None if not ours."""
  if name is not None and f'{module}.{name}' in DIRECTORIES:
    sub = DIRECTORIES[f'{module}.{name}']
    return f'//{sub}:{os.path.basename(sub)}'
  if module in DIRECTORIES and name is not None:
    return f'//{DIRECTORIES[module]}:{name}'
  package, _, leaf = module.rpartition('.')
  if package in DIRECTORIES:
    return f'//{DIRECTORIES[package]}:{leaf}'
  return None


def _strings(tree):
  """Every string literal, and `os.path.join(REPO, 'a', 'b')` as 'a/b'."""
  found = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
      found.add(node.value)
    elif (
      isinstance(node, ast.Call)
      and ast.unparse(node.func) == 'os.path.join'
      and node.args
      and all(
        isinstance(a, ast.Constant) and isinstance(a.value, str)
        for a in node.args[1:]
      )
    ):
      found.add('/'.join(a.value for a in node.args[1:]))
  return found


def _is_root_file(path):
  """Whether `path` names a file of the root package (no BUILD file of
  its own directory's): a document, the project's configuration."""
  if path.startswith('/') or path.endswith('.py'):
    return False
  full = os.path.join(REPO, path)
  parts = path.split('/')[:-1]
  return os.path.isfile(full) and not any(
    os.path.exists(os.path.join(REPO, *parts[: i + 1], 'BUILD'))
    for i in range(len(parts))
  )


def target(directory, source):
  """The target of `directory/source`: a dict of its rule and attributes."""
  path = os.path.join(REPO, directory, source)
  with open(path) as f:
    text = f.read()
  tree = ast.parse(text)
  name = _target_name(directory, source)
  deps, requirements, data = set(), set(), set()
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and node.level == 0:
      imported = [(node.module, a.name) for a in node.names]
    elif isinstance(node, ast.Import):
      imported = [(a.name, None) for a in node.names]
    else:
      continue
    for module, alias in imported:
      top = module.split('.')[0]
      label = _module_label(module, alias)
      if label is not None:
        deps.add(label)
      elif top in REQUIREMENTS:
        requirements.add(REQUIREMENTS[top])
      elif top not in sys.stdlib_module_names | OTHER_INTERPRETERS:
        raise ValueError(
          f'{directory}/{source} imports {module}, which is neither the '
          "project's, the standard library's, nor in REQUIREMENTS: add "
          'the package that installs it there.'
        )
  for string in _strings(tree):
    parts = string.split('.')
    if len(parts) == 2 and parts[0] in ('binaries', 'tff_methods_binaries'):
      if os.path.isfile(os.path.join(REPO, 'binaries', parts[1] + '.py')):
        data.add(f'//binaries:{parts[1]}')
    elif '/' not in string and string.endswith('.c'):
      if os.path.isfile(os.path.join(REPO, directory, string)):
        data.add(string)
    elif directory.split('/')[0] == 'tests' and _is_root_file(string):
      data.add(f'//:{string}')
  own = f'//{directory}:'
  deps.discard(own + name)
  deps = {':' + d[len(own) :] if d.startswith(own) else d for d in deps}
  if directory.split('/')[0] == 'tests':
    rule = 'py_test' if source.endswith('_test.py') else 'py_library'
    if rule == 'py_test':
      deps.add(':conftest' if directory == 'tests' else '//tests:conftest')
  elif '\ndef main(' in text:
    rule = 'py_binary'
  else:
    rule = 'py_library'
  return dict(
    rule=rule,
    name=name,
    srcs=[source],
    data=sorted(data),
    deps=sorted(deps) + [f'requirement("{r}")' for r in sorted(requirements)],
  )


def _list(items, quote=True, indent=4):
  shown = [f'"{i}"' if quote else i for i in items]
  if len(shown) == 1 and len(shown[0]) < 40:
    return f'[{shown[0]}]'
  inner = ' ' * (indent + 4)
  return '[\n' + ''.join(f'{inner}{s},\n' for s in shown) + ' ' * indent + ']'


def _render(t):
  lines = [f'{t["rule"]}(', f'    name = "{t["name"]}",']
  lines.append(f'    srcs = {_list(t["srcs"])},')
  if t['rule'] == 'py_test':
    # The suite's tests build TFF computations: Bazel's longest timeout.
    lines.append('    size = "large",')
    if t['name'] in MANUAL:
      for comment in MANUAL[t['name']].split('\n'):
        lines.append(f'    # {comment}')
      lines.append('    tags = ["manual"],')
  if t['data']:
    lines.append(f'    data = {_list(t["data"])},')
  if t['deps']:
    deps = [d if d.startswith('requirement(') else f'"{d}"' for d in t['deps']]
    lines.append(f'    deps = {_list(deps, quote=False)},')
  lines.append(')')
  return '\n'.join(lines)


def build_files():
  """Every BUILD file's path (relative to the repository) -> its text."""
  files = {}
  exported = set()
  for directory in DIRECTORIES.values():
    targets = [target(directory, s) for s in _sources(directory)]
    for t in targets:
      exported.update(d[len('//:') :] for d in t['data'] if d.startswith('//:'))
    body = '\n\n'.join(_render(t) for t in targets)
    files[f'{directory}/BUILD'] = f'{HEADER}\n{body}\n'
  files['BUILD'] = (
    'package(default_visibility = ["//visibility:public"])\n\n'
    'licenses(["notice"])\n\n'
    '# The repository files the tests read.\n'
    f'exports_files({_list(sorted(exported), indent=0)})\n'
  )
  return files


def main(argv):
  check = '--check' in argv[1:]
  stale = []
  for path, text in sorted(build_files().items()):
    full = os.path.join(REPO, path)
    current = open(full).read() if os.path.exists(full) else None
    if current != text:
      stale.append(path)
      if not check:
        with open(full, 'w') as f:
          f.write(text)
  if check and stale:
    print(f'Out of date: {", ".join(stale)}; run python tools/build_files.py.')
    return 1
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv))
