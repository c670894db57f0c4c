"""Tests for tff_methods_tooling.training_loop and
tff_methods_tooling.experiment."""

import collections
import csv
import dataclasses
import json
import os
import sys

import numpy as np
import pytest

from tff_methods.templates import model_lib
from tff_methods_tasks import models
from tff_methods_tooling import experiment
from tff_methods_tooling import run_directory
from tff_methods_tooling import training_loop

pytestmark = pytest.mark.usefixtures('tff_worker')


class Interrupted(Exception):
  pass


def _config(tmp_path, name, **overrides):
  values = dict(
    method='fedavgm',
    task='digits',
    model='mlp',
    num_clients=4,
    clients_per_round=2,
    rounds=4,
    batch_size=32,
    client_learning_rate=0.05,
    seed=3,
    output_dir=str(tmp_path / name),
    cache_dir=str(tmp_path / 'cache'),
  )
  values.update(overrides)
  return experiment.ExperimentConfig(**values)


def _metric_rows(output_dir):
  with open(os.path.join(output_dir, 'metrics.csv')) as f:
    rows = list(csv.DictReader(f))
  for row in rows:
    row.pop('seconds')
  return rows


def test_interrupted_and_resumed_run_equals_uninterrupted(tmp_path):
  whole = experiment.run(_config(tmp_path, 'whole'), progress=False)

  def interrupt_after_round_2(round_num, metrics):
    del metrics
    if round_num == 2:
      raise Interrupted()

  config = _config(tmp_path, 'resumed')
  with pytest.raises(Interrupted):
    experiment.run(config, progress=False, round_hook=interrupt_after_round_2)
  assert len(_metric_rows(config.output_dir)) == 2
  resumed_rounds = []
  resumed = experiment.run(
    config,
    progress=False,
    round_hook=lambda round_num, _: resumed_rounds.append(round_num),
  )
  assert resumed_rounds == [3, 4]  # Rounds 1-2 were not redone.
  np.testing.assert_allclose(
    model_lib.flat_trainable(resumed['final_weights']),
    model_lib.flat_trainable(whole['final_weights']),
    rtol=1e-5,
    atol=1e-6,
  )
  whole_rows = _metric_rows(str(tmp_path / 'whole'))
  resumed_rows = _metric_rows(config.output_dir)
  assert [r['round'] for r in resumed_rows] == ['1', '2', '3', '4']
  for a, b in zip(whole_rows, resumed_rows):
    for key in a:
      np.testing.assert_allclose(
        float(a[key]), float(b[key]), rtol=1e-4, err_msg=key
      )

  # A larger --rounds extends the finished run.
  extended_rounds = []
  experiment.run(
    dataclasses.replace(config, rounds=5),
    progress=False,
    round_hook=lambda r, _: extended_rounds.append(r),
  )
  assert extended_rounds == [5]
  assert len(_metric_rows(config.output_dir)) == 5


def test_a_run_in_a_directory_named_like_a_file_pattern_resumes(tmp_path):
  # TensorFlow reads a checkpoint's path as a file pattern; the run reaches
  # its program state by a link (`run_directory.tensorflow_path`). SCAFFOLD:
  # its clients' state files live under the directory too.
  settings = dict(method='scaffold', rounds=2)
  whole = experiment.run(_config(tmp_path, 'whole', **settings), progress=False)

  def interrupt_after_round_1(round_num, metrics):
    del metrics
    if round_num == 1:
      raise Interrupted()

  config = _config(tmp_path, 'a[1]*?', **settings)
  experiment.validate(config)
  with pytest.raises(Interrupted):
    experiment.run(config, progress=False, round_hook=interrupt_after_round_1)
  resumed_rounds = []
  resumed = experiment.run(
    config,
    progress=False,
    round_hook=lambda round_num, _: resumed_rounds.append(round_num),
  )
  assert resumed_rounds == [2]  # Round 1's checkpoint was found and read.
  np.testing.assert_allclose(
    model_lib.flat_trainable(resumed['final_weights']),
    model_lib.flat_trainable(whole['final_weights']),
    rtol=1e-5,
    atol=1e-6,
  )
  saved = os.listdir(os.path.join(config.output_dir, 'program_state'))
  assert 'program_state_2' in saved
  assert os.listdir(os.path.join(config.output_dir, 'client_states'))


def test_output_dir_of_another_experiment_is_refused(tmp_path):
  run_directory.check_experiment_config(
    str(tmp_path), dict(method='fedavg', mu=0.1, rounds=3)
  )
  # Changing only the number of rounds is allowed (it extends the run).
  run_directory.check_experiment_config(
    str(tmp_path), dict(method='fedavg', mu=0.1, rounds=9)
  )
  with pytest.raises(
    ValueError,
    match=r'different experiment \(method: '
    r"saved 'fedavg', now 'fedprox'; mu: saved 0.1, now 0.2",
  ):
    run_directory.check_experiment_config(
      str(tmp_path), dict(method='fedprox', mu=0.2, rounds=3)
    )


def test_a_setting_the_saved_config_lacks_is_taken_at_its_default(tmp_path):
  run_directory.check_experiment_config(str(tmp_path), dict(method='fedavg'))
  # A run saved before `aggregator` existed resumes with the default...
  run_directory.check_experiment_config(
    str(tmp_path),
    dict(method='fedavg', aggregator='mean'),
    defaults=dict(aggregator='mean'),
  )
  # ... and is refused with another value (the config now records it).
  with pytest.raises(ValueError, match="aggregator: saved 'mean', now 'dp'"):
    run_directory.check_experiment_config(
      str(tmp_path),
      dict(method='fedavg', aggregator='dp'),
      defaults=dict(aggregator='mean'),
    )


def test_diverged_round_is_rejected_and_the_model_kept(tmp_path):
  config = _config(
    tmp_path,
    'diverged',
    method='fedavg',
    rounds=2,
    client_learning_rate=1e30,
    client_momentum=0.0,
  )
  results = experiment.run(config, progress=False)
  assert results['rejected_rounds'] == 2
  rows = _metric_rows(config.output_dir)
  assert [r['rejected'] for r in rows] == ['1', '1']
  # No client trained: no made-up loss or accuracy.
  assert all(r['client_work/train/loss'] == 'nan' for r in rows)
  assert all(
    r['client_work/train/sparse_categorical_accuracy'] == 'nan' for r in rows
  )
  keras_model_fn = lambda: models.get_model('mlp', 10, (8, 8, 1))
  np.testing.assert_array_equal(
    model_lib.flat_trainable(results['final_weights']),
    model_lib.flat_trainable(model_lib.initial_weights(keras_model_fn, 3)),
  )


class _NonFiniteProcess:
  """A stand-in process whose server rule returns NaN weights in round 2."""

  Output = collections.namedtuple('Output', ['state', 'metrics'])

  def initialize(self):
    return np.zeros(2)

  def set_model_weights(self, state, weights):
    del state
    return np.asarray(weights.trainable[0], np.float64)

  def get_model_weights(self, state):
    return model_lib.tff.learning.models.ModelWeights([state], [])

  def next(self, state, client_ids):
    del client_ids
    new = state + 1.0 if state[0] < 1 else state * np.nan
    return self.Output(new, collections.OrderedDict())


def test_non_finite_global_model_is_rejected(tmp_path):
  results = training_loop.run_training(
    _NonFiniteProcess(),
    ['a', 'b'],
    1,
    3,
    str(tmp_path),
    model_lib.tff.learning.models.ModelWeights([np.zeros(2)], []),
    progress=False,
  )
  assert results['rejected_rounds'] == 2
  np.testing.assert_array_equal(
    results['final_weights'].trainable[0], [1.0, 1.0]
  )


def test_a_save_a_kill_interrupted_is_cleaned_up_on_resume(tmp_path):
  def run(rounds):
    return training_loop.run_training(
      _NonFiniteProcess(),
      ['a'],
      1,
      rounds,
      str(tmp_path),
      model_lib.tff.learning.models.ModelWeights([np.zeros(2)], []),
      progress=False,
    )

  run(1)
  root = tmp_path / 'program_state'
  saved = sorted(os.listdir(root))
  # What a kill mid-save leaves: TFF's temporary copy of the next version.
  (root / f'{saved[0].rsplit("_", 1)[0]}_2_temp1234' / 'variables').mkdir(
    parents=True
  )
  assert run(2)['rounds'] == 2
  assert not [n for n in os.listdir(root) if '_temp' in n]


def test_the_loop_leaves_the_threads_event_loop_usable(tmp_path):
  # TFF's own run_training_process calls asyncio.get_event_loop(), which
  # fails once asyncio.run() has cleared the thread's loop.
  training_loop.run_training(
    _NonFiniteProcess(),
    ['a'],
    1,
    1,
    str(tmp_path),
    model_lib.tff.learning.models.ModelWeights([np.zeros(2)], []),
    progress=False,
  )
  import asyncio

  assert asyncio.get_event_loop_policy().get_event_loop() is not None


def test_a_damaged_experiment_json_is_named(tmp_path):
  path = tmp_path / run_directory.CONFIG_FILE
  for content in ('{"rounds": 3, "seed"', '[1, 2]'):
    path.write_text(content)
    with pytest.raises(ValueError, match=rf"{path} is not a run's settings"):
      run_directory.experiment_config_differences(str(tmp_path), {'seed': 0})


def test_bad_settings_are_all_named_before_any_work(tmp_path):
  config = _config(
    tmp_path,
    'bad',
    method='fedmagic',
    alpha=0.0,
    clients_per_round=9,
    mu=-1.0,
    model='lenet7',
  )
  with pytest.raises(ValueError) as error:
    experiment.run(config)
  message = str(error.value)
  for expected in (
    "--method='fedmagic': Unknown method",
    '--alpha=0.0 must be > 0',
    '--clients_per_round=9 must be in [1, --num_clients=4]',
    '--mu=-1.0 must be >= 0',
    "--model='lenet7' is unknown",
  ):
    assert expected in message
  assert not os.path.exists(config.output_dir)


def test_partition_leaving_a_client_empty_is_refused(tmp_path):
  config = _config(tmp_path, 'empty', partition='iid', clients_per_round=2)
  # 2000 clients for the 1438 digits training examples cannot all get data.
  with pytest.raises(
    ValueError, match='num_clients=2000 is more than the ' '1438 examples'
  ):
    experiment.run(dataclasses.replace(config, num_clients=2000))


def test_a_retired_setting_at_todays_behaviour_still_resumes(tmp_path):
  config = {'method': 'fed2', 'rounds': 3}
  for saved, differs in (('uniform', False), ('class_weighted', True)):
    with open(tmp_path / run_directory.CONFIG_FILE, 'w') as f:
      json.dump({'method': 'fed2', 'rounds': 2, 'fed2_pairing': saved}, f)
    differences = run_directory.experiment_config_differences(
      str(tmp_path), config, retired={'fed2_pairing': 'uniform'}
    )
    assert differences == (
      ["fed2_pairing: saved 'class_weighted', now None"] if differs else []
    )


def test_the_progress_bar_names_the_training_loss_and_the_test_accuracy():
  # The loss is the clients' training loss, the accuracy the test set's at
  # the last evaluation: each named for what it is.
  postfix = training_loop.progress_postfix(
    {'loss': 0.5}, {'accuracy': 0.9}, 10, 0.25
  )
  assert dict(postfix) == dict(
    train_loss='0.500', test_acc='0.900', test_round='10', s_per_round='0.25'
  )
  assert 'test_acc' not in training_loop.progress_postfix(
    {'loss': 0.5}, {}, None, 0.25
  )


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
