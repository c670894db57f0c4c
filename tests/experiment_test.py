"""Tests for tooling/experiment.py: one source for every setting."""

import dataclasses

from absl import flags

from binaries import experiment_flags  # pylint: disable=unused-import
from tff_methods import methods
from tooling import experiment


def test_every_setting_is_a_flag_with_the_configs_default_and_help():
  for field in dataclasses.fields(experiment.ExperimentConfig):
    flag = flags.FLAGS[field.name]
    assert flag.help == field.metadata['help'], field.name
    if field.name != 'output_dir':  # a binary names its run when not given
      assert flag.default == field.default, field.name


def test_the_library_and_the_runner_share_their_defaults():
  config = experiment.ExperimentConfig()
  library = methods.Hyperparameters()
  shared = ({f.name for f in dataclasses.fields(methods.Hyperparameters)} &
            {f.name for f in dataclasses.fields(experiment.ExperimentConfig)})
  assert {'client_learning_rate', 'client_momentum', 'server_momentum',
          'temperature', 'cka_layers', 'fed2_pairing'} <= shared
  for name in shared - {'client_state_dir'}:  # the runner keeps it with a run
    assert getattr(config, name) == getattr(library, name), name
  # And the runner passes every one of them on.
  passed = config.hyperparameters()
  for name in shared - {'client_state_dir'}:
    assert getattr(passed, name) == getattr(config, name), name
