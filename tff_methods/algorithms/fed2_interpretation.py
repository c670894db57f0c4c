"""Fed2's interpretation of a model (Yu et al., KDD 2021): which
classes each neuron prefers (Eq. 9) and how spread a layer's preferences
are (its total variance, Eq. 17), the paper's evidence that deeper layers
specialize in classes, which is why Fed2 groups the last ones.

Paper: Yu et al., "Fed2: Feature-Aligned Federated Learning", KDD 2021.
https://arxiv.org/abs/2111.14213
"""

import collections

import numpy as np
import tensorflow as tf

from tff_methods.templates import model_lib


def class_preference(
  model: tf.keras.Model, x: np.ndarray, layer: str, batch_size: int = 256
) -> np.ndarray:
  """Eq. 9: each neuron's class-preference vector in `layer`.

  For neuron n (a filter of a conv layer, a unit of a dense one) and class
  c: the mean over examples of `sum over positions of a_n * d p_c / d a_n`,
  its activation times the gradient of class c's confidence (softmax
  probability), then normalized to sum to 1 in absolute value, so that
  neurons compare by preference, not scale.

  Returns:
    (neurons, classes) array.
  """
  sub = tf.keras.Model(
    model.input, [model.output[layer], model.output['logits']]
  )
  num_classes = int(model.output['logits'].shape[-1])
  total = None
  for start in range(0, len(x), batch_size):
    batch = tf.constant(x[start : start + batch_size])
    rows = []
    for c in range(num_classes):
      with tf.GradientTape() as tape:
        activation, logits = sub(batch, training=False)
        confidence = tf.reduce_sum(tf.nn.softmax(logits)[:, c])
      grad = tape.gradient(confidence, activation)
      product = activation * grad
      # Sum over examples and positions: one value per neuron.
      rows.append(
        tf.reduce_sum(tf.reshape(product, [-1, product.shape[-1]]), 0)
      )
    batch_total = tf.stack(rows, axis=1).numpy()
    total = batch_total if total is None else total + batch_total
  preference = total / len(x)
  scale = np.abs(preference).sum(axis=1, keepdims=True)
  return preference / np.where(scale > 0, scale, 1.0)


def layer_total_variance(preferences: np.ndarray) -> float:
  """Eq. 17: the mean squared distance of a layer's preference vectors
  from their mean, `(1/N) sum_n ||p_n - mean(p)||^2`."""
  centred = preferences - preferences.mean(axis=0, keepdims=True)
  return float(np.mean(np.sum(centred**2, axis=1)))


def total_variance_by_layer(
  model: tf.keras.Model, x: np.ndarray
) -> collections.OrderedDict:
  """Eq. 17 for every `layer_k` of the model, nearest the input first."""
  return collections.OrderedDict(
    (layer, layer_total_variance(class_preference(model, x, layer)))
    for layer in model_lib.layer_names(model)
  )
