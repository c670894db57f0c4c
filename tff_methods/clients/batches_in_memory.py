"""A client's batches for one round, in memory before training.

TFF's client work iterates the client's data inside the graph; a training
step run as `Dataset.reduce`'s function is slower than the same step in a
`tf.while_loop` over batches held in memory. Two forms hold them, with one
interface (`element_spec`, `kept`, `seen`, `batch(i)`, `reduce`):

- `BatchesInMemory` reads a data set's batches (up to a cap) into
  TensorArrays; `reduce_over_batches` is its `Dataset.reduce`.
- `SlicedBatches` cuts them from the round's examples, already in memory in
  order (`tff_methods_tasks.datasets.LocalBatches.round_examples`, through
  `client_data.ClientBatches`): no data set is made and read back.
"""

from typing import Union

import tensorflow as tf

# tf.data's default rewrites and autotuning run whenever an iterator is made,
# which for a small client's data costs more than reading it.
_PLAIN_OPTIONS = tf.data.Options()
_PLAIN_OPTIONS.experimental_optimization.apply_default_optimizations = False
_PLAIN_OPTIONS.autotune.enabled = False

# Per client, at most this much of its round's batches is read into memory
# before training (`reduce_over_batches`); the rest is streamed.
BATCHES_IN_MEMORY_MAX_MB = 1024


def _batch_bytes(batch) -> tf.Tensor:
  return tf.add_n(
    [
      tf.cast(tf.size(t), tf.int64) * t.dtype.size
      for t in tf.nest.flatten(batch)
    ]
  )


class BatchesInMemory:
  """A client's batches for one round, read into TensorArrays first.

  TFF's client work iterates the client's data inside the graph; a training step
  run as `Dataset.reduce`'s function is slower than the same step in a
  `tf.while_loop` over batches read beforehand, since the function runs with
  less of TensorFlow's graph optimization. Up to `max_mb` of batches are kept
  (`kept` of the `seen`); those past the cap are streamed by `Dataset.reduce`
  from a second pass (`dataset.skip`: the dataset must give the same batches
  when iterated again, as `tff_methods_tasks.datasets.LocalBatches`' do).
  """

  def __init__(
    self, dataset: tf.data.Dataset, max_mb: float = BATCHES_IN_MEMORY_MAX_MB
  ):
    max_bytes = int(max_mb * 2**20)
    self._dataset = dataset
    self.element_spec = dataset.element_spec
    flat_specs = tf.nest.flatten(self.element_spec)

    def append(state, batch):
      arrays, kept, seen, kept_bytes = state
      size = _batch_bytes(batch)
      keep = tf.logical_and(
        tf.equal(kept, seen), kept_bytes + size <= max_bytes
      )

      def write():
        return tuple(
          a.write(kept, t) for a, t in zip(arrays, tf.nest.flatten(batch))
        )

      arrays = tf.cond(keep, write, lambda: tuple(arrays))
      kept = tf.where(keep, kept + 1, kept)
      kept_bytes = tf.where(keep, kept_bytes + size, kept_bytes)
      return arrays, kept, seen + 1, kept_bytes

    empty = tuple(
      tf.TensorArray(
        s.dtype,
        size=0,
        dynamic_size=True,
        infer_shape=False,
        element_shape=s.shape,
      )
      for s in flat_specs
    )
    # An iterator in a `tf.while_loop`, not `Dataset.reduce`: the TFF worker
    # instantiates a reduce function on every call (a few ms per client).
    iterator = iter(dataset.with_options(_PLAIN_OPTIONS))

    def body(next_batch, state):
      return iterator.get_next_as_optional(), append(
        state, next_batch.get_value()
      )

    _, (self._arrays, self.kept, self.seen, _) = tf.while_loop(
      lambda next_batch, _: next_batch.has_value(),
      body,
      (
        iterator.get_next_as_optional(),
        (empty, tf.constant(0), tf.constant(0), tf.constant(0, tf.int64)),
      ),
    )

  def batch(self, i: tf.Tensor):
    """The i-th kept batch."""
    return tf.nest.pack_sequence_as(
      self.element_spec, [a.read(i) for a in self._arrays]
    )

  def reduce(self, initial_state, reduce_fn):
    """`dataset.reduce(initial_state, reduce_fn)`: kept batches, then the
    rest."""
    state = _reduce_kept(self, initial_state, reduce_fn)
    # Batches past the cap: streamed, from a second pass over the data.
    return tf.cond(
      self.seen > self.kept,
      lambda: self._dataset.skip(tf.cast(self.kept, tf.int64)).reduce(
        state, reduce_fn
      ),
      lambda: state,
    )


def reduce_over_batches(
  dataset: tf.data.Dataset,
  initial_state,
  reduce_fn,
  max_mb: float = BATCHES_IN_MEMORY_MAX_MB,
):
  """`dataset.reduce(initial_state, reduce_fn)`, about 30% faster.

  See `BatchesInMemory`.
  """
  return BatchesInMemory(dataset, max_mb).reduce(initial_state, reduce_fn)


class SlicedBatches:
  """A round's batches as consecutive slices of its examples.

  `examples` holds the round's examples in the order they are trained on
  (a nested structure of tensors with the examples along the first axis),
  and `batch_sizes` the size of each batch in turn: batch i is the
  `batch_sizes[i]` examples after the first i batches'. The interface is
  `BatchesInMemory`'s, with every batch kept.
  """

  def __init__(self, examples, batch_sizes: tf.Tensor):
    self._examples = examples
    self.element_spec = tf.nest.map_structure(
      lambda t: tf.TensorSpec([None] + t.shape[1:].as_list(), t.dtype),
      examples,
    )
    sizes = tf.cast(batch_sizes, tf.int32)
    self._ends = tf.cumsum(sizes)
    self._starts = self._ends - sizes
    self.kept = tf.size(sizes)
    self.seen = self.kept

  def batch(self, i: tf.Tensor):
    """The i-th batch."""
    start, end = self._starts[i], self._ends[i]
    return tf.nest.map_structure(lambda t: t[start:end], self._examples)

  def reduce(self, initial_state, reduce_fn):
    """`reduce_fn` over the batches in turn, from `initial_state`."""
    return _reduce_kept(self, initial_state, reduce_fn)


def _reduce_kept(batches, initial_state, reduce_fn):
  """`reduce_fn` over the first `batches.kept` batches, in a while loop."""

  def body(i, state):
    return i + 1, reduce_fn(state, batches.batch(i))

  _, state = tf.while_loop(
    lambda i, _: i < batches.kept, body, (tf.constant(0), initial_state)
  )
  return state


# Either form: what the training loop and `reference_outputs` read.
Batches = Union[BatchesInMemory, SlicedBatches]
