"""`pip install .` installs the repository's own files under tff_methods*
names, with working commands.

The repository's `tasks`, `tooling` and `binaries` are the packages
`tff_methods_tasks`, `tff_methods_tooling` and `tff_methods_binaries`
(pyproject.toml's package-dir), in the repository and installed alike; each
binary is also a console script.
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
# Installed package -> its directory in the repository.
PACKAGE_DIRS = {
  'tff_methods': 'tff_methods',
  'tff_methods_tasks': 'tasks',
  'tff_methods_tooling': 'tooling',
  'tff_methods_binaries': 'binaries',
}

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


@pytest.fixture(scope='module')
def wheel(tmp_path_factory):
  out = tmp_path_factory.mktemp('wheel')
  # Built from a copy: a build writes build/ and *.egg-info/ where it runs.
  source = out / 'source'
  source.mkdir()
  for name in ('pyproject.toml', 'README.md', 'LICENSE'):
    shutil.copy(os.path.join(REPO, name), source / name)
  for package in PACKAGE_DIRS.values():
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
    assert (
      'tff_methods/execution/bind_address.c' in names
    )  # Compiled on first use.
    (license_file,) = [n for n in names if n.endswith('LICENSE')]
    assert b'Apache License' in archive.read(license_file)


def test_the_wheel_holds_the_repositorys_files_byte_for_byte(wheel):
  with zipfile.ZipFile(wheel) as archive:
    installed = {
      n: archive.read(n)
      for n in archive.namelist()
      if n.split('/')[0] in PACKAGE_DIRS
    }
  repository = {}
  for package, directory in PACKAGE_DIRS.items():
    for root, dirs, files in os.walk(os.path.join(REPO, directory)):
      dirs[:] = [d for d in dirs if d != '__pycache__']
      for name in files:
        if name.endswith(('.py', '.c')):
          path = os.path.join(root, name)
          inside = os.path.relpath(path, os.path.join(REPO, directory))
          with open(path, 'rb') as f:
            repository[f'{package}/{inside}'] = f.read()
  assert sorted(installed) == sorted(repository)
  for name, content in installed.items():
    assert content == repository[name], name


def test_the_repository_imports_its_packages_by_their_installed_names():
  # A module imported as both `tasks.x` and `tff_methods_tasks.x` would be
  # two modules with two states.
  generic = re.compile(r'\b(from|import) (tasks|tooling|binaries)\b')
  for directory in (*PACKAGE_DIRS.values(), 'tests'):
    for root, dirs, files in os.walk(os.path.join(REPO, directory)):
      dirs[:] = [d for d in dirs if d != '__pycache__']
      for name in files:
        if name.endswith('.py'):
          with open(os.path.join(root, name)) as f:
            assert not generic.search(f.read()), os.path.join(root, name)


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
