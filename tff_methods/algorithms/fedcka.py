"""FedCKA (Son et al., 2022): contrastive regularization of the first layers.

Paper: Son, Kim and Chung, "Comparisons Where It Matters: Using Layer-Wise
Regularization to Improve Federated Learning on Heterogeneous Data",
Applied Sciences 12(19):9943, 2022. https://doi.org/10.3390/app12199943

Local objective, with `a_n`, `a_glob_n`, `a_prev_n` the activations of the
n-th regularized layer (the first M layers, nearest the input) of the local
model, the round's global model and the client's previous local model on
the same batch, each flattened to B x D:

  l_cka = (1/M) sum_n -log( e^{s(a_n, a_glob_n)}
                            / (e^{s(a_n, a_glob_n)} + e^{s(a_n, a_prev_n)}) ),
  loss = CE + mu * l_cka,

with `s` linear CKA by default (no temperature). Only the first M layers of
the global and previous models are computed, never their full forward pass
(the paper's efficiency claim, Table 4). In a client's first round there is
no previous model, so the term is 0 (as in MOON). Needs per-client state.

Server rule: FedAvg's example-weighted mean of the updates.
"""

import dataclasses
from typing import Sequence

import tensorflow as tf

from tff_methods.algorithms import method_spec
from tff_methods.algorithms import similarity as similarity_lib
from tff_methods.templates import regularizers

# The strength the project uses when none is given (the paper tunes 3, 5
# and 10 per data set).
DEFAULT_MU = 3.0


def cka_contrastive_loss(
  activations: Sequence[tf.Tensor],
  activations_global: Sequence[tf.Tensor],
  activations_prev: Sequence[tf.Tensor],
  similarity_to_each: similarity_lib.SimilarityToEach = (
    similarity_lib.linear_cka_to_each
  ),
) -> tf.Tensor:
  """FedCKA's loss averaged over the M regularized layers (no strength)."""
  losses = []
  for a, a_global, a_prev in zip(
    activations, activations_global, activations_prev
  ):
    logits = tf.stack(similarity_to_each(a, [a_global, a_prev]))
    losses.append(tf.reduce_logsumexp(logits) - logits[0])
  return tf.add_n(losses) / len(losses)


class CKAContrastiveTerm(regularizers.Regularizer):
  """`mu * l_cka` on layers `layer_1`..`layer_M`; 0 without a previous model."""

  name = 'fedcka'
  display_name = 'FedCKA'

  def __init__(
    self, mu: float, layers: int = 2, similarity: str = 'linear_cka'
  ):
    self.mu = regularizers.check_strength('FedCKA mu', mu)
    if not isinstance(layers, int) or layers < 1:
      raise ValueError(f'FedCKA layers must be an int >= 1, got {layers!r}.')
    self.layers = layers
    self.similarity = similarity
    self.similarity_to_each = similarity_lib.get_similarity_to_each(similarity)
    # The model outputs it reads: `layer_1` .. `layer_M`.
    self.outputs = tuple(f'layer_{n + 1}' for n in range(layers))
    self.global_outputs = self.outputs
    self.previous_outputs = self.outputs

  def __call__(self, step: regularizers.LocalStep) -> tf.Tensor:
    term = cka_contrastive_loss(
      [step.outputs[k] for k in self.outputs],
      [step.global_outputs[k] for k in self.outputs],
      [step.previous_outputs[k] for k in self.outputs],
      self.similarity_to_each,
    )
    return self.mu * tf.cast(step.has_previous, tf.float32) * term


@dataclasses.dataclass(frozen=True)
class Settings:
  """FedCKA's settings (flags `--fedcka_<name>`)."""

  mu: float = method_spec.setting(
    DEFAULT_MU, 'The contrastive strength.', minimum=0.0
  )
  layers: int = method_spec.setting(
    2,
    "M: the first M layers regularized (at most the model's: 7 on the "
    'FedCKA CNN).',
    minimum=1,
  )
  similarity: str = method_spec.setting(
    'linear_cka',
    "How two layers' activations are compared: linear_cka, kernel_cka, "
    'frobenius (-||a1 - a2||^2), cosine (the inner product), '
    'normalized_cosine or normalized_frobenius.',
    choices=tuple(similarity_lib.SIMILARITIES),
  )


METHOD = method_spec.MethodSpec(
  name='fedcka',
  display_name='FedCKA',
  settings=Settings,
  term=CKAContrastiveTerm,
)

# The public builder: TFF's builder arguments and the settings its term
# takes; what the registry and the binaries build.
build_fedcka = method_spec.builder(METHOD)
