"""What a client trains on in a round, and how a TFF worker serves it.

`LocalBatches` batches a client's examples as the reference code's data loaders
do (a fresh permutation per pass, `pass_order`: a stateless function of (seed,
client, pass)); `round_dataset_computation` serves them to the TFF worker by
(client id, round). `tff_methods_tasks.datasets` re-exports these names.
"""

import collections
import dataclasses
from typing import Any, Optional

import tensorflow as tf
import tensorflow_federated as tff

from tff_methods.clients import client_keys


@dataclasses.dataclass(frozen=True)
class LocalBatches:
  """What a client trains on in one round, as the reference code batches it.

  Every pass over a client's data is a fresh permutation (PyTorch's
  `DataLoader(shuffle=True)`), and batches never span two passes; the last,
  partial batch of a pass is kept unless `drop_last` (the MOON repo's
  setting). The passes of a client are numbered across rounds: round r
  trains passes r*E .. r*E+E-1 with `local_epochs` E, or, with
  `local_steps` K, the batches r*K .. r*K+K-1 of the client's endless
  stream of passes, so that consecutive rounds carry on through the data
  and every example is used within ceil(n / (K*B)) rounds. The stream's
  position is the round number, not the count of rounds the client took
  part in: under full participation this is the FedCos code's iterator
  (each client's iterator advances K batches a round); under partial
  participation a client skips the batches of the rounds it sat out. Pass
  p's order is a stateless function of (`seed`, the client id, p): reruns
  repeat it exactly, on any TFF worker.
  The round's examples are gathered in order once, so a round holds as many
  copies of the client's data as it makes passes (the local training loop
  holds the round's batches in memory anyway).

  Attributes:
    batch_size: Examples per batch, B.
    local_epochs: Passes per round (when `local_steps` is None).
    local_steps: Batches per round instead of whole passes.
    drop_last: Drop each pass's last batch when it is partial.
    seed: The experiment's seed.
    with_index: Add each example's position in the client's data as
      `index` (int64), for `reference_outputs.ReferenceOutputs`.
  """

  batch_size: int
  local_epochs: int = 1
  local_steps: Optional[int] = None
  drop_last: bool = False
  seed: int = 0
  with_index: bool = False

  def __post_init__(self):
    if self.batch_size < 1:
      raise ValueError(f'batch_size must be >= 1, got {self.batch_size}.')
    if self.local_steps is not None and self.local_steps < 1:
      raise ValueError(f'local_steps must be >= 1, got {self.local_steps}.')
    if self.local_steps is None and self.local_epochs < 1:
      raise ValueError(f'local_epochs must be >= 1, got {self.local_epochs}.')

  def element_spec(self, example_spec: Any) -> collections.OrderedDict:
    """The spec of one batch, given that of one example."""
    spec = collections.OrderedDict(
      (k, tf.TensorSpec([None] + list(s.shape), s.dtype))
      for k, s in example_spec.items()
    )
    if self.with_index:
      spec['index'] = tf.TensorSpec([None], tf.int64)
    return spec

  def __call__(
    self, dataset: tf.data.Dataset, client_id: Any = '', round_num: Any = 0
  ) -> tf.data.Dataset:
    """The batches `client_id` trains on in `round_num` (eager or graph)."""
    return self.of_examples(read_all(dataset), client_id, round_num)

  def of_examples(
    self, examples: Any, client_id: Any = '', round_num: Any = 0
  ) -> tf.data.Dataset:
    """`__call__` on a client's examples stacked (`read_all` of its data
    set): the same batches, without the data set's round trip."""
    round_examples, batch_sizes = self.round_examples(
      examples, client_id, round_num
    )

    # No tf.data function (map, flat_map, reduce) anywhere: the TFF worker
    # instantiates a data set's functions on every call, about 4 ms each,
    # which dominated a small client's round.
    def batch():
      # Every batch full but the last (one pass, or no partial batches):
      # `batch` cuts them. An iterator over `rebatch` costs about 2 ms more,
      # whatever the data's size.
      return tf.data.Dataset.from_tensor_slices(round_examples).batch(
        self.batch_size
      )

    def rebatch():
      # A partial batch at each pass's end: `rebatch` cuts the round's
      # examples into the planned sizes; `take` stops it before it looks for
      # a batch that is not there (it would wait forever). The extra size is
      # never reached: `rebatch` cannot take an empty list of sizes.
      sizes = tf.concat([batch_sizes, [self.batch_size]], 0)
      return (
        tf.data.Dataset.from_tensors(round_examples)
        .rebatch(sizes)
        .take(tf.size(batch_sizes, out_type=tf.int64))
      )

    only_last_partial = tf.reduce_all(
      tf.equal(batch_sizes[:-1], self.batch_size)
    )
    return tf.cond(only_last_partial, batch, rebatch).with_options(
      PLAIN_OPTIONS
    )

  def round_examples(
    self, examples: Any, client_id: Any = '', round_num: Any = 0
  ) -> tuple[Any, tf.Tensor]:
    """`of_examples`' batches as (the round's examples in training order,
    the size of each batch in turn): batch i is the next `sizes[i]`
    examples. What the training loop reads, without a data set made and
    read back (`tff_methods.clients.batches_in_memory.SlicedBatches`)."""
    size = tf.shape(tf.nest.flatten(examples)[0], out_type=tf.int64)[0]
    positions, batch_sizes = self._round_plan(size, client_id, round_num)
    round_examples = collections.OrderedDict(
      (k, tf.gather(v, positions)) for k, v in examples.items()
    )
    if self.with_index:
      round_examples['index'] = positions
    return round_examples, batch_sizes

  def _round_plan(self, size, client_id, round_num):
    """(positions of the round's examples in order, sizes of its batches)."""
    batch = tf.constant(self.batch_size, tf.int64)
    full_batches = size // batch
    partial = tf.constant(0, tf.int64) if self.drop_last else size % batch
    # One pass: `full_batches` of B, then the partial one if it is kept.
    pass_sizes = tf.concat(
      [
        tf.fill([full_batches], batch),
        tf.fill([tf.minimum(partial, 1)], partial),
      ],
      0,
    )
    per_pass = tf.size(pass_sizes, out_type=tf.int64)
    pass_examples = full_batches * batch + partial
    round_num = tf.cast(round_num, tf.int64)
    if self.local_steps is None:
      first_pass = round_num * self.local_epochs
      num_passes = tf.constant(self.local_epochs, tf.int64)
      skip = tf.constant(0, tf.int64)
      num_batches = num_passes * per_pass
    else:
      start = round_num * self.local_steps
      first_pass = start // tf.maximum(per_pass, 1)
      skip = start % tf.maximum(per_pass, 1)
      num_passes = tf.where(
        per_pass > 0,
        -(-(skip + self.local_steps) // tf.maximum(per_pass, 1)),
        0,
      )
      num_batches = tf.minimum(
        tf.constant(self.local_steps, tf.int64), num_passes * per_pass
      )

    def add_pass(pass_num, orders):
      order = pass_order(size, self.seed, client_id, pass_num)
      return pass_num + 1, tf.concat([orders, order[:pass_examples]], 0)

    _, orders = tf.while_loop(
      lambda pass_num, _: pass_num < first_pass + num_passes,
      add_pass,
      (first_pass, tf.zeros([0], tf.int64)),
      shape_invariants=(first_pass.shape, tf.TensorShape([None])),
    )
    batch_sizes = tf.tile(pass_sizes, [num_passes])[skip : skip + num_batches]
    # Every batch before `skip` in its pass is full.
    first = skip * batch
    positions = orders[first : first + tf.reduce_sum(batch_sizes)]
    return positions, batch_sizes


def pass_order(
  size: tf.Tensor, seed: int, client_id: Any, pass_num: tf.Tensor
) -> tf.Tensor:
  """The order of a client's `size` examples in its pass `pass_num`: a
  stateless function of (seed, client id, pass), so reruns and any TFF
  worker repeat it."""
  client_seed = tf.stack(
    [
      tf.constant(seed, tf.int64),
      tf.strings.to_hash_bucket_fast(client_id, _HASH_BUCKETS),
    ]
  )
  return tf.random.experimental.stateless_shuffle(
    tf.range(size),
    tf.random.experimental.stateless_fold_in(
      client_seed, tf.cast(pass_num, tf.int64)
    ),
  )


# tf.data's default rewrites and autotuning run whenever an iterator is made,
# which for a small client's data costs more than reading it.
PLAIN_OPTIONS = tf.data.Options()
PLAIN_OPTIONS.experimental_optimization.apply_default_optimizations = False
PLAIN_OPTIONS.autotune.enabled = False


def read_all(dataset: tf.data.Dataset) -> Any:
  """Every element of `dataset`, stacked: one tensor per component."""
  return (
    dataset.with_options(PLAIN_OPTIONS).batch(ALL_ELEMENTS).get_single_element()
  )


# Larger than any client's number of examples: one batch holds them all.
ALL_ELEMENTS = 2**31 - 1
_HASH_BUCKETS = 2**62


def round_dataset_computation(
  client_data: tff.simulation.datasets.ClientData, batches: LocalBatches
) -> tff.Computation:
  """Client and round -> that client's batches of that round, in TFF.

  The TFF worker reads the client's examples by its id
  (`ClientData.serializable_dataset_fn`, or `TFRecordClientData.
  serializable_examples_fn`'s tensors) and batches them as `batches` says:
  nothing but the `client_keys.CLIENT_KEY_TYPE` key is shipped.

  With `LocalBatches`, the computation also has `round_examples_fn`: the
  key -> the same batches as `LocalBatches.round_examples` gives them (the
  round's examples in order, the batches' sizes), which the project's
  client computations read in place of the data set
  (`tff_methods.clients.client_data.ClientBatches`).
  """

  # A client's examples as tensors where the client data has them that way
  # (`TFRecordClientData`): a data set of them, read back whole by
  # `LocalBatches`, cost the worker about 0.1 ms a client and round.
  examples_fn = getattr(client_data, 'serializable_examples_fn', None)
  local_batches = isinstance(batches, LocalBatches)

  def examples_of(client_id):
    if examples_fn is not None:
      return examples_fn(client_id)
    return read_all(client_data.serializable_dataset_fn(client_id))

  @tff.tensorflow.computation(client_keys.CLIENT_KEY_TYPE)
  def dataset_for_client_round(key):
    client_id, round_num = client_keys.split_client_key(key)
    if local_batches:
      return batches.of_examples(examples_of(client_id), client_id, round_num)
    return batches(
      client_data.serializable_dataset_fn(client_id), client_id, round_num
    )

  if local_batches:

    def round_examples_fn(key):
      client_id, round_num = client_keys.split_client_key(key)
      return batches.round_examples(
        examples_of(client_id), client_id, round_num
      )

    dataset_for_client_round.round_examples_fn = round_examples_fn
  return dataset_for_client_round
