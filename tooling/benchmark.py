"""Speed and memory of the methods: the logic behind `binaries/benchmark`.

All figures come from one process on CIFAR-shaped data generated with a
fixed seed (`tasks.datasets.generated_like`), every client taking part:

- `time_methods`: seconds per round of each method at the same settings,
  measured interleaved (one round of each method in turn, `repeats` times,
  after one untimed warm-up round each) so that every method sees the same
  machine state; the median, and its ratio to FedAvg's median (the
  project's `fedavg`, the loop every method shares) and to TFF's own
  `build_weighted_fed_avg`'s (`tff_fedavg`).
- `plain_tf_round_seconds`: the same local training (momentum SGD on
  cross-entropy, batches of the same size) as a plain TensorFlow loop with
  no TFF: a `tf.function` step on in-memory batches, weights averaged in
  numpy. The floor for this machine that TFF's runtime adds to.
- `memory_growth`: resident memory (this process and the TFF worker) after
  every round of a long FedAvg run of a small model.
- `report_markdown`: the figures beside their targets and the FedCKA
  paper's Table 4 ratios.
"""

import dataclasses
import os
import shutil
import statistics
import threading
import time
from typing import Any, Callable, Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tasks import datasets
from tasks import models as task_models
from tff_methods import client_keys
from tff_methods import methods as methods_lib
from tff_methods import model_lib
from tff_methods import reference_outputs
from tff_methods import runtime
from tff_methods import workers
from tooling import client_profile
from tooling import device_check
from tooling import experiment
from tooling import pytorch_loop

# Targets of issue 8: ratio of seconds per round to FedAvg's.
TARGET_RATIO = {
  'fedcka_cnn': {
    'fedcka': 1.2,
    'moon': 1.2,
    'fedprox': 1.1,
    'scaffold': 1.1,
    'fedcos': 1.1,
    'fedmax': 1.05,
    'fed2': 1.1,
  },
  'resnet18': dict.fromkeys(
    ('fedprox', 'scaffold', 'moon', 'fedcka', 'fedmax', 'fedcos', 'fed2'), 1.3
  ),
}
# FedCKA paper, Table 4: local training time relative to FedAvg (the 7-layer
# CNN, and ResNet-50).
PAPER_RATIO = {
  'fedcka_cnn': {
    'fedcka': 1.90,
    'moon': 1.78,
    'fedprox': 1.04,
    'scaffold': 1.04,
  },
  'resnet50': {'fedcka': 1.18, 'moon': 2.64, 'fedprox': 1.35, 'scaffold': 1.51},
}
# The project's FedAvg through TFF against the plain TF loop at 5 local
# epochs; memory growth.
TARGET_TFF_OVER_FLOOR = 1.2
TARGET_MEMORY_GROWTH = 0.10
# MOON's and FedCKA's ratio to FedAvg at most this far above their floors.
TARGET_ABOVE_FLOOR = 0.07
# What TFF adds per client beyond the plain loop's arithmetic.
TARGET_OVERHEAD_MS_PER_CLIENT = 3.0

BENCHMARK_METHODS = (
  'fedavg',
  'tff_fedavg',
  'fedprox',
  'scaffold',
  'moon',
  'fedcka',
  'fedmax',
  'fedcos',
  'fed2',
)
# TFF's own `build_weighted_fed_avg`: the same weights as the project's
# `fedavg` (tests/fedavg_test.py), timed beside it for reference.
TFF_FEDAVG = 'tff_fedavg'


def applicable_methods(
  model_name: str, names: Sequence[str] = BENCHMARK_METHODS
) -> list[str]:
  """The methods that run on `model_name` (Fed2 needs a groupable model)."""
  return [
    m for m in names if m != 'fed2' or model_name in task_models.FED2_MODELS
  ]


def model_kwargs(model_name: str) -> dict:
  """Models that take one get MOON's projection head, for every method."""
  if model_name in task_models.TAKES_PROJECTION_DIM:
    return {'projection_dim': 128}
  return {}


# Models that output MOON's projection head `z` as the benchmark builds them.
PROJECTION_MODELS = tuple(
  name
  for name in task_models.MODEL_NAMES
  if task_models.has_projection_head(name, **model_kwargs(name))
)


def _median(values):
  return float(statistics.median(values))


def time_methods(
  model_name: str,
  method_names: Sequence[str],
  data: datasets.FederatedData,
  hparams: methods_lib.Hyperparameters,
  local_epochs: int,
  batch_size: int,
  repeats: int = 3,
  seed: int = 0,
  on_round: Optional[Callable[[str, float], None]] = None,
) -> dict[str, dict[str, Any]]:
  """Seconds per round of each method, interleaved; ratios to FedAvg.

  FedAvg is the project's (`fedavg`), the local-training loop every method
  shares with no regularizer, so a ratio to it is what a method's own
  computation costs.

  Args:
    model_name: A `tasks.models` model (Fed2 uses its grouped form).
    method_names: Methods to time; must include 'fedavg'.
    data: The clients' data; every client takes part in every round.
    hparams: Shared optimizer settings and strengths.
    local_epochs: Local epochs per round.
    batch_size: Local batch size.
    repeats: Timed rounds of each method.
    seed: Initial weights.
    on_round: Called with (method, seconds) after every round.

  Returns:
    By method: `seconds` (each timed round), `median`, `ratio` (to FedAvg's
    median), `ratio_to_tff_fedavg` (when `tff_fedavg` is timed),
    `build_seconds`, `first_round_seconds`, and `empty_round_seconds`: the
    median of three rounds with no clients, after the timed ones (a round's
    fixed cost: the server state's trip to the worker and back).
  """
  if 'fedavg' not in method_names:
    raise ValueError('time_methods needs fedavg, the reference.')
  client_ids = list(data.client_data.client_ids)
  runs = {}
  for name in method_names:
    start = time.perf_counter()
    process, model_fn = _benchmark_process(
      name, model_name, data, hparams, local_epochs, batch_size, seed
    )
    state = process.initialize()
    state = process.set_model_weights(
      state, model_lib.initial_weights(model_fn, seed)
    )
    build = time.perf_counter() - start
    start = time.perf_counter()
    # Warm-up, round 1: not timed.
    state = process.next(state, _keys(client_ids, 1)).state
    first = time.perf_counter() - start
    runs[name] = dict(
      process=process,
      state=state,
      seconds=[],
      build_seconds=build,
      first_round_seconds=first,
    )
  for round_num in range(2, repeats + 2):
    for name in method_names:
      run = runs[name]
      start = time.perf_counter()
      run['state'] = (
        run['process'].next(run['state'], _keys(client_ids, round_num)).state
      )
      seconds = time.perf_counter() - start
      run['seconds'].append(seconds)
      if on_round:
        on_round(name, seconds)
  for run in runs.values():
    empty = []
    for _ in range(3):
      start = time.perf_counter()
      run['process'].next(run['state'], [])
      empty.append(time.perf_counter() - start)
    run['empty_round_seconds'] = _median(empty)
  reference = _median(runs['fedavg']['seconds'])
  timings = {
    name: dict(
      seconds=run['seconds'],
      median=_median(run['seconds']),
      ratio=_median(run['seconds']) / reference,
      build_seconds=run['build_seconds'],
      first_round_seconds=run['first_round_seconds'],
      empty_round_seconds=run['empty_round_seconds'],
    )
    for name, run in runs.items()
  }
  if TFF_FEDAVG in timings:
    tff_fedavg = timings[TFF_FEDAVG]['median']
    for timing in timings.values():
      timing['ratio_to_tff_fedavg'] = timing['median'] / tff_fedavg
  return timings


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
  """Each function's least share of three runs after a warm-up call."""
  figures = {}
  for name, fn in fns.items():
    fn()  # Warm-up: tracing.
    figures[name] = min(
      _share_of_one_call(fn, repeats, concurrent_clients) for _ in range(3)
    )
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
    methods_lib.Hyperparameters(),
    **model_kwargs(model_name),
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
  `tasks.datasets.LocalBatches` cuts them: each pass's full batches, then
  one of the rest (`_step_rows` numbers them alike)."""
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


def profile_methods(
  model_name: str,
  method_names: Sequence[str],
  data: datasets.FederatedData,
  examples_per_client: int,
  hparams: methods_lib.Hyperparameters,
  local_epochs: int,
  batch_size: int,
  rounds: int = 3,
  traced_clients: int = 8,
  seed: int = 0,
) -> dict[str, Any]:
  """Each method's client computation op by op (`client_profile`), built
  as `time_methods` builds it, on `data`'s clients (of
  `examples_per_client` examples, as the report says).

  Returns:
    The report's `client_profile`: the settings and, by method,
    `client_profile.profile_clients`' figures.
  """
  client_ids = list(data.client_data.client_ids)
  sessions = {}
  try:
    for name in method_names:
      process, model_fn = _benchmark_process(
        name, model_name, data, hparams, local_epochs, batch_size, seed
      )
      sessions[name] = client_profile.ClientSession(
        process, model_lib.initial_weights(model_fn, seed)
      )
    profiles = client_profile.profile_clients(
      sessions,
      client_ids,
      rounds=rounds,
      traced_clients=min(traced_clients, len(client_ids)),
    )
  finally:
    for session in sessions.values():
      session.close()
  return dict(
    model=model_name,
    examples_per_client=examples_per_client,
    local_epochs=local_epochs,
    batch_size=batch_size,
    methods=profiles,
  )


def floor_ratio(
  extra_seconds: float, fedavg_round_seconds: float, num_clients: int
) -> float:
  """A method's lowest possible ratio to FedAvg: 1 + extra / FedAvg's share.

  A round of `num_clients` clients is FedAvg's training of each; the
  method's round adds at least `extra_seconds` per client
  (`fedcka_extra_seconds`, `moon_extra_seconds`).
  """
  return 1.0 + extra_seconds * num_clients / fedavg_round_seconds


def loopback_worker_throughput(
  data: datasets.FederatedData,
  model_name: str,
  hparams: methods_lib.Hyperparameters,
  local_epochs: int,
  batch_size: int,
  worker_counts: Sequence[int] = (1, 2),
  repeats: int = 3,
  max_concurrent_clients: int = 2,
  seed: int = 0,
) -> dict[int, dict]:
  """FedAvg clients per second with N TFF workers on 127.0.0.1.

  For each N, starts N packaged workers, runs rounds through
  `runtime.create_remote_execution_context` (TFF's mergeable context, each
  worker training a contiguous part of the clients), and stops them.

  Returns:
    By N: `seconds` (each timed round after a warm-up), `median` and
    `clients_per_second`.
  """
  from tensorflow_federated.python.core.impl.context_stack import (
    context_stack_impl,
  )

  batches = datasets.LocalBatches(batch_size, local_epochs, seed=seed)
  client_ids = list(data.client_data.client_ids)
  model_fn = experiment.model_fn_for(
    'fedavg',
    model_name,
    data.num_classes,
    data.input_shape,
    hparams,
    **model_kwargs(model_name),
  )
  process = methods_lib.build_method_for_client_ids(
    'fedavg', model_fn, *_round_datasets(data, batches), hparams
  )
  results = {}
  for count in worker_counts:
    started = [
      workers.start_worker(
        max_concurrent_computation_calls=max_concurrent_clients
      )
      for _ in range(count)
    ]
    try:
      context = runtime.create_remote_execution_context(
        [f'127.0.0.1:{port}' for _, port in started]
      )
      with context_stack_impl.context_stack.install(context):
        state = process.set_model_weights(
          process.initialize(), model_lib.initial_weights(model_fn, seed)
        )
        state = process.next(state, _keys(client_ids, 1)).state  # Warm-up.
        seconds = []
        for round_num in range(2, repeats + 2):
          start = time.perf_counter()
          state = process.next(state, _keys(client_ids, round_num)).state
          seconds.append(time.perf_counter() - start)
    finally:
      for worker, _ in started:
        worker.kill()
        worker.wait()
    results[count] = dict(
      seconds=seconds,
      median=_median(seconds),
      clients_per_second=len(client_ids) / _median(seconds),
    )
  return results


def client_arrays(
  data: datasets.FederatedData,
) -> list[tuple[np.ndarray, np.ndarray]]:
  """Each client's (x, y) as numpy arrays, in client id order."""
  arrays = []
  for client_id in data.client_data.client_ids:
    batch = next(
      iter(
        data.client_data.create_tf_dataset_for_client(client_id).batch(
          1_000_000
        )
      )
    )
    arrays.append((batch['x'].numpy(), batch['y'].numpy()))
  return arrays


class PlainTFFedAvg:
  """FedAvg as a plain TF loop (no TFF): the floor TFF's runtime adds to.

  Every client starts from the global weights, takes momentum-SGD steps on
  shuffled in-memory batches for `local_epochs` (the step of
  `optimizers.build_client_sgd`: m = momentum * m + g; w -= lr * m), and the
  new global weights are the example-weighted mean of the clients' weights
  (numpy). The step is one `tf.function`.
  """

  def __init__(
    self,
    model_name: str,
    clients,
    num_classes: int,
    local_epochs: int,
    batch_size: int,
    learning_rate: float,
    momentum: float,
    seed: int = 0,
    initial_weights: Optional[Sequence[np.ndarray]] = None,
  ):
    self._clients = clients
    self._local_epochs = local_epochs
    self._batch_size = batch_size
    self._rng = np.random.default_rng(seed)
    model = model_lib.logits_only(
      task_models.get_model(
        model_name,
        num_classes,
        clients[0][0].shape[1:],
        **model_kwargs(model_name),
      )
    )
    variables = model.trainable_variables
    self._variables = variables
    self._velocity = [tf.Variable(tf.zeros_like(v)) for v in variables]
    velocity = self._velocity

    @tf.function
    def step(x, y):
      with tf.GradientTape() as tape:
        loss = tf.reduce_mean(
          tf.keras.losses.sparse_categorical_crossentropy(
            y, model(x, training=True), from_logits=True
          )
        )
      for v, m, g in zip(variables, velocity, tape.gradient(loss, variables)):
        m.assign(momentum * m + g)
        v.assign_sub(learning_rate * m)

    self._step = step
    self.global_weights = (
      [np.asarray(w) for w in initial_weights]
      if initial_weights is not None
      else [v.numpy() for v in variables]
    )

  def run_round(self) -> None:
    total = 0
    weighted = [np.zeros_like(w) for w in self.global_weights]
    for x, y in self._clients:
      for v, w in zip(self._variables, self.global_weights):
        v.assign(w)
      for m in self._velocity:
        m.assign(tf.zeros_like(m))
      for _ in range(self._local_epochs):
        order = self._rng.permutation(len(y))
        for i in range(0, len(y), self._batch_size):
          batch = order[i : i + self._batch_size]
          self._step(x[batch], y[batch])
      for acc, v in zip(weighted, self._variables):
        acc += len(y) * v.numpy()
      total += len(y)
    self.global_weights = [w / total for w in weighted]


def training_flops_per_example(model: tf.keras.Model) -> float:
  """FLOPs to train on one example: forward and backward of the model's
  convolutions and dense layers.

  A multiply-add is 2 FLOPs; the backward pass is taken as twice the
  forward (gradients of the inputs and of the weights), the usual count.
  Other layers (activations, pooling, normalization) are left out: they are
  a small share of these models' arithmetic.
  """
  forward = 0.0
  for layer in model.layers:
    if isinstance(layer, tf.keras.layers.SeparableConv2D):
      # A depthwise convolution, then a 1x1 one over the channels.
      out = layer.output_shape[1:]
      channels = layer.input_shape[-1] * layer.depth_multiplier
      depthwise = np.prod(layer.kernel_size) * channels
      forward += 2.0 * np.prod(out[:-1]) * (depthwise + channels * out[-1])
    elif isinstance(layer, tf.keras.layers.DepthwiseConv2D):
      out = layer.output_shape[1:]
      kernel = np.prod(layer.kernel_size)
      forward += 2.0 * kernel * np.prod(out)
    elif isinstance(layer, tf.keras.layers.Conv2D):
      out = layer.output_shape[1:]
      kernel = np.prod(layer.kernel_size) * layer.input_shape[-1]
      forward += 2.0 * kernel * np.prod(out) / max(1, layer.groups)
    elif isinstance(layer, tf.keras.layers.Dense):
      forward += 2.0 * layer.input_shape[-1] * layer.units
  return 3.0 * forward


MATMUL_SIZE = 1024


def matmul_flops_per_second(
  size: int = MATMUL_SIZE, repeats: int = 20
) -> float:
  """What this process's TensorFlow can do with every core: the FLOP/s of
  a `size` x `size` float32 matmul, the fastest of `repeats` (another
  process's work only slows one down: their median read 190 to 338
  GFLOP/s on one machine)."""
  rng = np.random.default_rng(0)
  a = tf.constant(rng.normal(size=(size, size)).astype(np.float32))
  b = tf.constant(rng.normal(size=(size, size)).astype(np.float32))
  matmul = tf.function(lambda a, b: tf.reduce_sum(tf.linalg.matmul(a, b)))
  matmul(a, b).numpy()  # Traced and warmed up.
  seconds = []
  for _ in range(repeats):
    start = time.perf_counter()
    matmul(a, b).numpy()
    seconds.append(time.perf_counter() - start)
  return 2.0 * size**3 / min(seconds)


def plain_tf_round_seconds(
  model_name: str,
  clients,
  num_classes: int,
  local_epochs: int,
  batch_size: int,
  learning_rate: float,
  momentum: float,
  repeats: int = 3,
  seed: int = 0,
) -> list[float]:
  """Seconds per `PlainTFFedAvg` round, per repeat, after a warm-up round."""
  loop = PlainTFFedAvg(
    model_name,
    clients,
    num_classes,
    local_epochs,
    batch_size,
    learning_rate,
    momentum,
    seed,
  )
  return pytorch_loop.time_rounds(loop.run_round, repeats)


def _status_kb(pid: int, field: str) -> int:
  try:
    with open(f'/proc/{pid}/status') as f:
      for line in f:
        if line.startswith(field + ':'):
          return int(line.split()[1])
  except OSError:
    pass
  return 0


def resident_mb() -> dict[str, float]:
  """Resident and peak resident memory (MB) of this process and workers."""
  pids = {'python': os.getpid()}
  pids.update({f'worker_{i}': p for i, p in enumerate(workers.worker_pids())})
  figures = {}
  for name, pid in pids.items():
    figures[f'{name}_rss_mb'] = _status_kb(pid, 'VmRSS') / 1024
    figures[f'{name}_peak_mb'] = _status_kb(pid, 'VmHWM') / 1024
  figures['total_rss_mb'] = sum(
    v for k, v in figures.items() if k.endswith('_rss_mb')
  )
  figures['total_peak_mb'] = sum(
    v for k, v in figures.items() if k.endswith('_peak_mb')
  )
  return figures


def reset_peak_memory() -> None:
  """Restarts the peak-resident counters (Linux `clear_refs` 5), if allowed."""
  for pid in [os.getpid()] + workers.worker_pids():
    try:
      with open(f'/proc/{pid}/clear_refs', 'w') as f:
        f.write('5')
    except OSError:
      pass


def memory_growth(
  data: datasets.FederatedData,
  model_name: str,
  rounds: int,
  hparams: methods_lib.Hyperparameters,
  batch_size: int = 32,
  after_round: int = 20,
  model_options: Optional[dict] = None,
) -> dict[str, Any]:
  """Resident memory over `rounds` FedAvg rounds of a small model.

  Returns:
    `rss_mb` per round (this process + workers), and `growth`: the relative
    increase from round `after_round` to the last.
  """
  model_fn = experiment.model_fn_for(
    'fedavg',
    model_name,
    data.num_classes,
    data.input_shape,
    hparams,
    **(model_options or {}),
  )
  process = methods_lib.build_method_for_client_ids(
    'fedavg',
    model_fn,
    *_round_datasets(data, datasets.LocalBatches(batch_size)),
    hparams,
  )
  state = process.set_model_weights(
    process.initialize(), model_lib.initial_weights(model_fn, 0)
  )
  client_ids = list(data.client_data.client_ids)
  rss = []
  for round_num in range(1, rounds + 1):
    state = process.next(state, _keys(client_ids, round_num)).state
    rss.append(resident_mb()['total_rss_mb'])
  return dict(
    rss_mb=rss, after_round=after_round, growth=_growth(rss, after_round)
  )


def _growth(rss_mb: Sequence[float], after_round: int) -> float:
  """Relative growth of resident memory from `after_round` to the last."""
  base = rss_mb[min(after_round, len(rss_mb)) - 1]
  return (rss_mb[-1] - base) / base


def scaling(
  client_counts: Sequence[int],
  model_name: str,
  examples_per_client: int,
  batch_size: int,
  hparams: methods_lib.Hyperparameters,
  cache_dir: str,
  repeats: int = 3,
  seed: int = 0,
  in_process_context=None,
) -> dict[int, dict[str, Any]]:
  """FedAvg's seconds per round as the cohort grows, against the plain loop.

  For each N of `client_counts`: N generated CIFAR-shaped clients of
  `examples_per_client` examples, all taking part, one local epoch; the
  project's FedAvg through TFF and `PlainTFFedAvg` at the same settings,
  and FedAvg in `in_process_context` when one is given.

  Returns:
    By N: `fedavg_seconds`, `plain_tf_seconds` (medians),
    `overhead_ms_per_client`: what TFF adds per client beyond the plain
    loop's arithmetic, and `fedavg_in_process_seconds`.
  """
  results = {}
  for count in client_counts:
    data = datasets.generated_like(
      'cifar10', count, examples_per_client, cache_dir, seed=seed
    )
    fedavg = time_methods(
      model_name, ['fedavg'], data, hparams, 1, batch_size, repeats, seed
    )['fedavg']['median']
    plain = _median(
      plain_tf_round_seconds(
        model_name,
        client_arrays(data),
        data.num_classes,
        1,
        batch_size,
        hparams.client_learning_rate,
        hparams.client_momentum,
        repeats,
        seed,
      )
    )
    results[count] = dict(
      fedavg_seconds=fedavg,
      plain_tf_seconds=plain,
      overhead_ms_per_client=_overhead_ms(fedavg, plain, count),
    )
    if in_process_context is not None:
      with tff.framework.get_context_stack().install(in_process_context):
        results[count]['fedavg_in_process_seconds'] = time_methods(
          model_name, ['fedavg'], data, hparams, 1, batch_size, repeats, seed
        )['fedavg']['median']
      in_process_context.close()
  return results


# The cross-device run's task: EMNIST's writers (3,400 of 100 to 300
# examples, 62 classes) in generated form.
CROSS_DEVICE_TASK = 'emnist'


def cross_device(
  method_names: Sequence[str],
  *,
  num_clients: int,
  min_examples: int,
  max_examples: int,
  clients_per_round: int,
  rounds: int,
  model_name: str,
  batch_size: int,
  hparams: methods_lib.Hyperparameters,
  output_dir: str,
  seed: int = 0,
  on_round: Optional[Callable[[str, int, float], None]] = None,
) -> dict[str, Any]:
  """A cross-device federation: many small clients, a sample per round.

  Generated EMNIST-shaped data (`num_clients` clients of `min_examples` to
  `max_examples`), `clients_per_round` sampled per round as
  `tooling.training_loop` samples them, one local epoch. For each method:
  seconds per round, clients per second, and resident memory (Python + TFF
  worker) after every round. For methods with per-client state, after the
  rounds: every client is given a state (those never sampled get one
  written from Python), and the store's size on disk and the time to read
  every client's state back are measured.

  Returns:
    The settings, `data_seconds` (building the partition and writing the
    clients' files), and under `methods`, by method: `seconds` per round,
    `median`, `clients_per_second`, `rss_mb` per round, `growth` (from
    round 10 to the last), and for stateful methods `state_store`
    (`clients`, `megabytes`, `load_seconds`).
  """
  cache_dir = os.path.join(output_dir, 'cache')
  shutil.rmtree(cache_dir, ignore_errors=True)  # Timed from scratch.
  start = time.perf_counter()
  data = datasets.generated_like(
    CROSS_DEVICE_TASK,
    num_clients,
    min_examples,
    cache_dir,
    seed=seed,
    max_examples_per_client=max_examples,
  )
  after_round = min(10, rounds)
  results = dict(
    num_clients=num_clients,
    min_examples=min_examples,
    max_examples=max_examples,
    clients_per_round=clients_per_round,
    rounds=rounds,
    model=model_name,
    batch_size=batch_size,
    data_seconds=time.perf_counter() - start,
    after_round=after_round,
    methods={},
  )
  client_ids = list(data.client_data.client_ids)
  for name in method_names:
    state_dir = os.path.join(output_dir, 'client_states', name)
    shutil.rmtree(state_dir, ignore_errors=True)
    method_hparams = dataclasses.replace(
      hparams, num_clients=num_clients, client_state_dir=state_dir
    )
    process, model_fn = _benchmark_process(
      name, model_name, data, method_hparams, 1, batch_size, seed
    )
    state = process.set_model_weights(
      process.initialize(), model_lib.initial_weights(model_fn, seed)
    )
    client_states = getattr(process, 'client_states', None)
    seconds, rss = [], []
    for round_num in range(1, rounds + 1):
      cohort = datasets.sample_clients(
        client_ids, clients_per_round, round_num, seed
      )
      begin = time.perf_counter()
      state = process.next(state, _keys(cohort, round_num)).state
      seconds.append(time.perf_counter() - begin)
      if client_states is not None:
        # As the training loop does: only the newest version is kept.
        client_states.prune(cohort, round_num)
      rss.append(resident_mb()['total_rss_mb'])
      if on_round:
        on_round(name, round_num, seconds[-1])
    timed = seconds[1:] or seconds  # The first round builds the graphs.
    results['methods'][name] = dict(
      seconds=seconds,
      median=_median(timed),
      clients_per_second=clients_per_round / _median(timed),
      rss_mb=rss,
      growth=_growth(rss, after_round),
    )
    if client_states is not None:
      results['methods'][name]['state_store'] = _fill_and_load_states(
        client_states, client_ids, rounds
      )
  return results


def _fill_and_load_states(
  client_states, client_ids: Sequence[str], rounds: int
) -> dict[str, float]:
  """Size and read time of the store once every client has a state."""
  for client_id in client_ids:
    if client_id not in client_states:
      client_states.put(client_id, client_states.initial_state, rounds)
  size = 0
  for root, _, files in os.walk(client_states.directory):
    size += sum(os.path.getsize(os.path.join(root, f)) for f in files)
  start = time.perf_counter()
  for client_id in client_ids:
    client_states.get(client_id)
  return dict(
    clients=len(client_ids),
    megabytes=size / 2**20,
    load_seconds=time.perf_counter() - start,
  )


def _format(value: Optional[float]) -> str:
  return '' if value is None else f'{value:.2f}'


def _overhead_ms(
  fedavg_seconds: float, plain_seconds: float, num_clients: int
) -> float:
  return 1000 * (fedavg_seconds - plain_seconds) / num_clients


def _mark(value: float, target: float) -> str:
  return 'yes' if value <= target else '**no**'


def combine_passes(passes: Sequence[dict[str, dict[str, Any]]]) -> dict:
  """`time_methods`' results of independent passes, as one result.

  Each method's `median` and `ratio` (and `ratio_to_tff_fedavg`) are the
  medians over the passes of each pass's own; `pass_ratios` lists the
  passes' ratios, whose range is the spread a single pass can show.
  """
  combined = {}
  for name in passes[0]:
    timings = [p[name] for p in passes]
    entry = dict(
      seconds=[s for t in timings for s in t['seconds']],
      median=_median([t['median'] for t in timings]),
      ratio=_median([t['ratio'] for t in timings]),
      pass_ratios=[t['ratio'] for t in timings],
    )
    if 'empty_round_seconds' in timings[0]:
      entry['empty_round_seconds'] = _median(
        [t['empty_round_seconds'] for t in timings]
      )
    if 'ratio_to_tff_fedavg' in timings[0]:
      entry['ratio_to_tff_fedavg'] = _median(
        [t['ratio_to_tff_fedavg'] for t in timings]
      )
    combined[name] = entry
  return combined


# The floor comparison's ratios: name -> (numerator, denominator) seconds.
FLOOR_RATIOS = {
  'fedavg_over_plain_tf': ('fedavg_seconds', 'plain_tf_seconds'),
  'tff_fedavg_over_plain_tf': ('tff_fedavg_seconds', 'plain_tf_seconds'),
  'pytorch_over_plain_tf': ('pytorch_seconds', 'plain_tf_seconds'),
  'fedavg_over_pytorch': ('fedavg_seconds', 'pytorch_seconds'),
  'tff_fedavg_over_pytorch': ('tff_fedavg_seconds', 'pytorch_seconds'),
}


def combine_floor_passes(passes: Sequence[dict[str, Any]]) -> dict:
  """The floor comparison's independent passes, as one result.

  Each pass times FedAvg through TFF, TFF's builder, the plain TF loop and
  (when measured) the PyTorch loop one after the other. Each time is the
  median over the passes, each ratio (`FLOOR_RATIOS`) the median of the
  passes' own ratios, with `pass_ratios` for their spread: a machine's
  load moves the loops apart within a pass, so a ratio is judged on its
  median, as the methods' are (`combine_passes`).
  """
  combined = dict(passes[0])
  for key in ('fedavg', 'tff_fedavg', 'plain_tf', 'pytorch'):
    values = [p[f'{key}_seconds'] for p in passes if p.get(f'{key}_seconds')]
    if values:
      combined[f'{key}_seconds'] = _median(values)
      combined[f'{key}_all'] = [s for p in passes for s in p[f'{key}_all']]
  combined['ratios'] = {}
  for name, (numerator, denominator) in FLOOR_RATIOS.items():
    ratios = [
      p[numerator] / p[denominator]
      for p in passes
      if p.get(numerator) and p.get(denominator)
    ]
    if ratios:
      combined['ratios'][name] = dict(
        median=_median(ratios), pass_ratios=ratios
      )
  return combined


def comparison_ratio(floor: dict, name: str) -> Optional[float]:
  """A `FLOOR_RATIOS` ratio of the floor comparison: the median over its
  passes, or (one pass, or results written before passes) the ratio of
  its times; None when one of them was not measured."""
  if name in floor.get('ratios', {}):
    return floor['ratios'][name]['median']
  numerator, denominator = FLOOR_RATIOS[name]
  if not floor.get(numerator) or not floor.get(denominator):
    return None
  return floor[numerator] / floor[denominator]


def _with_range(ratio: float, pass_ratios: Sequence[float], unit: str = ''):
  """A ratio, with its range over the passes when several ran."""
  if len(pass_ratios) < 2:
    return f'{ratio:.2f}{unit}'
  return f'{ratio:.2f}{unit} ({min(pass_ratios):.2f}-{max(pass_ratios):.2f})'


def _floor_pass_ratios(floor: dict, name: str) -> list[float]:
  """A `FLOOR_RATIOS` ratio in each pass of the floor comparison."""
  return floor.get('ratios', {}).get(name, {}).get('pass_ratios', [])


def _comparison_ratio_cell(floor: dict, name: str, unit: str = '') -> str:
  """A floor ratio, with its range over the passes when several ran."""
  return _with_range(
    comparison_ratio(floor, name), _floor_pass_ratios(floor, name), unit
  )


def _ratio_cell(timing: dict) -> str:
  """The ratio to FedAvg, with its range over the passes when several ran."""
  return _with_range(timing['ratio'], timing.get('pass_ratios', []))


def _flops_lines(results: dict, model: dict) -> list[str]:
  """Each method's training arithmetic per second, against the machine's."""
  machine = results.get('matmul_flops_per_second')
  per_example = model.get('training_flops_per_example')
  if not machine or not per_example:
    return []
  work = (
    per_example
    * model['examples_per_client']
    * model['local_epochs']
    * results['settings']['num_clients']
  )
  achieved = ', '.join(
    f'{name} {work / t["median"] / 1e9:.1f} '
    f'({work / t["median"] / machine:.0%})'
    for name, t in model['methods'].items()
  )
  return [
    f'Arithmetic: training the model is {per_example / 1e6:.1f} MFLOP an '
    f'example (its convolutions and dense layers, forward and backward), '
    f'{work / 1e9:.0f} GFLOP a round. A {MATMUL_SIZE}x{MATMUL_SIZE} '
    f'float32 matmul runs at {machine / 1e9:.1f} GFLOP/s on this '
    "machine's cores. GFLOP/s a round achieves (FedAvg's arithmetic over "
    f"the method's time) and its share of the matmul's: {achieved}.",
    '',
  ]


def _judged_ratio(timing: dict) -> float:
  """The ratio a target is judged on: the larger of the two FedAvgs'.

  TFF's builder is slower than the project's FedAvg, so a ratio to it alone
  would credit a method with the shared loop's speed-up rather than its own
  cost.
  """
  return max(timing['ratio'], timing.get('ratio_to_tff_fedavg', 0.0))


def _pytorch_cell(floor: dict) -> str:
  if floor.get('pytorch_seconds'):
    return f"{floor['pytorch_seconds']:.2f}"
  return f"not measured: {floor.get('pytorch_note', 'PyTorch not installed')}"


def report_markdown(results: dict) -> str:
  """The benchmark's figures beside their targets, as Markdown."""
  lines = [
    '# Benchmark',
    '',
    f"{results['settings']['num_clients']} clients, all taking part, "
    'CIFAR-shaped generated data; seconds per round are medians of '
    f"{results['settings']['repeats']} interleaved rounds after a "
    'warm-up round'
    + (
      f", over {results['settings']['passes']} independent passes (each "
      'in a new worker; ratios are the medians of the passes\' ratios, '
      'their range in brackets)'
      if results['settings'].get('passes', 1) > 1
      else ''
    )
    + '.',
    '',
  ]
  for model_name, model in results['models'].items():
    lines += [
      f"## {model_name}: {model['examples_per_client']} examples per "
      f"client, batch {results['settings']['batch_size']}, "
      f"{model['local_epochs']} local epoch(s)",
      '',
      '| method | s/round | ratio to FedAvg | '
      "ratio to TFF's FedAvg | target | met | "
      'FedCKA paper (Table 4) |',
      '|---|---|---|---|---|---|---|',
    ]
    targets = TARGET_RATIO.get(model_name, {})
    paper = PAPER_RATIO.get(model_name, {})
    fedavg = model['methods']['fedavg']['median']
    num_clients = results['settings']['num_clients']
    for name, timing in model['methods'].items():
      target = targets.get(name)
      judged = _judged_ratio(timing)
      extra = model.get(f'{name}_extra')
      cell = '' if target is None else f'<= {target}'
      if extra:
        # With its floor measured, a method is judged against the floor.
        target = (
          floor_ratio(extra['extra_seconds'], fedavg, num_clients)
          + TARGET_ABOVE_FLOOR
        )
        judged = timing['ratio']
        cell = f'<= {target:.2f} (floor + {TARGET_ABOVE_FLOOR})'
      lines.append(
        f"| {name} | {timing['median']:.2f} | {_ratio_cell(timing)} | "
        f"{_format(timing.get('ratio_to_tff_fedavg'))} | {cell} | "
        f"{'' if target is None else _mark(judged, target)}"
        f" | {paper.get(name, '')} |"
      )
    if model.get('in_process'):
      lines += [''] + device_check.benchmark_lines(
        model['methods'],
        model['in_process'],
        results['settings'].get('in_process_devices', ''),
      )
    for method, label, per_step_key, per_step_label in (
      (
        'fedcka',
        'FedCKA',
        'grams_seconds',
        "the Gram products on each batch's rows of the reference tables",
      ),
      (
        'moon',
        'MOON',
        'contrastive_seconds',
        "the contrastive terms on each batch's rows of the reference tables",
      ),
    ):
      extra = model.get(f'{method}_extra')
      if not extra:
        continue
      lowest = floor_ratio(extra['extra_seconds'], fedavg, num_clients)
      passes_ms = 1000 * extra['reference_passes_seconds']
      step_ms = 1000 * extra[per_step_key]
      fedavg_ms = 1000 * fedavg / num_clients
      measured = model['methods'].get(method)
      above = ''
      if measured:
        gap = measured['ratio'] - lowest
        # Below the floor only by the rounds' noise (the floor is a least
        # time, the ratio a median).
        where = (
          f'{gap:.2f} above its floor'
          if gap >= 0
          else f'{-gap:.2f} below its floor, within the noise'
        )
        above = (
          f" It ran at {measured['ratio']:.2f}: {where} (target <= "
          f'{TARGET_ABOVE_FLOOR} above: '
          f'{_mark(gap, TARGET_ABOVE_FLOOR)}).'
        )
      lines += [
        '',
        f"{label}'s floor: what it computes beyond FedAvg, "
        "timed alone, per client: the global and previous models' "
        f'reference passes {passes_ms:.0f} ms and {per_step_label} '
        f"{step_ms:.0f} ms, against FedAvg's {fedavg_ms:.0f} ms per "
        f'client: {label} cannot go below {lowest:.2f} of FedAvg '
        f'here.{above}',
      ]
    lines += [
      '',
      "FedAvg is the project's `fedavg`, the local-training "
      'loop every other method shares, with no regularizer: the '
      "ratio to it is what a method's own computation costs. "
      f"`{TFF_FEDAVG}` is TFF's `build_weighted_fed_avg`, which "
      'computes the same weights. A target is met when both ratios '
      "are within it; MOON's and FedCKA's, when their floors are "
      f'measured, are their floors + {TARGET_ABOVE_FLOOR}, judged on '
      'the ratio to FedAvg.',
    ]
    lines += [
      '',
      f"Clients per second (FedAvg): "
      f"{results['settings']['num_clients'] / fedavg:.2f}. Peak "
      f"resident memory: {model['peak_mb']:.0f} MB (Python + TFF "
      'worker).',
      '',
    ]
    empty = [
      f'{name} {timing["empty_round_seconds"]:.2f} s'
      for name, timing in model['methods'].items()
      if 'empty_round_seconds' in timing
    ]
    if empty:
      lines += [
        'A round with no clients (the fixed cost of a round: the server '
        'state to the worker and back): ' + ', '.join(empty) + '.',
        '',
      ]
    lines += _flops_lines(results, model)
  if results.get('client_profile'):
    lines += client_profile.report_markdown(results['client_profile']).split(
      '\n'
    )
  floor = results.get('floor')
  if floor:
    plain = floor['plain_tf_seconds']
    overhead = _overhead_ms(
      floor['fedavg_seconds'], plain, results['settings']['num_clients']
    )
    ratio = comparison_ratio(floor, 'fedavg_over_plain_tf')
    floor_passes = len(_floor_pass_ratios(floor, 'fedavg_over_plain_tf'))
    lines += [
      f"## FedAvg through TFF against a plain TF loop "
      f"({floor['model']}, {floor['examples_per_client']} examples "
      f"per client, {floor['local_epochs']} local epochs)",
      '',
    ]
    if floor_passes > 1:
      lines += [
        f'Each loop timed in {floor_passes} independent passes: seconds '
        "are the passes' medians, ratios the medians of the passes' "
        'ratios (their range in brackets).',
        '',
      ]
    lines += [
      '| | s/round | / plain TF |',
      '|---|---|---|',
      f"| FedAvg through TFF (the project's `fedavg`) | "
      f"{floor['fedavg_seconds']:.2f} | "
      f"{_comparison_ratio_cell(floor, 'fedavg_over_plain_tf')} |",
      f"| FedAvg through TFF (TFF's `build_weighted_fed_avg`) | "
      f"{floor['tff_fedavg_seconds']:.2f} | "
      f"{_comparison_ratio_cell(floor, 'tff_fedavg_over_plain_tf')} |",
      f'| plain TF loop (the floor) | {plain:.2f} | 1.00 |',
      f"| PyTorch loop (the reference code's way) | "
      f'{_pytorch_cell(floor)} | '
      + (
        _comparison_ratio_cell(floor, 'pytorch_over_plain_tf')
        if floor.get('pytorch_seconds')
        else ''
      )
      + ' |',
      '',
      f"The project's FedAvg / plain TF: {ratio:.2f} (target <= "
      f'{TARGET_TFF_OVER_FLOOR}: '
      f"{_mark(ratio, TARGET_TFF_OVER_FLOOR)}); TFF's builder: "
      f"{comparison_ratio(floor, 'tff_fedavg_over_plain_tf'):.2f}.",
      "TFF's cost per client beyond the plain loop: "
      f'{overhead:.1f} ms (target <= '
      f'{TARGET_OVERHEAD_MS_PER_CLIENT:.0f}: '
      f'{_mark(overhead, TARGET_OVERHEAD_MS_PER_CLIENT)}).',
    ]
    over_pytorch = comparison_ratio(floor, 'fedavg_over_pytorch')
    if over_pytorch is not None:
      lines.append(
        f"Faster than PyTorch (target): the project's FedAvg "
        f'{_mark(over_pytorch, 1.0)} '
        f"({_comparison_ratio_cell(floor, 'fedavg_over_pytorch', 'x')} "
        "PyTorch's time); TFF's builder "
        f"{_comparison_ratio_cell(floor, 'tff_fedavg_over_pytorch', 'x')}."
      )
    lines.append('')
  workers = results.get('workers')
  if workers:
    lines += [
      f"## FedAvg over loopback TFF workers ({workers['model']}, "
      f"{workers['examples_per_client']} examples per client, "
      f"{workers['local_epochs']} local epoch(s))",
      '',
      '| workers | s/round | clients/s |',
      '|---|---|---|',
    ]
    for count, timing in workers['by_count'].items():
      lines.append(
        f"| {count} | {timing['median']:.2f} | "
        f"{timing['clients_per_second']:.2f} |"
      )
    lines += [
      '',
      'Every worker on this machine (loopback), each running '
      f"{results['settings']['max_concurrent_clients']} client "
      'computations at once: the figures show the runtime\'s '
      'overhead of splitting a round, not a second machine\'s '
      'speed-up.',
      '',
    ]
  scaling_results = results.get('scaling')
  if scaling_results:
    lines += [
      f"## Clients per round ({scaling_results['model']}, "
      f"{scaling_results['examples_per_client']} examples per "
      'client, one local epoch, all taking part)',
      '',
      '| clients | FedAvg s/round | ms/client | plain TF s/round | '
      "ms/client | TFF's cost per client (ms) | FedAvg in-process s/round |",
      '|---|---|---|---|---|---|---|',
    ]
    for count, row in scaling_results['by_count'].items():
      count = int(count)
      in_process = row.get('fedavg_in_process_seconds')
      lines.append(
        f"| {count} | {row['fedavg_seconds']:.2f} | "
        f"{1000 * row['fedavg_seconds'] / count:.1f} | "
        f"{row['plain_tf_seconds']:.2f} | "
        f"{1000 * row['plain_tf_seconds'] / count:.1f} | "
        f"{row['overhead_ms_per_client']:.1f} | "
        f'{_format(in_process)} |'
      )
    lines.append('')
  device = results.get('cross_device')
  if device:
    lines += [
      f"## Cross-device: {device['num_clients']} EMNIST-shaped "
      f"clients of {device['min_examples']} to "
      f"{device['max_examples']} examples, "
      f"{device['clients_per_round']} per round "
      f"({device['model']}, batch {device['batch_size']}, one local "
      'epoch)',
      '',
      f"Building the partition and the clients' files: "
      f"{device['data_seconds']:.1f} s.",
      '',
      '| method | s/round | clients/s | memory growth | '
      'client states on disk | reading every state |',
      '|---|---|---|---|---|---|',
    ]
    for name, run in device['methods'].items():
      store = run.get('state_store')
      store_cells = (
        f"{store['megabytes']:.0f} MB ({store['clients']} clients) | "
        f"{store['load_seconds']:.1f} s "
        f"({1000 * store['load_seconds'] / store['clients']:.2f} ms each)"
        if store
        else 'none | '
      )
      lines.append(
        f"| {name} | {run['median']:.2f} | "
        f"{run['clients_per_second']:.1f} | "
        f"{100 * run['growth']:+.1f}% "
        f"({_mark(run['growth'], TARGET_MEMORY_GROWTH)}) | {store_cells} |"
      )
    lines += [
      '',
      'Seconds per round: median over the rounds after the '
      'first. Memory growth: resident memory (Python + TFF worker) '
      f"from round {device['after_round']} to the last, target < "
      f"{100 * TARGET_MEMORY_GROWTH:.0f}%. The state store is "
      'measured once every client has a state (clients never '
      'sampled get one written), read back from Python.',
      '',
    ]
  memory = results.get('memory')
  if memory:
    lines += [
      f"## Memory over {len(memory['rss_mb'])} rounds " f"({memory['model']})",
      '',
      f"Resident memory after round {memory['after_round']}: "
      f"{memory['rss_mb'][memory['after_round'] - 1]:.0f} MB; after "
      f"the last: {memory['rss_mb'][-1]:.0f} MB; growth "
      f"{100 * memory['growth']:.1f}% (target < "
      f"{100 * TARGET_MEMORY_GROWTH:.0f}%: "
      f"{_mark(memory['growth'], TARGET_MEMORY_GROWTH)}).",
      '',
    ]
  return '\n'.join(lines)


def _benchmark_process(
  name, model_name, data, hparams, local_epochs, batch_size, seed
):
  """(Method `name`'s process on `data`'s client keys, its model function),
  as every timed part of the benchmark builds them."""
  batches = datasets.LocalBatches(
    batch_size,
    local_epochs,
    seed=seed,
    with_index=methods_lib.wants_example_index(name, local_epochs),
  )
  model_fn = experiment.model_fn_for(
    name,
    model_name,
    data.num_classes,
    data.input_shape,
    hparams,
    **model_kwargs(model_name),
  )
  process = methods_lib.build_method_for_client_ids(
    name, model_fn, *_round_datasets(data, batches), hparams
  )
  return process, model_fn


def _round_datasets(
  data: datasets.FederatedData, batches: datasets.LocalBatches
):
  """The dataset computation and batch spec of `data` batched as `batches`."""
  return (
    datasets.round_dataset_computation(data.client_data, batches),
    batches.element_spec(data.client_data.element_type_structure),
  )


def _keys(client_ids, round_num):
  return [client_keys.client_key(c, round_num) for c in client_ids]
