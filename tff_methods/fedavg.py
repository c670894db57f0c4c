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

from typing import Any

import tensorflow_federated as tff

from tff_methods import local_training
from tff_methods import model_lib


def build_fedavg(
    keras_model_fn: model_lib.KerasModelFn,
    element_spec: Any,
    *,
    client_optimizer: tff.learning.optimizers.Optimizer,
    server_optimizer: tff.learning.optimizers.Optimizer | None = None,
    dataset_computation: tff.Computation | None = None,
) -> tff.learning.templates.LearningProcess:
  """FedAvg / FedAvgM / FedAdam / FedYogi through the project's loop.

  Args:
    keras_model_fn: Builds one of the project's multi-output Keras models.
    element_spec: The spec of one batch of client data.
    client_optimizer: The client optimizer.
    server_optimizer: `optimizers.build_server_optimizer(...)`; SGD with
      learning rate 1 (plain FedAvg) by default.
    dataset_computation: A client's key -> its batches (`tasks.datasets.
      round_dataset_computation`); when given, `next` takes the clients'
      keys and each client makes its batches in its own computation.
  """
  return local_training.build_local_training_process(
      keras_model_fn, element_spec, client_optimizer, server_optimizer,
      dataset_computation=dataset_computation)


def build_tff_fedavg(
    keras_model_fn: model_lib.KerasModelFn,
    element_spec: Any,
    *,
    client_optimizer: tff.learning.optimizers.Optimizer,
    server_optimizer: tff.learning.optimizers.Optimizer | None = None,
) -> tff.learning.templates.LearningProcess:
  """TFF's `build_weighted_fed_avg` on one of the project's models.

  Args:
    keras_model_fn: Builds one of the project's multi-output Keras models;
      TFF sees its `logits` output.
    element_spec: The spec of one batch of client data.
    client_optimizer: The client optimizer.
    server_optimizer: SGD with learning rate 1 (plain FedAvg) by default.
  """
  return tff.learning.algorithms.build_weighted_fed_avg(
      model_lib.tff_model_fn(keras_model_fn, element_spec),
      client_optimizer_fn=client_optimizer,
      server_optimizer_fn=(server_optimizer or
                           tff.learning.optimizers.build_sgdm(1.0)))
