"""Keras models that expose the intermediate outputs the methods regularize.

Every model here is a functional `tf.keras.Model` whose output is a dict:

- `layer_1`, `layer_2`, ...: each block's activation, nearest the input first
  (conv blocks for CNNs, hidden layers for the MLP, the stem and the residual
  stages for ResNets). FedCKA regularizes the first M of them.
- `features`: FedMAX's activation vector: the last post-ReLU hidden vector
  (the input of the classifier, or of the projection head where the model
  has one).
- `z`: the projection head's output, where the model has one (MOON).
- `logits`: the unnormalized class scores.

Every layer lies on the path from the input to `logits`, so the model's
trainable variables are exactly those of
`tff_methods.templates.model_lib.logits_only(model)`, in the same order: the
weights of the project's processes and of TFF's own builders are
interchangeable.

`get_model(name, num_classes, input_shape, ...)` builds one by name.
"""

from typing import Callable, Optional, Sequence

import tensorflow as tf

from tff_methods_tasks import model_outputs
from tff_methods_tasks import resnets

MODEL_NAMES = (
  'fedcka_cnn',
  'fedmax_cnn',
  'lenet',
  'mlp',
  'mlp1',
  'resnet18',
  'resnet50',
  'vgg9',
  'mobilenet',
  'shakespeare_lstm',
  'shakespeare_lstm100',
)

# What each model exposes to the methods: the zoo's one source of these
# facts (tests/models_test.py builds each model and checks them).
# Its `layer_k` outputs, which FedCKA's M may not exceed:
LAYER_OUTPUTS = {
  'fedcka_cnn': 7,
  'fedmax_cnn': 5,
  'lenet': 2,
  'mlp': 2,
  'mlp1': 1,
  'resnet18': 5,
  'resnet50': 5,
  'vgg9': 6,
  'mobilenet': 14,
  'shakespeare_lstm': 2,
  'shakespeare_lstm100': 2,
}
# MOON's projection head `z`: built in, or built when `projection_dim` > 0.
PROJECTION_BUILT_IN = ('fedcka_cnn',)
TAKES_PROJECTION_DIM = ('resnet18', 'resnet50')


def output_names(name: str, projection_dim: int = 0) -> tuple[str, ...]:
  """The named outputs of `get_model(name, ..., projection_dim=...)`: what
  the methods can read of it (`model_lib`'s contract)."""
  layers = tuple(f'layer_{k}' for k in range(1, LAYER_OUTPUTS[name] + 1))
  head = ('z',) if has_projection_head(name, projection_dim) else ()
  return ('logits', 'features') + head + layers


def has_projection_head(name: str, projection_dim: int = 0) -> bool:
  """Whether `get_model(name, ..., projection_dim=...)` outputs MOON's `z`."""
  return name in PROJECTION_BUILT_IN or (
    name in TAKES_PROJECTION_DIM and projection_dim > 0
  )


# MobileNet-v1 for 32x32 inputs: (filters, stride) of its 13 depthwise-
# separable blocks after the 3x3 stem (the stem and first block keep the
# resolution, as CIFAR versions do).
MOBILENET_BLOCKS = (
  (64, 1),
  (128, 2),
  (128, 1),
  (256, 2),
  (256, 1),
  (512, 2),
  (512, 1),
  (512, 1),
  (512, 1),
  (512, 1),
  (512, 1),
  (1024, 2),
  (1024, 1),
)

# Layer plans of the CNNs Fed2 can group
# (`tff_methods.algorithms.fed2.grouped_model`):
# ('conv', filters, kernel, pool), ('sep', filters, stride) a depthwise-
# separable block, or ('fc', units); the classifier comes last. The plain
# `vgg9` and `mobilenet` below are built from the same plans. Fed2's
# `fedcka_cnn` is the FedCKA CNN with a ReLU on its 256-wide last layer
# (the plain model's linear projection `z`), since every grouped layer is
# a ReLU block.
VGG9_PLAN = (
  ('conv', 32, 3, False),
  ('conv', 64, 3, True),
  ('conv', 128, 3, False),
  ('conv', 128, 3, True),
  ('conv', 256, 3, False),
  ('conv', 256, 3, True),
  ('fc', 512),
  ('fc', 512),
)
VGG16_PLAN = (
  ('conv', 64, 3, False),
  ('conv', 64, 3, True),
  ('conv', 128, 3, False),
  ('conv', 128, 3, True),
  ('conv', 256, 3, False),
  ('conv', 256, 3, False),
  ('conv', 256, 3, True),
  ('conv', 512, 3, False),
  ('conv', 512, 3, False),
  ('conv', 512, 3, True),
  ('conv', 512, 3, False),
  ('conv', 512, 3, False),
  ('conv', 512, 3, True),
  ('fc', 512),
  ('fc', 512),
)
FEDCKA_CNN_PLAN = (
  ('conv', 16, 5, True),
  ('conv', 32, 5, True),
  ('fc', 120),
  ('fc', 84),
  ('fc', 84),
  ('fc', 256),
)
MOBILENET_PLAN = (('conv', 32, 3, False),) + tuple(
  ('sep', filters, stride) for filters, stride in MOBILENET_BLOCKS
)
# Fed2's models: name -> (plan, the paper's decouple depth (the last 6
# layers, classifier included), whether the classifier reads globally
# average-pooled features).
_FED2_MODELS = {
  'vgg9': (VGG9_PLAN, 6, False),
  'vgg16': (VGG16_PLAN, 6, False),
  'fedcka_cnn': (FEDCKA_CNN_PLAN, 4, False),
  'mobilenet': (MOBILENET_PLAN, 6, True),
}
FED2_MODELS = tuple(_FED2_MODELS)


def fed2_plan(name: str, input_shape: Sequence[int]) -> dict:
  """Model `name` as Fed2 groups it: `tff_methods.algorithms.fed2.LayerPlan`'s
  fields.

  Raises:
    ValueError: for a model Fed2 can't group.
  """
  if name not in _FED2_MODELS:
    raise ValueError(
      f'Fed2 supports models {", ".join(FED2_MODELS)}, not ' f'{name!r}.'
    )
  layers, decouple_depth, global_pool = _FED2_MODELS[name]
  # The FedCKA CNN's convolutions are unpadded on 32x32 inputs (the paper).
  padding = (
    'valid' if (name == 'fedcka_cnn' and min(input_shape[:2]) >= 20) else 'same'
  )
  return dict(
    name=name,
    layers=layers,
    decouple_depth=decouple_depth,
    global_pool=global_pool,
    padding=padding,
  )


# Shakespeare as TFF prepares it: 86 characters + pad, out-of-vocabulary,
# beginning and end of sequence.
SHAKESPEARE_VOCAB_SIZE = 90


def fedcka_cnn(
  num_classes: int, input_shape=(32, 32, 3), padding: Optional[str] = None
) -> tf.keras.Model:
  """FedCKA's CNN (MOON's has the same layers with 6 and 16 channels).

  conv5x5(16) -> pool -> conv5x5(32) -> pool -> FC 120 -> 84 -> 84, then
  the projection 84 -> 256 (`z`, MOON's), then the classifier. Its seven
  layers are `layer_1`..`layer_7`, as FedCKA's Fig. 5 counts them: the two
  conv blocks (pooled outputs; M = 2 regularizes these), FC 120, FC 84,
  FC 84, `z` and the logits. `features` (FedMAX) is the second 84-d
  post-ReLU vector, the input of the projection.

  Args:
    num_classes: Number of classes.
    input_shape: (H, W, C).
    padding: 'valid' as in the paper (for 32x32 inputs); by default 'same' for
      inputs smaller than 20 pixels (e.g. 8x8 digits), where 'valid' convs
      would leave no pixels.
  """
  if padding is None:
    padding = 'valid' if min(input_shape[:2]) >= 20 else 'same'
  x = inputs = tf.keras.Input(input_shape)
  x = tf.keras.layers.Conv2D(16, 5, padding=padding, activation='relu')(x)
  block1 = x = tf.keras.layers.MaxPool2D(2, padding='same')(x)
  x = tf.keras.layers.Conv2D(32, 5, padding=padding, activation='relu')(x)
  block2 = x = tf.keras.layers.MaxPool2D(2, padding='same')(x)
  x = tf.keras.layers.Flatten()(x)
  fc1 = tf.keras.layers.Dense(120, activation='relu')(x)
  fc2 = tf.keras.layers.Dense(84, activation='relu')(fc1)
  fc3 = tf.keras.layers.Dense(84, activation='relu')(fc2)
  z = tf.keras.layers.Dense(256)(fc3)
  logits = tf.keras.layers.Dense(num_classes)(z)
  return tf.keras.Model(
    inputs,
    model_outputs.named(
      [block1, block2, fc1, fc2, fc3, z, logits], fc3, logits, z
    ),
    name='fedcka_cnn',
  )


def fedmax_cnn(num_classes: int, input_shape=(32, 32, 3)) -> tf.keras.Model:
  """FedMAX's five-conv CNN; `features` is its 512-d activation vector."""
  x = inputs = tf.keras.Input(input_shape)
  blocks = []
  for filters, pool in (
    (32, True),
    (64, False),
    (64, True),
    (64, False),
    (64, True),
  ):
    x = tf.keras.layers.Conv2D(
      filters, 3, padding='same', use_bias=False, activation='relu'
    )(x)
    if pool:
      x = tf.keras.layers.MaxPool2D(2, padding='same')(x)
    blocks.append(x)
  x = tf.keras.layers.Flatten()(x)
  features = tf.keras.layers.Dense(512, activation='relu')(x)
  logits = tf.keras.layers.Dense(num_classes)(features)
  return tf.keras.Model(
    inputs, model_outputs.named(blocks, features, logits), name='fedmax_cnn'
  )


def lenet(num_classes: int, input_shape=(32, 32, 3)) -> tf.keras.Model:
  """LeNet-5: FedCos's CIFAR-10 CNN (the reference code's `CNNCifar`).

  conv5x5(6) -> pool -> conv5x5(16) -> pool -> FC 120 -> 84 -> classes.
  """
  padding = 'valid' if min(input_shape[:2]) >= 20 else 'same'
  x = inputs = tf.keras.Input(input_shape)
  blocks = []
  for filters in (6, 16):
    x = tf.keras.layers.Conv2D(filters, 5, padding=padding, activation='relu')(
      x
    )
    x = tf.keras.layers.MaxPool2D(2, padding='same')(x)
    blocks.append(x)
  x = tf.keras.layers.Flatten()(x)
  x = tf.keras.layers.Dense(120, activation='relu')(x)
  features = tf.keras.layers.Dense(84, activation='relu')(x)
  logits = tf.keras.layers.Dense(num_classes)(features)
  return tf.keras.Model(
    inputs, model_outputs.named(blocks, features, logits), name='lenet'
  )


def mlp(
  num_classes: int,
  input_shape=(8, 8, 1),
  hidden: Sequence[int] = (200, 200),
  name: str = 'mlp',
) -> tf.keras.Model:
  """A multilayer perceptron; each hidden layer is a `layer_k` output."""
  x = inputs = tf.keras.Input(input_shape)
  x = tf.keras.layers.Flatten()(x)
  blocks = []
  for width in hidden:
    x = tf.keras.layers.Dense(width, activation='relu')(x)
    blocks.append(x)
  logits = tf.keras.layers.Dense(num_classes)(x)
  return tf.keras.Model(
    inputs, model_outputs.named(blocks, x, logits), name=name
  )


def mlp1(num_classes: int, input_shape=(28, 28, 1)) -> tf.keras.Model:
  """One hidden layer of 200: FedCos's FMNIST MLP (its dropout left out)."""
  # A single hidden layer: its output is both `layer_1` and the features.
  return mlp(num_classes, input_shape, hidden=(200,), name='mlp1')


def mobilenet(num_classes: int, input_shape=(32, 32, 3)) -> tf.keras.Model:
  """MobileNet-v1 (Fed2's second CIFAR-10 model), without normalization.

  3x3 stem conv(32), then `MOBILENET_BLOCKS` depthwise-separable convs
  (depthwise 3x3 + pointwise 1x1, ReLU), global average pooling, classifier.
  As in the project's VGGs there is no normalization layer: the baselines
  train the original networks, as in the Fed2 paper, whose FedAvg on VGG-9
  has no normalization (its Fig. 12); Fed2's grouped form of these plans
  has group normalization
  (`tff_methods.algorithms.fed2.LayerPlan.normalization`).
  `layer_1` is the stem, `layer_2`.. each separable block.
  """
  x = inputs = tf.keras.Input(input_shape)
  _, filters, kernel, _ = MOBILENET_PLAN[0]
  x = tf.keras.layers.Conv2D(
    filters, kernel, padding='same', activation='relu'
  )(x)
  blocks = [x]
  for _, filters, stride in MOBILENET_PLAN[1:]:
    x = tf.keras.layers.SeparableConv2D(
      filters, 3, stride, padding='same', activation='relu'
    )(x)
    blocks.append(x)
  features = tf.keras.layers.GlobalAveragePooling2D()(x)
  logits = tf.keras.layers.Dense(num_classes)(features)
  return tf.keras.Model(
    inputs, model_outputs.named(blocks, features, logits), name='mobilenet'
  )


def vgg9(num_classes: int, input_shape=(32, 32, 3)) -> tf.keras.Model:
  """FedMA's VGG-9 (Fed2's CIFAR-10 model): six 3x3 convs, three FC layers."""
  x = inputs = tf.keras.Input(input_shape)
  blocks = []
  convs, (fc1, fc2) = VGG9_PLAN[:-2], VGG9_PLAN[-2:]
  for _, filters, kernel, pool in convs:
    x = tf.keras.layers.Conv2D(
      filters, kernel, padding='same', activation='relu'
    )(x)
    if pool:
      x = tf.keras.layers.MaxPool2D(2, padding='same')(x)
    blocks.append(x)
  x = tf.keras.layers.Flatten()(x)
  x = tf.keras.layers.Dense(fc1[1], activation='relu')(x)
  features = tf.keras.layers.Dense(fc2[1], activation='relu')(x)
  logits = tf.keras.layers.Dense(num_classes)(features)
  return tf.keras.Model(
    inputs, model_outputs.named(blocks, features, logits), name='vgg9'
  )


def shakespeare_lstm(
  num_classes: int = SHAKESPEARE_VOCAB_SIZE,
  input_shape=(80,),
  embedding_dim: int = 8,
  units: int = 256,
  name: str = 'shakespeare_lstm',
) -> tf.keras.Model:
  """The character LSTM of the FedAvg/FedProx Shakespeare task.

  Input: (B, T) character ids; `logits`: (B, T, vocab), next character at
  every position.
  """
  inputs = tf.keras.Input(input_shape, dtype=tf.int32)
  x = tf.keras.layers.Embedding(num_classes, embedding_dim)(inputs)
  layer_1 = tf.keras.layers.LSTM(units, return_sequences=True)(x)
  layer_2 = tf.keras.layers.LSTM(units, return_sequences=True)(layer_1)
  logits = tf.keras.layers.Dense(num_classes)(layer_2)
  return tf.keras.Model(
    inputs, model_outputs.named([layer_1, layer_2], layer_2, logits), name=name
  )


def shakespeare_lstm100(
  num_classes: int = SHAKESPEARE_VOCAB_SIZE, input_shape=(80,)
) -> tf.keras.Model:
  """FedCos's Shakespeare model: 8-d embedding, two LSTMs of 100 units."""
  return shakespeare_lstm(
    num_classes, input_shape, units=100, name='shakespeare_lstm100'
  )


_REGISTRY: dict[str, Callable[..., tf.keras.Model]] = {
  'fedcka_cnn': fedcka_cnn,
  'fedmax_cnn': fedmax_cnn,
  'lenet': lenet,
  'mlp': mlp,
  'mlp1': mlp1,
  'resnet18': resnets.resnet18,
  'resnet50': resnets.resnet50,
  'vgg9': vgg9,
  'mobilenet': mobilenet,
  'shakespeare_lstm': shakespeare_lstm,
  'shakespeare_lstm100': shakespeare_lstm100,
}


def get_model(
  name: str, num_classes: int, input_shape: Sequence[int], **kwargs
) -> tf.keras.Model:
  """Builds the registered model `name` for `num_classes` and `input_shape`.

  Args:
    name: One of `MODEL_NAMES`.
    num_classes: Output classes (vocabulary size for `shakespeare_lstm`).
    input_shape: Shape of one example, without the batch dimension.
    **kwargs: Model-specific options (e.g. `projection_dim` for ResNets).

  Raises:
    ValueError: for an unknown name.
  """
  if name not in _REGISTRY:
    raise ValueError(f'Unknown model {name!r}; choose one of {MODEL_NAMES}.')
  return _REGISTRY[name](
    num_classes=num_classes, input_shape=tuple(input_shape), **kwargs
  )


def parameter_count(
  name: str, num_classes: int, input_shape: Sequence[int], **kwargs
) -> Optional[int]:
  """The parameters of `get_model(name, ...)`; None for a name it doesn't
  build (a model only Fed2's grouping builds)."""
  if name not in _REGISTRY:
    return None
  return get_model(name, num_classes, input_shape, **kwargs).count_params()
