"""The floors of the methods that add model-sized arithmetic to each step:
SCAFFOLD's correction and control variate, FedProx's proximal pull,
FedCos's cosine term's gradient (`benchmark_floors` judges by them)."""

from typing import Sequence

import numpy as np
import tensorflow as tf

from tff_methods_tasks import models as task_models
from tff_methods_tooling import benchmark_processes
from tff_methods_tooling import floor_timing


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
  Timed as `floor_timing.least_shares` times every floor, on random
  weights of the model's shapes; `1 + extra_seconds / (FedAvg's seconds
  per client)` is SCAFFOLD's floor.

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

  return floor_timing.least_shares(
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

  return floor_timing.least_shares(
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

  return floor_timing.least_shares(
    {'direction_seconds': direction_steps}, repeats, concurrent_clients
  )
