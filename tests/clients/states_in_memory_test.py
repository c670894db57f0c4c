"""Tests for tff_methods.clients.states_in_memory: client states kept in this
Python process are read and written by a round's TensorFlow in this
process, after the graph that traced it is gone, and a TFF worker refuses
the computations that read them."""

import gc
import os
import sys

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_methods.clients import client_states
from tff_methods.clients import states_in_memory
from tff_methods.execution import in_process
from tff_methods.execution import worker_compilation

INITIAL = dict(flag=np.int32(0), w=[np.zeros(2, np.float32)])


def _state(value):
  return dict(flag=np.int32(1), w=[np.full(2, value, np.float32)])


def _round_computation(files):
  """A client's reads and writes as TFF traces them: read the state before
  the round, write it plus one."""

  @tff.tensorflow.computation(tf.string, tf.int64)
  def client_round(client_id, round_num):
    state = files.read(client_id, round_num)
    new = dict(flag=tf.constant(1), w=[state['w'][0] + 1.0])
    with tf.control_dependencies([files.write(client_id, round_num, new)]):
      return tf.identity(state['w'][0])

  return client_round


def test_a_round_in_process_reads_and_writes_the_states_in_memory(tmp_path):
  files = client_states.ClientStateFiles(
    INITIAL, str(tmp_path / 'states'), in_memory=True
  )
  files.put('a', _state(4.0), round_num=1)
  client_round = _round_computation(files)
  # TFF's tracing graph held the numpy functions; the store keeps them.
  gc.collect()
  context = in_process.InProcessExecutionContext(['cpu:0'], fallback_fn=None)
  with tff.framework.get_context_stack().install(context):
    np.testing.assert_array_equal(client_round('a', 2), [4.0, 4.0])
    np.testing.assert_array_equal(client_round('a', 3), [5.0, 5.0])
    np.testing.assert_array_equal(client_round('new', 3), [0.0, 0.0])
  context.close()
  assert files.versions('a') == [1, 2, 3]
  assert files.get('a')['w'][0][0] == 6.0
  # Nothing reached the disk: the rounds wrote memory.
  assert not os.listdir(tmp_path / 'states')


def test_a_tff_worker_refuses_what_reads_states_in_memory(tmp_path):
  in_memory = client_states.ClientStateFiles(
    INITIAL, str(tmp_path / 'memory'), in_memory=True
  )
  on_disk = client_states.ClientStateFiles(INITIAL, str(tmp_path / 'disk'))
  assert worker_compilation.python_function_ops(
    _round_computation(in_memory)
  ) == {'PyFunc'}
  assert not worker_compilation.python_function_ops(_round_computation(on_disk))
  with pytest.raises(
    ValueError,
    match=r'calls back into this Python process \(PyFunc ops\), which a '
    r'TFF worker cannot run.*client_states_in_memory=False',
  ):
    worker_compilation.compile_for_simulation(_round_computation(in_memory))
  worker_compilation.compile_for_simulation(_round_computation(on_disk))


def test_a_state_file_that_does_not_parse_is_named_not_read(tmp_path):
  directory = tmp_path / 'states'
  files = client_states.ClientStateFiles(
    INITIAL, str(directory), in_memory=True
  )
  files.put('a', _state(1.0), round_num=1)
  files.put('b', _state(2.0), round_num=1)
  files.write_to_disk()
  path = os.path.join(files.client_dir('a'), '1.state')
  with open(path, 'r+b') as f:
    f.truncate(os.path.getsize(path) // 2)
  resumed = client_states.ClientStateFiles(
    INITIAL, str(directory), in_memory=True
  )
  # As the store on disk names it, before the round that would read it.
  on_disk = client_states.ClientStateFiles(INITIAL, str(directory))
  assert resumed.unreadable_files(['a', 'b'], 2) == [path]
  assert on_disk.unreadable_files(['a', 'b'], 2) == [path]
  assert resumed.unreadable_files(['a'], 1) == []  # Reads the initial state.
  assert resumed.get('b')['w'][0][0] == 2.0
  with pytest.raises(states_in_memory.UnreadableStateError, match=path):
    resumed.get('a')


def test_versions_are_kept_unsaved_until_saved():
  store = states_in_memory.StatesInMemory([np.zeros(2)])
  store.put('a', 1, [np.ones(2)])
  store.load('a', 0, [np.ones(2)])  # Read from disk: saved already.
  store.put('b', 2, [np.ones(2)])
  assert store.unsaved('a') == {1} and store.unsaved('b') == {2}
  store.remove('b', 2)
  assert store.unsaved('b') == set() and store.versions('b') == []
  store.saved()
  assert store.unsaved('a') == set() and store.versions('a') == [0, 1]
  for r in (2, 3, 5):
    store.put('a', r, [np.full(2, float(r))])
  store.prune('a', 4)  # What a resumption from round 4 reads: 3, then 5.
  assert store.versions('a') == [0, 3, 5]


def test_versions_beyond_the_budget_go_to_files_and_read_back():
  # Room for two versions of 16 bytes.
  store = states_in_memory.StatesInMemory(
    [np.zeros(4, np.float32)], budget_bytes=32
  )
  for r in (1, 2, 3, 4):
    store.put('a', r, [np.full(4, float(r), np.float32)])
  assert store.spilled == 2
  assert [store.get('a', r)[0][0] for r in (1, 2, 3, 4)] == [1, 2, 3, 4]
  # As a client's computation reads it: the newest, from its file.
  *arrays, version = store._read(b'a', np.int64(9))
  assert version == 4 and arrays[0][0] == 4.0
  store.remove('a', 1)  # Frees room in memory.
  store.put('a', 5, [np.full(4, 5.0, np.float32)])
  assert store.spilled == 2
  store.put('a', 4, [np.full(4, 6.0, np.float32)])  # Written again.
  assert store.get('a', 4)[0][0] == 6.0 and store.spilled == 2
  store.prune('a', 5)  # Keeps 5 only: every file removed.
  assert store.versions('a') == [5] and store.spilled == 0
  assert not os.listdir(store._spill_directory)


def test_by_default_half_the_available_memory_holds_arrays():
  available = states_in_memory.available_memory_bytes()
  # Linux's MemAvailable counts the reclaimable page cache: not below the
  # free pages.
  free = os.sysconf('SC_AVPHYS_PAGES') * os.sysconf('SC_PAGE_SIZE')
  assert available >= 0.9 * free
  budget = states_in_memory.StatesInMemory([np.zeros(2)]).budget_bytes
  assert budget == pytest.approx(available / 2, rel=0.1)


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
