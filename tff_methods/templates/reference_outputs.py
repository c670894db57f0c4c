"""The global and previous models' outputs that MOON and FedCKA read.

`ReferenceView` is a truncated copy of a model up to the outputs a
regularizer declares (FedCKA's first layers, MOON's projection), so only
those layers run. `ReferenceOutputs` computes the views' outputs once per
example and round (the reference models don't change during a client's
round) and reads each batch's rows back at every step.
"""

import collections
from typing import Any, Iterable, Mapping, Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_methods.clients import batches_in_memory
from tff_methods.templates import model_lib


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

  def __init__(
    self, keras_model_fn: model_lib.KerasModelFn, output_names: Sequence[str]
  ):
    config, self._kept = _truncated(keras_model_fn, output_names)
    self.model = tf.keras.Model.from_config(config)

  def __call__(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
    """The outputs on `x`, in inference mode."""
    return self.model(x, training=False)

  def output_shapes(self) -> dict[str, tf.TensorShape]:
    """Each output's shape for one example."""
    return {
      name: self.model.output[name].shape[1:] for name in self.model.output
    }

  def static_shapes(self) -> bool:
    """Whether every output's per-example shape is static."""
    return all(s.is_fully_defined() for s in self.output_shapes().values())

  def bytes_per_example(self) -> int:
    """Float32 bytes of all outputs for one example (static shapes)."""
    return sum(4 * int(np.prod(s)) for s in self.output_shapes().values())

  def largest_layer_bytes(self) -> int:
    """Float32 bytes of its largest layer output for one example: roughly
    what a forward pass holds per example at its peak."""
    sizes = [
      t.shape[1:].num_elements() or 0
      for layer in self.model.layers
      if not isinstance(layer, tf.keras.layers.InputLayer)
      for t in tf.nest.flatten(layer.output)
    ]
    return 4 * max(sizes + [1])

  def kept_weights(self, weights) -> tff.learning.models.ModelWeights:
    """The part of the FULL model's `ModelWeights` this copy keeps, in its
    variables' order (arrays or tensors, as given)."""
    return self._kept(weights)

  def assign(self, weights) -> None:
    """Sets the copy's variables from the FULL model's `ModelWeights`."""
    self.assign_kept(self.kept_weights(weights))

  def assign_kept(self, kept_weights) -> None:
    """Sets the copy's variables from `kept_weights(full weights)`."""
    model_lib.assign_weights(self.model, kept_weights)


class KeptWeights:
  """Which of a full model's weights its copy up to some outputs keeps:
  called on the full model's `ModelWeights`, the kept part, in the copy's
  variables' order."""

  def __init__(self, trainable_indices, non_trainable_indices):
    self._trainable_indices = list(trainable_indices)
    self._non_trainable_indices = list(non_trainable_indices)

  def __call__(self, weights) -> tff.learning.models.ModelWeights:
    trainable, non_trainable = weights
    return tff.learning.models.ModelWeights(
      trainable=[trainable[i] for i in self._trainable_indices],
      non_trainable=[non_trainable[i] for i in self._non_trainable_indices],
    )


def kept_weights(
  keras_model_fn: model_lib.KerasModelFn, output_names: Sequence[str]
) -> KeptWeights:
  """`ReferenceView(keras_model_fn, output_names).kept_weights`, without
  building the copy."""
  return _truncated(keras_model_fn, output_names)[1]


def kept_previous_weights(
  keras_model_fn: model_lib.KerasModelFn, regularizers: Sequence[Any]
) -> Optional[KeptWeights]:
  """What a client keeps of its local model for `regularizers` (None when
  none reads the previous model): the weights of the layers they read the
  previous model's outputs from (their `previous_outputs`), for FedCKA's
  first layers a small part of the model."""
  names = sorted(set(n for r in regularizers for n in r.previous_outputs))
  if not names:
    return None
  return kept_weights(keras_model_fn, names)


def _truncated(keras_model_fn, output_names):
  """(The config of the model truncated to `output_names`, its
  `KeptWeights`). The full model is traced in a scratch graph only to find
  which of its weights the truncated model keeps, and in which order."""
  with tf.Graph().as_default():
    full = keras_model_fn()
    missing = sorted(set(output_names) - set(full.output))
    if missing:
      raise ValueError(
        f'A regularizer reads outputs {missing} that model {full.name!r} '
        f'does not have (it has {sorted(full.output)}).'
      )
    view = tf.keras.Model(
      full.input, {name: full.output[name] for name in output_names}
    )
    kept = KeptWeights(
      _indices(view.trainable_variables, full.trainable_variables),
      _indices(view.non_trainable_variables, full.non_trainable_variables),
    )
    return view.get_config(), kept


def _indices(subset, variables):
  position = {v.ref(): i for i, v in enumerate(variables)}
  return [position[v.ref()] for v in subset]


def reference_view(
  keras_model_fn: model_lib.KerasModelFn, output_names: Sequence[str]
) -> Optional[ReferenceView]:
  """A `ReferenceView` up to `output_names`, or None when none are needed."""
  if not output_names:
    return None
  return ReferenceView(keras_model_fn, output_names)


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
  (the project has none), every batch in memory
  (`batches_in_memory.BatchesInMemory` or `SlicedBatches`) and the
  tables within `max_mb`; otherwise the outputs are computed at every step.
  """

  def __init__(
    self, views: Mapping[str, ReferenceView], max_mb: float, cache: bool = True
  ):
    self._views = dict(views)
    self.max_mb = max_mb
    self._cache = (
      cache
      and bool(self._views)
      and all(view.static_shapes() for view in self._views.values())
    )

  def compute(self, x: tf.Tensor) -> dict[str, Any]:
    """Every view's outputs on `x`, by view name."""
    return {key: view(x) for key, view in self._views.items()}

  def bytes_per_example(self) -> int:
    """The bytes of every view's outputs for one example."""
    return sum(view.bytes_per_example() for view in self._views.values())

  def tabulate(self, batches: batches_in_memory.Batches) -> Any:
    """The tables `outputs` reads, or None when not caching.

    Returns (use, outputs): whether the tables are used (all batches in
    memory, every example from 0 to the largest index in them, the tables
    within `max_mb`); every view's outputs on each example, by index. An
    example's input is taken from its first occurrence in the round's
    batches, so only the batches up to the one where every example has been
    seen (about one epoch) are read.
    """
    if (
      not self._cache
      or not isinstance(batches.element_spec, collections.abc.Mapping)
      or 'index' not in batches.element_spec
    ):
      return None
    # Each example's first position in the round's stream of examples.
    index = tf.cast(_concat_kept(batches, 'index'), tf.int32)
    num_examples = tf.reduce_max(tf.concat([index, [-1]], 0)) + 1
    positions = tf.math.unsorted_segment_min(
      tf.range(tf.size(index)), index, num_examples
    )
    batch_size = tf.cond(
      batches.kept > 0,
      lambda: tf.shape(batches.batch(0)['index'])[0],
      lambda: tf.constant(1),
    )
    # (An index missing from the stream has position INT32_MAX: the tables
    # are not used.)
    last = tf.cast(tf.reduce_max(tf.concat([positions, [-1]], 0)), tf.int64)
    max_examples = int(self.max_mb * 2**20) // max(self.bytes_per_example(), 1)
    every_example_seen = last < tf.cast(tf.size(index), tf.int64)
    use = tf.reduce_all(
      [
        tf.equal(batches.seen, batches.kept),
        batches.kept > 0,
        every_example_seen,
        tf.cast(num_examples, tf.int64) <= max_examples,
      ]
    )

    def run():
      # Only the batches up to the last first occurrence are read.
      examples = tf.gather(
        _concat_kept(batches, 'x', rows=tf.cast(last, tf.int32) + 1), positions
      )
      chunk = tf.maximum(
        batch_size, reference_chunk_examples(self._views.values())
      )
      num_chunks = (num_examples + chunk - 1) // chunk
      arrays = {
        key: {
          name: tf.TensorArray(
            tf.float32,
            size=num_chunks,
            infer_shape=False,
            element_shape=tf.TensorShape([None]).concatenate(shape),
          )
          for name, shape in view.output_shapes().items()
        }
        for key, view in self._views.items()
      }

      def body(i, arrays):
        outputs = self.compute(examples[i * chunk : (i + 1) * chunk])
        return i + 1, {
          key: {
            name: arrays[key][name].write(i, value)
            for name, value in outputs[key].items()
          }
          for key in arrays
        }

      _, arrays = tf.while_loop(
        lambda i, _: i < num_chunks, body, (tf.constant(0), arrays)
      )
      return tf.nest.map_structure(lambda a: a.concat(), arrays)

    def empty():
      return {
        key: {
          name: tf.zeros([0] + shape.as_list())
          for name, shape in view.output_shapes().items()
        }
        for key, view in self._views.items()
      }

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
# most this much: larger chunks run the reference passes faster than the
# training batches would, within a bounded memory (a ResNet-18's chunks
# hold 128 examples).
REFERENCE_CHUNK_MAX_EXAMPLES = 512
REFERENCE_CHUNK_MAX_MB = 64


def reference_chunk_examples(views: Iterable[ReferenceView]) -> int:
  """Examples per call of `views` when tabulating (a round's batch, if
  larger, instead): at most `REFERENCE_CHUNK_MAX_EXAMPLES`, and
  `REFERENCE_CHUNK_MAX_MB` of their largest layer outputs."""
  per_example = sum(view.largest_layer_bytes() for view in views)
  by_memory = int(REFERENCE_CHUNK_MAX_MB * 2**20) // max(per_example, 1)
  return max(1, min(REFERENCE_CHUNK_MAX_EXAMPLES, by_memory))


def _concat_kept(
  batches: batches_in_memory.Batches,
  key: str,
  rows: Optional[tf.Tensor] = None,
) -> tf.Tensor:
  """`key` of the kept batches, concatenated: all of them, or the first
  ones that hold at least `rows` rows."""
  spec = batches.element_spec[key]
  array = tf.TensorArray(
    spec.dtype,
    size=0,
    dynamic_size=True,
    infer_shape=False,
    element_shape=spec.shape,
  )

  def more(i, written, _):
    if rows is None:
      return i < batches.kept
    return tf.logical_and(i < batches.kept, written < rows)

  def body(i, written, array):
    value = batches.batch(i)[key]
    return i + 1, written + tf.shape(value)[0], array.write(i, value)

  _, _, array = tf.while_loop(
    more, body, (tf.constant(0), tf.constant(0), array)
  )
  return array.concat()
