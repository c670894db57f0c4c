"""The shared local-training client work, and learning processes built on it.

`build_local_training_client_work` is a `tff.learning.templates.
ClientWorkProcess` in the shape of TFF's `model_delta_client_work`: each
client starts from the broadcast global weights `w_g`, takes one optimizer
step per batch of its (already batched and repeated) data on

  objective = cross_entropy + sum of the regularizers' terms,

and returns the update `w_g - w` (TFF's sign convention: the server
optimizer treats it as a gradient) weighted by its number of examples. A
client whose update is not finite gets weight 0 and is counted in the
`num_non_finite_clients` measurement, as TFF does.

`build_local_training_process` composes it with a distributor (TFF's
broadcast, plus the values of regularizers that keep server state, such as
FedCos's last global move), a mean aggregator and TFF's server-optimizer
finalizer into a `tff.learning.templates.
LearningProcess`; with no regularizers and TFF's SGD it computes what
`tff.learning.algorithms.build_weighted_fed_avg` computes.
"""

import collections
import collections.abc
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_methods import aggregation
from tff_methods import model_lib
from tff_methods import regularizers as regularizers_lib

_TRAIN_SUMS = ('loss_sum', 'objective_sum', 'correct', 'num_labels',
               'num_examples', 'num_batches', 'num_non_finite_clients')


# Client update weight from the labels the client trained on (a count per
# class) and the default weight.
ClientWeightFn = Callable[[tf.Tensor, tf.Tensor], tf.Tensor]
# The data term of the local objective: (labels, model outputs) -> scalar.
LossFn = Callable[[tf.Tensor, Mapping[str, tf.Tensor]], tf.Tensor]


def cross_entropy(labels: tf.Tensor, outputs: Mapping[str, tf.Tensor]
                  ) -> tf.Tensor:
  """Mean sparse softmax cross-entropy of `outputs['logits']` (the default)."""
  return tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(
      labels, outputs['logits'], from_logits=True))


def squared_error(labels: tf.Tensor, outputs: Mapping[str, tf.Tensor]
                  ) -> tf.Tensor:
  """Mean of `0.5 * (logits - labels)^2`: least squares on a 1-d output."""
  predictions = tf.reshape(outputs['logits'], tf.shape(labels))
  return 0.5 * tf.reduce_mean(tf.square(predictions - labels))


def named_batch(batch) -> Mapping[str, Any]:
  """A batch as `OrderedDict(x, y, ...)`: TFF's `(x, y)` tuples too."""
  if isinstance(batch, collections.abc.Mapping):
    return batch
  if isinstance(batch, (tuple, list)) and len(batch) == 2:
    return collections.OrderedDict(x=batch[0], y=batch[1])
  raise TypeError('A batch of client data must be OrderedDict(x=..., y=...) '
                  f'or an (x, y) tuple, not {batch!r}.')


def check_element_spec(element_spec: Any) -> None:
  """Refuses, at build time, client data the loop can't read."""
  if isinstance(element_spec, collections.abc.Mapping):
    missing = [k for k in ('x', 'y') if k not in element_spec]
    if missing:
      raise ValueError(
          f'Client data elements must hold x and y; these have '
          f'{sorted(element_spec)} (missing {missing}).')
    return
  if isinstance(element_spec, (tuple, list)) and len(element_spec) == 2:
    return
  raise TypeError('Client data elements must be OrderedDict(x=..., y=...) '
                  f'or (x, y) tuples; their spec is {element_spec!r}.')


class ReferenceView:
  """A copy of the first layers of a model, up to some of its outputs.

  FedCKA and MOON read the global and previous models' outputs at a few
  layers; running `model` computes only the layers those outputs depend on
  (for FedCKA's first layers, a small part of the forward pass). Only those
  layers' variables exist in the graph: a full copy of a ResNet-50 would be
  created, initialized and assigned in every client's call.

  Attributes:
    model: The truncated Keras model, created in the current graph.
  """

  def __init__(self, keras_model_fn: model_lib.KerasModelFn,
               output_names: Sequence[str]):
    # Trace the full model in a scratch graph only to find which of its
    # weights the truncated model keeps, and in which order.
    with tf.Graph().as_default():
      full = keras_model_fn()
      missing = sorted(set(output_names) - set(full.output))
      if missing:
        raise ValueError(
            f'A regularizer reads outputs {missing} that model {full.name!r} '
            f'does not have (it has {sorted(full.output)}).')
      view = tf.keras.Model(full.input,
                            {name: full.output[name] for name in output_names})
      self._trainable_indices = _indices(view.trainable_variables,
                                         full.trainable_variables)
      self._non_trainable_indices = _indices(view.non_trainable_variables,
                                             full.non_trainable_variables)
      config = view.get_config()
    self.model = tf.keras.Model.from_config(config)

  def __call__(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
    """The outputs on `x`, in inference mode."""
    return self.model(x, training=False)

  def output_shapes(self) -> dict[str, tf.TensorShape]:
    """Each output's shape for one example."""
    return {name: self.model.output[name].shape[1:]
            for name in self.model.output}

  def static_shapes(self) -> bool:
    """Whether every output's per-example shape is static."""
    return all(s.is_fully_defined() for s in self.output_shapes().values())

  def bytes_per_example(self) -> int:
    """Float32 bytes of all outputs for one example (static shapes)."""
    return sum(4 * int(np.prod(s)) for s in self.output_shapes().values())

  def largest_layer_bytes(self) -> int:
    """Float32 bytes of its largest layer output for one example: roughly
    what a forward pass holds per example at its peak."""
    sizes = [t.shape[1:].num_elements() or 0
             for layer in self.model.layers
             if not isinstance(layer, tf.keras.layers.InputLayer)
             for t in tf.nest.flatten(layer.output)]
    return 4 * max(sizes + [1])

  def assign(self, weights) -> None:
    """Sets the copy's variables from the FULL model's `ModelWeights`."""
    trainable, non_trainable = weights
    model_lib.assign_weights(self.model, (
        [trainable[i] for i in self._trainable_indices],
        [non_trainable[i] for i in self._non_trainable_indices]))


def _indices(subset, variables):
  position = {v.ref(): i for i, v in enumerate(variables)}
  return [position[v.ref()] for v in subset]


def _reference_view(keras_model_fn: model_lib.KerasModelFn,
                    output_names: Sequence[str]) -> Optional[ReferenceView]:
  """A `ReferenceView` up to `output_names`, or None when none are needed."""
  if not output_names:
    return None
  return ReferenceView(keras_model_fn, output_names)


# tf.data's default rewrites and autotuning run whenever an iterator is made,
# which for a small client's data costs more than reading it.
_PLAIN_OPTIONS = tf.data.Options()
_PLAIN_OPTIONS.experimental_optimization.apply_default_optimizations = False
_PLAIN_OPTIONS.autotune.enabled = False

# Per client, at most this much of its round's batches is read into memory
# before training (`reduce_over_batches`); the rest is streamed.
BATCHES_IN_MEMORY_MAX_MB = 1024


def _batch_bytes(batch) -> tf.Tensor:
  return tf.add_n([tf.cast(tf.size(t), tf.int64) * t.dtype.size
                   for t in tf.nest.flatten(batch)])


class BatchesInMemory:
  """A client's batches for one round, read into TensorArrays first.

  TFF's client work iterates the client's data inside the graph; a training
  step run as `Dataset.reduce`'s function is about 30% slower than the same
  step in a `tf.while_loop` over batches read beforehand (measured with the
  FedCKA CNN, 10 clients x 40 steps: 8.3-10.2 s against 6.4 s; a step per
  numpy batch took 6.8-7.5 s). Up to `max_mb` of batches are kept
  (`kept` of the `seen`); those past the cap are streamed by
  `Dataset.reduce` from a second pass (`dataset.skip`: the dataset must give
  the same batches when iterated again, as `tasks.datasets.LocalBatches`'
  do).
  """

  def __init__(self, dataset: tf.data.Dataset,
               max_mb: float = BATCHES_IN_MEMORY_MAX_MB):
    max_bytes = int(max_mb * 2**20)
    self._dataset = dataset
    self.element_spec = dataset.element_spec
    flat_specs = tf.nest.flatten(self.element_spec)

    def append(state, batch):
      arrays, kept, seen, kept_bytes = state
      size = _batch_bytes(batch)
      keep = tf.logical_and(tf.equal(kept, seen),
                            kept_bytes + size <= max_bytes)

      def write():
        return tuple(a.write(kept, t)
                     for a, t in zip(arrays, tf.nest.flatten(batch)))

      arrays = tf.cond(keep, write, lambda: tuple(arrays))
      kept = tf.where(keep, kept + 1, kept)
      kept_bytes = tf.where(keep, kept_bytes + size, kept_bytes)
      return arrays, kept, seen + 1, kept_bytes

    empty = tuple(tf.TensorArray(s.dtype, size=0, dynamic_size=True,
                                 infer_shape=False, element_shape=s.shape)
                  for s in flat_specs)
    # An iterator in a `tf.while_loop`, not `Dataset.reduce`: the TFF worker
    # instantiates a reduce function on every call (a few ms per client).
    iterator = iter(dataset.with_options(_PLAIN_OPTIONS))

    def body(next_batch, state):
      return iterator.get_next_as_optional(), append(
          state, next_batch.get_value())

    _, (self._arrays, self.kept, self.seen, _) = tf.while_loop(
        lambda next_batch, _: next_batch.has_value(), body,
        (iterator.get_next_as_optional(),
         (empty, tf.constant(0), tf.constant(0), tf.constant(0, tf.int64))))

  def batch(self, i: tf.Tensor):
    """The i-th kept batch."""
    return tf.nest.pack_sequence_as(self.element_spec,
                                    [a.read(i) for a in self._arrays])

  def reduce(self, initial_state, reduce_fn):
    """`dataset.reduce(initial_state, reduce_fn)`: kept batches, then the rest.
    """

    def body(i, state):
      return i + 1, reduce_fn(state, self.batch(i))

    _, state = tf.while_loop(lambda i, _: i < self.kept, body,
                             (tf.constant(0), initial_state))
    # Batches past the cap: streamed, from a second pass over the data.
    return tf.cond(self.seen > self.kept,
                   lambda: self._dataset.skip(tf.cast(
                       self.kept, tf.int64)).reduce(state, reduce_fn),
                   lambda: state)


def reduce_over_batches(dataset: tf.data.Dataset, initial_state, reduce_fn,
                        max_mb: float = BATCHES_IN_MEMORY_MAX_MB):
  """`dataset.reduce(initial_state, reduce_fn)`, about 30% faster.

  See `BatchesInMemory`.
  """
  return BatchesInMemory(dataset, max_mb).reduce(initial_state, reduce_fn)


# Per client, at most this much memory holds the reference models' outputs
# for the client's examples (beyond it: computed at every step).
REFERENCE_CACHE_MAX_MB = 512


class ReferenceOutputs:
  """The reference models' outputs for each batch of a client's round.

  The global and previous models don't change during a client's round, so
  their outputs for an example (MOON's z, FedCKA's first-layer activations)
  need computing once per round, not once per step: `tabulate` runs them
  over each example once, before training, in chunks of up to
  `reference_chunk_examples` (larger batches than the round's run
  faster), and `outputs` reads each batch's rows back with one gather
  (one branch a step, on whether the tables are used). Needs the batches to
  carry each example's position in the client's data, `batch['index']`
  (`datasets.LocalBatches(..., with_index=True)`), no data augmentation
  (the project has none), every batch in memory (`BatchesInMemory`) and the
  tables within `max_mb`; otherwise the outputs are computed at every step.
  """

  def __init__(self, views: Mapping[str, ReferenceView], max_mb: float,
               cache: bool = True):
    self._views = dict(views)
    self.max_mb = max_mb
    self._cache = cache and bool(self._views) and all(
        view.static_shapes() for view in self._views.values())

  def compute(self, x: tf.Tensor) -> dict[str, Any]:
    """Every view's outputs on `x`, by view name."""
    return {key: view(x) for key, view in self._views.items()}

  def bytes_per_example(self) -> int:
    """The bytes of every view's outputs for one example."""
    return sum(view.bytes_per_example() for view in self._views.values())

  def tabulate(self, batches: BatchesInMemory) -> Any:
    """The tables `outputs` reads, or None when not caching.

    Returns (use, outputs): whether the tables are used (all batches in
    memory, every example from 0 to the largest index in them, the tables
    within `max_mb`); every view's outputs on each example, by index. An
    example's input is taken from its first occurrence in the round's
    batches, so only the batches up to the one where every example has been
    seen (about one epoch) are read.
    """
    if (not self._cache or
        not isinstance(batches.element_spec, collections.abc.Mapping) or
        'index' not in batches.element_spec):
      return None
    # Each example's first position in the round's stream of examples.
    index = tf.cast(_concat_kept(batches, 'index'), tf.int32)
    num_examples = tf.reduce_max(tf.concat([index, [-1]], 0)) + 1
    positions = tf.math.unsorted_segment_min(tf.range(tf.size(index)), index,
                                             num_examples)
    batch_size = tf.cond(
        batches.kept > 0,
        lambda: tf.shape(batches.batch(0)['index'])[0],
        lambda: tf.constant(1))
    # (An index missing from the stream has position INT32_MAX: the tables
    # are not used.)
    last = tf.cast(tf.reduce_max(tf.concat([positions, [-1]], 0)), tf.int64)
    max_examples = int(self.max_mb * 2**20) // max(self.bytes_per_example(),
                                                   1)
    every_example_seen = last < tf.cast(tf.size(index), tf.int64)
    use = tf.reduce_all([
        tf.equal(batches.seen, batches.kept), batches.kept > 0,
        every_example_seen,
        tf.cast(num_examples, tf.int64) <= max_examples])

    def run():
      # Only the batches up to the last first occurrence are read.
      examples = tf.gather(
          _concat_kept(batches, 'x', rows=tf.cast(last, tf.int32) + 1),
          positions)
      chunk = tf.maximum(batch_size, reference_chunk_examples(
          self._views.values()))
      num_chunks = (num_examples + chunk - 1) // chunk
      arrays = {key: {name: tf.TensorArray(
          tf.float32, size=num_chunks, infer_shape=False,
          element_shape=tf.TensorShape([None]).concatenate(shape))
                          for name, shape in view.output_shapes().items()}
                for key, view in self._views.items()}

      def body(i, arrays):
        outputs = self.compute(examples[i * chunk:(i + 1) * chunk])
        return i + 1, {key: {name: arrays[key][name].write(i, value)
                             for name, value in outputs[key].items()}
                       for key in arrays}

      _, arrays = tf.while_loop(lambda i, _: i < num_chunks, body,
                                (tf.constant(0), arrays))
      return tf.nest.map_structure(lambda a: a.concat(), arrays)

    def empty():
      return {key: {name: tf.zeros([0] + shape.as_list())
                    for name, shape in view.output_shapes().items()}
              for key, view in self._views.items()}

    return use, tf.cond(use, run, empty)

  def outputs(self, batch, tables) -> dict[str, Any]:
    """The views' outputs on `batch` (no gradient), by view name."""
    if not self._views:
      return {}
    if tables is None:
      outputs = self.compute(batch['x'])
    else:
      use, values = tables

      def read():
        rows = tf.cast(batch['index'], tf.int32)
        return tf.nest.map_structure(lambda v: tf.gather(v, rows), values)

      outputs = tf.cond(use, read, lambda: self.compute(batch['x']))
    return tf.nest.map_structure(tf.stop_gradient, outputs)


# The reference models run over a client's examples in chunks of at most
# this many examples, whose largest layer outputs (over all views) hold at
# most this much: one chunk of 512 ran the FedCKA CNN's two reference views
# in 48 ms a client against 60 ms in batches of 64 (medians of 15
# interleaved runs, one thread); a ResNet-18's chunks hold 128 examples.
REFERENCE_CHUNK_MAX_EXAMPLES = 512
REFERENCE_CHUNK_MAX_MB = 64


def reference_chunk_examples(views: Iterable[ReferenceView]) -> int:
  """Examples per call of `views` when tabulating (a round's batch, if
  larger, instead): at most `REFERENCE_CHUNK_MAX_EXAMPLES`, and
  `REFERENCE_CHUNK_MAX_MB` of their largest layer outputs."""
  per_example = sum(view.largest_layer_bytes() for view in views)
  by_memory = int(REFERENCE_CHUNK_MAX_MB * 2**20) // max(per_example, 1)
  return max(1, min(REFERENCE_CHUNK_MAX_EXAMPLES, by_memory))


def _concat_kept(batches: BatchesInMemory, key: str,
                 rows: Optional[tf.Tensor] = None) -> tf.Tensor:
  """`key` of the kept batches, concatenated: all of them, or the first
  ones that hold at least `rows` rows."""
  spec = batches.element_spec[key]
  array = tf.TensorArray(spec.dtype, size=0, dynamic_size=True,
                         infer_shape=False, element_shape=spec.shape)

  def more(i, written, _):
    if rows is None:
      return i < batches.kept
    return tf.logical_and(i < batches.kept, written < rows)

  def body(i, written, array):
    value = batches.batch(i)[key]
    return i + 1, written + tf.shape(value)[0], array.write(i, value)

  _, _, array = tf.while_loop(more, body,
                              (tf.constant(0), tf.constant(0), array))
  return array.concat()


def _union(names_lists):
  return tuple(sorted(set(n for names in names_lists for n in names)))


def build_client_update_fn(keras_model_fn: model_lib.KerasModelFn,
                           optimizer: tff.learning.optimizers.Optimizer,
                           regularizers: Sequence[
                               regularizers_lib.Regularizer],
                           weighting: tff.learning.ClientWeighting,
                           loss_fn: Optional[LossFn] = None,
                           count_labels: int = 0,
                           cache_reference_outputs: bool = True):
  """The `tf.function` that trains one client.

  Builds the model, and truncated copies of the global and previous models
  for the outputs the regularizers declare. `loss_fn(labels, outputs)` is
  the data term (cross-entropy on `logits` by default). With
  `count_labels=C > 0` the train sums also hold `label_counts`, how many
  labels of each of the C classes the client trained on (counted in the
  training pass, so the data is read once). When the batches carry
  `index` (each example's position in the client's data) and
  `cache_reference_outputs`, the reference models' outputs are computed
  once per example and round (`ReferenceOutputs`).

  Returns:
    A function `(initial_weights, dataset, previous_weights=None,
    has_previous=False, broadcast=None, client_state=None) ->
    (ClientResult, train_sums, final_weights)`; `broadcast` and
    `client_state` reach the regularizers through `LocalStep`.
  """
  loss_fn = loss_fn or cross_entropy
  # Every model here is assigned its weights before its first use.
  with model_lib.weights_assigned_before_use():
    model = keras_model_fn()
    global_reference = _reference_view(
        keras_model_fn, _union(r.global_outputs for r in regularizers))
    previous_reference = _reference_view(
        keras_model_fn, _union(r.previous_outputs for r in regularizers))
  views = {key: view for key, view in (('global', global_reference),
                                       ('previous', previous_reference))
           if view is not None}
  reference = ReferenceOutputs(views, REFERENCE_CACHE_MAX_MB,
                               cache=cache_reference_outputs)
  weight_correctors = [r for r in regularizers if r.corrects_weights]

  @tf.function
  def client_update(initial_weights, dataset, previous_weights=None,
                    has_previous=False, broadcast=None, client_state=None):
    trainable = model.trainable_variables
    model_lib.assign_weights(model, initial_weights)
    global_weights = list(initial_weights.trainable)
    if global_reference is not None:
      global_reference.assign(initial_weights)
    if previous_reference is not None:
      previous_reference.assign(previous_weights)
    batches = BatchesInMemory(dataset)
    tables = reference.tabulate(batches)

    def reduce_fn(state, batch):
      batch = named_batch(batch)
      sums, optimizer_state, (carried_tables, has_previous) = state
      # Reference models: inference mode, outside the tape.
      references = reference.outputs(batch, carried_tables or None)
      global_outputs = references.get('global')
      previous_outputs = references.get('previous')
      with tf.GradientTape() as tape:
        outputs = model(batch['x'], training=True)
        loss = loss_fn(batch['y'], outputs)
        step = regularizers_lib.LocalStep(
            trainable, global_weights, outputs, batch, global_outputs,
            previous_outputs, has_previous, broadcast, client_state)
        objective = loss
        for regularizer in regularizers:
          objective += regularizer(step)
      gradients = tape.gradient(objective, trainable)
      optimizer_state, new_weights = optimizer.next(
          optimizer_state, tuple(trainable), tuple(gradients))
      for variable, value in zip(trainable, new_weights):
        variable.assign(value)
      for regularizer in weight_correctors:
        for variable, delta in zip(trainable,
                                   regularizer.weight_correction(step)):
          variable.assign_sub(delta)
      predictions = tf.argmax(outputs['logits'], axis=-1, output_type=tf.int32)
      labels = tf.cast(batch['y'], tf.int32)
      batch_size = tf.cast(tf.shape(batch['y'])[0], tf.float32)
      sums = collections.OrderedDict(
          loss_sum=sums['loss_sum'] + loss * batch_size,
          objective_sum=sums['objective_sum'] + objective * batch_size,
          correct=sums['correct'] + tf.reduce_sum(
              tf.cast(tf.equal(predictions, labels), tf.float32)),
          num_labels=sums['num_labels'] + tf.cast(tf.size(labels),
                                                  tf.float32),
          num_examples=sums['num_examples'] + batch_size,
          num_batches=sums['num_batches'] + 1.0,
          num_non_finite_clients=sums['num_non_finite_clients'])
      if count_labels:
        sums['label_counts'] = state[0]['label_counts'] + tf.math.bincount(
            tf.reshape(labels, [-1]), minlength=count_labels,
            maxlength=count_labels, dtype=tf.float32)
      return sums, optimizer_state, (carried_tables, has_previous)

    specs = tuple(tf.TensorSpec(v.shape, v.dtype) for v in trainable)
    initial_sums = collections.OrderedDict(
        (k, tf.constant(0.0)) for k in _TRAIN_SUMS)
    if count_labels:
      initial_sums['label_counts'] = tf.zeros([count_labels])
    # Loop variables, not captures: a tensor captured into the loop lets
    # TensorFlow's oneDNN layout pass meet a MaxPool gradient before its
    # forward op and leave it on the slow generic kernel
    # (docs/performance.md).
    carried = (tables or (), tf.convert_to_tensor(has_previous))
    sums, _, _ = batches.reduce(
        (initial_sums, optimizer.initialize(specs), carried), reduce_fn)
    update = [g - w for g, w in zip(global_weights, trainable)]
    if weighting == tff.learning.ClientWeighting.NUM_EXAMPLES:
      weight = sums['num_examples']
    else:
      weight = tf.constant(1.0)
    is_finite = tf.reduce_all(
        [tf.reduce_all(tf.math.is_finite(u)) for u in update])

    def drop_client():
      # A diverged client must not reach the mean: zero update, zero weight,
      # and its metrics replaced by one count of non-finite clients.
      dropped = collections.OrderedDict((k, tf.zeros_like(v))
                                        for k, v in sums.items())
      dropped['num_non_finite_clients'] = tf.constant(1.0)
      return [tf.zeros_like(u) for u in update], tf.constant(0.0), dropped

    update, weight, sums = tf.cond(is_finite, lambda: (update, weight, sums),
                                   drop_client)
    final_weights = tff.learning.models.ModelWeights(
        trainable=[tf.identity(v) for v in model.trainable_variables],
        non_trainable=[tf.identity(v) for v in model.non_trainable_variables])
    return (tff.learning.templates.ClientResult(update=update,
                                                update_weight=weight),
            sums, final_weights)

  return client_update


def build_distributor(
    weights_type: tff.Type,
    regularizers: Sequence[regularizers_lib.Regularizer],
    trainable_zeros: Sequence[np.ndarray],
) -> tff.learning.templates.DistributionProcess:
  """Broadcasts the global weights, and the regularizers' server values.

  Without regularizers that keep server state this is TFF's
  `build_broadcast_process`. Otherwise its state holds each such
  regularizer's server state; every round it runs their `server_broadcast`
  on the global weights and broadcasts `OrderedDict(model=weights,
  broadcast=values by regularizer name)`.
  """
  if not regularizers_lib.keeps_server_state(regularizers):
    return tff.learning.templates.build_broadcast_process(weights_type)
  initial_states = regularizers_lib.with_server_state(regularizers,
                                                      trainable_zeros)
  stateful_regularizers = [r for r in regularizers if r.name in
                           initial_states]

  @tff.tensorflow.computation
  def initial_state_fn():
    return collections.OrderedDict(
        (name, tf.nest.map_structure(tf.constant, state))
        for name, state in initial_states.items())

  state_type = initial_state_fn.type_signature.result

  @tff.tensorflow.computation(state_type, weights_type)
  def server_update(state, weights):
    new_states, values = collections.OrderedDict(), collections.OrderedDict()
    for r in stateful_regularizers:
      new_states[r.name], values[r.name] = r.server_broadcast(
          state[r.name], list(weights.trainable))
    return new_states, values

  @tff.federated_computation
  def init_fn():
    return tff.federated_eval(initial_state_fn, tff.SERVER)

  @tff.federated_computation(init_fn.type_signature.result,
                             tff.FederatedType(weights_type, tff.SERVER))
  def next_fn(state, weights):
    updated = tff.federated_map(server_update, (state, weights))
    new_state, values = updated[0], updated[1]
    received = tff.federated_broadcast(tff.federated_zip(
        collections.OrderedDict(model=weights, broadcast=values)))
    return tff.templates.MeasuredProcessOutput(
        new_state, received, tff.federated_value((), tff.SERVER))

  return tff.learning.templates.DistributionProcess(init_fn, next_fn)


def split_received(received, has_broadcast: bool):
  """(model weights, broadcast values) from what the distributor sent."""
  if has_broadcast:
    return received['model'], received['broadcast']
  return received, None


def build_local_training_client_work(
    keras_model_fn: model_lib.KerasModelFn,
    element_spec: Any,
    optimizer: tff.learning.optimizers.Optimizer,
    regularizers: Sequence[regularizers_lib.Regularizer] = (),
    client_weighting: tff.learning.ClientWeighting = (
        tff.learning.ClientWeighting.NUM_EXAMPLES),
    received_type: Optional[tff.Type] = None,
    loss_fn: Optional[LossFn] = None,
    client_weight_fn: Optional[ClientWeightFn] = None,
    dataset_computation: Optional[tff.Computation] = None,
    metrics_aggregator: Optional[aggregation.MetricsAggregator] = None,
) -> tff.templates.MeasuredProcess:
  """Local training on cross-entropy plus `regularizers`, as client work.

  Args:
    keras_model_fn: Builds one of the project's multi-output Keras models
      (`tasks.models`); called inside TFF computations.
    element_spec: The spec of one batch of client data, `OrderedDict(x, y)`
      or an `(x, y)` tuple.
    optimizer: The client optimizer, e.g. `optimizers.build_client_sgd`.
    regularizers: Terms added to the local objective.
    client_weighting: How client updates are weighted in the mean.
    received_type: What each client receives from the distributor (see
      `build_distributor`); the model weights type by default.
    loss_fn: The data term; cross-entropy by default.
    client_weight_fn: `(label_counts, default_weight) -> update_weight`,
      for aggregators that take another weight than the example count (e.g.
      Fed2's per-group class counts): `label_counts[c]` is how many labels
      of class c the client trained on (counted during training);
      `default_weight` is 0 for a diverged client.
    dataset_computation: A client's key -> its batches (`tasks.datasets.
      round_dataset_computation`). When given, the clients' data are their
      keys and each client makes its batches inside its own computation
      (`ClientBatches`).
    metrics_aggregator: TFF's metrics aggregator (`aggregation`);
      `tff.learning.metrics.sum_then_finalize` by default.

  Returns:
    A `tff.learning.templates.ClientWorkProcess` with stateless server state;
    with `dataset_computation`, a `tff.templates.MeasuredProcess` of the
    same form whose client data are keys (a `ClientWorkProcess` takes only
    data sets).
  """
  regularizers = tuple(regularizers)
  if regularizers_lib.needs_client_state(regularizers):
    raise ValueError(
        'A regularizer reads the client\'s previous model or keeps client '
        'state, which needs per-client state: use tff_methods.stateful.'
        'build_stateful_local_training_process.')
  has_broadcast = regularizers_lib.keeps_server_state(regularizers)
  if received_type is None:
    received_type = model_lib.weights_type(keras_model_fn)
  data_type = tff.SequenceType(tff.types.tensorflow_to_type(element_spec))
  client_batches = ClientBatches(dataset_computation, data_type)
  num_classes = 0
  if client_weight_fn is not None:
    with tf.Graph().as_default():
      num_classes = int(keras_model_fn().output['logits'].shape[-1])

  @tff.federated_computation
  def init_fn():
    return tff.federated_value((), tff.SERVER)

  @tff.tensorflow.computation(received_type, client_batches.client_data_type)
  def client_update_computation(received, client_data):
    initial_weights, broadcast = split_received(received, has_broadcast)
    client_update = build_client_update_fn(keras_model_fn, optimizer,
                                           regularizers, client_weighting,
                                           loss_fn, count_labels=num_classes)
    result, sums, _ = client_update(initial_weights,
                                    client_batches(client_data),
                                    broadcast=broadcast)
    if client_weight_fn is not None:
      label_counts = sums.pop('label_counts')
      result = tff.learning.templates.ClientResult(
          update=result.update,
          update_weight=client_weight_fn(label_counts, result.update_weight))
    return result, aggregation.unfinalized_train_metrics(sums)

  aggregate_metrics = aggregation.build_metrics_aggregation(
      metrics_aggregator, client_update_computation.type_signature.result[1])

  @tff.federated_computation(
      init_fn.type_signature.result,
      tff.FederatedType(received_type, tff.CLIENTS),
      tff.FederatedType(client_batches.client_data_type, tff.CLIENTS))
  def next_fn(state, received, client_data):
    client_result, unfinalized_metrics = tff.federated_map(
        client_update_computation, (received, client_data))
    return tff.templates.MeasuredProcessOutput(
        state, client_result, aggregate_metrics(unfinalized_metrics))

  if dataset_computation is not None:
    return tff.templates.MeasuredProcess(init_fn, next_fn)
  return tff.learning.templates.ClientWorkProcess(init_fn, next_fn)


class ClientBatches:
  """What a client computation receives, and how it gets its batches.

  With a dataset computation (a client's key -> its batches), the client
  computation receives the key and calls it: the batches are made where they
  are trained on. Passed between two TFF computations instead, a data set is
  serialized with its data (TFF 0.87's worker turns it into a graph and back):
  for 500 CIFAR-shaped examples and 5 local epochs, 30 MB copied several
  times per client and round (docs/performance.md has the cost). Without
  one, the client computation receives its batches.
  """

  def __init__(self, dataset_computation: Optional[tff.Computation],
               data_type: tff.Type):
    dataset_computation = as_dataset_computation(dataset_computation)
    self._dataset_computation = dataset_computation
    if dataset_computation is None:
      self.client_data_type = data_type
    else:
      self.client_data_type = dataset_computation.type_signature.parameter
      made = dataset_computation.type_signature.result
      if not data_type.is_assignable_from(made):
        raise TypeError(f'The dataset computation makes {made}, but the '
                        f'process trains on {data_type}.')

  def __call__(self, client_data):
    """The client's batches (inside its TFF computation)."""
    if self._dataset_computation is None:
      return client_data
    return self._dataset_computation(client_data)


def as_dataset_computation(data: Any) -> Optional[tff.Computation]:
  """A dataset computation from itself, or from a TFF `ClientData` (its
  `dataset_computation`: a client id -> its data set); None stays None."""
  if data is None or isinstance(data, tff.Computation):
    return data
  if isinstance(data, tff.simulation.datasets.ClientData):
    return data.dataset_computation
  raise TypeError(
      'dataset_computation must be a tff.Computation (a client key -> its '
      'batches) or a tff.simulation.datasets.ClientData (preprocessed into '
      f'batches), got {type(data).__name__}.')


def build_local_training_process(
    keras_model_fn: model_lib.KerasModelFn,
    element_spec: Any,
    client_optimizer: tff.learning.optimizers.Optimizer,
    server_optimizer: Optional[tff.learning.optimizers.Optimizer] = None,
    regularizers: Sequence[regularizers_lib.Regularizer] = (),
    model_aggregator: Optional[aggregation.ModelAggregator] = None,
    client_weighting: Optional[tff.learning.ClientWeighting] = None,
    loss_fn: Optional[LossFn] = None,
    client_weight_fn: Optional[ClientWeightFn] = None,
    dataset_computation: Optional[tff.Computation] = None,
    metrics_aggregator: Optional[aggregation.MetricsAggregator] = None,
) -> tff.learning.templates.LearningProcess:
  """A `LearningProcess`: local training with regularizers, then FedOpt.

  Assembled from TFF's templates as `build_weighted_fed_avg` is: broadcast
  distributor, this module's client work, the model aggregator and TFF's
  apply-optimizer finalizer.

  Args:
    keras_model_fn: Builds a Keras model: the contract's (`model_lib`), or
      one with a single output, taken as the logits.
    element_spec: The spec of one batch of client data.
    client_optimizer: The client optimizer.
    server_optimizer: Applied to the averaged update; SGD with learning rate
      1.0 (plain averaging) by default.
    regularizers: Terms added to every client's local objective.
    model_aggregator: A weighted or unweighted aggregation factory
      (`aggregation.model_aggregation`); `tff.aggregators.MeanFactory()` by
      default.
    client_weighting: How client updates are weighted; None for
      NUM_EXAMPLES (UNIFORM with an unweighted factory).
    loss_fn: The data term; cross-entropy by default.
    client_weight_fn: See `build_local_training_client_work`; the
      aggregator then takes the weight it returns.
    dataset_computation: A client's key -> its batches (`tasks.datasets.
      round_dataset_computation`), or a batched TFF `ClientData`. When
      given, `next` takes the clients' keys, as after `tff.simulation.
      compose_dataset_computation_with_learning_process`, but each client
      makes its batches in its own computation (`ClientBatches`).
    metrics_aggregator: TFF's metrics aggregator;
      `tff.learning.metrics.sum_then_finalize` by default.
  """
  factory, client_weighting = aggregation.model_aggregation(
      model_aggregator, client_weighting)
  keras_model_fn = checked_model_fn(keras_model_fn, regularizers)
  check_element_spec(element_spec)
  server_optimizer = server_optimizer or tff.learning.optimizers.build_sgdm(
      1.0)
  zero_weights = model_lib.zero_weights(keras_model_fn)
  weights_type = model_lib.weights_type_of(zero_weights)

  initial_model_weights_fn = model_lib.initial_weights_computation(
      keras_model_fn)

  regularizers = tuple(regularizers)
  distributor = build_distributor(weights_type, regularizers,
                                  zero_weights.trainable)
  client_work = build_local_training_client_work(
      keras_model_fn, element_spec, client_optimizer, regularizers,
      client_weighting,
      received_type=distributor.next.type_signature.result.result.member,
      loss_fn=loss_fn, client_weight_fn=client_weight_fn,
      dataset_computation=dataset_computation,
      metrics_aggregator=metrics_aggregator)
  weight_type = client_work.next.type_signature.result.result.member[
      'update_weight']
  aggregator = factory.create(weights_type.trainable, weight_type)
  finalizer = tff.learning.templates.build_apply_optimizer_finalizer(
      server_optimizer, weights_type)
  recorder = build_mean_update_recorder(distributor, regularizers,
                                        weights_type.trainable)
  if recorder is None and dataset_computation is None:
    return tff.learning.templates.compose_learning_process(
        initial_model_weights_fn, distributor, client_work, aggregator,
        finalizer)
  return _compose(initial_model_weights_fn, distributor, client_work,
                  aggregator, finalizer, recorder)


def checked_model_fn(keras_model_fn: Any,
                     regularizers: Sequence[regularizers_lib.Regularizer]
                     ) -> model_lib.KerasModelFn:
  """`keras_model_fn` in the contract's form, checked for every output the
  regularizers read (`model_lib.check_outputs`), before any work."""
  if not callable(keras_model_fn) or isinstance(keras_model_fn,
                                                tf.keras.Model):
    raise TypeError(
        'Pass a function that builds the Keras model (it is called inside '
        f'TFF computations), not {type(keras_model_fn).__name__}; e.g. '
        'lambda: tff_methods.model_lib.named_outputs(make_model(), ...).')
  keras_model_fn = model_lib.contract_model_fn(keras_model_fn)
  needed = collections.defaultdict(list)
  for r in regularizers:
    for name in (tuple(r.outputs) + tuple(r.global_outputs) +
                 tuple(r.previous_outputs)):
      needed[name].append(r.display_name)
  model_lib.check_outputs(keras_model_fn, needed)
  return keras_model_fn


def build_mean_update_recorder(
    distributor: tff.learning.templates.DistributionProcess,
    regularizers: Sequence[regularizers_lib.Regularizer],
    trainable_type: tff.Type) -> Optional[tff.Computation]:
  """(distributor state, mean update) -> the state that has learnt it.

  None when no regularizer reads the mean update (`reads_mean_update`).
  """
  if not regularizers_lib.reads_mean_update(regularizers):
    return None
  state_type = distributor.initialize.type_signature.result.member

  @tff.tensorflow.computation(state_type, trainable_type)
  def record_mean_update(state, mean_update):
    new_state = collections.OrderedDict()
    for name in state:
      r = next(r for r in regularizers if r.name == name)
      new_state[name] = (r.record_mean_update(state[name], list(mean_update))
                         if r.reads_mean_update else
                         tf.nest.map_structure(tf.identity, state[name]))
    return new_state

  return record_mean_update


def _compose(initial_model_weights_fn, distributor, client_work, aggregator,
             finalizer, recorder=None
             ) -> tff.learning.templates.LearningProcess:
  """TFF's `compose_learning_process`, for client work of any client data
  (keys too), plus the recorder, if any, after aggregation."""

  @tff.federated_computation
  def init_fn():
    return tff.federated_zip(tff.learning.templates.LearningAlgorithmState(
        tff.federated_eval(initial_model_weights_fn, tff.SERVER),
        distributor.initialize(), client_work.initialize(),
        aggregator.initialize(), finalizer.initialize()))

  state_type = init_fn.type_signature.result
  data_type = client_work.next.type_signature.parameter[2]

  @tff.federated_computation(state_type, data_type)
  def next_fn(state, client_data):
    distributed = distributor.next(state.distributor,
                                   state.global_model_weights)
    worked = client_work.next(state.client_work, distributed.result,
                              client_data)
    aggregated = aggregator.next(state.aggregator, worked.result.update,
                                 worked.result.update_weight)
    finalized = finalizer.next(state.finalizer, state.global_model_weights,
                               aggregated.result)
    distributor_state = distributed.state
    if recorder is not None:
      distributor_state = tff.federated_map(
          recorder, (distributor_state, aggregated.result))
    new_state = tff.federated_zip(tff.learning.templates.LearningAlgorithmState(
        finalized.result, distributor_state, worked.state, aggregated.state,
        finalized.state))
    metrics = tff.federated_zip(collections.OrderedDict(
        distributor=distributed.measurements,
        client_work=worked.measurements,
        aggregator=aggregated.measurements,
        finalizer=finalized.measurements))
    return tff.learning.templates.LearningProcessOutput(new_state, metrics)

  return tff.learning.templates.LearningProcess(
      init_fn, next_fn, *model_weights_computations(state_type.member))


def model_weights_computations(state_type: tff.Type):
  """`get_model_weights` and `set_model_weights` of a
  `LearningAlgorithmState` of type `state_type`, as TFF's composer makes."""

  @tff.tensorflow.computation(state_type)
  def get_model_weights(state):
    return state.global_model_weights

  @tff.tensorflow.computation(state_type, state_type.global_model_weights)
  def set_model_weights(state, weights):
    return tff.learning.templates.LearningAlgorithmState(
        weights, state.distributor, state.client_work, state.aggregator,
        state.finalizer)

  return get_model_weights, set_model_weights
