"""Tests for tff_methods.clients.state_files: a state as one file, which
version a client reads, what pruning keeps, and the store's file
operations."""

import sys

import numpy as np
import pytest
import tensorflow as tf

from tff_methods.clients import state_files


def test_a_state_parses_back_to_its_arrays():
  state = dict(flag=np.int32(3), w=[np.arange(4.0), np.ones((2, 3), np.int64)])
  parsed = state_files.parse_state(state_files.serialize_state(state), state)
  assert parsed['flag'].numpy() == 3
  np.testing.assert_array_equal(parsed['w'][0].numpy(), np.arange(4.0))
  assert parsed['w'][1].dtype == tf.int64 and parsed['w'][1].shape == (2, 3)
  # A template of another shape is refused, not reshaped.
  with pytest.raises(tf.errors.InvalidArgumentError):
    state_files.parse_state(
      state_files.serialize_state(state),
      dict(state, flag=np.zeros(2, np.int32)),
    )


def test_versions_client_dirs_and_pruning(tmp_path):
  root = str(tmp_path / 'states')
  for client, versions in (('a.1', (0, 1, 2, 4)), ('a.12', (3,))):
    tf.io.gfile.makedirs(f'{root}/{client}')
    for v in versions:
      state_files.write_bytes(f'{root}/{client}/{v}.state', b'x')
  state_files.write_bytes(f'{root}/initial.state', b'i')
  # Only versions count: not `a.12`'s, nor a write's temporary file.
  state_files.write_bytes(f'{root}/a.1/9.state.tmp', b'x')
  assert state_files.versions(f'{root}/a.1') == [0, 1, 2, 4]
  assert state_files.versions(f'{root}/a.12') == [3]
  assert state_files.versions(f'{root}/none') == []
  assert sorted(state_files.client_dirs(root)) == ['a.1', 'a.12']
  # Keeps what a resumption from round 3 reads (2), and later ones (4), and
  # the client's own initial state (0).
  state_files.prune_directory(f'{root}/a.1', 3)
  assert state_files.versions(f'{root}/a.1') == [0, 2, 4]
  state_files.remove(f'{root}/a.1/9.state.tmp')
  state_files.write_bytes(f'{root}/a.1/4.state', b'new')  # Replaced whole.
  assert state_files.read_bytes(f'{root}/a.1/4.state') == b'new'
  state_files.remove(f'{root}/a.1/4.state')
  state_files.remove(f'{root}/a.1/4.state')  # Gone already: no error.
  assert state_files.versions(f'{root}/a.1') == [0, 2]


def test_a_client_reads_its_newest_version_before_the_round():
  own, initial = state_files.OWN_INITIAL_VERSION, state_files.INITIAL_VERSION
  assert state_files.readable_version([], 5) == initial
  assert state_files.readable_version([1, 3], 3) == 1  # Not round 3's own.
  assert state_files.readable_version([1, 3], 4) == 3
  # Its own initial state from the second round on.
  assert state_files.readable_version([own], 1) == initial
  assert state_files.readable_version([own], 2) == own
  assert state_files.readable_version([own, 2], 7) == 2


def test_pruning_keeps_what_a_resumption_reads():
  own = state_files.OWN_INITIAL_VERSION
  assert state_files.versions_to_prune([own, 1, 2, 4], 3) == [1]
  assert state_files.versions_to_prune([own, 1, 2, 4], 4) == [1, 2]
  assert state_files.versions_to_prune([4, 1, 2], 9) == [1, 2]  # Unsorted.
  assert state_files.versions_to_prune([5], 3) == []


def test_glob_characters_are_escaped():
  assert state_files.escape_glob('/runs[a]/x*?') == '/runs\\[a\\]/x\\*\\?'


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
