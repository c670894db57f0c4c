"""The floors of the methods whose terms read the model's outputs: MOON's
and FedCKA's reference passes and each step's term on its batch's rows of
reference tables of the client's size; FedMAX's term on each
batch's activation vectors (`benchmark_floors` judges by them)."""

from typing import Callable, Sequence

import numpy as np
import tensorflow as tf

from tff_methods.algorithms import fedmax
from tff_methods.algorithms import hyperparameters
from tff_methods.templates import reference_outputs
from tff_methods_tooling import benchmark_processes
from tff_methods_tooling import experiment
from tff_methods_tooling import floor_timing


def _reference_passes_fn(
  method: str,
  model_name: str,
  num_classes: int,
  input_shape: Sequence[int],
  output_names,
  examples: tf.Tensor,
  batch_size: int,
):
  """The global and the previous model up to `output_names` over every
  example once, in the chunks `reference_outputs.ReferenceOutputs` uses: a
  `tf.function` of no arguments."""
  model_fn = experiment.model_fn_for(
    method,
    model_name,
    num_classes,
    tuple(input_shape),
    hyperparameters.Hyperparameters(),
    **benchmark_processes.model_kwargs(model_name),
  )
  views = [
    reference_outputs.ReferenceView(model_fn, output_names) for _ in range(2)
  ]
  count = int(examples.shape[0])
  chunk = max(batch_size, reference_outputs.reference_chunk_examples(views))

  @tf.function
  def reference_passes():
    total = tf.constant(0.0)
    for start in range(0, count, chunk):
      for view in views:
        outputs = view(examples[start : start + chunk])
        total += tf.add_n([tf.reduce_sum(t) for t in outputs.values()])
    return total

  return reference_passes, views[0]


def _per_step_fn(
  step: Callable[[tf.Tensor, int, tf.Tensor], tf.Tensor],
  examples_per_client: int,
  batch_size: int,
  local_epochs: int,
):
  """`step(step_number, rows, total)` over a round's local steps, as
  `tff_methods_tasks.datasets.LocalBatches` cuts them: each pass's full
  batches, then one of the rest (`_step_rows` numbers them alike)."""
  full_per_pass, last_rows = divmod(examples_per_client, batch_size)
  full_steps = local_epochs * full_per_pass

  @tf.function
  def steps():
    _, total = tf.while_loop(
      lambda i, _: i < full_steps,
      lambda i, total: (i + 1, step(i, batch_size, total)),
      (tf.constant(0), tf.constant(0.0)),
    )
    for epoch in range(local_epochs if last_rows else 0):
      total = step(tf.constant(full_steps + epoch), last_rows, total)
    return total

  return steps


def _step_rows(
  rng: np.random.Generator,
  examples_per_client: int,
  batch_size: int,
  local_epochs: int,
) -> tf.Tensor:
  """Each local step's example indices (a row per step, numbered as
  `_per_step_fn` numbers them, padded to `batch_size`): a new permutation
  of the client's examples each pass, as the round's batches take them."""
  full_per_pass, last_rows = divmod(examples_per_client, batch_size)
  full, last = [], []
  for _ in range(local_epochs):
    order = rng.permutation(examples_per_client)
    full += list(order[: full_per_pass * batch_size].reshape(-1, batch_size))
    if last_rows:
      rest = np.zeros(batch_size, np.int64)
      rest[:last_rows] = order[full_per_pass * batch_size :]
      last.append(rest)
  return tf.constant(np.array(full + last, np.int32).reshape(-1, batch_size))


def _reference_tables(
  rng: np.random.Generator, examples_per_client: int, size: int
) -> list[tf.Tensor]:
  """The global and the previous model's tables of one output of `size`
  values: a row per example of the client, random."""
  return [
    tf.constant(
      rng.standard_normal((examples_per_client, size)).astype(np.float32)
    )
    for _ in ('global', 'previous')
  ]


def fedcka_extra_seconds(
  model_name: str,
  num_classes: int,
  input_shape: Sequence[int],
  examples_per_client: int,
  batch_size: int,
  local_epochs: int,
  num_layers: int = 2,
  repeats: int = 5,
  concurrent_clients: int = 2,
  seed: int = 0,
) -> dict[str, float]:
  """The work FedCKA adds to one client's round, timed on its own.

  Whatever the implementation, FedCKA computes beyond FedAvg's training:
  the first `num_layers` layers of the global and the previous model over
  each of the client's examples once (the reference passes), and at each
  local step, for each regularized layer of D values, the B x B Gram
  matrices of the local, global and previous activations and the B x B by
  B x D product of the local activations' gradient. The reference
  activations of a step's batch are its rows of the passes' tables (one
  per model and layer, of the client's size), read at the step: the
  Grams' reads of them are memory-bound, so timing them on a batch that
  stays in the cache would undercount. This times those alone,
  each a `tf.function` on random data of the benchmark's shapes called
  `repeats` times by each of `concurrent_clients` threads (as the TFF
  worker runs clients): a call's share is the wall time over the calls,
  the least of three such runs after a warm-up. So `1 + extra_seconds /
  (FedAvg's seconds per client)` is the ratio to FedAvg that FedCKA cannot
  go below on this machine (`report_markdown` prints it as FedCKA's
  floor).

  Returns:
    `reference_passes_seconds`, `grams_seconds` and their sum,
    `extra_seconds`.
  """
  rng = np.random.default_rng(seed)
  examples = tf.constant(
    rng.standard_normal((examples_per_client,) + tuple(input_shape)).astype(
      np.float32
    )
  )
  layers = tuple(f'layer_{n + 1}' for n in range(num_layers))
  reference_passes, view = _reference_passes_fn(
    'fedcka', model_name, num_classes, input_shape, layers, examples, batch_size
  )
  sizes = [int(np.prod(s)) for s in view.output_shapes().values()]
  # The local activations: two batches per layer, alternated, so no step
  # repeats the previous one's inputs (the forward pass has just written
  # them). The references: the global and previous model's tables.
  local_activations = [
    tf.constant(rng.standard_normal((2, batch_size, size)).astype(np.float32))
    for size in sizes
  ]
  reference_tables = [
    _reference_tables(rng, examples_per_client, size) for size in sizes
  ]
  step_rows = _step_rows(rng, examples_per_client, batch_size, local_epochs)

  def gram(a):
    return tf.matmul(a, a, transpose_b=True)

  def gram_step(step_number, rows, total):
    indices = step_rows[step_number, :rows]
    for local, tables in zip(local_activations, reference_tables):
      local = local[step_number % 2, :rows]
      global_, previous = [tf.gather(t, indices) for t in tables]
      upstream = gram(local) + gram(global_) + gram(previous)
      total += tf.reduce_sum(tf.matmul(upstream, local)[0])
    return total

  return floor_timing.least_shares(
    {
      'reference_passes_seconds': reference_passes,
      'grams_seconds': _per_step_fn(
        gram_step, examples_per_client, batch_size, local_epochs
      ),
    },
    repeats,
    concurrent_clients,
  )


def moon_extra_seconds(
  model_name: str,
  num_classes: int,
  input_shape: Sequence[int],
  examples_per_client: int,
  batch_size: int,
  local_epochs: int,
  repeats: int = 5,
  concurrent_clients: int = 2,
  seed: int = 0,
) -> dict[str, float]:
  """The work MOON adds to one client's round, timed on its own.

  Beyond FedAvg's training MOON computes the global and the previous
  model up to the projection `z` over each of the client's examples once
  (the reference passes), and at each local step the model-contrastive
  term on B x d projections (the references read from the passes'
  tables): the cosine similarities of the local `z` with
  both references, the two-way softmax, and its gradient with respect to
  the local `z` (the rest of the backward pass is FedAvg's). Timed as
  `fedcka_extra_seconds` times FedCKA's; `1 + extra_seconds / (FedAvg's
  seconds per client)` is MOON's floor.

  Returns:
    `reference_passes_seconds`, `contrastive_seconds` and their sum,
    `extra_seconds`.
  """
  rng = np.random.default_rng(seed)
  examples = tf.constant(
    rng.standard_normal((examples_per_client,) + tuple(input_shape)).astype(
      np.float32
    )
  )
  reference_passes, view = _reference_passes_fn(
    'moon', model_name, num_classes, input_shape, ('z',), examples, batch_size
  )
  dim = int(np.prod(view.output_shapes()['z']))
  # As FedCKA's: the local z alternated, the references read from tables.
  local_projections = tf.constant(
    rng.standard_normal((2, batch_size, dim)).astype(np.float32)
  )
  reference_tables = _reference_tables(rng, examples_per_client, dim)
  step_rows = _step_rows(rng, examples_per_client, batch_size, local_epochs)

  def contrastive_step(step_number, rows, total):
    local = local_projections[step_number % 2, :rows]
    indices = step_rows[step_number, :rows]
    global_, previous = [tf.gather(t, indices) for t in reference_tables]
    with tf.GradientTape() as tape:
      tape.watch(local)
      logits = (
        tf.stack(
          [
            -tf.keras.losses.cosine_similarity(local, global_),
            -tf.keras.losses.cosine_similarity(local, previous),
          ],
          1,
        )
        / 0.5
      )
      loss = tf.reduce_mean(
        tf.nn.sparse_softmax_cross_entropy_with_logits(
          tf.zeros([rows], tf.int32), logits
        )
      )
    return total + tf.reduce_sum(tape.gradient(loss, local)[0])

  return floor_timing.least_shares(
    {
      'reference_passes_seconds': reference_passes,
      'contrastive_seconds': _per_step_fn(
        contrastive_step, examples_per_client, batch_size, local_epochs
      ),
    },
    repeats,
    concurrent_clients,
  )


def fedmax_extra_seconds(
  model_name: str,
  num_classes: int,
  input_shape: Sequence[int],
  examples_per_client: int,
  batch_size: int,
  local_epochs: int,
  repeats: int = 5,
  concurrent_clients: int = 2,
  seed: int = 0,
) -> dict[str, float]:
  """The work FedMAX adds to one client's round, timed on its own.

  Beyond FedAvg's training FedMAX computes at each local step its entropy
  term on the batch's activation vectors (B x D, the model's `features`)
  and the term's gradient with respect to them (the rest of the backward
  pass is FedAvg's). Timed as `moon_extra_seconds` times MOON's
  contrastive term, on activations alternated between two batches; `1 +
  extra_seconds / (FedAvg's seconds per client)` is FedMAX's floor.

  Returns:
    `entropy_seconds`, and the same as `extra_seconds`.
  """
  rng = np.random.default_rng(seed)
  model_fn = experiment.model_fn_for(
    'fedmax',
    model_name,
    num_classes,
    tuple(input_shape),
    hyperparameters.Hyperparameters(),
    **benchmark_processes.model_kwargs(model_name),
  )
  view = reference_outputs.ReferenceView(model_fn, ('features',))
  width = int(np.prod(view.output_shapes()['features']))
  activations = tf.constant(
    rng.standard_normal((2, batch_size, width)).astype(np.float32)
  )

  def entropy_step(step_number, rows, total):
    features = activations[step_number % 2, :rows]
    with tf.GradientTape() as tape:
      tape.watch(features)
      loss = fedmax.DEFAULT_BETA * fedmax.activation_entropy_loss(features)
    return total + tf.reduce_sum(tape.gradient(loss, features)[0])

  return floor_timing.least_shares(
    {
      'entropy_seconds': _per_step_fn(
        entropy_step, examples_per_client, batch_size, local_epochs
      ),
    },
    repeats,
    concurrent_clients,
  )
