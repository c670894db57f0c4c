"""Tests for binaries/benchmark_flags.py: the benchmark's own flag checks."""

import sys

from absl import flags
from absl.testing import flagsaver
import pytest

from tff_methods_binaries import benchmark_flags


@pytest.fixture(autouse=True)
def parsed_flags():
  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()


def test_a_cross_device_model_without_z_is_refused_for_moon_only():
  # MOON reads the projection head `z`; FedCKA reads the first layers, which
  # the MLP has.
  with flagsaver.flagsaver(
    cross_device_methods=['fedavg', 'moon'], cross_device_model='mlp'
  ):
    errors = benchmark_flags.check()
  assert any(
    "--cross_device_model='mlp' has no projection head, which moon" in e
    for e in errors
  ), errors
  with flagsaver.flagsaver(
    cross_device_methods=['fedavg', 'fedcka'], cross_device_model='mlp'
  ):
    assert benchmark_flags.check() == []
  with flagsaver.flagsaver(
    cross_device_methods=['moon'], cross_device_model='fedcka_cnn'
  ):
    assert benchmark_flags.check() == []


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
