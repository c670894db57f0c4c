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
from typing import Sequence

import numpy as np
import tensorflow as tf

from tff_methods.algorithms import method_spec
from tff_methods.templates import regularizers

_EPSILON = 1e-4
# What `d` is: the paper's global move, or the FedCos code's mean update.
DIRECTIONS = ('global_move', 'mean_client_update')
# The FedCos paper's combinations (its Tables II-IV): FedCos added to
# FedProx, FedAvgM and FedAdam.
PAPER_COMBINATIONS = ('fedprox+fedcos', 'fedavgm+fedcos', 'fedadam+fedcos')
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
  term=DirectionPenalty,
)

# The public builder: TFF's builder arguments and the settings its term
# takes; what the registry and the binaries build.
build_fedcos = method_spec.builder(METHOD)
