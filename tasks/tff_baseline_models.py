"""TFF's baseline tasks' models named for the methods
(`tff_methods_tasks.tff_baselines`).

TFF's Keras model with its final softmax left out and, named by its
structure, the outputs the methods read: `layer_k` the blocks nearest the
input, `features` the classifier's input (past any dropout) and `z` the
same vector (MOON's code contrasts it when a model has no projection head);
and TFF's loss on those logits.
"""

from typing import Mapping

import tensorflow as tf

from tff_methods.templates import local_training
from tff_methods.templates import model_lib


def _producer(tensor) -> tf.keras.layers.Layer:
  return tensor._keras_history.layer  # pylint: disable=protected-access


def _named_layers(model: tf.keras.Model) -> dict:
  """`named_outputs`' arguments for one of TFF's baseline models."""
  layers = list(model.layers)
  classifier = _producer(model.output)
  features = _producer(classifier.input)
  while isinstance(features, tf.keras.layers.Dropout):
    features = _producer(features.input)
  adds = [layer for layer in layers if isinstance(layer, tf.keras.layers.Add)]
  if adds:
    # A ResNet: its stem (first activation), then each stage's last block.
    stem = next(
      layer for layer in layers if isinstance(layer, tf.keras.layers.Activation)
    )
    stages = [
      add
      for add, following in zip(adds, adds[1:] + [None])
      if following is None
      or tuple(add.output.shape) != tuple(following.output.shape)
    ]
    blocks = [stem] + stages
  else:
    blocks = [
      layer
      for layer in layers
      if layer.trainable_weights
      and layer is not classifier
      and not isinstance(layer, tf.keras.layers.Embedding)
    ]
  return dict(
    layers=[layer.name for layer in blocks],
    features=features.name,
    z=features.name,
  )


def keras_model_of(variable_model) -> tf.keras.Model:
  """The Keras model inside a task's `VariableModel` (TFF's
  `from_keras_model` keeps it as `_keras_model`)."""
  model = getattr(variable_model, '_keras_model', None)
  if not isinstance(model, tf.keras.Model):
    raise TypeError(
      'Expected the baseline task to wrap a Keras model '
      '(tff.learning.models.from_keras_model); got '
      f'{type(variable_model).__name__}.'
    )
  return model


def keras_model(tff_task) -> tf.keras.Model:
  """A new Keras model of the task, as TFF builds it."""
  return keras_model_of(tff_task.model_fn())


def methods_model(tff_task) -> tf.keras.Model:
  """TFF's model for the methods: logits out, its layers named."""
  model = keras_model(tff_task)
  return model_lib.named_outputs(
    model_lib.without_softmax(model), **_named_layers(model)
  )


def task_loss(labels: tf.Tensor, outputs: Mapping[str, tf.Tensor]) -> tf.Tensor:
  """TFF's loss on the methods' logits: the cross-entropy's mean over every
  position. TFF's `from_keras_model` computes the loss of the text tasks
  over the padding too (their models' masks do not reach it), and so does
  this; the masks still shape the LSTMs' outputs, in both."""
  return local_training.cross_entropy(labels, outputs)
