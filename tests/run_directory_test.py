"""Tests for tff_methods_tooling.run_directory's path that TensorFlow reads
literally.

The directory's lock and saved settings are tested with the runs that use
them (training_loop_test, faults_test).
"""

import os
import sys

import pytest
import tensorflow as tf

from tff_methods_tooling import run_directory


def _saved_variable(directory):
  module = tf.Module()
  module.v = tf.Variable([1.0, 2.0])
  tf.saved_model.save(module, directory)


def test_a_directory_named_like_a_file_pattern_is_read_through_a_link(
  tmp_path,
):
  plain = str(tmp_path / 'plain')
  assert run_directory.tensorflow_path(plain) == plain
  named = str(tmp_path / 'a[1]*?')
  link = run_directory.tensorflow_path(named)
  assert link != named and not set('[]*?') & set(link)
  assert os.path.realpath(link) == os.path.realpath(named)  # Made, linked.
  assert run_directory.tensorflow_path(named) == link  # The same each time.
  # What the link is for: TensorFlow does not find variables saved under
  # the pattern-like name, and does through the link.
  _saved_variable(os.path.join(named, 'model'))
  with pytest.raises(Exception, match='matching files'):
    tf.saved_model.load(os.path.join(named, 'model'))
  loaded = tf.saved_model.load(os.path.join(link, 'model'))
  assert loaded.v.numpy().tolist() == [1.0, 2.0]


def test_a_link_left_by_another_directory_is_replaced(tmp_path):
  named = str(tmp_path / 'b[2]')
  link = run_directory.tensorflow_path(named)
  os.remove(link)
  os.symlink(str(tmp_path), link)  # Stale: leads elsewhere.
  assert run_directory.tensorflow_path(named) == link
  assert os.path.realpath(link) == os.path.realpath(named)


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
