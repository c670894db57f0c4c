"""Tests for tff_methods_tooling.pytorch_loop: every method as a plain PyTorch
loop on the Keras model's layers (`pytorch_methods`, `pytorch_models`)."""

import dataclasses
import functools
import sys

import numpy as np
import pytest

from tff_methods.algorithms import hyperparameters
from tff_methods.algorithms import methods
from tff_methods.templates import model_lib
from tff_methods_tasks import models as task_models
from tff_methods_tooling import benchmark_processes
from tff_methods_tooling import plain_loops
from tff_methods_tooling import pytorch_loop
from tff_methods_tooling import pytorch_models

pytestmark = pytest.mark.usefixtures('tff_worker')


# An interpreter with torch (optional: its current releases do not install
# beside TensorFlow 2.14): TFF_METHODS_PYTORCH_PYTHON, `make pytorch-setup`'s
# .venv/torch, or this one.
PYTORCH_PYTHON = pytorch_loop.default_python()


needs_torch = pytest.mark.skipif(
  pytorch_loop.torch_import_error(PYTORCH_PYTHON) is not None,
  reason='no interpreter with torch (optional: make pytorch-setup, or set '
  'TFF_METHODS_PYTORCH_PYTHON)',
)


@needs_torch
def test_pytorch_loop_computes_the_plain_tf_loops_fedavg(tiny_cifar):
  # Same initial weights, one batch per client, two epochs (so momentum
  # carries over a step): the two frameworks must agree.
  clients = plain_loops.client_arrays(tiny_cifar)
  settings = dict(
    local_epochs=2, batch_size=64, learning_rate=0.1, momentum=0.9
  )
  plain = plain_loops.PlainTFFedAvg('fedcka_cnn', clients, 10, **settings)
  initial = [np.array(w) for w in plain.global_weights]
  plain.run_round()
  plan = pytorch_models.layer_plan(
    task_models.get_model('fedcka_cnn', 10, clients[0][0].shape[1:])
  )
  seconds, torch_weights = pytorch_loop.run_in(
    PYTORCH_PYTHON,
    clients,
    plan,
    repeats=0,
    initial_weights=initial,
    **settings,
  )
  assert seconds == []  # The warm-up round only.
  moved = 0.0
  for tf_w, torch_w, start in zip(plain.global_weights, torch_weights, initial):
    assert tf_w.shape == torch_w.shape
    np.testing.assert_allclose(torch_w, tf_w, rtol=1e-4, atol=1e-5)
    moved += float(np.abs(torch_w - start).sum())
  assert moved > 0


# Strengths large enough that each term moves the weights visibly in two
# rounds on the tiny data.
TWIN_SETTINGS = {
  'fedprox': {'mu': 1.0},
  'scaffold': {},
  'moon': {'mu': 5.0},
  'fedcka': {'mu': 5.0, 'layers': 3},
  'fedmax': {'beta': 100.0},
  'fedcos': {'mu': 1.0},
}


TWIN_ROUNDS = dict(
  local_epochs=2,
  batch_size=64,  # One batch per local epoch.
  learning_rate=0.05,
  momentum=0.9,
  repeats=1,  # With the warm-up round: two rounds.
)


def _twin_rounds(data, plan, initial, method, settings=None):
  _, weights = pytorch_loop.run_in(
    PYTORCH_PYTHON,
    plain_loops.client_arrays(data),
    plan,
    initial_weights=initial,
    method=method,
    method_settings=settings,
    **TWIN_ROUNDS,
  )
  return weights


@pytest.fixture(scope='module')
def fedcka_cnn(tiny_cifar):
  """The model, its plan and initial weights, and FedAvg's twin's rounds."""
  model_fn = functools.partial(
    task_models.get_model, 'fedcka_cnn', 10, tiny_cifar.input_shape
  )
  plan = pytorch_models.layer_plan(model_fn())
  initial = model_lib.initial_weights(model_fn, 0)
  trainable = [np.array(w) for w in initial.trainable]
  fedavg = _twin_rounds(tiny_cifar, plan, trainable, 'fedavg')
  return dict(plan=plan, initial=initial, fedavg=fedavg)


@needs_torch
@pytest.mark.parametrize('name', sorted(TWIN_SETTINGS))
def test_each_twin_computes_the_projects_rounds(name, tiny_cifar, fedcka_cnn):
  # Two rounds, every client in both (the second is the first with a
  # previous model, a control variate or a last move), one batch per local
  # epoch and two epochs (momentum carries over a step). Over the first
  # round, every method is FedAvg.
  hparams = hyperparameters.Hyperparameters(
    client_learning_rate=TWIN_ROUNDS['learning_rate'],
    client_momentum=TWIN_ROUNDS['momentum'],
    num_clients=3,
    method_settings={name: TWIN_SETTINGS[name]},
  )
  process, _ = benchmark_processes.benchmark_process(
    name,
    'fedcka_cnn',
    tiny_cifar,
    hparams,
    TWIN_ROUNDS['local_epochs'],
    TWIN_ROUNDS['batch_size'],
    seed=0,
  )
  state = process.set_model_weights(process.initialize(), fedcka_cnn['initial'])
  client_ids = list(tiny_cifar.client_data.client_ids)
  for round_num in (1, 2):
    keys = benchmark_processes.keys(client_ids, round_num)
    state = process.next(state, keys).state
  project = process.get_model_weights(state).trainable
  twin = _twin_rounds(
    tiny_cifar,
    fedcka_cnn['plan'],
    [np.array(w) for w in fedcka_cnn['initial'].trainable],
    name,
    dataclasses.asdict(hparams.settings_of(methods.REGISTRY[name])),
  )
  for ours, twins in zip(project, twin):
    np.testing.assert_allclose(twins, ours, rtol=1e-4, atol=2e-5)
  # The term (or SCAFFOLD's plain SGD and correction) made a difference
  # that the comparison above would see.
  apart = max(
    float(np.abs(a - b).max()) for a, b in zip(twin, fedcka_cnn['fedavg'])
  )
  assert apart > 1e-3


def test_layer_plan_reads_the_keras_chain():
  plan = pytorch_models.layer_plan(
    task_models.get_model('fedcka_cnn', 10, (32, 32, 3))
  )
  assert plan['input_shape'] == [32, 32, 3]
  assert [layer['kind'] for layer in plan['layers']] == (
    ['Conv2D', 'MaxPooling2D'] * 2 + ['Flatten'] + ['Dense'] * 5
  )
  first, last = plan['layers'][0], plan['layers'][-1]
  assert (
    first['filters'],
    first['kernel_size'],
    first['padding'],
    first['activation'],
  ) == (16, [5, 5], 'valid', 'relu')
  # The logits: 10 units, no activation; z (256) feeds them.
  assert (last['units'], last['activation']) == (10, 'linear')
  assert plan['layers'][-2]['units'] == 256
  with pytest.raises(ValueError, match="'resnet18' has"):
    pytorch_models.layer_plan(
      task_models.get_model('resnet18', 10, (32, 32, 3))
    )


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
