"""Tests for tff_methods.clients.client_states: the client-state store reads the
right state or says why not.

Which version a client reads and which are discarded or pruned, by round;
glob characters in the directory, the version each client read (checked by
the training loop after each round), each run's own directory under a
shared `--client_state_dir`, and pruning under TFF's program logic.
"""

import asyncio
import os
import sys

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_methods.clients import client_states
from tff_methods.clients import state_files
from tff_methods.execution import runtime
from tff_methods_tasks import datasets
from tff_methods_tooling import comparison
from tff_methods_tooling import experiment

INITIAL = dict(flag=np.int32(0), w=[np.zeros(2), np.zeros((1, 2))])


def _state(value):
  return dict(flag=np.int32(1), w=[np.full(2, value), np.full((1, 2), value)])


@pytest.mark.parametrize('name', ['runs[a]', 'star*', 'what?', 'back\\slash'])
def test_glob_characters_in_the_directory_match_nothing_else(tmp_path, name):
  files = client_states.ClientStateFiles(INITIAL, str(tmp_path / name))
  files.put('a', _state(1.0), round_num=1)
  files.put('a', _state(3.0), round_num=3)
  # A neighbour whose name the unescaped pattern would also match.
  neighbour = client_states.ClientStateFiles(INITIAL, str(tmp_path / 'runsa'))
  neighbour.put('a', _state(9.0), round_num=2)

  def read(round_num):
    state, version = files.read_with_version(
      tf.constant('a'), tf.constant(round_num, tf.int64)
    )
    return float(state['w'][0][0]), int(version)

  assert read(2) == (1.0, 1)  # the last round's version, found by name
  assert read(3) == (1.0, 1)  # by listing the client's versions
  assert read(4) == (3.0, 3)
  assert read(1) == (0.0, client_states.INITIAL_VERSION)


def test_the_version_read_is_what_python_expects(tmp_path):
  files = client_states.ClientStateFiles(INITIAL, str(tmp_path / 'states'))
  files.put('a', _state(7.0), client_states.OWN_INITIAL_VERSION)
  files.put('a', _state(2.0), round_num=2)
  for round_num in (1, 2, 3, 5):
    _, version = files.read_with_version(
      tf.constant('a'), tf.constant(round_num, tf.int64)
    )
    assert int(version) == files.expected_read_version('a', round_num)
  assert [files.expected_read_version('a', r) for r in (1, 2, 3)] == [
    client_states.INITIAL_VERSION,
    client_states.OWN_INITIAL_VERSION,
    2,
  ]


def _config(tmp_path, name, **settings):
  return experiment.ExperimentConfig(
    **{
      'method': 'moon',
      'task': 'digits',
      'model': 'fedcka_cnn',
      'num_clients': 4,
      'clients_per_round': 2,
      'rounds': 3,
      'batch_size': 32,
      'seed': 1,
      'output_dir': str(tmp_path / name),
      'cache_dir': str(tmp_path / 'cache'),
      **settings,
    }
  )


@pytest.mark.usefixtures('tff_worker')
def test_the_loop_refuses_a_round_whose_clients_read_other_versions(
  tmp_path, monkeypatch
):
  # As if a shared file system's listing were stale: Python expects the
  # clients to read versions their TensorFlow did not find.
  monkeypatch.setattr(
    client_states.ClientStateFiles,
    'expected_read_version',
    lambda self, client_id, round_num: round_num - 1,
  )
  with pytest.raises(
    RuntimeError, match='read other versions of their ' 'state'
  ):
    experiment.run(_config(tmp_path, 'stale'), progress=False)


def test_runs_sharing_a_state_directory_keep_their_own(tmp_path):
  base = _config(tmp_path, 'unused', client_state_dir=str(tmp_path / 'st'))
  configs = comparison.plan(
    base, ['moon', 'fedcka'], [0, 1], str(tmp_path / 'cmp')
  )
  directories = [c.hyperparameters().client_state_dir for c in configs]
  assert len(set(directories)) == 4
  assert all(os.path.dirname(d) == str(tmp_path / 'st') for d in directories)
  # The same run finds its directory again (it resumes from it).
  assert configs[0].hyperparameters().client_state_dir == directories[0]


def test_a_directory_holding_another_runs_states_is_refused(tmp_path):
  state_files.claim_directory(str(tmp_path / 'st'), 'runs/moon')
  state_files.claim_directory(str(tmp_path / 'st'), 'runs/moon')  # itself
  with pytest.raises(
    ValueError, match=r'holds the states of another run ' r'\(runs/moon\)'
  ):
    state_files.claim_directory(str(tmp_path / 'st'), 'runs/fedcka')
  # A run moved elsewhere (its old path is gone) is told how to keep its
  # states, not only to remove them.
  owner = tmp_path / 'st' / state_files.OWNER_FILE
  with pytest.raises(ValueError) as refused:
    state_files.claim_directory(str(tmp_path / 'st'), str(tmp_path / 'b'))
  assert f'write {tmp_path / "b"} into {owner} to keep its states' in str(
    refused.value
  )
  # An owner file a crash left empty is claimed, not refused.
  owner.write_text('')
  state_files.claim_directory(str(tmp_path / 'st'), 'runs/fedcka')
  assert owner.read_text().strip() == 'runs/fedcka'


@pytest.mark.usefixtures('tff_worker')
def test_overlapping_saves_run_one_after_the_other(tmp_path):
  # train_model saves in background tasks; TFF's file manager removes old
  # versions on each save, so two at once would remove one twice.
  class SlowManager(tff.program.ProgramStateManager):
    def __init__(self):
      self.running, self.most_at_once, self.saved = 0, 0, []

    async def get_versions(self):
      return self.saved or None

    async def load(self, version, structure):
      raise NotImplementedError

    async def save(self, program_state, version):
      self.running += 1
      self.most_at_once = max(self.most_at_once, self.running)
      await asyncio.sleep(0.01)
      self.saved.append(version)
      self.running -= 1

  inner = SlowManager()
  files = client_states.ClientStateFiles(
    dict(w=np.zeros(2, np.float32)), str(tmp_path)
  )
  manager = client_states.PruningProgramStateManager(inner, files)

  async def three_saves():
    await asyncio.gather(*(manager.save({}, v) for v in (1, 2, 3)))

  asyncio.new_event_loop().run_until_complete(three_saves())
  assert inner.most_at_once == 1
  assert inner.saved == [1, 2, 3]
  # A program run in another event loop saves too.
  asyncio.new_event_loop().run_until_complete(manager.save({}, 4))
  assert inner.saved[-1] == 4


def test_pruning_under_train_model_keeps_the_directory_bounded(tmp_path):
  config = _config(tmp_path, 'program', method='fedcka', rounds=6)
  data = experiment.load_data(config)
  process, _ = experiment.build_process(config, data)
  manager = client_states.PruningProgramStateManager(
    tff.program.FileProgramStateManager(str(tmp_path / 'program_state')),
    process.client_states,
  )
  initial = process.initialize()  # Outside the program's async context.
  with tff.framework.get_context_stack().install(
    runtime.create_program_context()
  ):
    asyncio.new_event_loop().run_until_complete(
      tff.learning.programs.train_model(
        train_process=process,
        initial_train_state=initial,
        train_data_source=datasets.ClientRoundDataSource(
          data.client_data.client_ids, seed=1
        ),
        train_per_round_clients=2,
        train_total_rounds=6,
        program_state_manager=manager,
        model_output_manager=tff.program.MemoryReleaseManager(),
        evaluation_manager=None,
        evaluation_periodicity=1,
      )
    )
  versions = {
    c: process.client_states.versions(c) for c in data.client_data.client_ids
  }
  # 6 rounds of 2 of 4 clients: 12 versions written; after each save only
  # each client's newest is kept.
  assert all(len(v) <= 1 for v in versions.values()), versions
  assert sum(len(v) for v in versions.values()) == 4
  assert max(max(v) for v in versions.values()) == 6


@pytest.mark.parametrize('in_memory', [False, True])
def test_a_client_reads_its_newest_version_written_before_the_round(
  tmp_path, in_memory
):
  files = client_states.ClientStateFiles(
    INITIAL, str(tmp_path / 'states'), in_memory=in_memory
  )
  files.put('a', _state(1.0), round_num=1)
  files.put('a', _state(3.0), round_num=3)
  files.put('b', _state(2.0), round_num=2)

  @tf.function
  def read(client_id, round_num):
    return files.read(tf.constant(client_id), tf.constant(round_num, tf.int64))

  # In TensorFlow, as the client computation reads it.
  assert read('a', 1)['flag'].numpy() == 0  # nothing before round 1
  assert read('a', 2)['w'][0].numpy()[0] == 1.0
  assert read('a', 3)['w'][0].numpy()[0] == 1.0  # round 3's own: not read
  assert read('a', 4)['w'][0].numpy()[0] == 3.0  # the last round's
  assert read('a', 9)['w'][0].numpy()[0] == 3.0
  assert read('b', 3)['w'][1].numpy()[0, 0] == 2.0
  assert read('new', 5)['flag'].numpy() == 0
  # Python sees the same.
  assert files.get('a', before_round=3)['w'][0][0] == 1.0
  assert files.get('a')['w'][0][0] == 3.0
  assert 'a' in files and 'new' not in files


@pytest.mark.parametrize('in_memory', [False, True])
def test_written_versions_are_discarded_and_pruned_by_round(
  tmp_path, in_memory
):
  files = client_states.ClientStateFiles(
    INITIAL, str(tmp_path / 'states'), in_memory=in_memory
  )
  for r in (1, 2, 4, 5):
    files.put('a', _state(float(r)), round_num=r)
  files.discard(['a'], 5)  # a rejected round
  assert files.versions('a') == [1, 2, 4]
  # A resumption from round 3 reads version 2; from round 4 on, version 4.
  files.prune(['a'], checkpoint_round=3)
  assert files.versions('a') == [2, 4]
  files.prune(['a'], checkpoint_round=4)
  assert files.versions('a') == [4]


@pytest.mark.parametrize('in_memory', [False, True])
def test_own_initial_state_is_read_from_the_second_round_on(
  tmp_path, in_memory
):
  files = client_states.ClientStateFiles(
    INITIAL, str(tmp_path / 'states'), in_memory=in_memory
  )
  files.put('a', _state(7.0), client_states.OWN_INITIAL_VERSION)
  read = lambda r: files.read(tf.constant('a'), tf.constant(r, tf.int64))
  assert read(1)['flag'].numpy() == 0
  assert read(2)['w'][0].numpy()[0] == 7.0


@pytest.mark.parametrize('in_memory', [False, True])
def test_clients_never_share_a_directory(tmp_path, in_memory):
  files = client_states.ClientStateFiles(
    INITIAL, str(tmp_path / 'states'), in_memory=in_memory
  )
  files.put('a/b', _state(1.0), 1)
  files.put('a_b', _state(2.0), 1)
  assert files.get('a/b')['w'][0][0] == 1.0
  assert files.get('a_b')['w'][0][0] == 2.0


@pytest.mark.parametrize('in_memory', [False, True])
def test_a_version_written_again_replaces_the_first(tmp_path, in_memory):
  # A round run again (retried) writes its version again: the next round
  # reads the second write, whole.
  files = client_states.ClientStateFiles(
    INITIAL, str(tmp_path / 'states'), in_memory=in_memory
  )
  for v in (2.0, 5.0):
    files.write(tf.constant('a'), tf.constant(2, tf.int64), _state(v))
  read = files.read(tf.constant('a'), tf.constant(3, tf.int64))
  assert read['w'][0].numpy()[0] == 5.0
  assert files.get('a')['w'][0][0] == 5.0


def test_states_in_memory_reach_the_disk_with_each_checkpoint(tmp_path):
  directory = tmp_path / 'states'
  files = client_states.ClientStateFiles(
    INITIAL, str(directory), in_memory=True
  )
  files.put('a', _state(1.0), round_num=1)
  write = lambda r, v: files.write(
    tf.constant('a'), tf.constant(r, tf.int64), _state(v)
  )
  write(2, 2.0)  # As a client computation writes it.
  # Nothing on disk yet: the rounds read and write memory.
  assert not state_files.has_client_states(str(directory))
  files.write_to_disk()
  [client_dir] = [d for d in os.listdir(directory) if d != 'initial.state']
  assert sorted(os.listdir(directory / client_dir)) == ['1.state', '2.state']
  # A round run again after a rejection rewrites its version on disk too.
  files.discard(['a'], 2)
  assert os.listdir(directory / client_dir) == ['1.state']
  write(2, 5.0)
  write(3, 3.0)
  files.write_to_disk()
  assert sorted(os.listdir(directory / client_dir)) == [
    '1.state',
    '2.state',
    '3.state',
  ]
  files.prune(['a'], checkpoint_round=2)  # Memory and disk alike.
  assert files.versions('a') == [2, 3]
  assert sorted(os.listdir(directory / client_dir)) == ['2.state', '3.state']
  # A new store (a resumed run) starts from the disk, not from memory.
  write(4, 4.0)
  resumed = client_states.ClientStateFiles(
    INITIAL, str(directory), in_memory=True
  )
  assert resumed.versions('a') == [2, 3]
  assert resumed.get('a', before_round=3)['w'][0][0] == 5.0
  read = resumed.read(tf.constant('a'), tf.constant(9, tf.int64))
  assert read['w'][1].numpy()[0, 0] == 3.0


def test_files_reject_states_of_another_shape():
  files = client_states.ClientStateFiles(INITIAL)
  with pytest.raises(ValueError, match="State of client 'a' has 1 tensors"):
    files.put('a', dict(flag=np.int32(1)), 1)


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
