"""Tests for tff_methods_tasks.models."""

import collections
import contextlib
import sys

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_methods.templates import model_lib
from tff_methods_tasks import models

SMALL = {
  'fedcka_cnn': ((32, 32, 3), {}),
  'fedmax_cnn': ((32, 32, 3), {}),
  'lenet': ((32, 32, 3), {}),
  'mlp': ((8, 8, 1), {}),
  'mlp1': ((28, 28, 1), {}),
  'mobilenet': ((32, 32, 3), {}),
  'shakespeare_lstm100': ((12,), {}),
  'resnet18': ((16, 16, 3), dict(width=8, projection_dim=16)),
  'resnet50': ((16, 16, 3), dict(width=4)),
  'vgg9': ((32, 32, 3), {}),
  'shakespeare_lstm': ((12,), dict(units=8)),
}


@pytest.mark.parametrize('name', models.MODEL_NAMES)
def test_every_model_exposes_named_outputs_and_matches_tffs_view(name):
  input_shape, kwargs = SMALL[name]
  num_classes = 90 if name.startswith('shakespeare') else 7
  model = models.get_model(name, num_classes, input_shape, **kwargs)
  assert {'features', 'logits'} <= set(model.output)
  assert len(model_lib.layer_names(model)) >= (1 if name == 'mlp1' else 2)
  # The zoo's published facts are the built model's.
  assert len(model_lib.layer_names(model)) == models.LAYER_OUTPUTS[name]
  assert ('z' in model.output) == models.has_projection_head(
    name, kwargs.get('projection_dim', 0)
  )
  assert set(model.output) == set(
    models.output_names(name, kwargs.get('projection_dim', 0))
  )
  # Raises if any trainable layer were off the path to the logits.
  wrapped = model_lib.logits_only(model)
  dtype = np.int32 if name.startswith('shakespeare') else np.float32
  x = np.ones((2,) + input_shape, dtype)
  out = model(x)
  assert out['logits'].shape[-1] == num_classes
  np.testing.assert_allclose(
    wrapped(x).numpy(), out['logits'].numpy(), rtol=1e-5
  )
  # The classifier reads `z` where the model has a projection head, else
  # `features`.
  last = model.layers[-1]
  np.testing.assert_allclose(
    last(out.get('z', out['features'])).numpy(),
    out['logits'].numpy(),
    rtol=1e-4,
    atol=1e-5,
  )


@pytest.mark.parametrize('name', ['fedcka_cnn', 'resnet18', 'shakespeare_lstm'])
def test_weights_type_is_tffs(name):
  # Read off the zero weights (one model build), it must equal the type TFF
  # derives from its own view of the model, or computations won't compose.
  input_shape, kwargs = SMALL[name]
  num_classes = 90 if name.startswith('shakespeare') else 7
  model_fn = lambda: models.get_model(name, num_classes, input_shape, **kwargs)
  dtype = tf.int32 if name.startswith('shakespeare') else tf.float32
  spec = collections.OrderedDict(
    x=tf.TensorSpec([None] + list(input_shape), dtype),
    y=tf.TensorSpec([None], tf.int32),
  )
  assert model_lib.weights_type(model_fn) == (
    tff.learning.models.weights_type_from_model(
      model_lib.tff_model_fn(model_fn, spec)
    )
  )


@pytest.mark.parametrize(
  'name, kwargs',
  [
    (name, SMALL[name][1])
    for name in models.MODEL_NAMES
    if not name.startswith('shakespeare')
  ],
)
def test_fedmax_activation_is_the_last_post_relu_hidden_vector(name, kwargs):
  input_shape = SMALL[name][0]
  model = models.get_model(name, 7, input_shape, **kwargs)
  x = np.random.default_rng(0).normal(size=(4,) + input_shape)
  features = model(x.astype(np.float32))['features'].numpy()
  # Post-ReLU: never negative, and some units off (a linear output such as
  # MOON's `z` has negative entries).
  assert features.min() >= 0.0 and (features == 0).any()
  if 'z' in model.output:
    assert model(x.astype(np.float32))['z'].numpy().min() < 0.0


def test_fedcka_cnn_exposes_its_seven_layers():
  model = models.get_model('fedcka_cnn', 10, (32, 32, 3))
  names = model_lib.layer_names(model)
  assert names == [f'layer_{k}' for k in range(1, 8)]
  widths = [int(np.prod(model.output[k].shape[1:])) for k in names]
  # Two pooled conv blocks, then FC 120, 84, 84, the projection 256 and the
  # logits: FedCKA's Fig. 5 counts these seven.
  assert widths == [14 * 14 * 16, 5 * 5 * 32, 120, 84, 84, 256, 10]
  assert model.output['features'].shape[-1] == 84


def test_fedcka_cnn_has_the_papers_shapes():
  model = models.get_model('fedcka_cnn', 10, (32, 32, 3))
  shapes = {k: tuple(v.shape[1:]) for k, v in model.output.items()}
  assert shapes['layer_1'] == (14, 14, 16)
  assert shapes['layer_2'] == (5, 5, 32)
  assert shapes['z'] == (256,)
  dense_widths = [
    layer.units
    for layer in model.layers
    if isinstance(layer, tf.keras.layers.Dense)
  ]
  assert dense_widths == [120, 84, 84, 256, 10]


def test_fedmax_cnn_activation_is_512_wide():
  model = models.get_model('fedmax_cnn', 10, (32, 32, 3))
  assert model.output['features'].shape[-1] == 512
  assert len(model_lib.layer_names(model)) == 5


def test_resnets_use_group_norm_only():
  model = models.get_model('resnet18', 10, (16, 16, 3), width=8)
  kinds = {type(layer).__name__ for layer in model.layers}
  assert 'GroupNormalization' in kinds
  assert 'BatchNormalization' not in kinds
  assert len(model_lib.layer_names(model)) == 5  # stem + 4 stages


def test_fedcos_and_fed2_models_have_the_papers_shapes():
  lenet = models.get_model('lenet', 10, (32, 32, 3))
  assert tuple(lenet.output['layer_2'].shape[1:]) == (5, 5, 16)
  assert [
    layer.units
    for layer in lenet.layers
    if isinstance(layer, tf.keras.layers.Dense)
  ] == [120, 84, 10]
  mlp1 = models.get_model('mlp1', 10, (28, 28, 1))
  assert [
    layer.units
    for layer in mlp1.layers
    if isinstance(layer, tf.keras.layers.Dense)
  ] == [200, 10]
  mobilenet = models.get_model('mobilenet', 10, (32, 32, 3))
  assert len(model_lib.layer_names(mobilenet)) == 14
  assert tuple(mobilenet.output['layer_14'].shape[1:]) == (2, 2, 1024)
  # MobileNet-v1's 3.2M parameters (CIFAR version, no normalization).
  assert 3.1e6 < mobilenet.count_params() < 3.3e6
  lstm = models.get_model('shakespeare_lstm100', 90, (80,))
  assert lstm.output['layer_1'].shape[-1] == 100


def test_unknown_model_is_named():
  with pytest.raises(ValueError, match="Unknown model 'lenet7'"):
    models.get_model('lenet7', 10, (8, 8, 1))


def _random_ops_and_initial_values(scope):
  with tf.Graph().as_default() as graph, scope:
    model = models.fedcka_cnn(10)
    random_ops = [
      op.type for op in graph.get_operations() if 'Random' in op.type
    ]
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      values = session.run(model.weights)
  return random_ops, values


def test_models_whose_weights_are_assigned_draw_no_random_initial_values():
  # The TFF worker runs a computation's initializers on every call.
  random_ops, values = _random_ops_and_initial_values(
    model_lib.weights_assigned_before_use()
  )
  assert not random_ops
  assert all(not v.any() for v in values)
  # Without the scope, Keras draws them.
  random_ops, values = _random_ops_and_initial_values(contextlib.nullcontext())
  assert random_ops
  assert any(v.any() for v in values)


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
