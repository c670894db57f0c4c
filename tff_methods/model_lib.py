"""The multi-output Keras model contract, and its glue to TFF.

A model the methods train is a functional `tf.keras.Model` whose output is
a dict of named tensors:

- `layer_1`, `layer_2`, ...: each block's activation, nearest the input
  first (FedCKA regularizes the first M of them);
- `features`: the last post-ReLU hidden vector (FedMAX's activations);
- `z`: a projection head's output, where the model has one (MOON);
- `logits`: the unnormalized class scores.

Every trainable layer lies on the path from the input to `logits`
(`logits_only` checks it). The task zoo's models (`tasks.models`) follow
this contract; so may a user's own. The project's own client work reads
that dict; TFF's builders
(`tff.learning.algorithms.build_weighted_fed_avg`, ...) take a
`tff.learning.models.VariableModel` built from the same layers with `logits`
as the only output. Both see the same trainable variables in the same order,
so their `tff.learning.models.ModelWeights` are interchangeable.
"""

import collections
import collections.abc
import contextlib
from typing import Any, Callable

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

KerasModelFn = Callable[[], tf.keras.Model]


def layer_names(model: tf.keras.Model) -> list[str]:
  """The model's `layer_k` output names, nearest the input first."""
  names = [k for k in model.output if k.startswith('layer_')]
  return sorted(names, key=lambda k: int(k.split('_')[1]))


def logits_only(model: tf.keras.Model) -> tf.keras.Model:
  """The same model (shared layers) with `logits` as its only output.

  This is the form TFF's `tff.learning.models.from_keras_model` takes.
  """
  wrapped = tf.keras.Model(model.input, model.output['logits'],
                           name=model.name + '_logits')
  if [v.ref() for v in wrapped.trainable_variables] != [
      v.ref() for v in model.trainable_variables]:
    raise ValueError(
        f'Model {model.name!r} has trainable layers off the path to its '
        'logits; its weights would not match TFF\'s view of it.')
  return wrapped



def tff_model_fn(keras_model_fn: KerasModelFn, element_spec: Any
                 ) -> Callable[[], tff.learning.models.VariableModel]:
  """A no-arg `VariableModel` factory for TFF's own builders.

  Args:
    keras_model_fn: Builds one of the project's multi-output Keras models.
    element_spec: The batched `OrderedDict(x, y)` spec of client data (other
      keys, such as `index`, are not the model's and are left out).
  """
  if isinstance(element_spec, collections.abc.Mapping):
    element_spec = collections.OrderedDict(x=element_spec['x'],
                                           y=element_spec['y'])

  def model_fn():
    return tff.learning.models.from_keras_model(
        logits_only(keras_model_fn()),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        input_spec=element_spec,
        metrics=[tf.keras.metrics.SparseCategoricalAccuracy()])

  return model_fn


def weights_type(keras_model_fn: KerasModelFn) -> tff.Type:
  """The TFF type of the model's `ModelWeights`, as TFF's builders see it
  (`tff.learning.models.weights_type_from_model`)."""
  return weights_type_of(zero_weights(keras_model_fn))


def weights_type_of(weights: tff.learning.models.ModelWeights) -> tff.Type:
  """The TFF type of numpy `ModelWeights` (e.g. `zero_weights`'), so a
  builder that needs both builds the model once."""
  return tff.types.tensorflow_to_type(tf.nest.map_structure(
      lambda w: tf.TensorSpec(np.shape(w), tf.as_dtype(np.asarray(w).dtype)),
      weights))


def initial_weights_computation(keras_model_fn: KerasModelFn
                                ) -> tff.Computation:
  """A no-arg TFF computation returning a freshly built model's weights."""

  @tff.tensorflow.computation
  def initial_model_weights_fn():
    model = keras_model_fn()
    return tff.learning.models.ModelWeights(
        trainable=list(model.trainable_variables),
        non_trainable=list(model.non_trainable_variables))

  return initial_model_weights_fn


def get_weights(model: tf.keras.Model) -> tff.learning.models.ModelWeights:
  """The model's current weights as numpy `ModelWeights`."""
  return tff.learning.models.ModelWeights(
      trainable=[v.numpy() for v in model.trainable_variables],
      non_trainable=[v.numpy() for v in model.non_trainable_variables])


def assign_weights(model: tf.keras.Model, weights) -> None:
  """Sets the model's variables from `ModelWeights` (or a (t, nt) pair)."""
  trainable, non_trainable = weights
  for v, w in zip(model.trainable_variables, trainable):
    v.assign(w)
  for v, w in zip(model.non_trainable_variables, non_trainable):
    v.assign(w)


@contextlib.contextmanager
def weights_assigned_before_use():
  """Variables created in this scope start at zeros, not at their
  initializers' values.

  For models whose weights are assigned before they are read, such as a
  client's copy of the global model: the TFF worker runs a computation's
  initializers on every call, and Keras' are random draws (Glorot, ...).
  Only variables of a known shape and dtype are affected.
  """

  def zeros_creator(next_creator, **kwargs):
    shape, dtype = kwargs.get('shape'), kwargs.get('dtype')
    if (shape is not None and dtype is not None
        and tf.TensorShape(shape).is_fully_defined()):
      kwargs['initial_value'] = lambda: tf.zeros(shape, dtype)
    return next_creator(**kwargs)

  with tf.variable_creator_scope(zeros_creator):
    yield


def initial_weights(keras_model_fn: KerasModelFn, seed: int
                    ) -> tff.learning.models.ModelWeights:
  """Seeded initial weights: the same seed gives the same model."""
  tf.keras.utils.set_random_seed(seed)
  return get_weights(keras_model_fn())


def zero_weights(keras_model_fn: KerasModelFn
                 ) -> tff.learning.models.ModelWeights:
  """Numpy zeros shaped like the model's weights (built in a scratch graph)."""
  with tf.Graph().as_default():
    model = keras_model_fn()
    return tff.learning.models.ModelWeights(
        [np.zeros(v.shape, v.dtype.as_numpy_dtype)
         for v in model.trainable_variables],
        [np.zeros(v.shape, v.dtype.as_numpy_dtype)
         for v in model.non_trainable_variables])


def all_finite(weights) -> bool:
  """Whether every tensor in a (nested) weights structure is finite."""
  return all(np.all(np.isfinite(np.asarray(w)))
             for w in tf.nest.flatten(weights))


def flat_trainable(weights) -> np.ndarray:
  """The trainable weights flattened into one vector."""
  trainable = weights.trainable if hasattr(weights, 'trainable') else (
      weights[0])
  return np.concatenate([np.ravel(w) for w in trainable])


def weights_to_dict(weights) -> collections.OrderedDict:
  """Flat name -> array mapping, e.g. for np.savez."""
  out = collections.OrderedDict()
  for kind, tensors in zip(('trainable', 'non_trainable'), weights):
    for i, w in enumerate(tensors):
      out[f'{kind}_{i}'] = np.asarray(w)
  return out
