"""The shared local-training loop as a learning process: one builder.

Laid out as TFF's `learning/templates` and `build_weighted_fed_avg`: the
client update (`local_training.build_client_update_fn`), run by one of two
client works, the distributor, aggregator and finalizer around it
(`composers.set_up_loop`), and the composer (`composers.compose_loop`).
The client work follows from the terms: clients without state train as
`client_works.build_local_training_client_work`; when a term reads the
client's previous model or keeps client state (MOON, FedCKA, SCAFFOLD),
as `stateful.build_stateful_client_work`, whose clients are keys and keep
their state in files. Every method of the shared loop, alone or combined,
is this builder with its terms and server rule; with no terms and TFF's
SGD it computes what `tff.learning.algorithms.build_weighted_fed_avg`
does.
"""

from typing import Any, Optional, Sequence

import tensorflow_federated as tff

from tff_methods.templates import aggregation
from tff_methods.templates import client_hparams
from tff_methods.templates import client_works
from tff_methods.templates import composers
from tff_methods.templates import local_training
from tff_methods.templates import model_lib
from tff_methods.templates import regularizers as regularizers_lib
from tff_methods.templates import stateful


def build_local_training_process(
  keras_model_fn: model_lib.KerasModelFn,
  element_spec: Any,
  client_optimizer_fn: tff.learning.optimizers.Optimizer,
  server_optimizer_fn: Optional[tff.learning.optimizers.Optimizer] = None,
  regularizers: Sequence[regularizers_lib.Regularizer] = (),
  model_aggregator: Optional[aggregation.ModelAggregator] = None,
  client_weighting: Optional[aggregation.ClientWeighting] = None,
  loss_fn: Optional[local_training.LossFn] = None,
  dataset_computation: Optional[tff.Computation] = None,
  metrics_aggregator: Optional[aggregation.MetricsAggregator] = None,
  client_learning_rate_fn: Optional[client_hparams.LearningRateFn] = None,
  client_state_dir: Optional[str] = None,
  client_states_in_memory: bool = False,
) -> tff.learning.templates.LearningProcess:
  """A `LearningProcess`: local training with `regularizers`, then FedOpt.

  Args:
    keras_model_fn: Builds a Keras model: the contract's (`model_lib`), or
      one with a single output, taken as the logits.
    element_spec: The spec of one batch of client data.
    client_optimizer_fn: The client optimizer (TFF's builders' name).
    server_optimizer_fn: Applied to the averaged update; SGD with learning rate
      1.0 (plain averaging) by default.
    regularizers: Terms added to every client's local objective.
    model_aggregator: A weighted or unweighted aggregation factory
      (`aggregation.model_aggregation`); `tff.aggregators.MeanFactory()` by
      default.
    client_weighting: How client updates are weighted; None for
      NUM_EXAMPLES (UNIFORM with an unweighted factory).
    loss_fn: The data term; cross-entropy by default.
    dataset_computation: A client's key -> its batches
      (`tff_methods_tasks.datasets.round_dataset_computation`), or a batched
      TFF `ClientData`. When given, `next` takes the clients' keys, and each
      client makes its batches in its own computation (`ClientBatches`);
      clients that keep state need it, and keys naming the round.
    metrics_aggregator: TFF's metrics aggregator;
      `tff.learning.metrics.sum_then_finalize` by default.
    client_learning_rate_fn: Round number (from 0) -> the client learning
      rate, as TFF's `build_weighted_fed_avg_with_optimizer_schedule`;
      None for the client optimizer's own (`get_hparams`/`set_hparams`
      read and set it).
    client_state_dir: For clients that keep state: where their state files
      live (default: a temporary directory, which a resumed program can't
      use).
    client_states_in_memory: For clients that keep state: keep them in
      this Python process, written to `client_state_dir` at each
      checkpoint (for a process run in this process, by
      `execution.in_process`); else they are read and written there.

  Returns:
    A `tff.learning.templates.LearningProcess`; for clients that keep state
    a `stateful.StatefulClientsLearningProcess`, whose `client_states` are
    the state files and whose `next` takes `[client id, round]` keys.

  Raises:
    ValueError: clients that keep state without a `dataset_computation`.
  """
  regularizers = tuple(regularizers)
  keeps_state = regularizers_lib.needs_client_state(regularizers)
  if keeps_state and dataset_computation is None:
    raise ValueError(
      f'{", ".join(r.display_name for r in regularizers)}: a term keeps '
      'per-client state, so its clients are keys: give a '
      'dataset_computation (a client key -> its batches).'
    )
  setup = composers.set_up_loop(
    keras_model_fn,
    element_spec,
    server_optimizer_fn,
    regularizers,
    model_aggregator,
    client_weighting,
    loss_fn,
  )
  if keeps_state:
    work = stateful.build_stateful_client_work(
      setup,
      element_spec,
      dataset_computation,
      client_optimizer_fn,
      regularizers,
      client_state_dir,
      client_states_in_memory=client_states_in_memory,
      metrics_aggregator=metrics_aggregator,
      client_learning_rate_fn=client_learning_rate_fn,
    )
  else:
    work = composers.LoopClientWork(
      client_works.build_local_training_client_work(
        setup.keras_model_fn,
        element_spec,
        client_optimizer_fn,
        regularizers,
        setup.client_weighting,
        received_type=setup.received_type,
        loss_fn=setup.loss_fn,
        dataset_computation=dataset_computation,
        metrics_aggregator=metrics_aggregator,
        client_learning_rate_fn=client_learning_rate_fn,
      )
    )
  return composers.compose_loop(setup, work)
