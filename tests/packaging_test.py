"""`pip install .` installs only tff_methods* names, and working commands.

The repository's `tasks`, `tooling` and `binaries` are installed as
`tff_methods_tasks`, `tff_methods_tooling` and `tff_methods_binaries`
(setup.py rewrites their imports); each binary is a console script.
"""

import configparser
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
import setup as project_setup

BINARIES = (
  'analyze',
  'benchmark',
  'compare',
  'device_check',
  'presets',
  'train',
  'tune',
  'worker',
)


def test_imports_and_commands_are_renamed():
  source = (
    'from tasks import datasets\n'
    'from tooling.presets import base\n'
    '  from binaries import runtime_flags\n'
    'import tff_methods\n'
    "msg = 'start it with python -m binaries.worker --port=8000'\n"
    'from tff_methods import tasks_like  # not a project package\n'
  )
  assert project_setup.rename_imports(source) == (
    'from tff_methods_tasks import datasets\n'
    'from tff_methods_tooling.presets import base\n'
    '  from tff_methods_binaries import runtime_flags\n'
    'import tff_methods\n'
    "msg = 'start it with tff-methods-worker --port=8000'\n"
    'from tff_methods import tasks_like  # not a project package\n'
  )


@pytest.fixture(scope='module')
def wheel(tmp_path_factory):
  out = tmp_path_factory.mktemp('wheel')
  # Built from a copy: a build writes build/ and *.egg-info/ where it runs.
  source = out / 'source'
  source.mkdir()
  for name in ('setup.py', 'pyproject.toml', 'README.md', 'LICENSE'):
    shutil.copy(os.path.join(REPO, name), source / name)
  for package in ('tff_methods', 'tasks', 'tooling', 'binaries'):
    shutil.copytree(
      os.path.join(REPO, package),
      source / package,
      ignore=shutil.ignore_patterns('__pycache__'),
    )
  subprocess.run(
    [
      sys.executable,
      '-m',
      'pip',
      'wheel',
      '--quiet',
      '--no-deps',
      '--no-build-isolation',
      '-w',
      str(out),
      str(source),
    ],
    cwd=str(out),
    check=True,
    capture_output=True,
    timeout=600,
  )
  (path,) = out.glob('tff_methods-*.whl')
  return path


def test_the_wheel_holds_only_tff_methods_names_and_every_command(wheel):
  with zipfile.ZipFile(wheel) as archive:
    names = archive.namelist()
    top = {
      n.split('/')[0]
      for n in names
      if not n.split('/')[0].endswith(('.dist-info', '.data'))
    }
    assert top == {
      'tff_methods',
      'tff_methods_tasks',
      'tff_methods_tooling',
      'tff_methods_binaries',
    }
    (entry_points,) = [n for n in names if n.endswith('entry_points.txt')]
    scripts = configparser.ConfigParser()
    scripts.read_string(archive.read(entry_points).decode())
    assert dict(scripts['console_scripts']) == {
      f'tff-methods-{b.replace("_", "-")}': f'tff_methods_binaries.{b}:run'
      for b in BINARIES
    }
    assert 'tff_methods/bind_address.c' in names  # Compiled on first use.
    (license_file,) = [n for n in names if n.endswith('LICENSE')]
    assert b'Apache License' in archive.read(license_file)
    # No installed module imports a generic top-level name.
    for name in names:
      if name.endswith('.py'):
        source = archive.read(name).decode()
        assert not re.search(
          r'^\s*(from|import) (tasks|tooling|binaries)\b', source, re.MULTILINE
        ), name
        assert 'python -m binaries' not in source, name


@pytest.mark.slow
def test_a_fresh_install_runs_its_commands(wheel, tmp_path):
  venv = tmp_path / 'venv'
  subprocess.run(
    [sys.executable, '-m', 'venv', '--without-pip', str(venv)],
    check=True,
    timeout=300,
  )
  python = str(venv / 'bin' / 'python')
  site = subprocess.run(
    [
      python,
      '-c',
      'import sysconfig; ' "print(sysconfig.get_paths()['purelib'])",
    ],
    check=True,
    capture_output=True,
    text=True,
  ).stdout.strip()
  # The dependencies from this environment; the project only from the wheel.
  with open(os.path.join(site, 'dependencies.pth'), 'w') as f:
    f.write(sysconfig.get_paths()['purelib'] + '\n')
  subprocess.run(
    [
      sys.executable,
      '-m',
      'pip',
      '--python',
      python,
      'install',
      '--quiet',
      '--no-deps',
      str(wheel),
    ],
    check=True,
    timeout=600,
    capture_output=True,
  )
  run = lambda *args: subprocess.run(
    [str(venv / 'bin' / args[0]), *args[1:]],
    cwd=str(tmp_path),
    capture_output=True,
    text=True,
    timeout=600,
    check=False,
  )
  result = run('tff-methods-presets', '--paper=fedcos')
  assert result.returncode == 0, result.stderr
  assert 'fedcos_table1_totally' in result.stdout
  result = run(
    'tff-methods-train',
    '--task=digits',
    '--model=mlp',
    '--num_clients=4',
    '--clients_per_round=2',
    '--rounds=1',
    '--noprogress',
    f'--output_dir={tmp_path / "run"}',
  )
  assert result.returncode == 0, result.stderr
  assert 'fedavg on digits: round 1' in result.stdout
  result = run('tff-methods-train', '--preset=nope')
  assert 'tff-methods-presets' in result.stderr  # The installed command.
  # --help from a console script: the docstring and every flag, exit 0.
  result = run('tff-methods-train', '--help')
  assert result.returncode == 0, result.stderr
  assert 'Trains one federated method on one task.' in result.stdout
  for flag in (
    '--[no]progress',
    '--method',
    '--client_learning_rate',
    '--tff_workers',
  ):
    assert flag in result.stdout


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
