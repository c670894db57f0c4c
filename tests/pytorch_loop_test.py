"""Tests for tff_methods_tooling.pytorch_loop: FedAvg as a plain PyTorch loop
on the Keras model's layers."""

import os
import sys

import numpy as np
import pytest

from tff_methods_tasks import models as task_models
from tff_methods_tooling import plain_loops
from tff_methods_tooling import pytorch_loop

pytestmark = pytest.mark.usefixtures('tff_worker')


# An interpreter with torch: this one, or TFF_METHODS_PYTORCH_PYTHON (torch is
# optional and its current releases do not install beside TensorFlow 2.14).
PYTORCH_PYTHON = os.environ.get('TFF_METHODS_PYTORCH_PYTHON', sys.executable)


@pytest.mark.skipif(
  pytorch_loop.torch_import_error(PYTORCH_PYTHON) is not None,
  reason='no interpreter with torch (optional; set '
  'TFF_METHODS_PYTORCH_PYTHON)',
)
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
  plan = pytorch_loop.layer_plan(
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


def test_layer_plan_reads_the_keras_chain():
  plan = pytorch_loop.layer_plan(
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
    pytorch_loop.layer_plan(task_models.get_model('resnet18', 10, (32, 32, 3)))


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
