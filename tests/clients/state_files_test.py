"""Tests for tff_methods.clients.state_files: a state as one file, the store's
file operations alike on disk and in memory, and where a store in memory
lives."""

import os
import subprocess
import sys
import tempfile

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


@pytest.fixture(params=['disk', 'memory'])
def root(request, tmp_path):
  if request.param == 'disk':
    yield str(tmp_path / 'states')
    return
  working = state_files.working_directory(1)
  yield working + '/states'
  state_files.remove_tree(working)


def test_versions_client_dirs_and_pruning_on_disk_and_in_memory(root):
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
  state_files.prune_directory(f'{root}/a.1', 3, own_initial_version=0)
  assert state_files.versions(f'{root}/a.1') == [0, 2, 4]
  state_files.remove(f'{root}/a.1/9.state.tmp')
  state_files.write_bytes(f'{root}/a.1/4.state', b'new')  # Replaced whole.
  assert state_files.read_bytes(f'{root}/a.1/4.state') == b'new'
  state_files.remove(f'{root}/a.1/4.state')
  state_files.remove(f'{root}/a.1/4.state')  # Gone already: no error.
  assert state_files.versions(f'{root}/a.1') == [0, 2]
  state_files.remove_tree(root)
  assert state_files.client_dirs(root) == []


def test_a_store_in_memory_works_in_shared_memory_where_it_has_room(tmp_path):
  shared = tmp_path / 'shm'
  shared.mkdir()
  room = os.statvfs(shared).f_bavail * os.statvfs(shared).f_frsize
  small = state_files.working_directory(1, shared_memory=str(shared))
  assert os.path.dirname(small) == str(shared) and os.path.isdir(small)
  # No room for ROOM_IN_VERSIONS versions, or no shared memory at all: the
  # temporary directory.
  for args in (
    (room // state_files.ROOM_IN_VERSIONS + 1, str(shared)),
    (1, str(tmp_path / 'none')),
  ):
    working = state_files.working_directory(*args)
    assert os.path.dirname(working) == tempfile.gettempdir()
    state_files.remove_tree(working)
  # Each store its own directory, named by its process.
  other = state_files.working_directory(1, shared_memory=str(shared))
  assert other != small
  assert os.path.basename(other).split('.')[1] == str(os.getpid())


def test_directories_of_ended_processes_are_removed(tmp_path):
  ended = subprocess.Popen(['true'])
  ended.wait()
  for pid in (ended.pid, os.getpid()):
    (tmp_path / f'tff_methods_states.{pid}.x').mkdir()
  (tmp_path / 'tff_methods_states.other').mkdir()  # Not a store's: kept.
  state_files.working_directory(1, shared_memory=str(tmp_path))
  left = {p.name for p in tmp_path.iterdir()}
  assert f'tff_methods_states.{ended.pid}.x' not in left
  assert {f'tff_methods_states.{os.getpid()}.x', 'tff_methods_states.other'} < (
    left
  )


def test_glob_characters_are_escaped():
  assert state_files.escape_glob('/runs[a]/x*?') == '/runs\\[a\\]/x\\*\\?'


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
