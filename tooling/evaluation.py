"""Central evaluation of a global model: accuracy and macro-F1.

Macro-F1 (the unweighted mean of per-class F1) is the FedMAX paper's metric
for its imbalanced medical sets; as in scikit-learn, it averages over the
classes present in the labels or the predictions.
"""

import collections

import numpy as np
import tensorflow as tf

from tff_methods.templates import model_lib


def macro_f1(labels: np.ndarray, predictions: np.ndarray) -> float:
  """Unweighted mean over classes of 2PR / (P + R)."""
  labels = np.ravel(labels)
  predictions = np.ravel(predictions)
  classes = np.union1d(labels, predictions)
  scores = []
  for c in classes:
    tp = np.sum((predictions == c) & (labels == c))
    fp = np.sum((predictions == c) & (labels != c))
    fn = np.sum((predictions != c) & (labels == c))
    denominator = 2 * tp + fp + fn
    scores.append(2 * tp / denominator if denominator else 0.0)
  return float(np.mean(scores)) if scores else 0.0


class Evaluator:
  """Evaluates `ModelWeights` on a fixed test set with one Keras model."""

  def __init__(
    self,
    keras_model_fn: model_lib.KerasModelFn,
    test_x: np.ndarray,
    test_y: np.ndarray,
    batch_size: int = 1024,
  ):
    self._model = keras_model_fn()
    self._x = test_x
    self._y = np.asarray(test_y)
    self._batch_size = batch_size

    self._predict = tf.function(
      lambda x: self._model(x, training=False)['logits']
    )

  def __call__(self, weights) -> collections.OrderedDict:
    model_lib.assign_weights(self._model, weights)
    predictions, losses = [], []
    for start in range(0, len(self._x), self._batch_size):
      x = self._x[start : start + self._batch_size]
      y = self._y[start : start + self._batch_size]
      logits = self._predict(tf.constant(x))
      losses.append(
        tf.keras.losses.sparse_categorical_crossentropy(
          y, logits, from_logits=True
        )
        .numpy()
        .ravel()
      )
      predictions.append(np.argmax(logits.numpy(), axis=-1))
    predictions = np.concatenate(
      [p.reshape(-1, *self._y.shape[1:]) for p in predictions]
    )
    return collections.OrderedDict(
      accuracy=float(np.mean(predictions == self._y)),
      macro_f1=macro_f1(self._y, predictions),
      loss=float(np.mean(np.concatenate(losses))),
    )
