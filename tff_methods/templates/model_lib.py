"""The multi-output Keras model contract, and its glue to TFF.

A model the methods train is a functional `tf.keras.Model` whose output is
a dict of named tensors:

- `layer_1`, `layer_2`, ...: each block's activation, nearest the input
  first (FedCKA regularizes the first M of them);
- `features`: the last post-ReLU hidden vector (FedMAX's activations);
- `z`: a projection head's output, where the model has one (MOON);
- `logits`: the unnormalized class scores.

Every trainable layer lies on the path from the input to `logits` (`logits_only`
checks it). The task zoo's models (`tff_methods_tasks.models`) follow this
contract. A user's own Keras model joins it through `named_outputs`, which names
the layers a method reads (`named_outputs(model, features='hidden')` for
FedMAX); a model with one output is taken as `logits` as it is, which is all
FedAvg, FedProx, FedCos and SCAFFOLD read. Every builder checks the model it is
given (`model_checks.check_outputs`) and says which named output a method needs
and how to name it. The project's own client work reads that dict; TFF's
builders (`tff.learning.algorithms.build_weighted_fed_avg`, ...) take a
`tff.learning.models.VariableModel` built from the same layers with `logits` as
the only output. Both see the same trainable variables in the same order, so
their `tff.learning.models.ModelWeights` are interchangeable.
"""

import collections
import collections.abc
import contextlib
from typing import Any, Callable, Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

KerasModelFn = Callable[[], tf.keras.Model]


def _layer_output(model: tf.keras.Model, layer: str) -> tf.Tensor:
  try:
    return model.get_layer(layer).output
  except ValueError:
    names = [layer.name for layer in model.layers]
    raise ValueError(
      f'Model {model.name!r} has no layer {layer!r}; its '
      f'layers are {names}.'
    ) from None


def _checked_input(model: tf.keras.Model) -> Any:
  if not isinstance(model, tf.keras.Model):
    raise TypeError(
      f'Expected a tf.keras.Model, got {type(model).__name__}' '.'
    )
  try:
    inputs = model.input
  except (AttributeError, ValueError):
    inputs = None
  if inputs is None:
    raise ValueError(
      f'Model {model.name!r} has no defined input: build it with '
      'tf.keras.Input (or give its first layer an input_shape).'
    )
  return inputs


def _check_logits(model: tf.keras.Model, logits: tf.Tensor) -> None:
  """Refuses logits that come out of a softmax, with advice that applies
  to where the softmax is."""
  history = getattr(logits, '_keras_history', None)
  layer = history.layer if history is not None else None
  if not _is_softmax(layer):
    return
  own_loss = (
    'or, to train on its probabilities as TFF does, pass a model_fn '
    'returning tff.learning.models.from_keras_model(model, loss=tf.keras.'
    'losses.SparseCategoricalCrossentropy(), ...)'
  )
  if isinstance(layer, tf.keras.layers.Softmax):
    before = layer.input._keras_history.layer.name  # pylint: disable=protected-access
    where = (
      f'name the layer before it as logits (named_outputs(model, '
      f'logits={before!r})), drop it (model_lib.without_softmax(model)), '
    )
  else:
    where = (
      'build the model with the softmax left out of that layer (model_lib.'
      'without_softmax(model) does: the same layers and weights, logits '
      'out), '
    )
  raise ValueError(
    f"Model {model.name!r}'s output comes out of a softmax (layer "
    f'{layer.name!r}); the methods train on unnormalized logits: '
    + where
    + own_loss
    + '.'
  )


def named_outputs(
  model,
  *,
  logits: Optional[str] = None,
  features: Optional[str] = None,
  z: Optional[str] = None,
  layers: Sequence[str] = (),
):
  """A Keras model with the layers the methods read named as its outputs.

  The adapter from any functional or Sequential Keras model to the
  contract: `layers` names `layer_1`, `layer_2`, ... (FedCKA's first
  layers, nearest the input first), `features` FedMAX's activation vector,
  `z` MOON's projection, and `logits` the class scores (the model's own
  output by default). The returned model shares the given model's layers
  and weights.

      model_fn = lambda: named_outputs(make_cnn(), features='dense_1',
                                       layers=['conv_1', 'conv_2'])

  Args:
    model: A `tf.keras.Model` with a defined input, or a no-argument
      function that builds one (then a function is returned).
    logits: The layer whose output is the logits; the model's output when
      None.
    features: The layer whose output is the last hidden vector.
    z: The layer whose output is the projection head's.
    layers: The layers whose outputs are `layer_1`, `layer_2`, ...

  Raises:
    ValueError: a named layer the model does not have (the message lists
      its layers), a model without a defined input, logits out of a softmax.
  """
  if callable(model) and not isinstance(model, tf.keras.Model):
    model_fn = model
    return lambda: named_outputs(
      model_fn(), logits=logits, features=features, z=z, layers=layers
    )
  inputs = _checked_input(model)
  outputs = collections.OrderedDict()
  for k, layer in enumerate(layers, start=1):
    outputs[f'layer_{k}'] = _layer_output(model, layer)
  if features is not None:
    outputs['features'] = _layer_output(model, features)
  if z is not None:
    outputs['z'] = _layer_output(model, z)
  if logits is not None:
    outputs['logits'] = _layer_output(model, logits)
  else:
    outputs['logits'] = contract_model(model).output['logits']
  _check_logits(model, outputs['logits'])
  return tf.keras.Model(inputs, outputs, name=model.name)


class _WithoutActivation(tf.keras.layers.Layer):
  """Runs a layer with its activation left out, on the layer's own weights.

  The layer is tracked as this one's only sublayer, so its weights (and
  their regularization losses) are this layer's, in the same order.
  """

  def __init__(self, layer: tf.keras.layers.Layer, **kwargs):
    super().__init__(name=f'{layer.name}_logits', **kwargs)
    self.wrapped = layer
    self.supports_masking = True

  def call(self, inputs):
    activation = self.wrapped.activation
    self.wrapped.activation = tf.keras.activations.linear
    try:
      return self.wrapped.call(inputs)
    finally:
      self.wrapped.activation = activation

  def compute_mask(self, inputs, mask=None):
    return mask


def _is_softmax(layer: Any) -> bool:
  return (
    getattr(layer, 'activation', None) is tf.keras.activations.softmax
    or getattr(layer, 'activation', None) is tf.nn.softmax
    or isinstance(layer, tf.keras.layers.Softmax)
  )


def without_softmax(model: tf.keras.Model) -> tf.keras.Model:
  """`model` with its final softmax left out: its output is the logits.

  The methods train on logits; many published Keras models (TFF's
  baseline models among them) end in a softmax, inside their last layer
  (`Dense(..., activation='softmax')`) or as a `Softmax` layer. The
  returned model shares `model`'s layers and weights, in the same order; a
  model that does not end in a softmax is returned as it is.
  """
  inputs = _checked_input(model)
  history = getattr(model.output, '_keras_history', None)
  last = history.layer if history is not None else None
  if last is None or not _is_softmax(last):
    return model
  if isinstance(last, tf.keras.layers.Softmax):
    logits = last.input
  else:
    logits = _WithoutActivation(last)(last.input)
  return tf.keras.Model(inputs, logits, name=model.name)


def contract_model(model: Any) -> tf.keras.Model:
  """`model` in the contract's form: a dict output with `logits`.

  A model whose output is already such a dict is returned as it is; a
  model with one output gets it named `logits`.

  Raises:
    TypeError: a `tff.learning.models.VariableModel` (or anything not a
      Keras model), or a model with several unnamed outputs.
    ValueError: a dict output without `logits`; logits out of a softmax.
  """
  if isinstance(model, tff.learning.models.VariableModel):
    raise TypeError(
      'The methods train a Keras model, not a tff.learning.models.'
      'VariableModel: pass a function that builds the tf.keras.Model '
      '(the one given to tff.learning.models.from_keras_model), wrapped '
      'in tff_methods.templates.model_lib.named_outputs(...) to name the '
      'layers a method reads.'
    )
  inputs = _checked_input(model)
  output = model.output
  if isinstance(output, collections.abc.Mapping):
    if 'logits' not in output:
      raise ValueError(
        f'Model {model.name!r} outputs {sorted(output)} but no '
        "'logits'; name its class scores with named_outputs(model, "
        'logits=...).'
      )
    return model
  if isinstance(output, (list, tuple)):
    raise TypeError(
      f'Model {model.name!r} has {len(output)} unnamed outputs; name them '
      'with tff_methods.templates.model_lib.named_outputs(model, '
      'logits=..., ...).'
    )
  _check_logits(model, output)
  return tf.keras.Model(inputs, {'logits': output}, name=model.name)


def contract_model_fn(keras_model_fn: Callable[[], Any]) -> KerasModelFn:
  """`keras_model_fn` whose models are in the contract (`contract_model`)."""
  if getattr(keras_model_fn, '_in_contract', False):
    return keras_model_fn

  def model_fn():
    return contract_model(keras_model_fn())

  model_fn._in_contract = True
  return model_fn


def layer_names(model: tf.keras.Model) -> list[str]:
  """The model's `layer_k` output names, nearest the input first."""
  names = [k for k in model.output if k.startswith('layer_')]
  return sorted(names, key=lambda k: int(k.split('_')[1]))


def logits_only(model: tf.keras.Model) -> tf.keras.Model:
  """The same model (shared layers) with `logits` as its only output.

  This is the form TFF's `tff.learning.models.from_keras_model` takes.
  """
  wrapped = tf.keras.Model(
    model.input, model.output['logits'], name=model.name + '_logits'
  )
  if [v.ref() for v in wrapped.trainable_variables] != [
    v.ref() for v in model.trainable_variables
  ]:
    raise ValueError(
      f'Model {model.name!r} has trainable layers off the path to its '
      "logits; its weights would not match TFF's view of it."
    )
  return wrapped


def tff_model_fn(
  keras_model_fn: KerasModelFn, element_spec: Any
) -> Callable[[], tff.learning.models.VariableModel]:
  """A no-arg `VariableModel` factory for TFF's own builders.

  Args:
    keras_model_fn: Builds one of the project's multi-output Keras models.
    element_spec: The batched `OrderedDict(x, y)` spec of client data (other
      keys, such as `index`, are not the model's and are left out).
  """
  if isinstance(element_spec, collections.abc.Mapping):
    element_spec = collections.OrderedDict(
      x=element_spec['x'], y=element_spec['y']
    )
  else:
    element_spec = tuple(element_spec)

  def model_fn():
    return tff.learning.models.from_keras_model(
      logits_only(contract_model(keras_model_fn())),
      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      input_spec=element_spec,
      metrics=[tf.keras.metrics.SparseCategoricalAccuracy()],
    )

  return model_fn


def weights_type(keras_model_fn: KerasModelFn) -> tff.Type:
  """The TFF type of the model's `ModelWeights`, as TFF's builders see it
  (`tff.learning.models.weights_type_from_model`)."""
  return weights_type_of(zero_weights(keras_model_fn))


def weights_type_of(weights: tff.learning.models.ModelWeights) -> tff.Type:
  """The TFF type of numpy `ModelWeights` (e.g. `zero_weights`'), so a
  builder that needs both builds the model once."""
  return tff.types.tensorflow_to_type(
    tf.nest.map_structure(
      lambda w: tf.TensorSpec(np.shape(w), tf.as_dtype(np.asarray(w).dtype)),
      weights,
    )
  )


def initial_weights_computation(
  keras_model_fn: KerasModelFn,
) -> tff.Computation:
  """A no-arg TFF computation returning a freshly built model's weights."""

  @tff.tensorflow.computation
  def initial_model_weights_fn():
    model = keras_model_fn()
    return tff.learning.models.ModelWeights(
      trainable=list(model.trainable_variables),
      non_trainable=list(model.non_trainable_variables),
    )

  return initial_model_weights_fn


def get_weights(model: tf.keras.Model) -> tff.learning.models.ModelWeights:
  """The model's current weights as numpy `ModelWeights`."""
  return tff.learning.models.ModelWeights(
    trainable=[v.numpy() for v in model.trainable_variables],
    non_trainable=[v.numpy() for v in model.non_trainable_variables],
  )


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
    if (
      shape is not None
      and dtype is not None
      and tf.TensorShape(shape).is_fully_defined()
    ):
      kwargs['initial_value'] = lambda: tf.zeros(shape, dtype)
    return next_creator(**kwargs)

  with tf.variable_creator_scope(zeros_creator):
    yield


def initial_weights(
  keras_model_fn: KerasModelFn, seed: int
) -> tff.learning.models.ModelWeights:
  """Seeded initial weights: the same seed gives the same model."""
  tf.keras.utils.set_random_seed(seed)
  return get_weights(keras_model_fn())


def scratch_model(keras_model_fn: KerasModelFn) -> tf.keras.Model:
  """The model `keras_model_fn` builds, in a graph of its own: for what a
  builder reads of a model without running it (its outputs, its input,
  its variables' names and shapes). Build it once and read it all: a large
  model takes seconds to build."""
  with tf.Graph().as_default():
    return keras_model_fn()


def zeros_like_weights(
  model: tf.keras.Model,
) -> tff.learning.models.ModelWeights:
  """Numpy zeros shaped like `model`'s weights."""
  return tff.learning.models.ModelWeights(
    [
      np.zeros(v.shape, v.dtype.as_numpy_dtype)
      for v in model.trainable_variables
    ],
    [
      np.zeros(v.shape, v.dtype.as_numpy_dtype)
      for v in model.non_trainable_variables
    ],
  )


def zero_weights(
  keras_model_fn: KerasModelFn,
) -> tff.learning.models.ModelWeights:
  """Numpy zeros shaped like the model's weights (built in a scratch graph)."""
  return zeros_like_weights(scratch_model(keras_model_fn))


def all_finite(weights) -> bool:
  """Whether every tensor in a (nested) weights structure is finite."""
  return all(
    np.all(np.isfinite(np.asarray(w))) for w in tf.nest.flatten(weights)
  )


def flat_trainable(weights) -> np.ndarray:
  """The trainable weights flattened into one vector."""
  trainable = (
    weights.trainable if hasattr(weights, 'trainable') else (weights[0])
  )
  return np.concatenate([np.ravel(w) for w in trainable])


def weights_to_dict(weights) -> collections.OrderedDict:
  """Flat name -> array mapping, e.g. for np.savez."""
  out = collections.OrderedDict()
  for kind, tensors in zip(('trainable', 'non_trainable'), weights):
    for i, w in enumerate(tensors):
      out[f'{kind}_{i}'] = np.asarray(w)
  return out


def keras_model_with_weights(
  keras_model_fn: Callable[[], Any], weights
) -> tf.keras.Model:
  """A new model from `keras_model_fn` holding trained `ModelWeights`.

  The export path: the model is the one `keras_model_fn` builds (a user's
  plain Keras model stays plain), its variables set through the contract's
  view of it, so it saves, reloads and predicts as a Keras model does.
  """
  model = keras_model_fn()
  trainable, non_trainable = weights
  shapes = [tuple(v.shape) for v in model.trainable_variables]
  if shapes != [tuple(np.shape(w)) for w in trainable]:
    raise ValueError(
      f'The weights hold trainable tensors of shapes '
      f'{[tuple(np.shape(w)) for w in trainable]}; model {model.name!r} has '
      f'{shapes}.'
    )
  # The user's own model, softmax or not: its variables are the contract
  # view's, in the same order (as TFF's `ModelWeights.assign_weights_to`).
  assign_weights(model, (trainable, non_trainable))
  return model
