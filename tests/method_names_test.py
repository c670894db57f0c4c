"""No built-in method is named outside its own module but where it must be.

The library, the task zoo, the tooling and the binaries ask the methods'
declarations (`methods.REGISTRY`: what a method reads, keeps, brings) what
they need of a method; a method's name in a string literal elsewhere is
allowed only where `ALLOWED` says why.
"""

import ast
import importlib
import os
import pkgutil
import re
import sys

import pytest

from tff_methods.algorithms import method_spec
from tff_methods.algorithms import methods

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCES = ('tff_methods', 'tasks', 'tooling', 'binaries')


def _owners():
  """A built-in method's name -> the module of `tff_methods.algorithms`
  that declares it."""
  owners = {}
  for info in pkgutil.iter_modules(
    [os.path.join(REPO, 'tff_methods', 'algorithms')]
  ):
    if info.name == 'methods':  # The registry lists them all.
      continue
    module = importlib.import_module(f'tff_methods.algorithms.{info.name}')
    for value in vars(module).values():
      for spec in value if isinstance(value, tuple) else (value,):
        if isinstance(spec, method_spec.MethodSpec):
          owners[spec.name] = info.name
  return owners


OWNER = _owners()

# (path, or a folder ending in '/') -> (the names allowed there, '*' for
# every one, and why).
ALLOWED = {
  'tff_methods/algorithms/fedcos.py': (
    {'fedprox', 'fedavgm', 'fedadam'},
    "the FedCos paper's combinations, which its tables name",
  ),
  'tooling/presets/': ('*', "a paper's table names the methods it ran"),
  'tooling/pytorch_methods.py': ('*', 'each PyTorch twin ports one method'),
  'tooling/benchmark_report.py': (
    '*',
    "the benchmark's targets per method, and the FedCKA paper's Table 4",
  ),
  'tooling/benchmark_floors.py': (
    {'fedcka', 'moon', 'scaffold', 'fedprox', 'fedcos', 'fedmax'},
    'the floor of each method that computes more than FedAvg: what its term '
    'or process adds, timed alone',
  ),
  'tooling/floors_on_outputs.py': (
    {'fedcka', 'moon', 'fedmax'},
    "the floors of the terms that read the model's outputs, on each one's "
    'model',
  ),
  'tooling/benchmark.py': (
    {'tff_fedavg'},
    "TFF's own FedAvg, timed beside the project's",
  ),
  'tooling/benchmark_processes.py': (
    {'tff_fedavg'},
    "TFF's own FedAvg, timed beside the project's",
  ),
  'tooling/device_check.py': (
    {'tff_fedavg'},
    "TFF's own FedAvg, checked beside the methods",
  ),
  'binaries/benchmark_flags.py': (
    {'moon', 'scaffold'},
    'the cross-device run by default: one method of each kind of client '
    'state',
  ),
}
# FedAvg is the baseline every ratio, reference row and default is measured
# against: named anywhere outside the library.
BASELINE = 'fedavg'


def named_methods():
  """{(path, method name)} of every string literal that is a built-in
  method's name, or names joined as `--methods` and combinations join them
  ('fedprox+fedcos', 'fedavg,moon'), outside the method's own module. Prose
  (help texts, messages, docstrings) may name methods: it is read by
  people, not keyed on."""
  found = set()
  for top in SOURCES:
    for directory, _, files in os.walk(os.path.join(REPO, top)):
      for name in files:
        if not name.endswith('.py'):
          continue
        path = os.path.relpath(os.path.join(directory, name), REPO)
        tree = ast.parse(open(os.path.join(REPO, path)).read())
        for node in ast.walk(tree):
          if not (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and _NAMES.fullmatch(node.value)
          ):
            continue
          for method in re.split(r'[+,@]', node.value):
            if method in OWNER and name[: -len('.py')] != OWNER[method]:
              found.add((path, method))
  return found


# Names joined by '+', ',' or '@' (a method under an aggregator's label).
_NAMES = re.compile(r'[a-z][a-z0-9_]*(?:[+,@][a-z][a-z0-9_]*)*')


def _allowance(path):
  for place, allowance in ALLOWED.items():
    if path == place or (place.endswith('/') and path.startswith(place)):
      return place, allowance
  return None, (set(), '')


def test_every_built_in_method_has_its_module():
  assert set(OWNER) == set(methods.REGISTRY)
  assert (OWNER['fedprox'], OWNER['tff_fedadam']) == ('fedprox', 'fedavg')


def test_a_method_is_named_outside_its_module_only_where_allowed():
  found = named_methods()
  assert ('tooling/benchmark_report.py', 'fedcka') in found  # It looks.
  unexplained = sorted(
    (path, method)
    for path, method in found
    if not _baseline(path, method)
    and not (_allowance(path)[1][0] == '*' or method in _allowance(path)[1][0])
  )
  assert not unexplained, (
    'A method named outside its module: ask its declaration '
    '(methods.REGISTRY) instead, or add the place to ALLOWED with why: '
    f'{unexplained}'
  )


def _baseline(path, method):
  return method == BASELINE and not path.startswith('tff_methods/')


def test_every_allowance_is_still_needed():
  used = {
    _allowance(path)[0]
    for path, method in named_methods()
    if not _baseline(path, method)
  }
  assert set(ALLOWED) <= used, sorted(set(ALLOWED) - used)


@pytest.mark.parametrize('place', sorted(ALLOWED))
def test_every_allowance_says_why(place):
  names, why = ALLOWED[place]
  assert why and (names == '*' or names <= set(OWNER))


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
