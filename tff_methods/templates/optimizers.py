"""Client and server optimizers as `tff.learning.optimizers.Optimizer`s.

The papers train clients with PyTorch's SGD: momentum and L2 weight decay
added to the gradient before the momentum step (`g + wd * w`). TFF's
`build_sgdm` has no weight decay, so `build_client_sgd` wraps it. Server
optimizers turn FedAvg into FedAvgM / FedAdam / FedYogi (Reddi et al.).
"""

from typing import Any

import tensorflow as tf
import tensorflow_federated as tff

SERVER_OPTIMIZERS = ('sgd', 'sgdm', 'adam', 'yogi')


class _WeightDecay(tff.learning.optimizers.Optimizer):
  """Adds `weight_decay * w` to every gradient, then applies `base`."""

  def __init__(
    self, base: tff.learning.optimizers.Optimizer, weight_decay: float
  ):
    self._base = base
    self._weight_decay = weight_decay

  def initialize(self, specs: Any):
    return self._base.initialize(specs)

  def next(self, state, weights, gradients):
    gradients = tf.nest.map_structure(
      lambda g, w: g + tf.cast(self._weight_decay, g.dtype) * w,
      gradients,
      weights,
    )
    return self._base.next(state, weights, gradients)

  def get_hparams(self, state):
    return self._base.get_hparams(state)

  def set_hparams(self, state, hparams):
    return self._base.set_hparams(state, hparams)


def build_client_sgd(
  learning_rate: float, momentum: float = 0.0, weight_decay: float = 0.0
) -> tff.learning.optimizers.Optimizer:
  """SGD with optional momentum and PyTorch-style L2 weight decay.

  With `weight_decay=0` this is exactly TFF's `build_sgdm`.

  Raises:
    ValueError: on a non-positive learning rate, momentum outside [0, 1) or
      negative weight decay.
  """
  if not learning_rate > 0:
    raise ValueError(f'client learning rate must be > 0, got {learning_rate}.')
  if not 0.0 <= momentum < 1.0:
    raise ValueError(f'client momentum must be in [0, 1), got {momentum}.')
  if weight_decay < 0:
    raise ValueError(f'weight_decay must be >= 0, got {weight_decay}.')
  base = tff.learning.optimizers.build_sgdm(
    learning_rate, momentum=momentum or None
  )
  if weight_decay == 0:
    return base
  return _WeightDecay(base, weight_decay)


MOMENTUM_FORMS = ('heavy_ball', 'ema')


def build_server_optimizer(
  name: str,
  learning_rate: float = 1.0,
  momentum: float = 0.9,
  momentum_form: str = 'heavy_ball',
  beta_1: float = 0.9,
  beta_2: float = 0.99,
  epsilon: float = 1e-3,
) -> tff.learning.optimizers.Optimizer:
  """The server optimizer applied to the averaged client update.

  Args:
    name: 'sgd' (FedAvg with learning rate 1 is plain averaging), 'sgdm'
      (FedAvgM), 'adam' (FedAdam) or 'yogi' (FedYogi).
    learning_rate: The server learning rate.
    momentum: FedAvgM's momentum, beta.
    momentum_form: FedAvgM's form: 'heavy_ball' (TFF's SGDM, Hsu et al.:
      m = beta m + delta) or 'ema' (the FedCos code's: m = beta m +
      (1 - beta) delta). Both step w += lr m; from m = 0, 'ema' is
      heavy-ball with learning rate lr (1 - beta).
    beta_1, beta_2, epsilon: FedAdam's / FedYogi's parameters (Reddi et al.
      use epsilon 1e-3).
  """
  if not learning_rate > 0:
    raise ValueError(f'server learning rate must be > 0, got {learning_rate}.')
  if name == 'sgd':
    return tff.learning.optimizers.build_sgdm(learning_rate)
  if momentum_form not in MOMENTUM_FORMS:
    raise ValueError(
      f'Unknown server momentum form {momentum_form!r}; '
      f'choose one of {", ".join(MOMENTUM_FORMS)}.'
    )
  if name == 'sgdm':
    scale = 1.0 - momentum if momentum_form == 'ema' else 1.0
    return tff.learning.optimizers.build_sgdm(learning_rate * scale, momentum)
  if name == 'adam':
    return tff.learning.optimizers.build_adam(
      learning_rate, beta_1, beta_2, epsilon
    )
  if name == 'yogi':
    return tff.learning.optimizers.build_yogi(
      learning_rate, beta_1, beta_2, epsilon
    )
  raise ValueError(
    f'Unknown server optimizer {name!r}; choose one of ' f'{SERVER_OPTIMIZERS}.'
  )
