"""Tests for tff_methods_tooling.commands: a command named as this process
was started."""

import importlib.machinery
import sys
import types

import pytest

from tff_methods_tooling import commands


def _started_as(monkeypatch, module_name):
  main = types.ModuleType('__main__')
  main.__spec__ = (
    None
    if module_name is None
    else importlib.machinery.ModuleSpec(module_name, None)
  )
  monkeypatch.setitem(sys.modules, '__main__', main)


@pytest.mark.parametrize(
  'main, expected',
  [
    ('binaries.train', 'python -m binaries.device_check'),
    (
      'tff_methods_binaries.train',
      'python -m tff_methods_binaries.device_check',
    ),
    (None, 'tff-methods-device-check'),  # A console script.
    ('pytest.__main__', 'tff-methods-device-check'),  # Not a binary.
  ],
)
def test_a_command_is_named_as_this_process_was_started(
  monkeypatch, main, expected
):
  _started_as(monkeypatch, main)
  assert commands.command('device_check') == expected


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
