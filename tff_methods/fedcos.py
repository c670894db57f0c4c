"""FedCos (Zhang et al.): a cosine penalty towards the global model's last move.

Paper: Zhang et al., "FedCos: A Scene-adaptive Federated Optimization
Enhancement for Performance Improvement", IEEE Internet of Things Journal,
2022. https://arxiv.org/abs/2204.03174

Local objective, with `delta = w - w_g` (all trainable tensors flattened
together) and `d = w_g^t - w_g^{t-1}` the global model's last move:

  loss = f_i(w) + mu * (1 - <delta, d> / sqrt(||delta||^2 ||d||^2 + 1e-4)),

the reference code's `penalty5`; the epsilon keeps the gradient finite at
delta = 0. `d` is 0 in the first round, and so is the term.

FedCos is an add-on: `f_i` may be any local objective and the server rule
any method's (FedAvg, FedProx + FedCos, FedAvgM + FedCos, FedOpt + FedCos in
the paper's Tables I-II). It is a `Regularizer` with server state: the
previous global weights live in the distributor's state, and every round
the distributor broadcasts `d` beside the global model.

`direction='mean_client_update'` takes `d` as the FedCos code does: the
last round's mean client update `mean(w - w_g)`, before the server
optimizer. Under FedAvg (server SGD, learning rate 1) both are the same;
under FedAvgM or FedAdam they differ.
"""

import collections
import dataclasses
from typing import Any, Callable, Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_methods import aggregation
from tff_methods import local_training
from tff_methods import method_spec
from tff_methods import model_lib
from tff_methods import processes
from tff_methods import regularizers

_EPSILON = 1e-4
# What `d` is: the paper's global move, or the FedCos code's mean update.
DIRECTIONS = ('global_move', 'mean_client_update')
# The strength the project uses when none is given (the paper's tables use
# 0.01 to 0.05).
DEFAULT_MU = 0.02


def _flat(tensors: Sequence[tf.Tensor]) -> tf.Tensor:
  return tf.concat([tf.reshape(t, [-1]) for t in tensors], axis=0)


def direction_penalty(
  delta: Sequence[tf.Tensor], direction: Sequence[tf.Tensor]
) -> tf.Tensor:
  """`1 - <delta, d> / sqrt(||delta||^2 ||d||^2 + 1e-4)`; 0 while d is 0."""
  delta, direction = _flat(delta), _flat(direction)
  squared_direction = tf.reduce_sum(tf.square(direction))
  cosine = tf.reduce_sum(delta * direction) / tf.sqrt(
    tf.reduce_sum(tf.square(delta)) * squared_direction + _EPSILON
  )
  return tf.where(squared_direction > 0, 1.0 - cosine, 0.0)


class DirectionPenalty(regularizers.Regularizer):
  """`mu * direction_penalty(w - w_g, d)`; d broadcast by the server."""

  name = 'fedcos'
  display_name = 'FedCos'

  def __init__(self, mu: float, direction: str = 'global_move'):
    self.mu = regularizers.check_strength('FedCos mu', mu)
    if direction not in DIRECTIONS:
      raise ValueError(
        f'Unknown FedCos direction {direction!r}; choose one '
        f'of {", ".join(DIRECTIONS)}.'
      )
    self.direction = direction
    # `d`, at the server: the last global move, or the last mean update
    # (which the state then learns after each round).
    from_mean_update = direction == 'mean_client_update'
    self.server_state = regularizers.ServerState(
      initial=self._initial_server_state,
      broadcast=(
        self._broadcast_mean_move
        if from_mean_update
        else self._broadcast_global_move
      ),
      record_mean_update=(
        self._record_mean_update if from_mean_update else None
      ),
    )

  def _initial_server_state(self, trainable_zeros):
    # `previous`: the last global weights, or the last mean update.
    return collections.OrderedDict(
      previous=[np.asarray(z) for z in trainable_zeros],
      has_previous=np.int32(0),
    )

  def _broadcast_global_move(self, server_state, global_weights):
    seen = tf.cast(server_state['has_previous'], tf.float32)
    direction = [
      seen * (w - p) for w, p in zip(global_weights, server_state['previous'])
    ]
    new_state = collections.OrderedDict(
      previous=[tf.identity(w) for w in global_weights],
      has_previous=tf.constant(1, tf.int32),
    )
    return new_state, direction

  def _broadcast_mean_move(self, server_state, global_weights):
    del global_weights
    seen = tf.cast(server_state['has_previous'], tf.float32)
    # TFF's update is w_g - w: the clients' mean move is its negative.
    return server_state, [-seen * u for u in server_state['previous']]

  def _record_mean_update(self, server_state, mean_update):
    # A round whose mean is not finite leaves `d` as it was.
    finite = tf.reduce_all(
      [tf.reduce_all(tf.math.is_finite(u)) for u in mean_update]
    )
    return tf.cond(
      finite,
      lambda: collections.OrderedDict(
        previous=[tf.identity(u) for u in mean_update],
        has_previous=tf.constant(1, tf.int32),
      ),
      lambda: collections.OrderedDict(
        previous=[tf.identity(u) for u in server_state['previous']],
        has_previous=tf.identity(server_state['has_previous']),
      ),
    )

  def __call__(self, step: regularizers.LocalStep) -> tf.Tensor:
    delta = [w - wg for w, wg in zip(step.weights, step.global_weights)]
    return self.mu * direction_penalty(delta, step.broadcast[self.name])


def build_fedcos(
  keras_model_fn: model_lib.KerasModelFn,
  element_spec: Any,
  *,
  client_optimizer_fn: tff.learning.optimizers.Optimizer,
  mu: float = DEFAULT_MU,
  server_optimizer_fn: Optional[tff.learning.optimizers.Optimizer] = None,
  base_regularizers: Sequence[regularizers.Regularizer] = (),
  direction: str = 'global_move',
  dataset_computation: Optional[tff.Computation] = None,
  model_aggregator: Optional[aggregation.ModelAggregator] = None,
  metrics_aggregator: Optional[aggregation.MetricsAggregator] = None,
  client_weighting: Optional[aggregation.ClientWeighting] = None,
  loss_fn: Optional[local_training.LossFn] = None,
  client_learning_rate_fn: Optional[Callable[[Any], Any]] = None,
) -> tff.learning.templates.LearningProcess:
  """Builds FedCos over FedAvg (or over another method's pieces).

  Args:
    keras_model_fn: Builds a Keras model: one of `tff_methods_tasks.models`, a
      user's single-output model (taken as the logits), or one whose layers
      `model_lib.named_outputs` names.
    element_spec: The spec of one batch of client data.
    client_optimizer_fn: The client optimizer.
    mu: The penalty's strength, >= 0; 0 is the base method (paper: 0.01 to
      0.05).
    server_optimizer_fn: The base method's server optimizer; SGD with
      learning rate 1 (FedAvg) by default, SGD with momentum for FedAvgM +
      FedCos, Adam for FedAdam + FedCos.
    base_regularizers: The base method's own terms, e.g.
      `[fedprox.ProximalTerm(mu_prox)]` for FedProx + FedCos.
    direction: `d`, 'global_move' (the paper, default) or
      'mean_client_update' (the FedCos code).
    dataset_computation: A client's key -> its batches
      (`tff_methods_tasks.datasets.round_dataset_computation`), or a batched TFF
      `ClientData`; when given, `next` takes the clients' keys (ids for a
      `ClientData`) and each client makes its batches in its own computation.
    model_aggregator: TFF's model aggregator, weighted or unweighted
      (`tff.learning.robust_aggregator()`, `dp_aggregator(...)`, ...;
      `tff_methods.aggregation`); the weighted mean by default.
    metrics_aggregator: TFF's metrics aggregator;
      `tff.learning.metrics.sum_then_finalize` by default.
    client_weighting: `tff.learning.ClientWeighting` or
      `aggregation.NumTokens()`; NUM_EXAMPLES by default, UNIFORM with an
      unweighted `model_aggregator`.
    loss_fn: The data term, `(labels, model outputs) -> scalar`;
      cross-entropy on `logits` by default.
    client_learning_rate_fn: Round number (from 0) -> the client learning
      rate, as TFF's `build_weighted_fed_avg_with_optimizer_schedule`; None
      for the client optimizer's own, which `get_hparams`/`set_hparams`
      read and set.
  """
  return processes.build_local_training_process(
    keras_model_fn,
    element_spec,
    client_optimizer_fn,
    server_optimizer_fn,
    regularizers=list(base_regularizers) + [DirectionPenalty(mu, direction)],
    dataset_computation=dataset_computation,
    model_aggregator=model_aggregator,
    metrics_aggregator=metrics_aggregator,
    client_weighting=client_weighting,
    loss_fn=loss_fn,
    client_learning_rate_fn=client_learning_rate_fn,
  )


@dataclasses.dataclass(frozen=True)
class Settings:
  """FedCos's settings (flags `--fedcos_<name>`)."""

  mu: float = method_spec.setting(
    DEFAULT_MU, "The cosine penalty's strength.", minimum=0.0
  )
  direction: str = method_spec.setting(
    'global_move',
    "d: the global model's last move (global_move, the paper) or the mean "
    'client update before the server optimizer (mean_client_update, the '
    'FedCos code).',
    choices=DIRECTIONS,
  )


METHOD = method_spec.MethodSpec(
  name='fedcos',
  display_name='FedCos',
  settings=Settings,
  term=lambda settings: DirectionPenalty(settings.mu, settings.direction),
)
