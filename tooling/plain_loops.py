"""FedAvg's local training as a plain TensorFlow loop (no TFF): the floor
TFF's runtime adds to; and what the machine can do (the model's training
FLOPs, a matmul's FLOP/s)."""

import time
from typing import Optional, Sequence

import numpy as np
import tensorflow as tf

from tff_methods.templates import model_lib
from tff_methods_tasks import datasets
from tff_methods_tasks import models as task_models

# Targets of issue 8: ratio of seconds per round to FedAvg's.
from tff_methods_tooling import benchmark_processes
from tff_methods_tooling import pytorch_loop


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
        **benchmark_processes.model_kwargs(model_name),
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
