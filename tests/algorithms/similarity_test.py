"""Tests for tff_methods.algorithms.similarity."""

import sys

import numpy as np
import pytest
import tensorflow as tf

from tff_methods.algorithms import fedcka
from tff_methods.algorithms import similarity

RNG = np.random.default_rng(0)
X = RNG.normal(size=(12, 7)).astype(np.float32)
Y = (X @ RNG.normal(size=(7, 5)) + 0.5 * RNG.normal(size=(12, 5))).astype(
  np.float32
)


def _feature_space_linear_cka(x, y):
  x = x - x.mean(0)
  y = y - y.mean(0)
  return np.linalg.norm(y.T @ x) ** 2 / (
    np.linalg.norm(x.T @ x) * np.linalg.norm(y.T @ y)
  )


def test_linear_cka_of_identical_inputs_is_one():
  assert np.isclose(similarity.linear_cka(X, X).numpy(), 1.0, atol=1e-6)


def test_linear_cka_equals_the_feature_space_formula():
  assert np.isclose(
    similarity.linear_cka(X, Y).numpy(),
    _feature_space_linear_cka(X, Y),
    rtol=1e-5,
  )
  hand_x = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], np.float32)
  hand_y = np.array([[2.0], [0.0], [1.0]], np.float32)
  # Centred: x -> [[1/3,-2/3],[-2/3,1/3],[1/3,1/3]], y -> [[1],[-1],[0]];
  # Y^T X = [1, -1] -> 2; X^T X = [[2/3,-1/3],[-1/3,2/3]] -> sqrt(10)/3;
  # Y^T Y = 2. CKA = 2 / (sqrt(10)/3 * 2) = 3 / sqrt(10).
  assert np.isclose(
    similarity.linear_cka(hand_x, hand_y).numpy(), 3 / np.sqrt(10), rtol=1e-5
  )


def test_linear_cka_is_symmetric_and_invariant():
  base = similarity.linear_cka(X, Y).numpy()
  assert np.isclose(similarity.linear_cka(Y, X).numpy(), base, rtol=1e-5)
  q, _ = np.linalg.qr(RNG.normal(size=(7, 7)))
  rotated = (X @ q).astype(np.float32)
  assert np.isclose(similarity.linear_cka(rotated, Y).numpy(), base, rtol=1e-4)
  assert np.isclose(similarity.linear_cka(3.5 * X, Y).numpy(), base, rtol=1e-5)
  assert np.isclose(similarity.linear_cka(X, 0.2 * Y).numpy(), base, rtol=1e-5)


def test_conv_maps_are_flattened_per_example():
  maps = RNG.normal(size=(6, 3, 3, 2)).astype(np.float32)
  other = RNG.normal(size=(6, 4, 4, 1)).astype(np.float32)
  assert np.isclose(
    similarity.linear_cka(maps, other).numpy(),
    _feature_space_linear_cka(maps.reshape(6, -1), other.reshape(6, -1)),
    rtol=1e-5,
  )


def _numpy_kernel_cka(x, y, threshold=0.5):
  # Kornblith et al.'s gram_rbf / center_gram / cka.

  def gram(a):
    dots = a @ a.T
    norms = np.diag(dots)
    sq = -2 * dots + norms[:, None] + norms[None, :]
    return np.exp(-sq / (2 * threshold**2 * np.median(sq)))

  def center(g):
    n = g.shape[0]
    h = np.eye(n) - np.ones((n, n)) / n
    return h @ g @ h

  gx, gy = (
    center(gram(x.astype(np.float64))),
    center(gram(y.astype(np.float64))),
  )
  return np.sum(gx * gy) / (np.linalg.norm(gx) * np.linalg.norm(gy))


def test_kernel_cka_matches_kornbliths_formula():
  assert np.isclose(similarity.kernel_cka(X, X).numpy(), 1.0, atol=1e-5)
  assert np.isclose(
    similarity.kernel_cka(X, Y).numpy(), _numpy_kernel_cka(X, Y), rtol=1e-4
  )


def test_table3_similarities_are_the_papers_forms_per_element_by_hand():
  a = np.array([[1.0, 0.0], [0.0, 1.0]], np.float32)
  b = np.array([[2.0, 1.0], [0.0, 3.0]], np.float32)
  # ||a - b||_F^2 = 1 + 1 + 0 + 4, negated; <vec a, vec b> = 2 + 3; both
  # over B x D = 4 elements.
  frobenius = similarity.get_similarity('frobenius')
  cosine = similarity.get_similarity('cosine')
  assert np.isclose(frobenius(a, b).numpy(), -6.0 / 4)
  assert np.isclose(cosine(a, b).numpy(), 5.0 / 4)
  # = ||vec a|| ||vec b|| cos(theta) / 4, the normalized cosine's theta.
  normalized = similarity.get_similarity('normalized_cosine')(a, b).numpy()
  assert np.isclose(
    cosine(a, b).numpy(), np.sqrt(2.0) * np.sqrt(14.0) * normalized / 4
  )


def test_per_element_forms_do_not_grow_with_the_batch_or_the_width():
  a = np.random.default_rng(0).normal(size=(8, 5)).astype(np.float32)
  b = np.random.default_rng(1).normal(size=(8, 5)).astype(np.float32)
  for name in ('frobenius', 'cosine'):
    measure = similarity.get_similarity(name)
    once = measure(a, b).numpy()
    assert np.isclose(measure(np.tile(a, (3, 1)), np.tile(b, (3, 1))), once)
    assert np.isclose(measure(np.tile(a, (1, 4)), np.tile(b, (1, 4))), once)


@pytest.mark.parametrize('name', list(similarity.SIMILARITIES))
def test_every_similarity_makes_fedcka_pull_towards_the_global_model(name):
  # FedCKA's loss with a = a_g (like the global model) must be below the
  # loss with a = a_p (like the previous model): every measure is a
  # similarity, higher when more alike.
  rng = np.random.default_rng(7)
  a_global, a_prev = [
    rng.normal(size=(16, 6)).astype(np.float32) for _ in range(2)
  ]
  to_each = similarity.get_similarity_to_each(name)

  def loss(a):
    return fedcka.cka_contrastive_loss(
      [a], [a_global], [a_prev], to_each
    ).numpy()

  assert loss(a_global) < loss(a_prev)
  # And along the path between them, nearer the global model is lower.
  assert loss(a_global + 0.25 * (a_prev - a_global)) < loss(
    a_global + 0.75 * (a_prev - a_global)
  )


def test_normalized_cosine_and_frobenius_by_hand():
  a = np.array([[1.0, 0.0], [0.0, 1.0]], np.float32)
  b = np.array([[1.0, 1.0], [0.0, 0.0]], np.float32)
  # vec(a) . vec(b) = 1, |vec(a)| = sqrt(2), |vec(b)| = sqrt(2).
  assert np.isclose(similarity.cosine_similarity(a, b).numpy(), 0.5)
  # b^T a = [[1, 0], [1, 0]] -> ||.||_F^2 = 2; ||a||^2 = 2, ||b||^2 = 2.
  assert np.isclose(similarity.frobenius_similarity(a, b).numpy(), 0.5)
  assert np.isclose(
    similarity.frobenius_similarity(X, X).numpy(),
    np.linalg.norm(X.T @ X) ** 2 / np.sum(X * X) ** 2,
    rtol=1e-5,
  )


def test_unknown_similarity_is_named():
  with pytest.raises(ValueError, match="Unknown similarity 'l2'"):
    similarity.get_similarity('l2')


def test_linear_cka_on_fedckas_first_layer_shape():
  # B=128 examples of a 14x14x16 map (D=3136 > B): the Gram form's case.
  x = RNG.normal(size=(128, 14, 14, 16)).astype(np.float32)
  y = (0.3 * x + RNG.normal(size=x.shape)).astype(np.float32)
  assert np.isclose(similarity.linear_cka(x, x).numpy(), 1.0, atol=1e-5)
  assert np.isclose(
    similarity.linear_cka(x, y).numpy(),
    _feature_space_linear_cka(x.reshape(128, -1), y.reshape(128, -1)),
    rtol=1e-4,
  )


def test_linear_cka_gradient_matches_the_feature_space_formula():
  # The Gram matrix's own gradient, (S + S^T) X, against a finite difference
  # of the feature-space formula (float64 numpy), in a few directions.
  x = tf.constant(X)
  with tf.GradientTape() as tape:
    tape.watch(x)
    value = similarity.linear_cka(x, Y)
  gradient = tape.gradient(value, x).numpy()
  x64, y64 = X.astype(np.float64), Y.astype(np.float64)
  for seed in range(3):
    direction = np.random.default_rng(seed).normal(size=X.shape)
    step = 1e-5
    numeric = (
      _feature_space_linear_cka(x64 + step * direction, y64)
      - _feature_space_linear_cka(x64 - step * direction, y64)
    ) / (2 * step)
    assert np.isclose(
      np.sum(gradient * direction), numeric, rtol=1e-3, atol=1e-6
    )


@pytest.mark.parametrize('name', list(similarity.SIMILARITIES))
def test_similarity_to_each_equals_one_at_a_time(name):
  # Same shapes as X (the cosine compares flattened batches).
  y = (X @ RNG.normal(size=(7, 7)) + RNG.normal(size=X.shape)).astype(
    np.float32
  )
  z = (0.5 * y + RNG.normal(size=X.shape)).astype(np.float32)
  one = similarity.get_similarity(name)
  to_each = similarity.get_similarity_to_each(name)
  values = [v.numpy() for v in to_each(X, [y, z, X])]
  assert np.allclose(
    values, [one(X, y).numpy(), one(X, z).numpy(), one(X, X).numpy()], rtol=1e-5
  )
  # The gradient with respect to the shared x, too.
  x = tf.constant(X)
  with tf.GradientTape(persistent=True) as tape:
    tape.watch(x)
    shared = tf.add_n(to_each(x, [y, z]))
    separate = one(x, y) + one(x, z)
  assert np.allclose(
    tape.gradient(shared, x).numpy(),
    tape.gradient(separate, x).numpy(),
    rtol=1e-4,
    atol=1e-6,
  )


def test_linear_cka_to_each_gradient_with_respect_to_each_y():
  # The written-out gradient against autodiff of the one-at-a-time form.
  y = tf.constant(Y)
  z = tf.constant((0.5 * Y + RNG.normal(size=Y.shape)).astype(np.float32))
  weights = [0.7, -1.3]  # Unequal upstream gradients.
  with tf.GradientTape(persistent=True) as tape:
    tape.watch([y, z])
    shared = similarity.linear_cka_to_each(X, [y, z])
    shared = weights[0] * shared[0] + weights[1] * shared[1]
    separate = weights[0] * similarity.linear_cka(X, y) + weights[
      1
    ] * similarity.linear_cka(X, z)
  for t in (y, z):
    np.testing.assert_allclose(
      tape.gradient(shared, t).numpy(),
      tape.gradient(separate, t).numpy(),
      rtol=1e-4,
      atol=1e-6,
    )


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
