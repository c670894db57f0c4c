"""The floors of the methods that compute more than FedAvg: what each
computes beyond it, timed alone per client (MOON's and FedCKA's reference
passes and each step's term on its batch's rows of reference tables of the
client's size; SCAFFOLD's, FedProx's and FedCos's model-sized arithmetic;
FedMAX's term on each batch's activations), the least ratio to FedAvg that
this work allows (`floor_ratio`), and the report's sentence on it
(`floor_note`)."""

import threading
import time
from typing import Callable, Optional, Sequence

import numpy as np
import tensorflow as tf

from tff_methods.algorithms import fedmax
from tff_methods.algorithms import hyperparameters
from tff_methods.templates import reference_outputs
from tff_methods_tasks import models as task_models
from tff_methods_tooling import benchmark_processes
from tff_methods_tooling import experiment


def _share_of_one_call(
  fn: Callable[[], tf.Tensor], repeats: int, concurrent_clients: int
) -> float:
  """Seconds of one call when `concurrent_clients` threads call at once.

  As the TFF worker runs clients: several at a time, so a client's share of
  the machine is the wall time over the calls.
  """

  def calls():
    for _ in range(repeats):
      fn().numpy()

  threads = [threading.Thread(target=calls) for _ in range(concurrent_clients)]
  start = time.perf_counter()
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join()
  return (time.perf_counter() - start) / (repeats * concurrent_clients)


def _least_shares(
  fns: dict[str, Callable[[], tf.Tensor]], repeats: int, concurrent_clients: int
) -> dict[str, float]:
  """Each function's least share of three runs after a warm-up call, less
  the least share of a call that computes nothing: the call itself (about
  0.2 ms a call on 2 cores), which a round does not pay for each part of
  a method's work."""

  def least(fn):
    fn()  # Warm-up: tracing.
    return min(
      _share_of_one_call(fn, repeats, concurrent_clients) for _ in range(3)
    )

  one = tf.constant(1.0)
  call = least(tf.function(lambda: one + 1.0))
  figures = {name: max(0.0, least(fn) - call) for name, fn in fns.items()}
  figures['extra_seconds'] = sum(figures[name] for name in fns)
  return figures


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

  return _least_shares(
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

  return _least_shares(
    {
      'reference_passes_seconds': reference_passes,
      'contrastive_seconds': _per_step_fn(
        contrastive_step, examples_per_client, batch_size, local_epochs
      ),
    },
    repeats,
    concurrent_clients,
  )


def _model_sized(
  model_name: str,
  num_classes: int,
  input_shape: Sequence[int],
  rng: np.random.Generator,
  count: int,
) -> list[list[tf.Tensor]]:
  """`count` sets of random tensors of the model's trainable shapes."""
  model = task_models.get_model(
    model_name,
    num_classes,
    tuple(input_shape),
    **benchmark_processes.model_kwargs(model_name),
  )
  return [
    [
      tf.constant(rng.standard_normal(w.shape).astype(np.float32))
      for w in model.trainable_weights
    ]
    for _ in range(count)
  ]


def _local_steps(
  examples_per_client: int, batch_size: int, local_epochs: int
) -> int:
  """A client's local steps in a round (each pass's last one may be short)."""
  return local_epochs * -(-examples_per_client // batch_size)


def _one_value_each(tensors: Sequence[tf.Tensor]) -> tf.Tensor:
  # A value of each result keeps it computed, without a pass over it that
  # the method does not make (a reduction would be one).
  return tf.add_n([tf.reshape(t, [-1])[0] for t in tensors])


def scaffold_extra_seconds(
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
  """The work SCAFFOLD adds to one client's round, timed on its own.

  Beyond FedAvg's training SCAFFOLD moves the weights by `-eta (c - c_i)`
  at each local step (the correction), and once a round computes the new
  control variate `c_i - c + (w_g - w) / (K eta)`, its change, and adds
  the change to the round's sum (the control update): model-sized
  elementwise arithmetic, which any implementation does. Reading and
  writing `c_i` is not counted: the reference code keeps it in memory.
  Timed as `fedcka_extra_seconds` times FedCKA's, on random weights of the
  model's shapes; `1 + extra_seconds / (FedAvg's seconds per client)` is
  SCAFFOLD's floor.

  Returns:
    `correction_seconds`, `control_update_seconds` and their sum,
    `extra_seconds`.
  """
  rng = np.random.default_rng(seed)
  # `update` is the client's model change, which FedAvg computes too.
  weights, update, control, client_control, total = _model_sized(
    model_name, num_classes, input_shape, rng, 5
  )
  eta = tf.constant(0.1)
  num_steps = _local_steps(examples_per_client, batch_size, local_epochs)

  @tf.function
  def corrections():
    # Unrolled: a loop would add its own per-step cost to the floor.
    moved = weights
    for _ in range(num_steps):
      moved = [
        w - eta * (c - ci) for w, c, ci in zip(moved, control, client_control)
      ]
    return _one_value_each(moved)

  @tf.function
  def control_update():
    sums = []
    for ci, c, u, t in zip(client_control, control, update, total):
      new = ci - c + u / (num_steps * eta)
      sums.append(t + (new - ci))
    return _one_value_each(sums)

  return _least_shares(
    {
      'correction_seconds': corrections,
      'control_update_seconds': control_update,
    },
    repeats,
    concurrent_clients,
  )


def fedprox_extra_seconds(
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
  """The work FedProx adds to one client's round, timed on its own.

  Beyond FedAvg's training FedProx moves the weights at each local step by
  its proximal term's gradient, `-eta mu (w - w_g)`: model-sized
  elementwise arithmetic, which any implementation does (the term's value,
  a reduction, only for reporting, is not counted). Timed as
  `scaffold_extra_seconds` times SCAFFOLD's correction; `1 + extra_seconds
  / (FedAvg's seconds per client)` is FedProx's floor.

  Returns:
    `proximal_seconds`, and the same as `extra_seconds`.
  """
  rng = np.random.default_rng(seed)
  weights, global_weights = _model_sized(
    model_name, num_classes, input_shape, rng, 2
  )
  eta_mu = tf.constant(0.1 * 0.01)
  num_steps = _local_steps(examples_per_client, batch_size, local_epochs)

  @tf.function
  def proximal_steps():
    moved = weights
    for _ in range(num_steps):  # Unrolled, as SCAFFOLD's corrections.
      moved = [w - eta_mu * (w - g) for w, g in zip(moved, global_weights)]
    return _one_value_each(moved)

  return _least_shares(
    {'proximal_seconds': proximal_steps}, repeats, concurrent_clients
  )


def direction_gradient(
  weights: Sequence[tf.Tensor],
  global_weights: Sequence[tf.Tensor],
  direction: Sequence[tf.Tensor],
  squared_direction: tf.Tensor,
  mu: float,
) -> list[tf.Tensor]:
  """FedCos's term's gradient with respect to the weights, tensor by
  tensor: with `delta = w - w_g`, `d` the direction and `n = sqrt(|delta|^2
  |d|^2 + 1e-4)`, `mu (<delta, d> |d|^2 delta / n^3 - d / n)`.
  `squared_direction`: `|d|^2`, the same at every step."""
  delta = [w - g for w, g in zip(weights, global_weights)]
  dot = tf.add_n([tf.reduce_sum(a * d) for a, d in zip(delta, direction)])
  squared = tf.add_n([tf.reduce_sum(tf.square(a)) for a in delta])
  norm = tf.sqrt(squared * squared_direction + 1e-4)
  along = mu * dot * squared_direction / norm**3
  across = -mu / norm
  return [along * a + across * d for a, d in zip(delta, direction)]


def fedcos_extra_seconds(
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
  """The work FedCos adds to one client's round, timed on its own.

  Beyond FedAvg's training FedCos moves the weights at each local step by
  its cosine term's gradient (`direction_gradient`: the change from the
  global model, its dot product with the global model's last move and its
  squared norm, and the two scaled back onto the weights), and once a
  round the move's squared norm: model-sized arithmetic, which any
  implementation does. Timed as `scaffold_extra_seconds` times SCAFFOLD's
  correction; `1 + extra_seconds / (FedAvg's seconds per client)` is
  FedCos's floor.

  Returns:
    `direction_seconds`, and the same as `extra_seconds`.
  """
  rng = np.random.default_rng(seed)
  weights, global_weights, direction = _model_sized(
    model_name, num_classes, input_shape, rng, 3
  )
  eta = tf.constant(0.1)
  num_steps = _local_steps(examples_per_client, batch_size, local_epochs)

  @tf.function
  def direction_steps():
    squared_direction = tf.add_n(
      [tf.reduce_sum(tf.square(d)) for d in direction]
    )
    moved = weights
    for _ in range(num_steps):  # Unrolled, as SCAFFOLD's corrections.
      gradient = direction_gradient(
        moved, global_weights, direction, squared_direction, 0.02
      )
      moved = [w - eta * g for w, g in zip(moved, gradient)]
    return _one_value_each(moved)

  return _least_shares(
    {'direction_seconds': direction_steps}, repeats, concurrent_clients
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

  return _least_shares(
    {
      'entropy_seconds': _per_step_fn(
        entropy_step, examples_per_client, batch_size, local_epochs
      ),
    },
    repeats,
    concurrent_clients,
  )


# Each method's floor, by name (`benchmark_run` measures those it runs).
EXTRA_SECONDS = {
  'fedcka': fedcka_extra_seconds,
  'moon': moon_extra_seconds,
  'scaffold': scaffold_extra_seconds,
  'fedprox': fedprox_extra_seconds,
  'fedcos': fedcos_extra_seconds,
  'fedmax': fedmax_extra_seconds,
}


# MOON's and FedCKA's ratio to FedAvg at most this far above their floors.
TARGET_ABOVE_FLOOR = 0.07

# On the worker, the methods whose target is their floor +
# TARGET_ABOVE_FLOOR when it is measured; the others keep their own targets,
# their floors printed beside them. (In-process, every method with a floor
# is judged on it: `benchmark_in_process.target`.)
JUDGED_ON_FLOOR = ('fedcka', 'moon')


def floor_ratio(
  extra_seconds: float, fedavg_round_seconds: float, num_clients: int
) -> float:
  """A method's lowest possible ratio to FedAvg: 1 + extra / FedAvg's share.

  A round of `num_clients` clients is FedAvg's training of each; the
  method's round adds at least `extra_seconds` per client (`*_extra_seconds`).
  """
  return 1.0 + extra_seconds * num_clients / fedavg_round_seconds


def floor_target(
  extra: dict, fedavg_round_seconds: float, num_clients: int
) -> float:
  """A `JUDGED_ON_FLOOR` method's target: its floor + `TARGET_ABOVE_FLOOR`."""
  return (
    floor_ratio(extra['extra_seconds'], fedavg_round_seconds, num_clients)
    + TARGET_ABOVE_FLOOR
  )


# Each floor's parts, as the report names them: (what, its figure's key).
_PASSES = "the global and previous models' reference passes"
_ROWS = "on each batch's rows of the reference tables"
FLOOR_PARTS = {
  'fedcka': (
    'FedCKA',
    [
      (_PASSES, 'reference_passes_seconds'),
      (f'the Gram products {_ROWS}', 'grams_seconds'),
    ],
  ),
  'moon': (
    'MOON',
    [
      (_PASSES, 'reference_passes_seconds'),
      (f'the contrastive terms {_ROWS}', 'contrastive_seconds'),
    ],
  ),
  'scaffold': (
    'SCAFFOLD',
    [
      ("the weights' corrections over the round's steps", 'correction_seconds'),
      ("the control variate's update and its sum", 'control_update_seconds'),
    ],
  ),
  'fedprox': (
    'FedProx',
    [("the proximal term's pull over the round's steps", 'proximal_seconds')],
  ),
  'fedcos': (
    'FedCos',
    [
      ("the cosine term's gradient over the round's steps", 'direction_seconds')
    ],
  ),
  'fedmax': (
    'FedMAX',
    [
      (
        "the entropy term and its gradient on each batch's activations",
        'entropy_seconds',
      )
    ],
  ),
}


def _ms(seconds: float) -> str:
  milliseconds = 1000 * seconds
  return f'{milliseconds:.0f}' if milliseconds >= 10 else f'{milliseconds:.2g}'


def floor_note(
  method: str,
  extra: dict,
  fedavg_round_seconds: float,
  num_clients: int,
  ratio: Optional[float] = None,
  fedavg_name: str = 'FedAvg',
) -> str:
  """The report's sentence on a method's floor (`extra`: its
  `*_extra_seconds` figures) against FedAvg's round, and where `ratio` (the
  method's measured ratio to that FedAvg) is; for `JUDGED_ON_FLOOR`'s
  methods, against the target of `TARGET_ABOVE_FLOOR` above it."""
  label, parts = FLOOR_PARTS[method]
  lowest = floor_ratio(
    extra['extra_seconds'], fedavg_round_seconds, num_clients
  )
  measured = ''
  if ratio is not None:
    gap = ratio - lowest
    # Below the floor only by the rounds' noise (the floor is a least
    # time, the ratio a median).
    where = (
      f'{gap:.2f} above its floor'
      if gap >= 0
      else f'{-gap:.2f} below its floor, within the noise'
    )
    target = ''
    if method in JUDGED_ON_FLOOR:
      met = 'yes' if gap <= TARGET_ABOVE_FLOOR else '**no**'
      target = f' (target <= {TARGET_ABOVE_FLOOR} above: {met})'
    measured = f' It ran at {ratio:.2f}: {where}{target}.'
  work = ' and '.join(f'{what} {_ms(extra[key])} ms' for what, key in parts)
  return (
    f"{label}'s floor: what it computes beyond FedAvg, timed alone, per "
    f"client: {work}, against {fedavg_name}'s "
    f'{_ms(fedavg_round_seconds / num_clients)} ms per client: {label} '
    f'cannot go below {lowest:.2f} of {fedavg_name} here.{measured}'
  )
