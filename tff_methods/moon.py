"""MOON (Li, He and Song, CVPR 2021): model-contrastive federated learning.

Local objective, with `z`, `z_glob`, `z_prev` the projection-head outputs of
the local model, the round's global model and the client's previous local
model on the same example (the last two in inference mode, no gradient):

  l_con = -log( exp(cos(z, z_glob) / tau)
                / (exp(cos(z, z_glob) / tau) + exp(cos(z, z_prev) / tau)) ),
  loss = CE + mu * mean over the batch of l_con.

In the first round there is no previous model and, as in the reference
code, the term is 0. A client that first takes part in a later round has
no previous model either: by default its term is 0 too (the paper's
reading); `first_round='initial_model'` contrasts it against its own
randomly initialised model, as the MOON repo does (every party has its own
initialisation, and the pool of previous models holds every party's net).
Needs per-client state (the previous model).

Server rule: FedAvg's example-weighted mean of the updates.
"""

import collections
import zlib
from typing import Any, Callable, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_methods import model_lib
from tff_methods import regularizers
from tff_methods import stateful


def _cosine(a: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
  """Row-wise cosine similarity of two B x D matrices."""
  a = tf.math.l2_normalize(tf.reshape(a, [tf.shape(a)[0], -1]), axis=1)
  b = tf.math.l2_normalize(tf.reshape(b, [tf.shape(b)[0], -1]), axis=1)
  return tf.reduce_sum(a * b, axis=1)


def contrastive_loss(z: tf.Tensor, z_global: tf.Tensor, z_prev: tf.Tensor,
                     temperature: float = 0.5) -> tf.Tensor:
  """The batch mean of MOON's model-contrastive loss (no strength)."""
  logits = tf.stack([_cosine(z, z_global), _cosine(z, z_prev)],
                    axis=1) / temperature
  # -log softmax(logits)[0]: the global model's projection is the positive.
  return tf.reduce_mean(tf.reduce_logsumexp(logits, axis=1) - logits[:, 0])


class ModelContrastiveTerm(regularizers.Regularizer):
  """`mu * l_con` on the projection `z`; 0 without a previous model."""

  name = 'moon'
  global_outputs = ('z',)
  previous_outputs = ('z',)

  def __init__(self, mu: float, temperature: float = 0.5):
    self.mu = regularizers.check_strength('MOON mu', mu)
    if not temperature > 0:
      raise ValueError(f'MOON temperature must be > 0, got {temperature!r}.')
    self.temperature = float(temperature)

  def __call__(self, step: regularizers.LocalStep) -> tf.Tensor:
    term = contrastive_loss(step.outputs['z'], step.global_outputs['z'],
                            step.previous_outputs['z'], self.temperature)
    return self.mu * tf.cast(step.has_previous, tf.float32) * term


FIRST_ROUNDS = ('skip', 'initial_model')


def own_initial_model_state_fn(keras_model_fn: model_lib.KerasModelFn,
                               seed: int) -> Callable[[str], Any]:
  """client id -> a state whose previous model is the client's own init.

  The MOON repo gives every party its own randomly initialised net; here
  the initialisation is seeded by (seed, client id), so reruns repeat it.
  """

  def state_of(client_id: str):
    client_seed = zlib.crc32(f'{seed}/{client_id}'.encode())
    return collections.OrderedDict(
        has_previous=np.int32(1),
        model=model_lib.initial_weights(keras_model_fn, client_seed))

  return state_of


def build_moon(
    keras_model_fn: model_lib.KerasModelFn,
    element_spec: Any,
    dataset_computation: tff.Computation,
    client_optimizer: tff.learning.optimizers.Optimizer,
    mu: float,
    temperature: float = 0.5,
    server_optimizer: Optional[tff.learning.optimizers.Optimizer] = None,
    client_state_dir: Optional[str] = None,
    *,
    first_round: str = 'skip',
    seed: int = 0,
) -> stateful.StatefulLearningProcess:
  """Builds MOON as a stateful-client learning process.

  Args:
    keras_model_fn: Builds a model with a projection output `z`
      (`fedcka_cnn`, or a ResNet with `projection_dim`).
    element_spec: The spec of one batch of client data.
    dataset_computation: Client id -> that client's preprocessed dataset.
    client_optimizer: The client optimizer.
    mu: The contrastive strength, >= 0; 0 is FedAvg.
    temperature: tau, 0.5 by default as in the paper.
    server_optimizer: SGD with learning rate 1 by default.
    client_state_dir: Keep the previous models in files here
      (default: a temporary directory).
    first_round: A client first taking part after the first round: 'skip'
      its term (default) or contrast it against its own 'initial_model'
      (the MOON repo).
    seed: Seeds the clients' own initial models.
  """
  return stateful.build_stateful_local_training_process(
      keras_model_fn, element_spec, dataset_computation, client_optimizer,
      server_optimizer, [ModelContrastiveTerm(mu, temperature)],
      client_state_dir,
      late_client_state_fn=late_client_state_fn(first_round, keras_model_fn,
                                                seed))


def late_client_state_fn(first_round: str,
                         keras_model_fn: model_lib.KerasModelFn, seed: int
                         ) -> Optional[Callable[[str], Any]]:
  """The `late_client_state_fn` of MOON's `first_round` setting."""
  if first_round not in FIRST_ROUNDS:
    raise ValueError(f'Unknown MOON first_round {first_round!r}; choose one '
                     f'of {", ".join(FIRST_ROUNDS)}.')
  if first_round == 'skip':
    return None
  return own_initial_model_state_fn(keras_model_fn, seed)
