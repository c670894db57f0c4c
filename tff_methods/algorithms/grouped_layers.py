"""Fed2's grouped Keras layers: G groups side by side, each reading its own.

The building blocks of `fed2.grouped_model`. A grouped layer holds the G
groups' features side by side in equal channel blocks; `split_groups` and
`flatten_groups` keep each block whole, `GroupedDense` is G dense layers
in one stacked kernel (group first; `fed2.tensor_groups` reports it as
`fed2.STACKED`), and `GatherClasses` puts the groups' logits back in class
order. Their variable names carry `fed2_stacked_` or `fed2_group<g>_`,
which is how `fed2.tensor_groups` finds each group's weights. Group g of
every client sits at the same coordinates, so the plain mean of the
updates is Fed2's paired averaging.
"""

import numpy as np
import tensorflow as tf


def side_by_side(tensors):
  if len(tensors) == 1:
    return tensors[0]
  return tf.keras.layers.Concatenate(axis=-1)(tensors)


class ChannelSlice(tf.keras.layers.Layer):
  """The channels [start, end) of the last axis (no weights)."""

  def __init__(self, start, end, **kwargs):
    super().__init__(**kwargs)
    self._start, self._end = int(start), int(end)

  def call(self, inputs):
    return inputs[..., self._start : self._end]

  def get_config(self):
    return dict(super().get_config(), start=self._start, end=self._end)


def split_groups(x, num_groups):
  """The groups' blocks of the last axis of `x` (side by side, equal)."""
  if num_groups == 1:
    return [x]
  width = x.shape[-1] // num_groups
  return [
    ChannelSlice(g * width, (g + 1) * width)(x) for g in range(num_groups)
  ]


def flatten_groups(x, num_groups):
  """Flattens grouped feature maps so that each group's block stays whole.

  [B, H, W, G*w] -> [B, G*(H*W*w)], group g's map flattened (as Keras'
  `Flatten` would flatten it alone) in block g.
  """
  if len(x.shape) == 2:
    return x
  return GroupFlatten(num_groups)(x)


class GroupFlatten(tf.keras.layers.Layer):
  """[B, ..., G*w] -> [B, G*(...*w)], groups in contiguous blocks."""

  def __init__(self, num_groups, **kwargs):
    super().__init__(**kwargs)
    self._num_groups = int(num_groups)

  def call(self, inputs):
    spatial = inputs.shape[1:-1].as_list()
    width = inputs.shape[-1] // self._num_groups
    x = tf.reshape(inputs, [-1] + spatial + [self._num_groups, width])
    # Group axis first, then the group's own (..., w) in Flatten's order.
    rank = len(spatial) + 3
    x = tf.transpose(x, [0, rank - 2] + list(range(1, rank - 2)) + [rank - 1])
    return tf.reshape(x, [-1, int(np.prod(spatial)) * width * self._num_groups])

  def get_config(self):
    return dict(super().get_config(), num_groups=self._num_groups)


def per_group_glorot_uniform(widths):
  """Initializes a stacked [G, in, max(widths)] kernel group by group.

  Group g's [in, widths[g]] block is Glorot-uniform, as a Keras `Dense` of
  that shape would be; the padding columns past widths[g] are zeros.
  """

  def initializer(shape, dtype=None):
    del dtype
    glorot = tf.keras.initializers.GlorotUniform()
    return tf.stack(
      [
        tf.pad(glorot((shape[1], w)), [[0, 0], [0, shape[2] - w]])
        for w in widths
      ]
    )

  return initializer


class GroupedDense(tf.keras.layers.Layer):
  """G dense layers as one: group g maps to `widths[g]` units.

  With `grouped_input=False` every group reads the whole input (the first
  decoupled layer); with True the input is the groups' features side by
  side in equal blocks and group g reads block g only. The output is the
  groups' units side by side. The weights are stacked, a [G, in, w] kernel
  and a [G, w] bias (`tensor_groups` reports them as `STACKED`; the mean
  of the updates averages slice g with group g's weights): G separate layers
  would be 2G small tensors, each with its own optimizer update at every
  step, which was most of Fed2's extra cost. Groups narrower than the
  widest are padded with unused zero columns.
  """

  def __init__(self, widths, grouped_input, activation=None, **kwargs):
    super().__init__(**kwargs)
    self._widths = [int(w) for w in widths]
    self._grouped_input = bool(grouped_input)
    self._activation = tf.keras.activations.get(activation)

  # Plain Python: Keras may convert `build` with autograph (it did in
  # tests/multi_worker_test.py), and the converted one failed with
  # KeyError: '__class__'.
  @tf.autograph.experimental.do_not_convert
  def build(self, input_shape):
    num_groups, widest = len(self._widths), max(self._widths)
    self._input_width = int(input_shape[-1])
    if self._grouped_input:
      self._input_width //= num_groups
    self.kernel = self.add_weight(
      name='fed2_stacked_kernel',
      shape=(num_groups, self._input_width, widest),
      initializer=per_group_glorot_uniform(self._widths),
    )
    self.bias = self.add_weight(
      name='fed2_stacked_bias', shape=(num_groups, widest), initializer='zeros'
    )
    super().build(input_shape)

  def call(self, inputs):
    num_groups, widest = len(self._widths), max(self._widths)
    if self._grouped_input:
      x = tf.reshape(inputs, [-1, num_groups, self._input_width])
      y = tf.einsum('bgi,gio->bgo', x, self.kernel)
    else:
      y = tf.einsum('bi,gio->bgo', inputs, self.kernel)
    y = tf.reshape(y + self.bias, [-1, num_groups * widest])
    if any(w != widest for w in self._widths):
      y = tf.gather(
        y,
        [g * widest + k for g, w in enumerate(self._widths) for k in range(w)],
        axis=-1,
      )
    return self._activation(y)

  def get_config(self):
    return dict(
      super().get_config(),
      widths=self._widths,
      grouped_input=self._grouped_input,
      activation=tf.keras.activations.serialize(self._activation),
    )


class GatherClasses(tf.keras.layers.Layer):
  """Reorders the last axis by a fixed permutation (no weights)."""

  def __init__(self, order, **kwargs):
    super().__init__(**kwargs)
    self._order = [int(i) for i in order]

  def call(self, inputs):
    return tf.gather(inputs, self._order, axis=-1)

  def get_config(self):
    return dict(super().get_config(), order=self._order)
