"""Keeps the Bazel BUILD files in step with the code.

`tools/build_files.py` writes them from the sources (`make build-files`);
`make bazel` builds and runs them offline (Bazel's native py rules). This
test, which needs no Bazel, checks that the BUILD files are what the
generator writes now, and reads them (evaluating each with stand-ins for
the rules) to check what the generator promises: every Python source
belongs to exactly one target, every test file has a py_test, every binary
a py_binary, every dependency names an existing target or a required
package, and every project module a file imports is among its target's
dependencies.
"""

import ast
import importlib.util
import os
import re
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _generator():
  spec = importlib.util.spec_from_file_location(
    'build_files', os.path.join(REPO, 'tools', 'build_files.py')
  )
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_the_build_files_are_what_the_generator_writes():
  for path, text in _generator().build_files().items():
    with open(os.path.join(REPO, path)) as f:
      assert f.read() == text, (
        f'{path} is out of date: run make build-files (or python '
        'tools/build_files.py).'
      )


# The library's layers, lowest first: each imports only from those before
# it (docs/design.md, "Layers").
LAYERS = ('execution', 'clients', 'templates', 'algorithms')
PACKAGES = (
  'tasks',
  'tff_methods',
  *(f'tff_methods/{layer}' for layer in LAYERS),
  'tooling',
  'tooling/presets',
  'binaries',
  'tests',
  *(f'tests/{layer}' for layer in LAYERS),
)
# A Python package's name -> its directory, the Bazel package.
DIRECTORIES = {
  'tff_methods_tasks': 'tasks',
  'tff_methods': 'tff_methods',
  **{f'tff_methods.{layer}': f'tff_methods/{layer}' for layer in LAYERS},
  'tff_methods_tooling': 'tooling',
  'tff_methods_tooling.presets': 'tooling/presets',
  'tff_methods_binaries': 'binaries',
}
# Installed with --no-deps after requirements.txt (see the Makefile).
INSTALLED_SEPARATELY = {'tensorflow-federated'}


def _read_build(package):
  targets = []

  def rule(kind):
    def record(**kwargs):
      targets.append(dict(kind=kind, package=package, **kwargs))

    return record

  namespace = dict(
    load=lambda *args: None,
    package=lambda **kwargs: None,
    licenses=lambda *args: None,
    exports_files=lambda *args: None,
    requirement=lambda name: f'requirement:{name}',
    py_library=rule('py_library'),
    py_binary=rule('py_binary'),
    py_test=rule('py_test'),
  )
  with open(os.path.join(REPO, package, 'BUILD')) as f:
    exec(f.read(), namespace)
  return targets


def _requirements():
  names = set()
  with open(os.path.join(REPO, 'requirements.txt')) as f:
    for line in f:
      line = line.split('#')[0].strip()
      if line:
        names.add(re.split(r'[<>=~!\[; ]', line)[0].lower())
  return names | INSTALLED_SEPARATELY


def _project_imports(path):
  found = set()
  for node in ast.walk(ast.parse(open(path).read())):
    package = (
      DIRECTORIES.get(node.module) if isinstance(node, ast.ImportFrom) else None
    )
    if package in PACKAGES:
      for alias in node.names:
        # A subpackage is its own Bazel package, named after itself.
        sub = f'{package}/{alias.name}'
        found.add(
          f'//{sub}:{alias.name}'
          if sub in PACKAGES
          else f'//{package}:{alias.name}'
        )
  return found


TARGETS = [t for p in PACKAGES for t in _read_build(p)]
BY_LABEL = {f"//{t['package']}:{t['name']}": t for t in TARGETS}


def _label(dep, package):
  return f'//{package}{dep}' if dep.startswith(':') else dep


@pytest.mark.parametrize('package', PACKAGES)
def test_every_source_is_in_exactly_one_target(package):
  directory = os.path.join(REPO, package)
  # An __init__.py with code is a source too.
  sources = sorted(
    f
    for f in os.listdir(directory)
    if f.endswith('.py')
    and (f != '__init__.py' or os.path.getsize(os.path.join(directory, f)))
  )
  claimed = [s for t in TARGETS if t['package'] == package for s in t['srcs']]
  assert sorted(claimed) == sources


def test_tests_and_binaries_have_the_right_rules():
  for label, target in BY_LABEL.items():
    (src,) = target['srcs']
    if target['package'].split('/')[0] == 'tests' and src.endswith('_test.py'):
      assert target['kind'] == 'py_test', label
    if target['package'] == 'binaries':
      # Programs (with a main) are binaries; shared flag modules libraries.
      with open(os.path.join(REPO, 'binaries', src)) as f:
        is_program = '\ndef main(' in f.read()
      assert target['kind'] == (
        'py_binary' if is_program else 'py_library'
      ), label


def test_every_dependency_exists():
  required = _requirements()
  for label, target in BY_LABEL.items():
    for dep in target.get('deps', []):
      if dep.startswith('requirement:'):
        assert dep.split(':', 1)[1] in required, (label, dep)
      else:
        assert _label(dep, target['package']) in BY_LABEL, (label, dep)


def test_every_required_package_has_a_stand_in_target():
  # Offline, `requirement(name)` is //third_party/python:name, an empty
  # target for a package the interpreter's environment holds.
  stand_ins = {t['name'] for t in _read_build('third_party/python')}
  used = {
    dep.split(':', 1)[1]
    for target in TARGETS
    for dep in target.get('deps', [])
    if dep.startswith('requirement:')
  }
  assert used <= stand_ins, sorted(used - stand_ins)
  with open(os.path.join(REPO, 'WORKSPACE')) as f:
    workspace = f.read()
  assert 'http_archive' not in workspace  # Nothing is fetched.


def test_every_project_import_is_a_declared_dependency():
  for label, target in BY_LABEL.items():
    path = os.path.join(REPO, target['package'], target['srcs'][0])
    declared = {_label(d, target['package']) for d in target.get('deps', [])}
    missing = _project_imports(path) - declared
    assert not missing, f'{label} imports {sorted(missing)} undeclared'


# What each package may import of the others. The library's layers import
# only downwards: its execution (workers, contexts, devices) and its clients
# (keys, data, state store) nothing of the rest, its templates (the shared
# loop's pieces) those two, its algorithms (the methods, their declarations,
# the registry) the templates and the clients but not the execution, which
# the user chooses; `privacy` the clients' keys. The library imports neither
# the task zoo nor the tooling, the zoo a few of the library's pieces, the
# tooling no binary.
MAY_IMPORT = {
  'tff_methods': {'tff_methods.clients'},
  'tff_methods/execution': {'tff_methods.execution'},
  'tff_methods/clients': {'tff_methods.clients'},
  'tff_methods/templates': {
    'tff_methods.templates',
    'tff_methods.clients',
    'tff_methods.execution',
  },
  'tff_methods/algorithms': {
    'tff_methods.algorithms',
    'tff_methods.templates',
    'tff_methods.clients',
  },
  # The zoo: the library's client keys, and for TFF's baseline tasks its
  # model contract and cross-entropy.
  'tasks': {
    'tff_methods_tasks',
    'tff_methods.clients.client_keys',
    'tff_methods.templates.local_training',
    'tff_methods.templates.model_lib',
  },
  'tooling': {'tff_methods', 'tff_methods_tasks', 'tff_methods_tooling'},
  'tooling/presets': {'tff_methods_tooling'},
}


@pytest.mark.parametrize('package', sorted(MAY_IMPORT))
def test_packages_import_only_downwards(package):
  for source in sorted(os.listdir(os.path.join(REPO, package))):
    if not source.endswith('.py'):
      continue
    tree = ast.parse(open(os.path.join(REPO, package, source)).read())
    for node in ast.walk(tree):
      if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
      elif isinstance(node, ast.ImportFrom):
        names = [f'{node.module}.{a.name}' for a in node.names]
      else:
        names = []
      for name in names:
        top = name.split('.')[0]
        if top in DIRECTORIES:
          allowed = MAY_IMPORT[package]
          assert any(
            name == a or name.startswith(a + '.') for a in allowed
          ), f'{package}/{source} imports {name}'


def test_every_library_module_has_a_test_file_of_its_own():
  # The library's modules each have tests/<layer>/<module>_test.py, as
  # the library's folders are laid out (the task zoo's, the tooling's and
  # the binaries' are tested with the runs that use them where they have
  # none).
  modules = [
    os.path.join(layer, name[: -len('.py')])
    for layer in ('', *LAYERS)
    for name in _generator()._sources(os.path.join('tff_methods', layer))
    if name != '__init__.py'
  ]
  assert len(modules) >= 40
  missing = [
    m
    for m in modules
    if not os.path.exists(os.path.join(REPO, 'tests', f'{m}_test.py'))
  ]
  assert not missing, missing


def test_the_library_is_its_layers_and_privacy():
  # Every module of the library sits in a layer's folder but `privacy`.
  top = sorted(
    name
    for name in os.listdir(os.path.join(REPO, 'tff_methods'))
    if name.endswith('.py') or name.endswith('.c')
  )
  assert top == ['__init__.py', 'privacy.py']


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
