"""Tests for binaries/expected_errors.py: how the binaries end on failures."""

import sys

import pytest

from tff_methods_binaries import expected_errors
from tff_methods_tasks import datasets
from tff_methods_tooling import comparison


@pytest.mark.parametrize(
  'error',
  [
    datasets.DataUnavailableError("Could not load 'cifar10' (no network)."),
    comparison.RunFailedError('moon seed 1 failed: ValueError: bad.'),
  ],
)
def test_an_expected_failure_ends_in_one_line(error, capsys):
  def main(argv):
    del argv
    raise error

  assert expected_errors.one_line_errors(main)(['train']) == 1
  err = capsys.readouterr().err
  assert err.count('\n') == 1 and 'Traceback' not in err
  assert err.startswith(type(error).__name__ + ': ')


def test_an_unexpected_failure_keeps_its_traceback():
  def main(argv):
    del argv
    raise KeyError('a bug')

  with pytest.raises(KeyError):
    expected_errors.one_line_errors(main)(['train'])


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
