"""Tests for tff_methods.algorithms.hyperparameters: the settings every builder
is called with, turned into optimizers, strengths and aggregators."""

import sys

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_methods.algorithms import fedcos
from tff_methods.algorithms import fedmax
from tff_methods.algorithms import fedprox
from tff_methods.algorithms import hyperparameters
from tff_methods.algorithms import moon
from tff_methods.templates import aggregation

SPECS = [tf.TensorSpec([2], tf.float32)]


def _hparams(optimizer):
  return optimizer.get_hparams(optimizer.initialize(SPECS))


def test_a_methods_own_setting_comes_before_mu_and_mu_before_its_default():
  settings = hyperparameters.Hyperparameters(
    mu=0.3, method_settings={'fedcos': {'mu': 0.05}}
  )
  assert settings.settings_of(fedcos.METHOD).mu == 0.05
  assert settings.settings_of(fedprox.METHOD).mu == 0.3
  assert (
    hyperparameters.Hyperparameters().settings_of(fedprox.METHOD).mu
    == fedprox.DEFAULT_MU
  )
  # mu is a strength: FedMAX's beta and MOON's temperature keep theirs.
  assert settings.settings_of(fedmax.METHOD).beta == fedmax.DEFAULT_BETA
  assert settings.settings_of(moon.METHOD).temperature == 0.5
  # Given as a mapping or as pairs, in any order: the same settings.
  assert settings == hyperparameters.Hyperparameters(
    mu=0.3, method_settings=[('fedcos', [('mu', 0.05)])]
  )


def test_a_setting_a_method_lacks_or_a_value_it_refuses_is_named():
  with pytest.raises(ValueError, match='MOON has no setting temp; its '):
    hyperparameters.Hyperparameters(
      method_settings={'moon': {'temp': 1.0}}
    ).settings_of(moon.METHOD)
  with pytest.raises(ValueError, match='--moon_temperature=0.0 must be > 0'):
    hyperparameters.Hyperparameters(
      method_settings={'moon': {'temperature': 0.0}}
    ).settings_of(moon.METHOD)
  with pytest.raises(ValueError, match="--fedcos_direction='up' is unknown"):
    hyperparameters.Hyperparameters(
      method_settings={'fedcos': {'direction': 'up'}}
    ).settings_of(fedcos.METHOD)


@pytest.mark.parametrize(
  'name, default_learning_rate',
  [('sgd', 1.0), ('sgdm', 1.0), ('adam', 0.01), ('yogi', 0.01)],
)
def test_the_server_learning_rate_defaults_by_rule(name, default_learning_rate):
  default = hyperparameters.Hyperparameters().server_optimizer(name)
  assert np.isclose(_hparams(default)['learning_rate'], default_learning_rate)
  given = hyperparameters.Hyperparameters(
    server_learning_rate=0.5
  ).server_optimizer(name)
  assert np.isclose(_hparams(given)['learning_rate'], 0.5)


def test_the_client_optimizer_carries_the_learning_rate_and_momentum():
  settings = hyperparameters.Hyperparameters(
    client_learning_rate=0.2, client_momentum=0.5
  )
  hparams = _hparams(settings.client_optimizer())
  assert np.isclose(hparams['learning_rate'], 0.2)
  assert np.isclose(hparams['momentum'], 0.5)


def test_weighting_and_aggregator_default_to_the_builders_own():
  # None: the builder's default, so that a DP (unweighted) aggregator
  # stays uniform instead of getting an example weighting.
  assert hyperparameters.Hyperparameters().weighting() is None
  assert hyperparameters.Hyperparameters().model_aggregator() is None
  uniform = hyperparameters.Hyperparameters(client_weighting='uniform')
  assert uniform.weighting() == aggregation.CLIENT_WEIGHTINGS['uniform']
  robust = hyperparameters.Hyperparameters(aggregator='robust')
  assert isinstance(
    robust.model_aggregator(), tff.aggregators.WeightedAggregationFactory
  )
  dp = hyperparameters.Hyperparameters(aggregator='dp', clients_per_round=20)
  assert isinstance(
    dp.model_aggregator(), tff.aggregators.UnweightedAggregationFactory
  )


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
