"""The named outputs every model of the zoo (`tff_methods_tasks.models`)
returns."""

from typing import Optional, Sequence

import tensorflow as tf


def named(
  layers: Sequence[tf.Tensor],
  features: tf.Tensor,
  logits: tf.Tensor,
  z: Optional[tf.Tensor] = None,
) -> dict:
  """`layer_1`..`layer_N` (nearest the input first), `features`, `z` (where
  the model has a projection head) and `logits`."""
  out = {f'layer_{i + 1}': t for i, t in enumerate(layers)}
  out['features'] = features
  if z is not None:
    out['z'] = z
  out['logits'] = logits
  return out
