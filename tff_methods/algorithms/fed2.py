"""Fed2 (Yu et al., KDD 2021): feature-aligned grouped models, paired averaging.

Structure adaptation (`grouped_model`): the first layers stay dense and
shared; the last `decouple_depth` layers are split into G groups. Each
group is its own branch: its first decoupled layer reads the whole shared
representation, its later layers read only the group's own features (a
group convolution), and its part of the classifier produces only the logits
of the classes assigned to it. The class -> group assignment is fixed by a
seed and the same on every client; with fewer groups than classes, several
classes share a group. So class c's logit depends only on the shared layers
and group(c)'s parameters: the gradients of other groups are exactly zero.
Group widths are ceil(C / G) per layer of width C. The groups' dense layers
(classifier included) keep their weights stacked, group first, one tensor
per layer; their convolutions keep a kernel per group. As in the paper,
group normalization replaces batch normalization in every convolution
block; in a decoupled layer each Fed2 group's channels form one
normalization group (GN with G groups over the layer), so a group's
outputs still depend on its own weights only.

Local objective: cross-entropy, as FedAvg.

Server rule: the paper's paired averaging. Group g of every client is
averaged with group g of the others; since the class -> group assignment
is fixed and shared, that is coordinate averaging of the grouped model,
weighted by examples. So TFF's aggregators (robust, DP, compression,
secure), which average coordinate by coordinate, keep the pairing.

Feature interpretation (`fed2_interpretation`): the paper's Eq. 9
class-preference vector of each neuron (activation x gradient of each class's
confidence, averaged over the data) and Eq. 17 layer total variance, which
guides the decoupling depth.
"""

import dataclasses
import functools
import math
import re
from typing import Any, Callable, Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_methods.algorithms import grouped_layers
from tff_methods.algorithms import method_spec
from tff_methods.templates import aggregation
from tff_methods.templates import local_training
from tff_methods.templates import model_lib
from tff_methods.templates import processes
from tff_methods.templates import tff_models

NORMALIZATIONS = ('group', 'none')


@dataclasses.dataclass(frozen=True)
class LayerPlan:
  """A plain CNN or MLP, layer by layer, as Fed2 groups it.

  Attributes:
    name: The model's name.
    layers: ('conv', filters, kernel, pool), ('sep', filters, stride) (a
      depthwise-separable block) or ('fc', units), nearest the input first;
      every one a ReLU block. The classifier is added after them.
    decouple_depth: How many last layers (classifier included) are split
      into groups by default (the paper: 6).
    global_pool: Whether the classifier reads globally average-pooled
      features.
    padding: The convolutions' padding.
    normalization: 'group' (the paper: group normalization in every
      convolution block; in a decoupled layer each Fed2 group's channels
      are one normalization group, so groups stay independent) or 'none'.
  """

  name: str
  layers: tuple[tuple[Any, ...], ...]
  decouple_depth: int
  global_pool: bool = False
  padding: str = 'same'
  normalization: str = 'group'


_GROUP_PATTERN = re.compile(r'fed2_group(\d+)_')
_STACKED_PATTERN = re.compile(r'fed2_stacked_')


def class_groups(
  num_classes: int, num_groups: int, seed: int = 0
) -> list[list[int]]:
  """The classes of each group: a seeded permutation dealt round-robin."""
  if not 1 <= num_groups <= num_classes:
    raise ValueError(
      f'Fed2 groups must be in [1, {num_classes}] (the number '
      f'of classes), got {num_groups!r}.'
    )
  order = np.random.default_rng(seed).permutation(num_classes)
  return [
    sorted(int(c) for c in order[g::num_groups]) for g in range(num_groups)
  ]


def _layer(spec, width, name, padding, activation='relu'):
  if spec[0] == 'sep':
    return tf.keras.layers.SeparableConv2D(
      width, 3, spec[2], padding='same', activation=activation, name=name
    )
  if spec[0] == 'conv':
    return tf.keras.layers.Conv2D(
      width, spec[2], padding=padding, activation=activation, name=name
    )
  return tf.keras.layers.Dense(width, activation=activation, name=name)


# Group normalization's groups in a shared layer: Wu and He's 32, with at
# least `_MIN_CHANNELS_PER_NORM_GROUP` channels in each (a group of one
# channel on a small feature map normalizes away what the layer computed).
_SHARED_NORM_GROUPS = 32
_MIN_CHANNELS_PER_NORM_GROUP = 4


def _block(x, spec, width, name, padding, normalization, norm_groups=None):
  """One ReLU block. Convolutions get group normalization before the ReLU
  (`normalization='group'`, the paper's replacement of batch norm), over
  `norm_groups` groups of channels (by default the most groups, up to
  `_SHARED_NORM_GROUPS`, that divide `width` with at least
  `_MIN_CHANNELS_PER_NORM_GROUP` channels each); dense layers none."""
  if spec[0] == 'fc' or normalization == 'none':
    return _layer(spec, width, name, padding)(x)
  x = _layer(spec, width, name, padding, activation=None)(x)
  if norm_groups is None:
    norm_groups = max(
      [
        d
        for d in range(1, _SHARED_NORM_GROUPS + 1)
        if width % d == 0 and width // d >= _MIN_CHANNELS_PER_NORM_GROUP
      ]
      or [1]
    )
  x = tf.keras.layers.GroupNormalization(groups=norm_groups, name=f'{name}_gn')(
    x
  )
  return tf.keras.layers.ReLU()(x)


def _flattened_for(t, spec):
  """`t` flattened before a dense layer (`spec` 'fc'), else as it is."""
  if spec[0] == 'fc' and len(t.shape) > 2:
    return tf.keras.layers.Flatten()(t)
  return t


def _decoupled_layer(x, spec, i, grouped, num_groups, padding, normalization):
  """Layer `i` split into `num_groups` groups side by side; `grouped`: `x`
  holds the groups' blocks already (else every group reads all of it)."""
  width = math.ceil(spec[1] / num_groups)
  if spec[0] == 'fc':
    x = (
      grouped_layers.flatten_groups(x, num_groups)
      if grouped
      else (_flattened_for(x, spec))
    )
    return grouped_layers.GroupedDense(
      [width] * num_groups,
      grouped,
      activation='relu',
      name=f'fed2_groups_{i + 1}',
    )(x)
  branches = (
    grouped_layers.split_groups(x, num_groups)
    if grouped
    else ([x] * num_groups)
  )
  new = []
  for g, t in enumerate(branches):
    # One normalization group per Fed2 group: GN with G groups over the
    # layer, whose G channel blocks are the Fed2 groups.
    t = _block(
      t,
      spec,
      width,
      f'fed2_group{g}_{i + 1}',
      padding,
      normalization,
      norm_groups=1,
    )
    if spec[0] == 'conv' and spec[3]:
      t = tf.keras.layers.MaxPool2D(2, padding='same')(t)
    new.append(t)
  return grouped_layers.side_by_side(new)


def grouped_model(
  plan: LayerPlan,
  num_classes: int,
  input_shape: Sequence[int],
  num_groups: int = 10,
  decouple_depth: Optional[int] = None,
  seed: int = 0,
) -> tf.keras.Model:
  """The Fed2 form of the model `plan` describes, with named outputs.

  Args:
    plan: The model, layer by layer (the task zoo's are
      `tff_methods_tasks.models.fed2_plan(name, input_shape)`).
    num_classes: Number of classes.
    input_shape: Shape of one input.
    num_groups: G, 1..num_classes.
    decouple_depth: How many of the last layers (classifier included) are
      split into groups; the model's paper default if None.
    seed: Fixes the class -> group assignment.

  Returns:
    A Keras model with outputs `layer_k` (every layer; a decoupled layer's
    output is its groups' outputs side by side), `features` and `logits`.
  """
  name, padding, global_pool = plan.name, plan.padding, plan.global_pool
  if plan.normalization not in NORMALIZATIONS:
    raise ValueError(
      f'Fed2 normalization must be one of '
      f'{", ".join(NORMALIZATIONS)}, got '
      f'{plan.normalization!r}.'
    )
  depth = plan.decouple_depth if decouple_depth is None else decouple_depth
  layers = plan.layers  # (the classifier comes after them)
  if not 1 <= depth <= len(layers) + 1:
    raise ValueError(
      f'Fed2 decouple depth for {name} must be in [1, '
      f'{len(layers) + 1}] (its layers), got {depth!r}.'
    )
  groups = class_groups(num_classes, num_groups, seed)
  first_decoupled = len(layers) + 1 - depth  # index into layers

  inputs = tf.keras.Input(tuple(input_shape))
  x = inputs
  layer_outputs = []

  for i in range(first_decoupled):
    spec = layers[i]
    x = _flattened_for(x, spec)
    x = _block(x, spec, spec[1], f'shared_{i + 1}', padding, plan.normalization)
    if spec[0] == 'conv' and spec[3]:
      x = tf.keras.layers.MaxPool2D(2, padding='same')(x)
    layer_outputs.append(x)

  # Past the shared layers, `x` holds the groups' features side by side
  # (`grouped`), each group reading back only its own block.
  grouped = False
  for i in range(first_decoupled, len(layers)):
    x = _decoupled_layer(
      x, layers[i], i, grouped, num_groups, padding, plan.normalization
    )
    grouped = num_groups > 1
    layer_outputs.append(x)

  if global_pool and len(x.shape) > 2:
    # Per-channel means: each group keeps its own block.
    features = tf.keras.layers.GlobalAveragePooling2D()(x)
  else:
    features = (
      grouped_layers.flatten_groups(x, num_groups)
      if grouped
      else (_flattened_for(x, ('fc',)))
    )
  group_logits = grouped_layers.GroupedDense(
    [len(classes) for classes in groups], grouped, name='fed2_groups_logits'
  )(features)
  # Back to class order: where class c sits in the groups' concatenation.
  order = np.argsort([c for classes in groups for c in classes])
  logits = grouped_layers.GatherClasses(order, name='class_order')(group_logits)
  outputs = {f'layer_{k + 1}': t for k, t in enumerate(layer_outputs)}
  outputs['features'] = features
  outputs['logits'] = logits
  return tf.keras.Model(inputs, outputs, name=f'{name}_fed2')


STACKED = -2  # `tensor_groups` value of a tensor whose axis 0 is the group.


def tensor_groups(keras_model_fn: model_lib.KerasModelFn) -> list[int]:
  """For each trainable tensor: its group (0..G-1), -1 if shared, or
  `STACKED` if it holds every group's weights along axis 0."""
  return _groups_and_count(keras_model_fn)[0]


def _groups_and_count(keras_model_fn):
  """(`tensor_groups`, the model's number of groups G, 1 if ungrouped)."""
  # Built eagerly: building in a scratch tf.Graph would invalidate the
  # caller's eager Keras models.
  found, count = [], 1
  for v in keras_model_fn().trainable_variables:
    match = _GROUP_PATTERN.search(v.name)
    if _STACKED_PATTERN.search(v.name):
      found.append(STACKED)
      count = max(count, int(v.shape[0]))
    else:
      found.append(int(match.group(1)) if match else -1)
      count = max(count, found[-1] + 1)
  return found, count


def grouped_model_fn(
  plan: LayerPlan,
  num_classes: int,
  input_shape: Sequence[int],
  num_groups: int = 10,
  decouple_depth: Optional[int] = None,
  seed: int = 0,
) -> model_lib.KerasModelFn:
  """A no-arg builder of `grouped_model(...)`; checks the settings now."""
  fn = functools.partial(
    grouped_model,
    plan,
    num_classes,
    tuple(input_shape),
    num_groups,
    decouple_depth,
    seed,
  )
  fn()  # Raises on bad settings before any work starts.
  return fn


def build_fed2(
  keras_model_fn: model_lib.KerasModelFn,
  element_spec: Any,
  *,
  client_optimizer_fn: tff.learning.optimizers.Optimizer,
  num_groups: int = 10,
  server_optimizer_fn: Optional[tff.learning.optimizers.Optimizer] = None,
  dataset_computation: Optional[tff.Computation] = None,
  model_aggregator: Optional[aggregation.ModelAggregator] = None,
  metrics_aggregator: Optional[aggregation.MetricsAggregator] = None,
  client_weighting: Optional[aggregation.ClientWeighting] = None,
  loss_fn: Optional[local_training.LossFn] = None,
  client_learning_rate_fn: Optional[Callable[[Any], Any]] = None,
) -> tff.learning.templates.LearningProcess:
  """Builds Fed2 as a `tff.learning.templates.LearningProcess`.

  Fed2's paired averaging puts group g of every client at the same
  coordinates of the update, so a coordinate-wise mean pairs group g with
  group g (by examples: FedAvg on the grouped model). TFF's aggregators
  (robust, DP, compression, secure) keep the pairing.

  Args:
    keras_model_fn: Builds the grouped model (`grouped_model_fn(...)`) with
      the same `num_groups`; a model without grouped layers is
      refused.
    element_spec: The spec of one batch of client data.
    client_optimizer_fn: The client optimizer.
    num_groups: G.
    server_optimizer_fn: SGD with learning rate 1 by default.
    dataset_computation: A client's key -> its batches
      (`tff_methods_tasks.datasets.round_dataset_computation`), or a batched TFF
      `ClientData`; when given, `next` takes the clients' keys (ids for a
      `ClientData`) and each client makes its batches in its own computation.
    model_aggregator: TFF's model aggregator, weighted or unweighted
      (`tff.learning.robust_aggregator()`, `dp_aggregator(...)`, ...;
      `tff_methods.templates.aggregation`); the weighted mean by default.
    metrics_aggregator: TFF's metrics aggregator;
      `tff.learning.metrics.sum_then_finalize` by default.
    client_weighting: `tff.learning.ClientWeighting` or
      `aggregation.NumTokens()`; NUM_EXAMPLES by default, UNIFORM with an
      unweighted `model_aggregator`.
    loss_fn: The data term, `(labels, model outputs) -> scalar`;
      cross-entropy on `logits` by default.
    client_learning_rate_fn: Round number (from 0) -> the client learning
      rate, as TFF's `build_weighted_fed_avg_with_optimizer_schedule`; None
      for the client optimizer's own, which `get_hparams`/`set_hparams`
      read and set.

  Raises:
    ValueError: a model without grouped layers.
  """
  keras_model_fn, loss_fn = tff_models.keras_model_and_loss(
    keras_model_fn, loss_fn
  )
  groups_of_tensors, model_groups = _groups_and_count(keras_model_fn)
  if num_groups > 1 and all(g == -1 for g in groups_of_tensors):
    raise ValueError(
      f'Fed2 with num_groups={num_groups} needs its grouped model '
      '(fed2.grouped_model_fn); the given model has no grouped layers.'
    )
  if model_groups > 1 and model_groups != num_groups:
    raise ValueError(
      f'The model has {model_groups} groups but Fed2 was asked for '
      f'num_groups={num_groups}: pass num_groups={model_groups}, or build '
      f'the model with fed2.grouped_model_fn(..., num_groups={num_groups}).'
    )
  return processes.build_local_training_process(
    keras_model_fn,
    element_spec,
    client_optimizer_fn,
    server_optimizer_fn,
    model_aggregator=model_aggregator,
    client_weighting=client_weighting,
    dataset_computation=dataset_computation,
    metrics_aggregator=metrics_aggregator,
    loss_fn=loss_fn,
    client_learning_rate_fn=client_learning_rate_fn,
  )


def _build_from_hparams(
  keras_model_fn,
  element_spec,
  hparams,
  *,
  dataset_computation=None,
  loss_fn=None,
  tff_model_fn=None,
):
  del tff_model_fn  # Fed2 trains its own grouped Keras model.
  return build_fed2(
    keras_model_fn,
    element_spec,
    client_optimizer_fn=hparams.client_optimizer(),
    num_groups=hparams.settings_of(METHOD).groups,
    server_optimizer_fn=hparams.server_optimizer('sgd'),
    dataset_computation=dataset_computation,
    model_aggregator=hparams.model_aggregator(),
    client_weighting=hparams.weighting(),
    loss_fn=loss_fn,
  )


@dataclasses.dataclass(frozen=True)
class Settings:
  """Fed2's settings (flags `--fed2_<name>`)."""

  groups: int = method_spec.setting(10, 'G, the number of groups.', minimum=1)
  decouple_depth: Optional[int] = method_spec.setting(
    None,
    "How many final layers are grouped (default: the model's: 6 for VGG, "
    '4 for the FedCKA CNN).',
    minimum=1,
  )


def _grouped_model_fn(settings, hparams, layer_plan, num_classes, input_shape):
  return grouped_model_fn(
    LayerPlan(**layer_plan()),
    num_classes,
    input_shape,
    settings.groups,
    settings.decouple_depth,
    hparams.seed,
  )


METHOD = method_spec.MethodSpec(
  name='fed2',
  display_name='Fed2',
  settings=Settings,
  model_fn=_grouped_model_fn,
  build=_build_from_hparams,
)
