"""The client optimizer's hyperparameters, as the client work's state.

As TFF's `model_delta_client_work`: the client work's state is the client
optimizer's hyperparameters (its `get_hparams`, e.g. `learning_rate` and
`momentum` for SGD), broadcast to the clients every round, so that a
process's `get_hparams` and `set_hparams` read and set the client learning
rate as TFF's processes do.

With a `client_learning_rate_fn`, as TFF's `build_scheduled_client_work`
(`build_weighted_fed_avg_with_optimizer_schedule`): the state is the round
number, from 0, and the clients of round `r` train with learning rate
`client_learning_rate_fn(r)`, reported as the client work's
`client_learning_rate` measurement. As in TFF, such a client work has no
hyperparameters to get or set (an empty structure).
"""

import collections
from typing import Any, Callable, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

LearningRateFn = Callable[[Any], Any]


def as_optimizer(optimizer: Any) -> tff.learning.optimizers.Optimizer:
  """`optimizer`, or the optimizer of TFF's schedule form (learning rate ->
  optimizer), whose learning rate is then set through its hyperparameters.

  Raises:
    TypeError: neither a TFF optimizer nor a function returning one.
  """
  if callable(optimizer) and not isinstance(
    optimizer, tff.learning.optimizers.Optimizer
  ):
    optimizer = optimizer(1.0)
  if not isinstance(optimizer, tff.learning.optimizers.Optimizer):
    raise TypeError(
      'client_optimizer_fn must be a tff.learning.optimizers.Optimizer '
      '(e.g. tff.learning.optimizers.build_sgdm(0.1)), got '
      f'{optimizer!r}.'
    )
  return optimizer


def initial_hparams(optimizer: tff.learning.optimizers.Optimizer):
  """The optimizer's hyperparameters, as TFF's client works read them: of
  a state for a whimsy spec."""
  return optimizer.get_hparams(
    optimizer.initialize(tf.TensorSpec((), tf.float32))
  )


class ClientHparams:
  """The client work's state and what its clients receive of it.

  Args:
    optimizer: The client optimizer, a `tff.learning.optimizers.Optimizer`;
      with a schedule also TFF's form, learning rate -> optimizer.
    learning_rate_fn: Round number (from 0) -> the clients' learning rate,
      traced in TensorFlow (it gets an int32 tensor); None for the
      optimizer's own learning rate, which `set_hparams` can change.

  Raises:
    TypeError: an optimizer that is not TFF's, or a schedule that is not
      callable.
    ValueError: a schedule for an optimizer without a `learning_rate`.
  """

  def __init__(
    self,
    optimizer: tff.learning.optimizers.Optimizer,
    learning_rate_fn: Optional[LearningRateFn] = None,
  ):
    self.optimizer = _checked_optimizer(optimizer, learning_rate_fn)
    self.learning_rate_fn = learning_rate_fn
    self.initial = initial_hparams(self.optimizer)
    _check_schedule(learning_rate_fn, self.initial)

    @tff.federated_computation
    def init_fn():
      if learning_rate_fn is None:
        return tff.federated_value(self.initial, tff.SERVER)
      return tff.federated_value(np.int32(0), tff.SERVER)

    self.init_fn = init_fn
    self.state_type = init_fn.type_signature.result.member
    # Python floats become float32, as in the optimizer's own state.
    learning_rate_dtype = tf.convert_to_tensor(
      self.initial.get('learning_rate', 0.0)
    ).dtype

    @tff.tensorflow.computation(self.state_type)
    def round_hparams(state):
      if learning_rate_fn is None:
        return state
      hparams = collections.OrderedDict(self.initial)
      hparams['learning_rate'] = tf.cast(
        learning_rate_fn(state), learning_rate_dtype
      )
      return hparams

    self._round_hparams = round_hparams
    self.hparams_type = round_hparams.type_signature.result

    @tff.tensorflow.computation(self.state_type)
    def next_state(state):
      return state + 1 if learning_rate_fn is not None else state

    self._next_state = next_state

    self.get_hparams_fn, self.set_hparams_fn = _hparams_fns(
      self.state_type, scheduled=learning_rate_fn is not None
    )
    if learning_rate_fn is not None:

      @tff.tensorflow.computation(self.hparams_type)
      def learning_rate(hparams):
        return hparams['learning_rate']

      self._learning_rate = learning_rate

  def round_values(self, state):
    """In a federated computation: (the round's hyperparameters at CLIENTS,
    the client work's next state, its measurements) from its state."""
    hparams = tff.federated_map(self._round_hparams, state)
    measurements = collections.OrderedDict()
    if self.learning_rate_fn is not None:
      measurements['client_learning_rate'] = tff.federated_map(
        self._learning_rate, hparams
      )
    return (
      tff.federated_broadcast(hparams),
      tff.federated_map(self._next_state, state),
      measurements,
    )


def _checked_optimizer(optimizer, learning_rate_fn):
  """The client optimizer, checked (TFF's schedule form is taken too with a
  `learning_rate_fn`)."""
  if learning_rate_fn is not None:
    return as_optimizer(optimizer)
  if not isinstance(optimizer, tff.learning.optimizers.Optimizer):
    raise TypeError(
      'client_optimizer_fn must be a tff.learning.optimizers.Optimizer '
      '(e.g. tff.learning.optimizers.build_sgdm(0.1)), got '
      f'{optimizer!r}.'
    )
  return optimizer


def _check_schedule(learning_rate_fn, initial):
  if learning_rate_fn is None:
    return
  if not callable(learning_rate_fn):
    raise TypeError(
      'client_learning_rate_fn must be a function of the round number '
      f'(from 0) returning the learning rate, got {learning_rate_fn!r}.'
    )
  if 'learning_rate' not in initial:
    raise ValueError(
      "client_learning_rate_fn schedules the client optimizer's "
      "'learning_rate', which this optimizer does not have (its "
      f'hyperparameters are {sorted(initial)}).'
    )


def _hparams_fns(state_type, scheduled: bool):
  """The client work's `get_hparams_fn` and `set_hparams_fn`: its state is
  the optimizer's hyperparameters; scheduled, it has none of its own (as
  TFF's scheduled client work)."""
  if not scheduled:

    @tff.tensorflow.computation(state_type)
    def get_hparams_fn(state):
      return state

    @tff.tensorflow.computation(state_type, state_type)
    def set_hparams_fn(state, hparams):
      del state
      return hparams

    return get_hparams_fn, set_hparams_fn

  @tff.tensorflow.computation(state_type)
  def get_no_hparams(state):
    del state
    return collections.OrderedDict()

  @tff.tensorflow.computation(state_type, get_no_hparams.type_signature.result)
  def set_no_hparams(state, hparams):
    del hparams
    return state

  return get_no_hparams, set_no_hparams
