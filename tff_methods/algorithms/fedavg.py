"""FedAvg and the FedOpt family, and TFF's own FedAvg to check them against.

Papers:
  McMahan et al., "Communication-Efficient Learning of Deep Networks from
  Decentralized Data", AISTATS 2017. https://arxiv.org/abs/1602.05629
  Hsu, Qi and Brown, "Measuring the Effects of Non-Identical Data
  Distribution for Federated Visual Classification", arXiv 2019 (FedAvgM).
  https://arxiv.org/abs/1909.06335
  Reddi et al., "Adaptive Federated Optimization", ICLR 2021 (FedAdam,
  FedYogi). https://arxiv.org/abs/2003.00295

Local objective: cross-entropy, plain local training from the global model.
Server rule: the example-weighted mean of client updates, applied by a server
optimizer: SGD with learning rate 1 (FedAvg), SGD with momentum (FedAvgM),
Adam (FedAdam) or Yogi (FedYogi), as in Reddi et al. (2021).

- `build_fedavg`: the project's FedAvg, the shared local-training loop of
  every other method with no regularizer (`local_training`). It computes
  what TFF's builder computes (same weights and metrics, tested) in about
  half the time (the client's batches are read into memory before training
  instead of training inside `Dataset.reduce`; README, "Benchmark"), so a
  method's ratio to it is what its regularizer costs.
- `build_tff_fedavg`: `tff.learning.algorithms.build_weighted_fed_avg`
  itself (method `tff_fedavg`), TFF's baseline as TFF ships it.
"""

import functools
from typing import Any, Callable, Optional

import tensorflow_federated as tff

from tff_methods.algorithms import method_spec
from tff_methods.templates import aggregation
from tff_methods.templates import model_lib
from tff_methods.templates import tff_models


def build_tff_fedavg(
  keras_model_fn: model_lib.KerasModelFn,
  element_spec: Any,
  *,
  client_optimizer_fn: tff.learning.optimizers.Optimizer,
  server_optimizer_fn: Optional[tff.learning.optimizers.Optimizer] = None,
  model_aggregator: Optional[aggregation.ModelAggregator] = None,
  metrics_aggregator: Optional[aggregation.MetricsAggregator] = None,
  client_weighting: Optional[aggregation.ClientWeighting] = None,
  tff_model_fn: Optional[
    Callable[[], tff.learning.models.VariableModel]
  ] = None,
) -> tff.learning.templates.LearningProcess:
  """TFF's `build_weighted_fed_avg` on a Keras model (its `logits`).

  Args:
    keras_model_fn: Builds a Keras model: one of `tff_methods_tasks.models`, a
      user's single-output model (taken as the logits), or one whose layers
      `model_lib.named_outputs` names.
    element_spec: The spec of one batch of client data.
    client_optimizer_fn: The client optimizer.
    server_optimizer_fn: SGD with learning rate 1 (plain FedAvg) by default.
    model_aggregator: As TFF's builders take it; an unweighted factory
      gives TFF's `build_unweighted_fed_avg`.
    metrics_aggregator: As TFF's builders take it.
    client_weighting: As TFF's builders take it (NUM_EXAMPLES by default),
      or `aggregation.NumTokens()`, through a model that reports its tokens
      as its examples (`tff_models.TokensAsExamples`).
    tff_model_fn: A `VariableModel` to train instead of the Keras model's
      logits with cross-entropy: a TFF baseline task's own
      (`tff_methods_tasks.tff_baselines`), with its loss and metrics.
  """
  factory, client_weighting = aggregation.model_aggregation(
    model_aggregator, client_weighting
  )
  tff_model_fn = tff_model_fn or model_lib.tff_model_fn(
    keras_model_fn, element_spec
  )
  if isinstance(client_weighting, aggregation.NumTokens):
    # TFF's builder weighs by the examples its model reports.
    tff_model_fn = functools.partial(
      _tokens_as_examples, tff_model_fn, client_weighting.pad_token
    )
    client_weighting = tff.learning.ClientWeighting.NUM_EXAMPLES
  return tff.learning.algorithms.build_weighted_fed_avg(
    tff_model_fn,
    client_optimizer_fn=client_optimizer_fn,
    server_optimizer_fn=(
      server_optimizer_fn or tff.learning.optimizers.build_sgdm(1.0)
    ),
    client_weighting=client_weighting,
    model_aggregator=factory,
    metrics_aggregator=metrics_aggregator,
  )


def _tokens_as_examples(tff_model_fn, pad_token):
  return tff_models.TokensAsExamples(tff_model_fn(), pad_token)


# The project's FedAvg and FedOpt: the shared loop with a server rule.
FEDAVG = method_spec.MethodSpec(
  name='fedavg', display_name='FedAvg', server_optimizer='sgd'
)
FEDAVGM = method_spec.MethodSpec(
  name='fedavgm', display_name='FedAvgM', server_optimizer='sgdm'
)
FEDADAM = method_spec.MethodSpec(
  name='fedadam', display_name='FedAdam', server_optimizer='adam'
)
FEDYOGI = method_spec.MethodSpec(
  name='fedyogi', display_name='FedYogi', server_optimizer='yogi'
)

# The project's FedAvg: the shared loop with no term. Its
# `server_optimizer_fn` gives FedAvgM, FedAdam or FedYogi
# (`optimizers.build_server_optimizer`).
build_fedavg = method_spec.builder(FEDAVG)


def _tff_algorithm(server_rule):
  """TFF's `build_weighted_fed_avg` with `server_rule`, from the run's
  hyperparameters."""

  def build(
    keras_model_fn,
    element_spec,
    hparams,
    *,
    dataset_computation=None,
    loss_fn=None,
    tff_model_fn=None,
  ):
    del loss_fn  # TFF's model brings its loss.
    process = build_tff_fedavg(
      keras_model_fn,
      element_spec,
      client_optimizer_fn=hparams.client_optimizer(),
      server_optimizer_fn=hparams.server_optimizer(server_rule),
      model_aggregator=hparams.model_aggregator(),
      client_weighting=hparams.weighting(),
      tff_model_fn=tff_model_fn,
    )
    if dataset_computation is None:
      return process
    # As a TFF user composes it: one computation makes the batches and
    # passes them to the client's.
    return tff.simulation.compose_dataset_computation_with_learning_process(
      dataset_computation, process
    )

  return build


# TFF's own algorithms, with the server rules of the four above, to compare
# with TFF's baselines literally.
TFF_ALGORITHMS = tuple(
  method_spec.MethodSpec(
    name=f'tff_{spec.name}',
    display_name=f'TFF {spec.display_name}',
    build=_tff_algorithm(spec.server_optimizer),
  )
  for spec in (FEDAVG, FEDAVGM, FEDADAM, FEDYOGI)
)
