"""MOON (Li, He and Song, CVPR 2021): model-contrastive federated learning.

Paper: Li, He and Song, "Model-Contrastive Federated Learning", CVPR 2021.
https://arxiv.org/abs/2103.16257

Local objective, with `z`, `z_glob`, `z_prev` the projection-head outputs of
the local model, the round's global model and the client's previous local
model on the same example (the last two in inference mode, no gradient):

  l_con = -log( exp(cos(z, z_glob) / tau)
                / (exp(cos(z, z_glob) / tau) + exp(cos(z, z_prev) / tau)) ),
  loss = CE + mu * mean over the batch of l_con.

In the first round there is no previous model and, as in the reference
code, the term is 0. A client that first takes part in a later round has
no previous model either: by default its term is 0 too (the paper's
reading); `write_own_initial_models` contrasts it against its own
randomly initialised model, as the MOON repo does (every party has its own
initialisation, and the pool of previous models holds every party's net).
Needs per-client state (the previous model).

Server rule: FedAvg's example-weighted mean of the updates.
"""

import collections
import dataclasses
from typing import Any, Callable, Optional, Sequence
import zlib

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_methods import aggregation
from tff_methods import client_states as client_states_lib
from tff_methods import local_training
from tff_methods import method_spec
from tff_methods import model_lib
from tff_methods import processes
from tff_methods import reference_outputs
from tff_methods import regularizers
from tff_methods import stateful

# The strength the project uses when none is given (the paper: 1 for
# CIFAR-100 and Tiny-ImageNet, 5 for CIFAR-10).
DEFAULT_MU = 1.0


def _cosine(a: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
  """Row-wise cosine similarity of two B x D matrices."""
  a = tf.math.l2_normalize(tf.reshape(a, [tf.shape(a)[0], -1]), axis=1)
  b = tf.math.l2_normalize(tf.reshape(b, [tf.shape(b)[0], -1]), axis=1)
  return tf.reduce_sum(a * b, axis=1)


def contrastive_loss(
  z: tf.Tensor, z_global: tf.Tensor, z_prev: tf.Tensor, temperature: float = 0.5
) -> tf.Tensor:
  """The batch mean of MOON's model-contrastive loss (no strength)."""
  logits = (
    tf.stack([_cosine(z, z_global), _cosine(z, z_prev)], axis=1) / temperature
  )
  # -log softmax(logits)[0]: the global model's projection is the positive.
  return tf.reduce_mean(tf.reduce_logsumexp(logits, axis=1) - logits[:, 0])


class ModelContrastiveTerm(regularizers.Regularizer):
  """`mu * l_con` on the projection `z`; 0 without a previous model."""

  name = 'moon'
  display_name = 'MOON'
  outputs = ('z',)
  global_outputs = ('z',)
  previous_outputs = ('z',)

  def __init__(self, mu: float, temperature: float = 0.5):
    self.mu = regularizers.check_strength('MOON mu', mu)
    if not temperature > 0:
      raise ValueError(f'MOON temperature must be > 0, got {temperature!r}.')
    self.temperature = float(temperature)

  def __call__(self, step: regularizers.LocalStep) -> tf.Tensor:
    term = contrastive_loss(
      step.outputs['z'],
      step.global_outputs['z'],
      step.previous_outputs['z'],
      self.temperature,
    )
    return self.mu * tf.cast(step.has_previous, tf.float32) * term


FIRST_ROUNDS = ('skip', 'initial_model')


def write_own_initial_models(
  client_states: client_states_lib.ClientStateFiles,
  client_ids: Sequence[str],
  keras_model_fn: model_lib.KerasModelFn,
  seed: int,
) -> None:
  """Gives each client its own initial model as its previous model.

  The MOON repo's reading: every party has its own randomly initialised net,
  and a party that first takes part after the first round is contrasted
  against it. Written as each client's version 0, which clients read from
  the second round on (`client_states.OWN_INITIAL_VERSION`); the
  initialisation is seeded by (seed, client id), so reruns repeat it.
  Clients that already have one keep it (a resumed run).
  """
  own_initial = client_states_lib.OWN_INITIAL_VERSION
  # A client keeps the layers MOON reads of its previous model, up to z.
  kept = reference_outputs.kept_weights(keras_model_fn, ('z',))
  for client_id in client_ids:
    if own_initial in client_states.versions(client_id):
      continue
    client_seed = zlib.crc32(f'{seed}/{client_id}'.encode())
    client_states.put(
      client_id,
      collections.OrderedDict(
        has_previous=np.int32(1),
        model=kept(model_lib.initial_weights(keras_model_fn, client_seed)),
      ),
      own_initial,
    )


def build_moon(
  keras_model_fn: model_lib.KerasModelFn,
  element_spec: Any,
  *,
  dataset_computation: tff.Computation,
  client_optimizer_fn: tff.learning.optimizers.Optimizer,
  mu: float = DEFAULT_MU,
  temperature: float = 0.5,
  server_optimizer_fn: Optional[tff.learning.optimizers.Optimizer] = None,
  client_state_dir: Optional[str] = None,
  base_regularizers: Sequence[regularizers.Regularizer] = (),
  model_aggregator: Optional[aggregation.ModelAggregator] = None,
  metrics_aggregator: Optional[aggregation.MetricsAggregator] = None,
  client_weighting: Optional[aggregation.ClientWeighting] = None,
  loss_fn: Optional[local_training.LossFn] = None,
  client_learning_rate_fn: Optional[Callable[[Any], Any]] = None,
) -> stateful.StatefulClientsLearningProcess:
  """Builds MOON as a stateful-client learning process.

  Args:
    keras_model_fn: Builds a Keras model: one of `tff_methods_tasks.models`, a
      user's single-output model (taken as the logits), or one whose layers
      `model_lib.named_outputs` names; MOON reads its projection output `z`
      (`fedcka_cnn`, or a ResNet with `projection_dim`).
    element_spec: The spec of one batch of client data.
    dataset_computation: A client's `[client id, round]` key -> its
      batches (`tff_methods_tasks.datasets.round_dataset_computation`), or TFF's
      client-id form: a batched `ClientData` or its `dataset_computation`
      (`client_data.key_dataset_computation`).
    client_optimizer_fn: The client optimizer.
    mu: The contrastive strength, >= 0; 0 is FedAvg.
    temperature: tau, 0.5 by default as in the paper.
    server_optimizer_fn: SGD with learning rate 1 by default.
    client_state_dir: Where the clients' state files live; a temporary
      directory by default, which a resumed program can't use (`next`
      refuses to start past round 1 with it).
    base_regularizers: Other methods' terms to add (a combination).
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

  Returns:
    A `tff.learning.templates.LearningProcess` whose `next` takes the
    clients' `(client_id, round_num)` keys. A client first taking part
    after the first round has no previous model and no term (the paper's
    reading); `write_own_initial_models` gives the MOON repo's.
  """
  return processes.build_local_training_process(
    keras_model_fn,
    element_spec,
    client_optimizer_fn,
    server_optimizer_fn,
    list(base_regularizers) + [ModelContrastiveTerm(mu, temperature)],
    dataset_computation=dataset_computation,
    client_state_dir=client_state_dir,
    model_aggregator=model_aggregator,
    metrics_aggregator=metrics_aggregator,
    client_weighting=client_weighting,
    loss_fn=loss_fn,
    client_learning_rate_fn=client_learning_rate_fn,
  )


@dataclasses.dataclass(frozen=True)
class Settings:
  """MOON's settings (flags `--moon_<name>`)."""

  mu: float = method_spec.setting(
    DEFAULT_MU, 'The model-contrastive strength.', minimum=0.0
  )
  temperature: float = method_spec.setting(
    0.5, 'The contrastive temperature tau.', above=0.0
  )
  first_round: str = method_spec.setting(
    'skip',
    'A client first taking part after round 1 skips the term (skip, the '
    'paper) or contrasts against its own initial model (initial_model, '
    'the MOON repo).',
    choices=FIRST_ROUNDS,
  )


def _prepare_clients(settings, process, client_ids, keras_model_fn, seed):
  if settings.first_round == 'initial_model':
    write_own_initial_models(
      process.client_states, client_ids, keras_model_fn, seed
    )


METHOD = method_spec.MethodSpec(
  name='moon',
  display_name='MOON',
  settings=Settings,
  prepare_clients=_prepare_clients,
  term=lambda settings: ModelContrastiveTerm(settings.mu, settings.temperature),
)
