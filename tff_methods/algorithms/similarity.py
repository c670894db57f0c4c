"""Similarity of two layers' representations of the same batch.

Each function takes `x` (B x ...) and `y` (B x ...), the activations of two
models on the same B examples, flattens them to B x D matrices and returns a
scalar, a similarity: higher when the two are more alike. FedCKA's
contrastive loss uses one of them in place of CKA (its Table 3 ablation):

- `linear_cka`: Kornblith et al. (2019) linear CKA, from the B x B Gram
  matrices, `tr(Kc Lc) / (||Kc||_F ||Lc||_F)` with `Kc = Xc Xc^T` for
  column-centred `Xc`. Equal to `||Yc^T Xc||_F^2 / (||Xc^T Xc||_F
  ||Yc^T Yc||_F)` but costs O(B^2 D) instead of O(B D^2).
- `kernel_cka`: CKA with RBF kernels whose bandwidth is `threshold` times the
  median pairwise distance (Kornblith's `gram_rbf`; 0.5 in FedCKA).
- `negated_squared_frobenius` ('frobenius'): the paper's "squared
  Frobenius norm (`||a1 - a2||_F^2`)" read as a similarity, negated (a
  distance in Eq. 2's place would make the loss smallest when the local
  activations are far from the global model's), per element: `-||a1 -
  a2||_F^2 / (B D)`.
- `vectorized_inner_product` ('cosine'): the paper's "vectorized cosine
  similarity (`||vec(a1)|| ||vec(a2)|| cos(theta)`)", the inner product of
  the flattened batches, as written, per element: `<vec a1, vec a2> / (B D)`.
- `cosine_similarity` ('normalized_cosine'): the plain cosine of the two
  flattened batches, in [-1, 1].
- `frobenius_similarity` ('normalized_frobenius'): `||Y^T X||_F^2 /
  (||X||_F^2 ||Y||_F^2)`, uncentred, in [0, 1].

Both of the paper's forms are taken per element (divided by B x D), so
that, like CKA's, their size does not grow with the batch or the layer's
width: one strength `mu` then weighs the M layers alike (FedCKA averages
their losses) whatever the batch size. Unscaled, a 64-example batch of a
layer of 6 x 14 x 14 activations would put a sum of 75,000 terms inside the
log-sum-exp beside a batch-mean cross-entropy. They stay unbounded;
FedCKA's loss takes them through a log-sum-exp, finite for any finite value.
"""

from typing import Callable, Sequence

import tensorflow as tf

_EPSILON = 1e-12


def _flatten(x: tf.Tensor) -> tf.Tensor:
  x = tf.convert_to_tensor(x)
  return tf.reshape(tf.cast(x, tf.float32), [tf.shape(x)[0], -1])


def _center_gram(gram: tf.Tensor) -> tf.Tensor:
  """H K H with H = I - 11^T / n."""
  gram = gram - tf.reduce_mean(gram, axis=0, keepdims=True)
  return gram - tf.reduce_mean(gram, axis=1, keepdims=True)


@tf.custom_gradient
def _gram(x: tf.Tensor) -> tf.Tensor:
  """`X X^T`; its gradient `(S + S^T) X` is one matmul (autodiff takes two)."""

  def gradient(upstream):
    return tf.matmul(upstream + tf.transpose(upstream), x)

  return tf.matmul(x, x, transpose_b=True), gradient


def _cka_from_centered_grams(gram_x: tf.Tensor, gram_y: tf.Tensor) -> tf.Tensor:
  hsic = tf.reduce_sum(gram_x * gram_y)
  norms = tf.norm(gram_x) * tf.norm(gram_y)
  return hsic / (norms + _EPSILON)


def _cka_from_grams(gram_x: tf.Tensor, gram_y: tf.Tensor) -> tf.Tensor:
  return _cka_from_centered_grams(_center_gram(gram_x), _center_gram(gram_y))


def linear_cka(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
  """Linear CKA of two B x ... activations, via B x B Gram matrices."""
  return _cka_from_grams(_gram(_flatten(x)), _gram(_flatten(y)))


def linear_cka_to_each(
  x: tf.Tensor, ys: Sequence[tf.Tensor]
) -> list[tf.Tensor]:
  """`[linear_cka(x, y) for y in ys]`, x's Gram matrix computed once.

  FedCKA takes this, and its gradient, at every local step: the gradient
  with respect to x is written out (`_linear_cka_to_each_flat`) rather
  than left to autodiff.
  """
  flat = [t for y in ys for t in _centered_gram_and_norm(_flatten(y))]
  return list(_linear_cka_to_each_flat(_flatten(x), *flat))


def _centered_gram_and_norm(x: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
  """`(Kc, ||Kc||_F)` of the rows of B x D `x`."""
  gram = _center_gram(_gram(x))
  return gram, tf.norm(gram)


@tf.custom_gradient
def _linear_cka_to_each_flat(x: tf.Tensor, *grams_and_norms: tf.Tensor):
  """Linear CKA of B x D `x` with each (Lc_r, n_r), and its gradient.

  With Kc the centred Gram of x, n_K its norm, h_r = tr(Kc Lc_r) and
  d_r = n_K n_r + eps, CKA_r = h_r / d_r and, holding n_r fixed (its own
  gradient flows through `_centered_gram_and_norm`),

    dCKA_r / dKc = Lc_r / d_r - (h_r n_r / d_r^2) Kc / n_K.

  Kc and Lc_r are doubly centred and symmetric, so this is also the
  gradient with respect to the uncentred K = X X^T, and dX = 2 G X, G the
  upstream-weighted sum: one B x B x D matmul, and a few B x B ops where
  autodiff takes the centring's and norms' gradients and a transpose.
  """
  gram_x, norm_x = _centered_gram_and_norm(x)
  grams, norms = grams_and_norms[0::2], grams_and_norms[1::2]
  hsics = [tf.reduce_sum(gram_x * gram_y) for gram_y in grams]
  denominators = [norm_x * norm_y + _EPSILON for norm_y in norms]
  values = [h / d for h, d in zip(hsics, denominators)]

  def gradient(*upstream):
    # n_K is 0 only when Kc is 0, and the term it divides is then 0 too.
    coefficient_x = tf.add_n(
      [
        u * h * n / d**2
        for u, h, n, d in zip(upstream, hsics, norms, denominators)
      ]
    ) / tf.maximum(norm_x, _EPSILON)
    grad_gram_x = tf.add_n(
      [(u / d) * gram_y for u, d, gram_y in zip(upstream, denominators, grams)]
    )
    # The factor 2 on the B x B side: one B x D product fewer, and the same
    # bits (a power of two scales every term of the product exactly).
    grad_x = tf.matmul(2.0 * (grad_gram_x - coefficient_x * gram_x), x)
    grad_others = []
    for u, h, d in zip(upstream, hsics, denominators):
      grad_others += [(u / d) * gram_x, -u * h * norm_x / d**2]
    return [grad_x] + grad_others

  return tuple(values), gradient


def _median(values: tf.Tensor) -> tf.Tensor:
  """The median of all entries (mean of the two middle ones when even)."""
  flat = tf.sort(tf.reshape(values, [-1]))
  n = tf.size(flat)
  upper = flat[n // 2]
  lower = flat[(n - 1) // 2]
  return 0.5 * (upper + lower)


def _rbf_gram(x: tf.Tensor, threshold: float) -> tf.Tensor:
  dots = tf.matmul(x, x, transpose_b=True)
  squared_norms = tf.linalg.diag_part(dots)
  squared_distances = tf.maximum(
    squared_norms[:, None] + squared_norms[None, :] - 2.0 * dots, 0.0
  )
  squared_median = _median(squared_distances)
  return tf.exp(
    -squared_distances / (2.0 * threshold**2 * squared_median + _EPSILON)
  )


def kernel_cka(x: tf.Tensor, y: tf.Tensor, threshold: float = 0.5) -> tf.Tensor:
  """RBF-kernel CKA; bandwidth `threshold` x the median distance."""
  x, y = _flatten(x), _flatten(y)
  return _cka_from_grams(_rbf_gram(x, threshold), _rbf_gram(y, threshold))


def kernel_cka_to_each(
  x: tf.Tensor, ys: Sequence[tf.Tensor], threshold: float = 0.5
) -> list[tf.Tensor]:
  """`[kernel_cka(x, y) for y in ys]`, with x's kernel computed once."""
  gram_x = _center_gram(_rbf_gram(_flatten(x), threshold))
  return [
    _cka_from_centered_grams(
      gram_x, _center_gram(_rbf_gram(_flatten(y), threshold))
    )
    for y in ys
  ]


def cosine_similarity(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
  """The cosine between the two batches, each flattened to one vector."""
  x, y = tf.reshape(_flatten(x), [-1]), tf.reshape(_flatten(y), [-1])
  return tf.reduce_sum(x * y) / (tf.norm(x) * tf.norm(y) + _EPSILON)


def negated_squared_frobenius(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
  """`-||x - y||_F^2 / (B D)`: FedCKA Table 3's squared Frobenius norm as a
  similarity (0 when equal, lower the further apart), per element."""
  return -tf.reduce_mean(tf.square(_flatten(x) - _flatten(y)))


def vectorized_inner_product(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
  """`<vec x, vec y> / (B D)` = `||vec x|| ||vec y|| cos(theta) / (B D)`
  (FedCKA Table 3's vectorized cosine, per element)."""
  return tf.reduce_mean(_flatten(x) * _flatten(y))


def frobenius_similarity(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
  """`||Y^T X||_F^2 / (||X||_F^2 ||Y||_F^2)`, uncentred, in [0, 1]."""
  x, y = _flatten(x), _flatten(y)
  # ||Y^T X||_F^2 = tr(X X^T Y Y^T): the B x B form again.
  cross = tf.reduce_sum(
    tf.matmul(x, x, transpose_b=True) * tf.matmul(y, y, transpose_b=True)
  )
  return cross / (tf.reduce_sum(x * x) * tf.reduce_sum(y * y) + _EPSILON)


SIMILARITIES: dict[str, Callable[[tf.Tensor, tf.Tensor], tf.Tensor]] = {
  'linear_cka': linear_cka,
  'kernel_cka': kernel_cka,
  'frobenius': negated_squared_frobenius,
  'cosine': vectorized_inner_product,
  'normalized_cosine': cosine_similarity,
  'normalized_frobenius': frobenius_similarity,
}


# One layer against several (FedCKA compares the local layer with the global
# and the previous model's): the shared half of the work done once.
_TO_EACH = {'linear_cka': linear_cka_to_each, 'kernel_cka': kernel_cka_to_each}

SimilarityToEach = Callable[[tf.Tensor, Sequence[tf.Tensor]], list[tf.Tensor]]


def get_similarity(name: str) -> Callable[[tf.Tensor, tf.Tensor], tf.Tensor]:
  if name not in SIMILARITIES:
    raise ValueError(
      f'Unknown similarity {name!r}; choose one of '
      f'{", ".join(SIMILARITIES)}.'
    )
  return SIMILARITIES[name]


def get_similarity_to_each(name: str) -> SimilarityToEach:
  """`(x, ys) -> [similarity(x, y) for y in ys]` for similarity `name`."""
  similarity = get_similarity(name)
  return _TO_EACH.get(name, lambda x, ys: [similarity(x, y) for y in ys])
