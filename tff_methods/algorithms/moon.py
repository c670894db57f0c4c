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
from typing import Sequence
import zlib

import numpy as np
import tensorflow as tf

from tff_methods.algorithms import method_spec
from tff_methods.clients import client_states as client_states_lib
from tff_methods.templates import model_lib
from tff_methods.templates import reference_outputs
from tff_methods.templates import regularizers

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
  term=ModelContrastiveTerm,
)

# The public builder: TFF's builder arguments and the settings its term
# takes; what the registry and the binaries build.
build_moon = method_spec.builder(METHOD)
