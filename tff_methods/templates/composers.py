"""The pieces every method's process is composed of, beside its client work.

As TFF's `learning/templates`: the loop's set-up (`set_up_loop`: the model
and data checked, the aggregation made weighted, the distributor,
finalizer and recorder of `distributors` built), and the composer of the
pieces into a `LearningProcess`: TFF's `compose_learning_process` where it
can build the round, else `compose_computations` (client work whose client
data are keys, recorders after aggregation). `compose_loop` composes the
loop's pieces around either of its client works (`processes`).
"""

import collections
import dataclasses
from typing import Any, Callable, Optional, Sequence

import tensorflow as tf
import tensorflow_federated as tff

from tff_methods.clients import client_data
from tff_methods.templates import aggregation
from tff_methods.templates import distributors
from tff_methods.templates import model_checks
from tff_methods.templates import model_lib
from tff_methods.templates import regularizers as regularizers_lib
from tff_methods.templates import tff_models


@dataclasses.dataclass(frozen=True)
class LoopSetup:
  """What both builders of the shared local-training loop start from.

  Attributes:
    keras_model_fn: The user's model as the project's Keras model, checked
      for every output the terms read.
    loss_fn: The data term (the model's own loss for a TFF model).
    factory: The model aggregation factory, made weighted.
    client_weighting: How client updates are weighted.
    zero_weights: Zeros shaped like the model's weights.
    weights_type: Their TFF type.
    initial_model_weights_fn: The computation of the initial weights.
    distributor: TFF's broadcast, with the terms' server state.
    received_type: What a client receives from the distributor.
    finalizer: TFF's apply-optimizer finalizer with the server optimizer.
    mean_update_recorder: `build_mean_update_recorder`'s, or None.
  """

  keras_model_fn: Callable[[], Any]
  loss_fn: Callable[..., Any]
  factory: Any
  client_weighting: Any
  zero_weights: tff.learning.models.ModelWeights
  weights_type: tff.Type
  initial_model_weights_fn: tff.Computation
  distributor: tff.learning.templates.DistributionProcess
  received_type: tff.Type
  finalizer: tff.learning.templates.FinalizerProcess
  mean_update_recorder: Optional[tff.Computation]


def set_up_loop(
  keras_model_fn,
  element_spec: Any,
  server_optimizer: Optional[tff.learning.optimizers.Optimizer],
  regularizers: Sequence[regularizers_lib.Regularizer],
  model_aggregator: Optional[aggregation.ModelAggregator],
  client_weighting: Optional[aggregation.ClientWeighting],
  loss_fn: Optional[Callable[..., Any]],
) -> LoopSetup:
  """The pieces around a loop's client work, checked before any is built:
  TFF's model interfaces taken (`tff_models.keras_model_and_loss`), the
  model's outputs and the data's spec checked, the aggregation made
  weighted, and the distributor, finalizer and recorder built. The server
  optimizer is SGD with learning rate 1 (plain averaging) by default."""
  keras_model_fn, loss_fn = tff_models.keras_model_and_loss(
    keras_model_fn, loss_fn
  )
  factory, client_weighting = aggregation.model_aggregation(
    model_aggregator, client_weighting
  )
  keras_model_fn, model = model_checks.checked_model(
    keras_model_fn, regularizers
  )
  client_data.check_element_spec(element_spec, model_checks.input_shape(model))
  zero_weights = model_lib.zeros_like_weights(model)
  weights_type = model_lib.weights_type_of(zero_weights)
  distributor = distributors.build_distributor(
    weights_type, regularizers, zero_weights.trainable
  )
  return LoopSetup(
    keras_model_fn=keras_model_fn,
    loss_fn=loss_fn,
    factory=factory,
    client_weighting=client_weighting,
    zero_weights=zero_weights,
    weights_type=weights_type,
    initial_model_weights_fn=model_lib.initial_weights_computation(
      keras_model_fn
    ),
    distributor=distributor,
    received_type=distributor.next.type_signature.result.result.member,
    finalizer=tff.learning.templates.build_apply_optimizer_finalizer(
      server_optimizer or tff.learning.optimizers.build_sgdm(1.0),
      weights_type,
    ),
    mean_update_recorder=distributors.build_mean_update_recorder(
      distributor, regularizers, weights_type.trainable
    ),
  )


def compose_computations(
  initial_model_weights_fn,
  distributor,
  client_work,
  aggregator,
  finalizer,
  recorders: Sequence[distributors.Recorder] = (),
) -> tuple[tff.Computation, tff.Computation]:
  """`initialize` and `next` of the four pieces, as TFF's
  `compose_learning_process` composes them, for client work of any client
  data (keys too), with the `recorders` after aggregation.

  The client work's `next(state, received, client_data)` returns, at
  CLIENTS, a structure with `update` and `update_weight` (a `ClientResult`,
  or more for the recorders to read), and its measurements at SERVER.
  """

  @tff.federated_computation
  def init_fn():
    return tff.federated_zip(
      tff.learning.templates.LearningAlgorithmState(
        tff.federated_eval(initial_model_weights_fn, tff.SERVER),
        distributor.initialize(),
        client_work.initialize(),
        aggregator.initialize(),
        finalizer.initialize(),
      )
    )

  state_type = init_fn.type_signature.result
  data_type = client_work.next.type_signature.parameter[2]

  @tff.federated_computation(state_type, data_type)
  def next_fn(state, client_data):
    distributed = distributor.next(
      state.distributor, state.global_model_weights
    )
    worked = client_work.next(
      state.client_work, distributed.result, client_data
    )
    aggregated = aggregator.next(
      state.aggregator, worked.result.update, worked.result.update_weight
    )
    finalized = finalizer.next(
      state.finalizer, state.global_model_weights, aggregated.result
    )
    distributor_state = distributed.state
    for record in recorders:
      distributor_state = record(
        distributor_state, aggregated.result, worked.result
      )
    new_state = tff.federated_zip(
      tff.learning.templates.LearningAlgorithmState(
        finalized.result,
        distributor_state,
        worked.state,
        aggregated.state,
        finalized.state,
      )
    )
    metrics = tff.federated_zip(
      collections.OrderedDict(
        distributor=distributed.measurements,
        client_work=worked.measurements,
        aggregator=aggregated.measurements,
        finalizer=finalized.measurements,
      )
    )
    return tff.learning.templates.LearningProcessOutput(new_state, metrics)

  return init_fn, next_fn


@dataclasses.dataclass(frozen=True)
class LoopClientWork:
  """A client work of the shared loop, and what its process needs beside it.

  Attributes:
    process: The client work (`next(state, received, client data)`).
    recorders: What learns from the round after aggregation, beside the
      terms' mean-update recorder (SCAFFOLD's reports).
    make_process: `(initialize, next, (get_hparams, set_hparams))` -> the
      learning process, for a client work whose process is of its own kind
      (clients with state files); None for TFF's.
  """

  process: Any
  recorders: Sequence[distributors.Recorder] = ()
  make_process: Optional[Callable[..., Any]] = None


def compose_loop(
  setup: LoopSetup, work: LoopClientWork
) -> tff.learning.templates.LearningProcess:
  """The learning process of the loop's pieces (`setup`) around `work`:
  TFF's `compose_learning_process` where it can build it (data sets in,
  nothing to record), else `compose` with the recorders."""
  weight_type = work.process.next.type_signature.result.result.member[
    'update_weight'
  ]
  aggregator = setup.factory.create(setup.weights_type.trainable, weight_type)
  pieces = (
    setup.initial_model_weights_fn,
    setup.distributor,
    work.process,
    aggregator,
    setup.finalizer,
  )
  recorders = list(work.recorders)
  if setup.mean_update_recorder is not None:
    recorders.insert(
      0, distributors.mean_update_recording(setup.mean_update_recorder)
    )
  if work.make_process is not None:
    initialize_fn, next_fn = compose_computations(*pieces, recorders)
    return work.make_process(
      initialize_fn,
      next_fn,
      hparams_computations(
        initialize_fn.type_signature.result.member,
        work.process,
        setup.finalizer,
      ),
    )
  takes_data_sets = isinstance(
    work.process.next.type_signature.parameter[2].member, tff.SequenceType
  )
  if takes_data_sets and not recorders:
    return tff.learning.templates.compose_learning_process(*pieces)
  return compose(*pieces, recorders=recorders)


class KeyedClientWork(tff.templates.MeasuredProcess):
  """Client work whose client data may be keys, with TFF's hyperparameter
  computations (a `ClientWorkProcess` takes only data sets)."""

  def __init__(self, initialize_fn, next_fn, get_hparams_fn, set_hparams_fn):
    super().__init__(initialize_fn, next_fn)
    self.get_hparams = get_hparams_fn
    self.set_hparams = set_hparams_fn


class CheckedNext:
  """A computation that runs a check on its arguments first; everything
  else (its type signature, ...) is the computation's."""

  def __init__(self, computation: tff.Computation, check_clients):
    self._computation = computation
    self._check_clients = check_clients

  def __getattr__(self, name):
    return getattr(self._computation, name)

  def __call__(self, state, clients, *args, **kwargs):
    self._check_clients(clients)
    return self._computation(state, clients, *args, **kwargs)


class ClientIdsLearningProcess(tff.learning.templates.LearningProcess):
  """A `LearningProcess` built with a `dataset_computation`: its `next`
  takes client ids or keys, and refuses data sets before the round runs
  (TFF would fail inside with "Unexpected value found")."""

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self._checked_next = CheckedNext(super().next, self.check_clients)

  @property
  def next(self):
    """`next(state, client ids or keys)`, after `check_clients`."""
    return self._checked_next

  def check_clients(self, clients: Any) -> None:
    """Refuses, before the round runs, what the clients can't take."""
    refuse_data_sets(clients)


def refuse_data_sets(clients: Any) -> None:
  """Raises if a process that makes its clients' batches is given them."""
  if isinstance(clients, (list, tuple)) and any(
    isinstance(c, tf.data.Dataset) for c in clients
  ):
    raise TypeError(
      'This process was built with a dataset_computation: its next takes '
      "the clients' ids (or keys), and each client makes its own batches; "
      'it was given data sets. Pass the client ids, or build the process '
      'without dataset_computation to pass data sets.'
    )


def hparams_computations(state_type: tff.Type, client_work, finalizer):
  """`get_hparams` and `set_hparams` of a `LearningAlgorithmState`, as TFF's
  `compose_learning_process` makes them: the client work's and the
  finalizer's hyperparameters (the client and server optimizers')."""

  @tff.tensorflow.computation(state_type)
  def get_hparams_fn(state):
    return collections.OrderedDict(
      client_work=client_work.get_hparams(state.client_work),
      finalizer=finalizer.get_hparams(state.finalizer),
    )

  @tff.tensorflow.computation(state_type, get_hparams_fn.type_signature.result)
  def set_hparams_fn(state, hparams):
    return tff.learning.templates.LearningAlgorithmState(
      state.global_model_weights,
      state.distributor,
      client_work.set_hparams(state.client_work, hparams['client_work']),
      state.aggregator,
      finalizer.set_hparams(state.finalizer, hparams['finalizer']),
    )

  return get_hparams_fn, set_hparams_fn


def compose(
  initial_model_weights_fn,
  distributor,
  client_work,
  aggregator,
  finalizer,
  recorders: Sequence[distributors.Recorder] = (),
) -> tff.learning.templates.LearningProcess:
  """`compose_computations`' round as a `LearningProcess`."""
  init_fn, next_fn = compose_computations(
    initial_model_weights_fn,
    distributor,
    client_work,
    aggregator,
    finalizer,
    recorders,
  )
  state_type = init_fn.type_signature.result.member
  get_hparams_fn, set_hparams_fn = hparams_computations(
    state_type, client_work, finalizer
  )
  takes_data_sets = isinstance(
    next_fn.type_signature.parameter[1].member, tff.SequenceType
  )
  process_class = (
    tff.learning.templates.LearningProcess
    if takes_data_sets
    else ClientIdsLearningProcess
  )
  return process_class(
    init_fn,
    next_fn,
    *model_weights_computations(state_type),
    get_hparams_fn=get_hparams_fn,
    set_hparams_fn=set_hparams_fn,
  )


def model_weights_computations(state_type: tff.Type):
  """`get_model_weights` and `set_model_weights` of a
  `LearningAlgorithmState` of type `state_type`, as TFF's composer makes."""

  @tff.tensorflow.computation(state_type)
  def get_model_weights(state):
    return state.global_model_weights

  @tff.tensorflow.computation(state_type, state_type.global_model_weights)
  def set_model_weights(state, weights):
    return tff.learning.templates.LearningAlgorithmState(
      weights,
      state.distributor,
      state.client_work,
      state.aggregator,
      state.finalizer,
    )

  return get_model_weights, set_model_weights
