"""The shared loop's client works, as TFF's `learning/templates/client_works`.

`client_work` wraps one client's computation (the round's optimizer
hyperparameters to every client, the computation on each, their metrics
aggregated) for clients with or without state:
`build_local_training_client_work` is it around `local_training`'s client
update for clients without state; `stateful` puts it around the
computation of clients that keep state.
"""

from typing import Any, Callable, Optional, Sequence

import tensorflow_federated as tff

from tff_methods.clients import client_data
from tff_methods.templates import aggregation
from tff_methods.templates import client_hparams
from tff_methods.templates import composers
from tff_methods.templates import distributors
from tff_methods.templates import local_training
from tff_methods.templates import model_lib
from tff_methods.templates import regularizers as regularizers_lib


def build_local_training_client_work(
  keras_model_fn: model_lib.KerasModelFn,
  element_spec: Any,
  optimizer: tff.learning.optimizers.Optimizer,
  regularizers: Sequence[regularizers_lib.Regularizer] = (),
  client_weighting: aggregation.ClientWeighting = (
    tff.learning.ClientWeighting.NUM_EXAMPLES
  ),
  received_type: Optional[tff.Type] = None,
  loss_fn: Optional[local_training.LossFn] = None,
  dataset_computation: Optional[tff.Computation] = None,
  metrics_aggregator: Optional[aggregation.MetricsAggregator] = None,
  client_learning_rate_fn: Optional[client_hparams.LearningRateFn] = None,
) -> tff.templates.MeasuredProcess:
  """Local training on cross-entropy plus `regularizers`, as client work.

  Its state is the client optimizer's hyperparameters, or the round number
  under `client_learning_rate_fn` (`client_hparams`), as TFF's client works.

  Args:
    keras_model_fn: Builds one of the project's multi-output Keras models
      (`tff_methods_tasks.models`); called inside TFF computations.
    element_spec: The spec of one batch of client data, `OrderedDict(x, y)`
      or an `(x, y)` tuple.
    optimizer: The client optimizer, e.g. `optimizers.build_client_sgd`.
    regularizers: Terms added to the local objective.
    client_weighting: How client updates are weighted in the mean.
    received_type: What each client receives from the distributor (see
      `build_distributor`); the model weights type by default.
    loss_fn: The data term; cross-entropy by default.
    dataset_computation: A client's key -> its batches
      (`tff_methods_tasks.datasets.round_dataset_computation`). When given, the
      clients' data are their keys and each client makes its batches inside its
      own computation (`ClientBatches`).
    metrics_aggregator: TFF's metrics aggregator (`aggregation`);
      `tff.learning.metrics.sum_then_finalize` by default.
    client_learning_rate_fn: Round number (from 0) -> the client learning
      rate, as TFF's `build_weighted_fed_avg_with_optimizer_schedule`.

  Returns:
    A `tff.learning.templates.ClientWorkProcess`;
    with `dataset_computation`, a `tff.templates.MeasuredProcess` of the
    same form whose client data are keys (a `ClientWorkProcess` takes only
    data sets).
  """
  regularizers = tuple(regularizers)
  if regularizers_lib.needs_client_state(regularizers):
    raise ValueError(
      "A regularizer reads the client's previous model or keeps client "
      'state, which needs per-client state: use '
      'tff_methods.templates.stateful.build_stateful_client_work (or '
      'tff_methods.templates.processes.build_local_training_process, '
      'which picks).'
    )
  has_broadcast = regularizers_lib.keeps_server_state(regularizers)
  if received_type is None:
    received_type = model_lib.weights_type(keras_model_fn)
  data_type = tff.SequenceType(tff.types.tensorflow_to_type(element_spec))
  client_batches = client_data.ClientBatches(dataset_computation, data_type)
  hparams = client_hparams.ClientHparams(optimizer, client_learning_rate_fn)

  # The client's data (its key) last: as TFF's client works take their
  # data, and as the benchmark's client profile finds the key.
  @tff.tensorflow.computation(
    received_type, hparams.hparams_type, client_batches.client_data_type
  )
  def client_update_computation(received, optimizer_hparams, client_data):
    initial_weights, broadcast = distributors.split_received(
      received, has_broadcast
    )
    client_update = local_training.build_client_update_fn(
      keras_model_fn,
      hparams.optimizer,
      regularizers,
      client_weighting,
      loss_fn,
    )
    result, sums, _ = client_update(
      initial_weights,
      client_batches(client_data),
      broadcast=broadcast,
      optimizer_hparams=optimizer_hparams,
    )
    return result, aggregation.unfinalized_train_metrics(sums)

  return client_work(
    hparams,
    client_update_computation,
    metrics_aggregator,
    keyed=dataset_computation is not None,
  )


def client_work(
  hparams: client_hparams.ClientHparams,
  client_computation: tff.Computation,
  metrics_aggregator: Optional[aggregation.MetricsAggregator] = None,
  keyed: bool = False,
  more_measurements: Optional[Callable[..., dict]] = None,
) -> tff.templates.MeasuredProcess:
  """The client work around one client's computation, with or without
  client state: the round's optimizer hyperparameters to every client,
  `client_computation` on each, their metrics aggregated.

  Args:
    hparams: The client optimizer's hyperparameters as the work's state.
    client_computation: `(received, optimizer hparams, client data) ->
      (client output, unfinalized train metrics, *more)`.
    metrics_aggregator: TFF's metrics aggregator;
      `tff.learning.metrics.sum_then_finalize` by default.
    keyed: Whether the client data are keys (a `composers.KeyedClientWork`)
      rather than data sets (TFF's `ClientWorkProcess`).
    more_measurements: `(*more at CLIENTS) -> {name: value at SERVER}`,
      measured beside `train` (the stateful work's state-file counts).
  """
  received_type, _, client_data_type = (
    client_computation.type_signature.parameter
  )
  aggregate_metrics = aggregation.build_metrics_aggregation(
    metrics_aggregator, client_computation.type_signature.result[1]
  )

  @tff.federated_computation(
    hparams.init_fn.type_signature.result,
    tff.FederatedType(received_type, tff.CLIENTS),
    tff.FederatedType(client_data_type, tff.CLIENTS),
  )
  def next_fn(state, received, client_data):
    at_clients, new_state, measurements = hparams.round_values(state)
    client_output, unfinalized, *more = tff.federated_map(
      client_computation, (received, at_clients, client_data)
    )
    if more_measurements is not None:
      measurements = dict(more_measurements(*more), **measurements)
    return tff.templates.MeasuredProcessOutput(
      new_state,
      client_output,
      aggregate_metrics(unfinalized, **measurements),
    )

  if keyed:
    return composers.KeyedClientWork(
      hparams.init_fn,
      next_fn,
      hparams.get_hparams_fn,
      hparams.set_hparams_fn,
    )
  return tff.learning.templates.ClientWorkProcess(
    hparams.init_fn,
    next_fn,
    get_hparams_fn=hparams.get_hparams_fn,
    set_hparams_fn=hparams.set_hparams_fn,
  )
