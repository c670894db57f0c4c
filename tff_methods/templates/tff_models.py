"""TFF's model interfaces, as the Keras contract the methods train.

A TFF user's `model_fn` returns a `tff.learning.models.VariableModel`
(`tff.learning.models.from_keras_model(keras_model, loss=..., ...)`), or the
user has a `tff.learning.models.FunctionalModel`; TFF's builders take both.
`keras_model_and_loss` turns either into what the project's loop trains: a
Keras model whose output `logits` is the model's own output (logits or
probabilities, whatever its loss reads), and the model's own loss as the
data term. The methods that read only the weights and that output
(FedAvg, FedProx, FedCos, SCAFFOLD, Fed2) train such a model as TFF's
FedAvg would, with their terms added. Methods that read inner layers
(MOON, FedCKA, FedMAX) need the Keras model itself, named with
`model_lib.named_outputs`.
"""

from typing import Any, Callable, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_methods.clients import client_data

LossFn = Callable[[tf.Tensor, Any], tf.Tensor]


def keras_model_and_loss(
  model_fn: Any, loss_fn: Optional[LossFn]
) -> tuple[Any, Optional[LossFn]]:
  """(Keras model builder, data term) for a builder's `keras_model_fn`.

  Args:
    model_fn: A no-arg function building a Keras model (returned as it is),
      one returning a `VariableModel` made by `from_keras_model`, or a
      `FunctionalModel` (or a function returning one).
    loss_fn: The builder's `loss_fn`; None for the model's own loss.

  Raises:
    TypeError: a `VariableModel` not made by `from_keras_model`.
    ValueError: a model with several losses (several outputs).
  """
  if isinstance(model_fn, tff.learning.models.FunctionalModel):
    functional = model_fn
  elif callable(model_fn) and not isinstance(model_fn, tf.keras.Model):
    try:
      with tf.Graph().as_default():
        built = model_fn()
    except Exception:  # pylint: disable=broad-except
      # TFF's functional_model_from_keras needs eager mode.
      built = model_fn()
    if isinstance(built, tff.learning.models.VariableModel):
      return _from_variable_model(model_fn, built, loss_fn)
    if not isinstance(built, tff.learning.models.FunctionalModel):
      return model_fn, loss_fn
    functional = model_fn()
  else:
    return model_fn, loss_fn
  return _from_functional_model(functional, loss_fn)


def _from_variable_model(model_fn, built, loss_fn):
  keras_model = getattr(built, '_keras_model', None)
  if keras_model is None:
    raise TypeError(
      f'{type(built).__name__} is a tff.learning.models.VariableModel not '
      'made by tff.learning.models.from_keras_model: the methods train a '
      'Keras model. Pass a function that builds the tf.keras.Model (or the '
      'from_keras_model of one).'
    )
  losses = list(built._loss_fns)  # pylint: disable=protected-access
  if len(losses) != 1:
    raise ValueError(
      f'The model has {len(losses)} losses (one per output); the methods '
      'train a model with one output and one loss.'
    )
  model_loss = losses[0]

  def keras_model_fn():
    model = model_fn()._keras_model  # pylint: disable=protected-access
    return _logits_are_the_output(model)

  if loss_fn is None:

    def loss_fn(labels, outputs):
      return model_loss(y_true=labels, y_pred=outputs['logits'])

  return keras_model_fn, loss_fn


def _logits_are_the_output(model: tf.keras.Model) -> tf.keras.Model:
  """The contract's dict form of a one-output model, whatever its output
  (probabilities too: the model's own loss reads them)."""
  if isinstance(model.output, (list, tuple, dict)):
    raise ValueError(
      f'Model {model.name!r} has several outputs; the methods train a model '
      'with one output and one loss.'
    )
  return tf.keras.Model(model.input, {'logits': model.output}, name=model.name)


class FunctionalModelLayer(tf.keras.layers.Layer):
  """A `FunctionalModel` as a Keras layer: its weights are this layer's
  variables (from its `initial_weights`), its call `predict_on_batch`."""

  def __init__(self, functional_model, **kwargs):
    super().__init__(name='functional_model', **kwargs)
    self._functional_model = functional_model
    trainable, non_trainable = functional_model.initial_weights
    self._weights_of = []
    for kind, values in (
      ('trainable', trainable),
      ('non_trainable', non_trainable),
    ):
      self._weights_of.append(
        [
          self.add_weight(
            name=f'{kind}_{i}',
            shape=np.shape(value),
            dtype=tf.as_dtype(np.asarray(value).dtype),
            initializer=tf.constant_initializer(np.asarray(value)),
            trainable=kind == 'trainable',
          )
          for i, value in enumerate(values)
        ]
      )

  def call(self, x, training=None):
    trainable, non_trainable = self._weights_of
    return self._functional_model.predict_on_batch(
      (trainable, non_trainable), x, bool(training)
    )


def _from_functional_model(functional, loss_fn):
  spec = functional.input_spec
  x_spec = spec['x'] if isinstance(spec, dict) else spec[0]

  def keras_model_fn():
    inputs = tf.keras.Input(
      shape=x_spec.shape[1:], batch_size=x_spec.shape[0], dtype=x_spec.dtype
    )
    outputs = FunctionalModelLayer(functional)(inputs)
    return tf.keras.Model(inputs, {'logits': outputs}, name='functional_model')

  if loss_fn is None:

    def loss_fn(labels, outputs):
      return functional.loss(output=outputs['logits'], label=labels)

  return keras_model_fn, loss_fn


class TokensAsExamples(tff.learning.models.VariableModel):
  """A TFF model whose forward pass counts its batch's tokens as examples.

  TFF 0.87's `build_weighted_fed_avg` weighs clients by the examples its
  model's forward pass reports (NUM_EXAMPLES) and takes no other function
  of a client; through this model that weight is the client's tokens, its
  labels other than `pad_token` (`aggregation.NumTokens`). Everything else,
  metrics included, is the wrapped model's.
  """

  def __init__(self, model: tff.learning.models.VariableModel, pad_token=0):
    self._model = model
    self._pad_token = pad_token

  @property
  def trainable_variables(self):
    return self._model.trainable_variables

  @property
  def non_trainable_variables(self):
    return self._model.non_trainable_variables

  @property
  def local_variables(self):
    return self._model.local_variables

  @property
  def input_spec(self):
    return self._model.input_spec

  @tf.function
  def forward_pass(self, batch_input, training=True):
    output = self._model.forward_pass(batch_input, training=training)
    labels = client_data.named_batch(batch_input)['y']
    tokens = tf.math.count_nonzero(
      tf.not_equal(labels, tf.cast(self._pad_token, labels.dtype)),
      dtype=tf.int32,
    )
    return output._replace(num_examples=tokens)

  @tf.function
  def predict_on_batch(self, batch_input, training=True):
    return self._model.predict_on_batch(batch_input, training=training)

  @tf.function
  def report_local_unfinalized_metrics(self):
    return self._model.report_local_unfinalized_metrics()

  def metric_finalizers(self):
    return self._model.metric_finalizers()

  @tf.function
  def reset_metrics(self):
    return self._model.reset_metrics()
