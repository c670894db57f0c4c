"""Tests for tooling/experiment.py: one source for every setting."""

import dataclasses

from absl import flags

from binaries import experiment_flags  # pylint: disable=unused-import
from tff_methods import methods
from tff_methods import runtime
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


def test_model_parameters_are_counted_from_the_tasks_shapes():
  # By hand: conv 5x5x3x16 + 16, conv 5x5x16x32 + 32, then dense layers
  # 800x120, 120x84, 84x84, 84x256, 256x10, each with its biases.
  cnn = experiment.model_parameters(
      experiment.ExperimentConfig(task='cifar10', model='fedcka_cnn'))
  assert cnn == (1216 + 12832 + 96120 + 10164 + 7140 + 21760 + 2570)
  resnet = experiment.model_parameters(
      experiment.ExperimentConfig(task='cifar10', model='resnet18'))
  assert resnet > runtime.LARGE_MODEL_PARAMETERS > cnn
  # A model only Fed2's grouping builds (VGG-16) is not counted.
  assert experiment.model_parameters(dataclasses.replace(
      experiment.ExperimentConfig(), model='vgg16')) is None
