"""Tests for tff_methods_tooling.evaluation."""

import sys

import numpy as np
import pytest
from sklearn import metrics

from tff_methods.templates import model_lib
from tff_methods_tasks import models
from tff_methods_tooling import evaluation


def test_macro_f1_by_hand():
  labels = np.array([0, 0, 1, 1])
  predictions = np.array([0, 1, 1, 1])
  # class 0: P=1, R=1/2, F1=2/3; class 1: P=2/3, R=1, F1=4/5.
  assert np.isclose(
    evaluation.macro_f1(labels, predictions), (2 / 3 + 4 / 5) / 2
  )


def test_macro_f1_matches_scikit_learn():
  rng = np.random.default_rng(0)
  labels = rng.integers(0, 5, 300)
  predictions = np.where(rng.random(300) < 0.6, labels, rng.integers(0, 6, 300))
  assert np.isclose(
    evaluation.macro_f1(labels, predictions),
    metrics.f1_score(labels, predictions, average='macro'),
  )


def test_evaluator_uses_the_given_weights():
  model_fn = lambda: models.get_model('mlp', 3, (4,), hidden=(5,))
  x = np.random.default_rng(0).normal(size=(50, 4)).astype(np.float32)
  weights = model_lib.initial_weights(model_fn, seed=1)
  reference = model_fn()
  model_lib.assign_weights(reference, weights)
  y = np.argmax(reference(x)['logits'].numpy(), axis=1)
  result = evaluation.Evaluator(model_fn, x, y, batch_size=16)(weights)
  assert result['accuracy'] == 1.0
  assert result['macro_f1'] == 1.0


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
