"""The shared local-training loop: its losses, its client update, and its
client work for clients without state.

`build_local_training_client_work` is a `tff.learning.templates.
ClientWorkProcess` in the shape of TFF's `model_delta_client_work`: each
client starts from the broadcast global weights `w_g`, takes one optimizer
step per batch of its (already batched and repeated) data on

  objective = cross_entropy + sum of the regularizers' terms,

and returns the update `w_g - w` (TFF's sign convention) weighted by its
examples (or tokens, or uniformly). A client whose update is not finite
(an entry, or its l2 norm) gets weight 0 and is counted in
`num_non_finite_clients`, as TFF does.

`build_client_update_fn` is the client update both client works run (this
one, and `stateful`'s for clients that keep state); `processes` composes
either into a learning process.
"""

import collections
import collections.abc
from typing import Callable, Mapping, Optional, Sequence

import tensorflow as tf
import tensorflow_federated as tff

from tff_methods.clients import batches_in_memory
from tff_methods.clients import client_data
from tff_methods.templates import aggregation
from tff_methods.templates import model_lib
from tff_methods.templates import reference_outputs
from tff_methods.templates import regularizers as regularizers_lib

_TRAIN_SUMS = (
  'loss_sum',
  'objective_sum',
  'correct',
  'num_labels',
  'num_examples',
  'num_batches',
  'num_non_finite_clients',
)


# The data term of the local objective: (labels, model outputs) -> scalar.
LossFn = Callable[[tf.Tensor, Mapping[str, tf.Tensor]], tf.Tensor]


def cross_entropy(
  labels: tf.Tensor, outputs: Mapping[str, tf.Tensor]
) -> tf.Tensor:
  """Mean sparse softmax cross-entropy of `outputs['logits']` (the default)."""
  return tf.reduce_mean(
    tf.keras.losses.sparse_categorical_crossentropy(
      labels, outputs['logits'], from_logits=True
    )
  )


def squared_error(
  labels: tf.Tensor, outputs: Mapping[str, tf.Tensor]
) -> tf.Tensor:
  """Mean of `0.5 * (logits - labels)^2`: least squares on a 1-d output."""
  predictions = tf.reshape(outputs['logits'], tf.shape(labels))
  return 0.5 * tf.reduce_mean(tf.square(predictions - labels))


def _labels_like(labels: tf.Tensor, predictions: tf.Tensor) -> tf.Tensor:
  """`labels` shaped as `predictions`, as Keras' sparse accuracy takes them.

  TFF's tutorials batch labels as `(B, 1)`; compared with `(B,)`
  predictions, `tf.equal` would broadcast to `(B, B)`.
  """
  if (
    labels.shape.rank is not None
    and predictions.shape.rank is not None
    and labels.shape.rank == predictions.shape.rank + 1
  ):
    labels = tf.squeeze(labels, axis=-1)
  return labels


def _union(names_lists):
  return tuple(sorted(set(n for names in names_lists for n in names)))


def _objective(loss, model_losses, regularizers, step):
  """The data term, the model's own losses and every regularizer's term."""
  objective = loss
  if model_losses:
    # The model's own weight regularization, which Keras and TFF's
    # `from_keras_model` train with (TFF's ResNets have L2 on each layer);
    # the loss reported is the data term, as TFF's.
    objective += tf.add_n(model_losses)
  for regularizer in regularizers:
    term = regularizer(step)
    if term is not None:
      objective += term
  return objective


def _added_batch(sums, loss, objective, logits, batch):
  """The training sums (`_TRAIN_SUMS`) with one batch's added."""
  predictions = tf.argmax(logits, axis=-1, output_type=tf.int32)
  labels = _labels_like(tf.cast(batch['y'], tf.int32), predictions)
  batch_size = tf.cast(tf.shape(batch['y'])[0], tf.float32)
  return collections.OrderedDict(
    loss_sum=sums['loss_sum'] + loss * batch_size,
    objective_sum=sums['objective_sum'] + objective * batch_size,
    correct=sums['correct']
    + tf.reduce_sum(tf.cast(tf.equal(predictions, labels), tf.float32)),
    num_labels=sums['num_labels'] + tf.cast(tf.size(labels), tf.float32),
    num_examples=sums['num_examples'] + batch_size,
    num_batches=sums['num_batches'] + 1.0,
    num_non_finite_clients=sums['num_non_finite_clients'],
  )


def _dropped_if_not_finite(update, weight, sums):
  """`(update, weight, sums)`, or for a diverged client a zero update, zero
  weight, and its metrics replaced by one count of non-finite clients: it
  must not reach the mean.

  Finite entries are not enough: an update whose l2 norm overflows (an
  entry above about 1.8e19) turns NaN under a DP clip, so it is dropped as
  a diverged one is, before any aggregator sees it.
  """
  is_finite = tf.logical_and(
    tf.reduce_all([tf.reduce_all(tf.math.is_finite(u)) for u in update]),
    tf.math.is_finite(tf.linalg.global_norm(update)),
  )

  def drop_client():
    dropped = collections.OrderedDict(
      (k, tf.zeros_like(v)) for k, v in sums.items()
    )
    dropped['num_non_finite_clients'] = tf.constant(1.0)
    return [tf.zeros_like(u) for u in update], tf.constant(0.0), dropped

  return tf.cond(is_finite, lambda: (update, weight, sums), drop_client)


def _models(keras_model_fn, regularizers, cache_reference_outputs):
  """The model a client trains, the truncated global and previous models
  for the outputs the regularizers declare (None where none is read), and
  their outputs' tables (`ReferenceOutputs`)."""
  # Every model here is assigned its weights before its first use.
  with model_lib.weights_assigned_before_use():
    model = keras_model_fn()
    global_reference = reference_outputs.reference_view(
      keras_model_fn, _union(r.global_outputs for r in regularizers)
    )
    previous_reference = reference_outputs.reference_view(
      keras_model_fn, _union(r.previous_outputs for r in regularizers)
    )
  views = {
    key: view
    for key, view in (
      ('global', global_reference),
      ('previous', previous_reference),
    )
    if view is not None
  }
  reference = reference_outputs.ReferenceOutputs(
    views,
    reference_outputs.REFERENCE_CACHE_MAX_MB,
    cache=cache_reference_outputs,
  )
  return model, global_reference, previous_reference, reference


def _applied(optimizer, state, trainable, gradients, weight_correctors, step):
  """The optimizer's step on the trainable variables, then each weight
  correction (SCAFFOLD's); the optimizer's new state."""
  state, new_weights = optimizer.next(state, tuple(trainable), tuple(gradients))
  for variable, value in zip(trainable, new_weights):
    variable.assign(value)
  for regularizer in weight_correctors:
    for variable, delta in zip(trainable, regularizer.weight_correction(step)):
      variable.assign_sub(delta)
  return state


def _training_step(
  model, loss_fn, regularizers, reference, optimizer, weighting, round_values
):
  """One batch of a client's training, as `batches.reduce` takes it:
  `(sums, optimizer state, (tables, has_previous), tokens), batch` -> the
  same after the batch. `round_values` are what the regularizers read of
  the round: (trainable variables, global weights, broadcast, client
  state, learning rate)."""
  trainable, global_weights, broadcast, client_state, learning_rate = (
    round_values
  )
  counts_tokens = isinstance(weighting, aggregation.NumTokens)
  weight_correctors = [r for r in regularizers if r.weight_correction]

  def reduce_fn(state, batch):
    batch = client_data.named_batch(batch)
    sums, optimizer_state, (carried_tables, has_previous), tokens = state
    # Reference models: inference mode, outside the tape.
    references = reference.outputs(batch, carried_tables or None)
    global_outputs = references.get('global')
    previous_outputs = references.get('previous')
    with tf.GradientTape() as tape:
      outputs = model(batch['x'], training=True)
      loss = loss_fn(batch['y'], outputs)
      step = regularizers_lib.LocalStep(
        trainable,
        global_weights,
        outputs,
        batch,
        global_outputs,
        previous_outputs,
        has_previous,
        broadcast,
        client_state,
        learning_rate,
      )
      objective = _objective(loss, model.losses, regularizers, step)
    gradients = tape.gradient(objective, trainable)
    optimizer_state = _applied(
      optimizer,
      optimizer_state,
      trainable,
      gradients,
      weight_correctors,
      step,
    )
    sums = _added_batch(sums, loss, objective, outputs['logits'], batch)
    if counts_tokens:
      tokens += weighting.count(batch['y'])
    return sums, optimizer_state, (carried_tables, has_previous), tokens

  return reduce_fn


def _client_result(model, global_weights, weighting, sums, tokens):
  """(`ClientResult`: the update `w_g - w` and its weight, the training
  sums, the final weights), a diverged client's dropped."""
  trainable = model.trainable_variables
  update = [g - w for g, w in zip(global_weights, trainable)]
  weight = {
    tff.learning.ClientWeighting.NUM_EXAMPLES: sums['num_examples'],
    tff.learning.ClientWeighting.UNIFORM: tf.constant(1.0),
  }.get(weighting, tokens)
  update, weight, sums = _dropped_if_not_finite(update, weight, sums)
  final_weights = tff.learning.models.ModelWeights(
    trainable=[tf.identity(v) for v in model.trainable_variables],
    non_trainable=[tf.identity(v) for v in model.non_trainable_variables],
  )
  return (
    tff.learning.templates.ClientResult(update=update, update_weight=weight),
    sums,
    final_weights,
  )


def build_client_update_fn(
  keras_model_fn: model_lib.KerasModelFn,
  optimizer: tff.learning.optimizers.Optimizer,
  regularizers: Sequence[regularizers_lib.Regularizer],
  weighting: aggregation.ClientWeighting,
  loss_fn: Optional[LossFn] = None,
  cache_reference_outputs: bool = True,
):
  """The `tf.function` that trains one client.

  Builds the model, and truncated copies of the global and previous models
  for the outputs the regularizers declare. `loss_fn(labels, outputs)` is
  the data term (cross-entropy on `logits` by default). When the batches carry
  `index` (each example's position in the client's data) and
  `cache_reference_outputs`, the reference models' outputs are computed
  once per example and round (`ReferenceOutputs`).

  Returns:
    A function `(initial_weights, dataset, previous_weights=None,
    has_previous=False, broadcast=None, client_state=None,
    optimizer_hparams=None) -> (ClientResult, train_sums, final_weights)`;
    `dataset` is the client's batches, a data set or `batches_in_memory.
    SlicedBatches`; `previous_weights` is the part of the previous model
    the regularizers' previous-model view reads (`reference_outputs.
    ReferenceView.kept_weights`); `broadcast` and `client_state` reach the
    regularizers through `LocalStep`; `optimizer_hparams` are the round's
    hyperparameters of the optimizer (`client_hparams`), its own when None.
  """
  loss_fn = loss_fn or cross_entropy
  model, global_reference, previous_reference, reference = _models(
    keras_model_fn, regularizers, cache_reference_outputs
  )

  # Without autograph: the loop is written in TensorFlow's control flow
  # (tf.cond, `batches.reduce`'s tf.while_loop), so converting it and all
  # it calls would only cost time (about 2 s of a process's first build).
  @tf.function(autograph=False)
  def client_update(
    initial_weights,
    dataset,
    previous_weights=None,
    has_previous=False,
    broadcast=None,
    client_state=None,
    optimizer_hparams=None,
  ):
    trainable = model.trainable_variables
    learning_rate = None
    if optimizer_hparams is not None:
      learning_rate = optimizer_hparams.get('learning_rate')
    model_lib.assign_weights(model, initial_weights)
    global_weights = list(initial_weights.trainable)
    if global_reference is not None:
      global_reference.assign(initial_weights)
    if previous_reference is not None:
      previous_reference.assign_kept(previous_weights)
    if isinstance(dataset, batches_in_memory.SlicedBatches):
      batches = dataset
    else:
      batches = batches_in_memory.BatchesInMemory(dataset)
    tables = reference.tabulate(batches)

    reduce_fn = _training_step(
      model,
      loss_fn,
      regularizers,
      reference,
      optimizer,
      weighting,
      round_values=(
        trainable,
        global_weights,
        broadcast,
        client_state,
        learning_rate,
      ),
    )

    specs = tuple(tf.TensorSpec(v.shape, v.dtype) for v in trainable)
    initial_sums = collections.OrderedDict(
      (k, tf.constant(0.0)) for k in _TRAIN_SUMS
    )
    # Loop variables, not captures: a tensor captured into the loop lets
    # TensorFlow's oneDNN layout pass meet a MaxPool gradient before its
    # forward op and leave it on the slow generic kernel
    # (docs/performance.md).
    carried = (tables or (), tf.convert_to_tensor(has_previous))
    optimizer_state = optimizer.initialize(specs)
    if optimizer_hparams is not None:
      optimizer_state = optimizer.set_hparams(
        optimizer_state, optimizer_hparams
      )
    sums, _, _, tokens = batches.reduce(
      (initial_sums, optimizer_state, carried, tf.constant(0.0)), reduce_fn
    )
    return _client_result(model, global_weights, weighting, sums, tokens)

  return client_update
