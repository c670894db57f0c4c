"""CIFAR-style ResNets with group normalization (`tff_methods_tasks.models`'
resnet18 and resnet50): a 3x3 stem, no max-pool, four residual stages, and an
optional projection head, their outputs named as every zoo model's."""

import tensorflow as tf

from tff_methods_tasks import model_outputs


def _group_norm(x, groups=2):
  channels = x.shape[-1]
  return tf.keras.layers.GroupNormalization(groups=min(groups, channels))(x)


def _basic_block(x, filters, stride, groups):
  shortcut = x
  y = tf.keras.layers.Conv2D(filters, 3, stride, 'same', use_bias=False)(x)
  y = tf.keras.layers.ReLU()(_group_norm(y, groups))
  y = tf.keras.layers.Conv2D(filters, 3, 1, 'same', use_bias=False)(y)
  y = _group_norm(y, groups)
  if stride != 1 or x.shape[-1] != filters:
    shortcut = tf.keras.layers.Conv2D(filters, 1, stride, use_bias=False)(x)
    shortcut = _group_norm(shortcut, groups)
  return tf.keras.layers.ReLU()(tf.keras.layers.Add()([y, shortcut]))


def _bottleneck_block(x, filters, stride, groups):
  shortcut = x
  y = tf.keras.layers.Conv2D(filters, 1, use_bias=False)(x)
  y = tf.keras.layers.ReLU()(_group_norm(y, groups))
  y = tf.keras.layers.Conv2D(filters, 3, stride, 'same', use_bias=False)(y)
  y = tf.keras.layers.ReLU()(_group_norm(y, groups))
  y = tf.keras.layers.Conv2D(4 * filters, 1, use_bias=False)(y)
  y = _group_norm(y, groups)
  if stride != 1 or x.shape[-1] != 4 * filters:
    shortcut = tf.keras.layers.Conv2D(4 * filters, 1, stride, use_bias=False)(x)
    shortcut = _group_norm(shortcut, groups)
  return tf.keras.layers.ReLU()(tf.keras.layers.Add()([y, shortcut]))


def _resnet(
  name,
  block_fn,
  blocks_per_stage,
  num_classes,
  input_shape,
  projection_dim,
  norm_groups,
  width,
):
  """A CIFAR-style ResNet (3x3 stem, no max-pool) with group normalization.

  `layer_1` is the stem, `layer_2`..`layer_5` the four residual stages; with
  a projection head (`projection_dim` > 0), pooled features -> dense -> ReLU
  -> dense(projection_dim) = `z` -> classifier, as in MOON. `features`
  (FedMAX) is the pooled vector, post-ReLU, with or without the head.
  """
  x = inputs = tf.keras.Input(input_shape)
  x = tf.keras.layers.Conv2D(width, 3, 1, 'same', use_bias=False)(x)
  x = tf.keras.layers.ReLU()(_group_norm(x, norm_groups))
  blocks = [x]
  for stage, num_blocks in enumerate(blocks_per_stage):
    filters = width * 2**stage
    for i in range(num_blocks):
      stride = 2 if (i == 0 and stage > 0) else 1
      x = block_fn(x, filters, stride, norm_groups)
    blocks.append(x)
  pooled = tf.keras.layers.GlobalAveragePooling2D()(x)
  z = None
  head_input = pooled
  if projection_dim:
    h = tf.keras.layers.Dense(pooled.shape[-1], activation='relu')(pooled)
    z = head_input = tf.keras.layers.Dense(projection_dim)(h)
  logits = tf.keras.layers.Dense(num_classes)(head_input)
  return tf.keras.Model(
    inputs, model_outputs.named(blocks, pooled, logits, z), name=name
  )


def resnet18(
  num_classes: int,
  input_shape=(32, 32, 3),
  projection_dim=0,
  norm_groups: int = 2,
  width: int = 64,
) -> tf.keras.Model:
  """ResNet-18 with group normalization and an optional projection head."""
  return _resnet(
    'resnet18',
    _basic_block,
    (2, 2, 2, 2),
    num_classes,
    input_shape,
    projection_dim,
    norm_groups,
    width,
  )


def resnet50(
  num_classes: int,
  input_shape=(32, 32, 3),
  projection_dim=0,
  norm_groups: int = 2,
  width: int = 64,
) -> tf.keras.Model:
  """ResNet-50 with group normalization and an optional projection head."""
  return _resnet(
    'resnet50',
    _bottleneck_block,
    (3, 4, 6, 3),
    num_classes,
    input_shape,
    projection_dim,
    norm_groups,
    width,
  )
