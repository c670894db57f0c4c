"""Tests for tooling/experiment.py: one source for every setting."""

import csv
import dataclasses
import json
import os
import sys

from absl import flags
import pytest

from tff_methods import privacy
from tff_methods.algorithms import hyperparameters
from tff_methods.algorithms import methods
from tff_methods.execution import workers
from tff_methods_binaries import (
  experiment_flags,  # noqa: F401 (defines the flags)
)
from tff_methods_tooling import dp_runs
from tff_methods_tooling import experiment


def test_every_setting_is_a_flag_with_the_configs_default_and_help():
  for field in dataclasses.fields(experiment.ExperimentConfig):
    flag = flags.FLAGS[field.name]
    assert flag.help == field.metadata['help'], field.name
    if field.name != 'output_dir':  # a binary names its run when not given
      assert flag.default == field.default, field.name


def test_the_library_and_the_runner_share_their_defaults():
  config = experiment.ExperimentConfig()
  library = hyperparameters.Hyperparameters()
  shared = {
    f.name for f in dataclasses.fields(hyperparameters.Hyperparameters)
  } & {f.name for f in dataclasses.fields(experiment.ExperimentConfig)}
  assert {
    'client_learning_rate',
    'client_momentum',
    'server_momentum',
    'mu',
  } <= shared
  for name in shared - {'client_state_dir'}:  # the runner keeps it with a run
    assert getattr(config, name) == getattr(library, name), name
  # And the runner passes every one of them on.
  passed = config.hyperparameters()
  for name in shared - {'client_state_dir'}:
    assert getattr(passed, name) == getattr(config, name), name
  # Each method's own settings: the runner's are its declared defaults.
  for spec in methods.REGISTRY.values():
    assert passed.settings_of(spec) == library.settings_of(spec), spec.name
    assert passed.settings_of(spec) == spec.settings(), spec.name


def test_model_parameters_are_counted_from_the_tasks_shapes():
  # By hand: conv 5x5x3x16 + 16, conv 5x5x16x32 + 32, then dense layers
  # 800x120, 120x84, 84x84, 84x256, 256x10, each with its biases.
  cnn = experiment.model_parameters(
    experiment.ExperimentConfig(task='cifar10', model='fedcka_cnn')
  )
  assert cnn == (1216 + 12832 + 96120 + 10164 + 7140 + 21760 + 2570)
  resnet = experiment.model_parameters(
    experiment.ExperimentConfig(task='cifar10', model='resnet18')
  )
  assert resnet > workers.LARGE_MODEL_PARAMETERS > cnn
  # A model only Fed2's grouping builds (VGG-16) is not counted.
  assert (
    experiment.model_parameters(
      dataclasses.replace(experiment.ExperimentConfig(), model='vgg16')
    )
    is None
  )


def test_the_aggregator_settings_are_checked_before_any_work():
  errors = {
    'aggregator': dict(aggregator='median'),
    'dp_clip': dict(aggregator='dp', dp_clip=-1.0),
    # TFF's own bound: noise below 0.1 x the clients per round.
    'clients_per_round=2': dict(
      aggregator='dp',
      dp_noise_multiplier=0.5,
      num_clients=4,
      clients_per_round=2,
    ),
  }
  for flag, settings in errors.items():
    config = experiment.ExperimentConfig(
      **{'method': 'fedavg', 'task': 'digits', **settings}
    )
    with pytest.raises(ValueError, match=f'--{flag}'):
      experiment.validate(config)
  experiment.validate(
    experiment.ExperimentConfig(
      method='fedcka',
      task='digits',
      aggregator='dp',
      dp_noise_multiplier=0.5,
      clients_per_round=10,
    )
  )


def test_a_dp_cohort_too_small_for_the_adaptive_clip_is_refused_in_one_line():
  config = experiment.ExperimentConfig(
    method='fedavg',
    task='digits',
    aggregator='dp',
    dp_noise_multiplier=0.5,
    clients_per_round=5,
  )
  with pytest.raises(ValueError) as refused:
    experiment.validate(config)
  message = str(refused.value)
  # What to change, by flag, with the values that would do.
  for advice in (
    'raise --clients_per_round above 5',
    '--dp_clipped_count_stddev above 0.25',
    'lower --dp_noise_multiplier below 0.5',
    '(--dp_clip)',
  ):
    assert advice in message
  assert message.strip().splitlines()[0] == 'Bad settings:'
  assert len(message.strip().splitlines()) == 2  # one line for the one error


@pytest.mark.usefixtures('tff_worker')
def test_a_dp_run_at_a_target_epsilon_meets_it_for_its_poisson_cohorts(
  tmp_path,
):
  config = experiment.ExperimentConfig(
    method='fedavg',
    task='digits',
    model='mlp',
    num_clients=4,
    clients_per_round=2,
    rounds=2,
    aggregator='dp',
    dp_clip=1.0,
    dp_target_epsilon=3.0,
    dp_accountant='pld',
    client_sampling='poisson',
    output_dir=str(tmp_path / 'run'),
    cache_dir=str(tmp_path / 'cache'),
  )
  experiment.run(config, progress=False)
  with open(tmp_path / 'run' / 'results.json') as f:
    dp = json.load(f)['dp']
  noise = privacy.calibrate_noise_multiplier(
    3.0, 2, 4, 2, 4**-1.1, sampling='poisson', accountant='pld'
  )
  assert dp['noise_multiplier'] == pytest.approx(noise)
  assert 0.99 * 3.0 <= dp['epsilon'] <= 3.0
  assert (dp['sampling'], dp['target_epsilon']) == ('poisson', 3.0)
  assert (dp['accountant'], dp['adjacency']) == ('pld', 'add-or-remove-one')
  # The noise was calibrated for 2 rounds: a longer run is refused before
  # any work, and the run is left as it was.
  with pytest.raises(ValueError, match='calibrated for --dp_target_epsilon'):
    experiment.run(dataclasses.replace(config, rounds=3), progress=False)
  with open(tmp_path / 'run' / 'experiment.json') as f:
    assert json.load(f)['rounds'] == 2


@pytest.mark.usefixtures('tff_worker')
def test_a_checkpoint_without_its_settings_is_not_resumed(tmp_path):
  config = experiment.ExperimentConfig(
    task='digits',
    model='mlp',
    num_clients=4,
    clients_per_round=2,
    rounds=1,
    output_dir=str(tmp_path / 'run'),
    cache_dir=str(tmp_path / 'cache'),
  )
  experiment.run(config, progress=False)
  # A no-op rerun of the finished run keeps a valid results.json, with the
  # seconds its rounds took (metrics.csv's).
  with open(tmp_path / 'run' / 'results.json') as f:
    first = json.load(f)['seconds_per_round']
  experiment.run(config, progress=False)
  with open(tmp_path / 'run' / 'results.json') as f:
    again = json.loads(f.read(), parse_constant=pytest.fail)
  assert again['seconds_per_round'] == pytest.approx(first)
  # Settings gone: another learning rate must not resume this checkpoint.
  os.remove(tmp_path / 'run' / 'experiment.json')
  other = dataclasses.replace(config, rounds=2, client_learning_rate=0.01)
  with pytest.raises(ValueError, match='no experiment.json'):
    experiment.run(other, progress=False)
  assert not (tmp_path / 'run' / 'experiment.json').exists()


def test_settings_the_data_refuses_leave_no_settings_behind(tmp_path):
  config = experiment.ExperimentConfig(
    task='digits',
    model='mlp',
    num_clients=5000,
    clients_per_round=2,
    output_dir=str(tmp_path / 'run'),
    cache_dir=str(tmp_path / 'cache'),
  )
  with pytest.raises(ValueError, match='num_clients=5000 is more than'):
    experiment.run(config, progress=False)
  # So the corrected rerun is not taken for another experiment.
  assert not (tmp_path / 'run' / 'experiment.json').exists()
  assert (
    experiment.saved_settings_differences(
      dataclasses.replace(config, num_clients=4)
    )
    == []
  )
  for seed in (-1, 2**64):
    with pytest.raises(ValueError, match=rf'--seed={seed} must be in'):
      experiment.validate(dataclasses.replace(config, seed=seed))


def test_classes_no_client_trains_on_are_warned_of(caplog):
  experiment.warn_of_untrained_classes([[2, 0, 1], [3, 0, 0]])
  assert '1 of the 3 classes have no training example' in caplog.text
  assert '(classes 1)' in caplog.text
  caplog.clear()
  experiment.warn_of_untrained_classes([[2, 1, 1]])
  assert caplog.text == ''


def test_dp_settings_are_refused_in_one_line_each_naming_the_flag():
  base = experiment.ExperimentConfig(
    task='digits', model='mlp', num_clients=10, clients_per_round=5
  )

  def refusal(**settings):
    with pytest.raises(ValueError) as refused:
      experiment.validate(dataclasses.replace(base, **settings))
    lines = str(refused.value).strip().splitlines()[1:]
    assert len(lines) == 1, lines
    return lines[0]

  assert '--client_sampling=poisson' in refusal(
    aggregator='dp',
    dp_clip=1.0,
    dp_accountant='pld',
    client_sampling='without_replacement',
  )
  assert 'needs --aggregator=dp' in refusal(dp_target_epsilon=5.0)
  assert 'drop --dp_noise_multiplier=1.0' in refusal(
    aggregator='dp', dp_clip=1.0, dp_target_epsilon=5.0, dp_noise_multiplier=1.0
  )
  assert '--dp_target_quantile=1.0 must be in (0, 1)' in refusal(
    aggregator='dp', dp_noise_multiplier=0.1, dp_target_quantile=1.0
  )
  # A target that needs more noise than the adaptive clip takes with 5
  # clients a round: what to change, by flag.
  line = refusal(aggregator='dp', dp_target_epsilon=5.0, rounds=20)
  noise = privacy.calibrate_noise_multiplier(5.0, 5, 10, 20, 10**-1.1)
  assert f'needs noise multiplier {noise:.4g}' in line
  for advice in (
    '--clients_per_round',
    '--dp_clipped_count_stddev',
    '--dp_clip',
    'fewer --rounds',
    'raise --dp_target_epsilon',
  ):
    assert advice in line
  # The same target with a fixed clip, or a larger clipped-count noise,
  # is taken; so is the noise it needs.
  experiment.validate(
    dataclasses.replace(
      base, aggregator='dp', dp_target_epsilon=5.0, rounds=20, dp_clip=1.0
    )
  )
  experiment.validate(
    dataclasses.replace(
      base,
      aggregator='dp',
      dp_target_epsilon=5.0,
      rounds=20,
      dp_clipped_count_stddev=noise,
    )
  )


@pytest.mark.usefixtures('tff_worker')
def test_a_dp_run_records_its_epsilon_and_releases_no_unnoised_figure(
  tmp_path,
):
  config = experiment.ExperimentConfig(
    method='fedavg',
    task='digits',
    model='mlp',
    num_clients=4,
    clients_per_round=3,
    rounds=2,
    aggregator='dp',
    dp_noise_multiplier=0.25,
    output_dir=str(tmp_path / 'run'),
    cache_dir=str(tmp_path / 'cache'),
  )
  experiment.run(config, progress=False)
  with open(tmp_path / 'run' / 'results.json') as f:
    dp = json.load(f)['dp']
  delta = 4**-1.1
  # Poisson cohorts, add-or-remove-one, PLD: the default under DP.
  assert dp['epsilon'] == pytest.approx(
    privacy.epsilon(0.25, 3, 4, 2, delta, sampling='poisson')
  )
  assert dp['delta'] == pytest.approx(delta)
  assert (dp['rounds'], dp['clients_per_round'], dp['num_clients']) == (2, 3, 4)
  assert (dp['sampling'], dp['adjacency']) == ('poisson', 'add-or-remove-one')
  assert 'secret seed' in dp['cohorts']
  # And round by round in metrics.csv: it grows with the rounds.
  with open(tmp_path / 'run' / 'metrics.csv') as f:
    rows = list(csv.DictReader(f))
  epsilons = [float(row['dp/epsilon']) for row in rows]
  assert epsilons[-1] == pytest.approx(dp['epsilon'])
  assert (
    epsilons[0] == pytest.approx(privacy.epsilon(0.25, 3, 4, 1, delta))
    and epsilons[0] < epsilons[1]
  )
  # What the files hold is what the guarantee covers: the evaluation, the
  # epsilon, the round's time and rejection, and the noised adaptive clip;
  # no client's loss, accuracy or count, no un-noised aggregator count, no
  # partition report.
  for column in rows[0]:
    assert column in ('round', 'rejected', 'seconds', 'dp/epsilon') or (
      column.startswith('eval/') or column.endswith('dp_query_metrics/clip')
    ), column
  assert any(c.endswith('dp_query_metrics/clip') for c in rows[0])
  events = b''.join(
    open(os.path.join(root, name), 'rb').read()
    for root, _, names in os.walk(tmp_path / 'run' / 'tensorboard')
    for name in names
  )
  assert b'eval/accuracy' in events and b'client_work' not in events
  assert not os.path.exists(tmp_path / 'run' / 'partition.txt')
  # The cohorts came from the secret seed, not from --seed.
  with open(tmp_path / 'run' / dp_runs.SAMPLING_SEED_FILE) as f:
    assert int(f.read()) != config.seed
  with open(tmp_path / 'run' / 'experiment.json') as f:
    assert json.load(f)['sampling_seed'] is None
  without_noise = dataclasses.replace(config, dp_noise_multiplier=0.0)
  assert dp_runs.guarantee(without_noise, 4, 2)['epsilon'] is None
  robust = dataclasses.replace(config, aggregator='robust')
  assert dp_runs.guarantee(robust, 4, 2) is None
  # --dp_delta sets the delta reported.
  at_delta = dataclasses.replace(config, dp_delta=1e-3)
  assert dp_runs.guarantee(at_delta, 4, 2)['epsilon'] == pytest.approx(
    privacy.epsilon(0.25, 3, 4, 2, 1e-3)
  )
  with pytest.raises(ValueError, match=r'--dp_delta=1.5 must be in \(0, 1\)'):
    experiment.validate(dataclasses.replace(config, dp_delta=1.5))


def test_a_method_whose_clients_report_outside_the_aggregator_refuses_dp():
  # SCAFFOLD's control-variate changes are summed without clip or noise.
  config = experiment.ExperimentConfig(
    method='scaffold',
    task='digits',
    aggregator='dp',
    num_clients=20,
    clients_per_round=10,
    scaffold_weighting='uniform',
  )
  with pytest.raises(ValueError) as refused:
    experiment.validate(config)
  (line,) = str(refused.value).strip().splitlines()[1:]
  assert line.strip().startswith('--method=scaffold with --aggregator=dp')
  assert 'control variates' in line
  experiment.validate(dataclasses.replace(config, aggregator='mean'))


@pytest.mark.usefixtures('tff_worker')
def test_a_run_under_an_aggregator_records_its_measurements(tmp_path):
  config = experiment.ExperimentConfig(
    method='scaffold',
    task='digits',
    model='mlp',
    num_clients=4,
    clients_per_round=3,
    rounds=2,
    aggregator='robust',
    output_dir=str(tmp_path / 'run'),
    cache_dir=str(tmp_path / 'cache'),
  )
  experiment.run(config, progress=False)
  with open(tmp_path / 'run' / 'metrics.csv') as f:
    rows = list(csv.DictReader(f))
  # TFF's robust aggregator: its clipping norm starts at 1 and adapts.
  assert float(rows[0]['aggregator/zeroing/clipping_norm']) == 1.0
  assert float(rows[1]['aggregator/zeroing/clipping_norm']) != 1.0
  with open(tmp_path / 'run' / 'experiment.json') as f:
    assert json.load(f)['aggregator'] == 'robust'


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
