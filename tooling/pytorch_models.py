"""A chain-shaped Keras model as data, and the same network in PyTorch.

`layer_plan` reads a model of `tff_methods_tasks.models` (Conv2D,
MaxPooling2D, Flatten and Dense layers in a chain, such as `fedcka_cnn`) into
data another interpreter can read; `torch_model` builds it there, with the
weights in Keras' order and `relayout` moving them between the two layouts.
`pytorch_loop` trains it. Imports only numpy at its top (torch where it
runs), so it runs in an interpreter with torch and without the project.
"""

from typing import Sequence

import numpy as np

# Keras layers the PyTorch loop can build, by class name.
_PLAN_LAYERS = ('Conv2D', 'MaxPooling2D', 'Flatten', 'Dense')


def layer_plan(keras_model) -> dict:
  """A chain-shaped Keras model as data the PyTorch interpreter can build.

  The architecture stays defined once, in `tff_methods_tasks.models`: this reads
  the layers on the path from the input to `logits` (Conv2D, MaxPooling2D,
  Flatten, Dense) and `torch_model` builds the same network in PyTorch.
  `outputs` maps each named output on that path (`layer_k`, `features`, `z`,
  `logits`) to the index of the layer that gives it, for the methods that
  read them. Needs no TensorFlow import of its own: it reads the model's
  layers and configs.

  Raises:
    ValueError: for a model that is not such a chain (e.g. a ResNet).
  """
  layers = []
  named = keras_model.output
  if not isinstance(named, dict):
    named = {'logits': named}
  outputs = {}
  previous = keras_model.layers[0]
  for layer in keras_model.layers[1:]:
    kind = type(layer).__name__
    if kind not in _PLAN_LAYERS or layer.input is not previous.output:
      raise ValueError(
        f'The PyTorch loop builds chains of {", ".join(_PLAN_LAYERS)}; '
        f'{keras_model.name!r} has {kind} {layer.name!r}'
        + (' off the chain' if kind in _PLAN_LAYERS else '')
        + '.'
      )
    previous = layer
    config = layer.get_config()
    entry = dict(
      kind=kind,
      padding=config.get('padding'),
      activation=config.get('activation'),
    )
    if kind == 'Conv2D':
      if tuple(config['strides']) != (1, 1) or tuple(
        config['dilation_rate']
      ) != (1, 1):
        raise ValueError(
          f'{layer.name}: the PyTorch loop builds stride-1, '
          'undilated convolutions only.'
        )
      entry.update(
        filters=config['filters'], kernel_size=list(config['kernel_size'])
      )
    elif kind == 'MaxPooling2D':
      entry.update(
        pool_size=list(config['pool_size']), strides=list(config['strides'])
      )
    elif kind == 'Dense':
      entry.update(units=config['units'])
    for name, tensor in named.items():
      if tensor is layer.output:
        outputs[name] = len(layers)
    layers.append(entry)
  return dict(
    name=keras_model.name,
    input_shape=list(keras_model.input_shape[1:]),
    layers=layers,
    outputs=outputs,
  )


def torch_model(plan: dict):
  """The network of `layer_plan` in PyTorch (NCHW inputs); its parameters
  are in Keras' weight order. A copy (`copy.deepcopy`) is a model of its
  own: each layer runs the module the model holds."""
  import torch
  from torch import nn

  activations = {None: None, 'linear': None, 'relu': torch.relu}
  height, width, channels = plan['input_shape']
  shape = [channels, height, width]
  modules, kinds = nn.ModuleList(), []
  for layer in plan['layers']:
    kind = layer['kind']
    if kind == 'Conv2D':
      module = nn.Conv2d(
        shape[0],
        layer['filters'],
        layer['kernel_size'],
        padding=layer['padding'],
      )
    elif kind == 'MaxPooling2D':
      if layer['padding'] == 'same' and layer['pool_size'] != layer['strides']:
        raise ValueError(
          'The PyTorch loop builds "same" pooling only with '
          'the pool size as stride (ceil mode).'
        )
      module = nn.MaxPool2d(
        layer['pool_size'],
        layer['strides'],
        ceil_mode=layer['padding'] == 'same',
      )
    elif kind == 'Flatten':
      module = nn.Flatten()
    else:
      module = nn.Linear(shape[0], layer['units'])
    if layer['activation'] not in activations:
      raise ValueError(
        f'The PyTorch loop has no {layer["activation"]!r} ' 'activation.'
      )
    modules.append(module)
    # Flatten in Keras' (H, W, C) order, so its weights load as they are.
    kinds.append((activations[layer['activation']], kind == 'Flatten'))
    with torch.no_grad():
      shape = list(_apply(module, *kinds[-1], torch.zeros([1] + shape)).shape)
      shape = shape[1:]
  named = plan.get('outputs') or {'logits': len(kinds) - 1}

  class KerasChain(nn.Module):
    def __init__(self):
      super().__init__()
      self.layers = modules

    def forward(self, x):
      return self.outputs(x, ('logits',))['logits']

    def outputs(self, x, names):
      """The named outputs `names` of `x`, running the layers only as far
      as the deepest of them (FedCKA's first layers need no more)."""
      found = {}
      last = max(named[n] for n in names)
      for index, (module, kind) in enumerate(zip(self.layers, kinds)):
        x = _apply(module, *kind, x)
        found.update((n, x) for n in names if named[n] == index)
        if index == last:
          return found

  return KerasChain()


def _apply(module, activation, channels_last, x):
  """`module` on `x`, permuted to NHWC first if `channels_last`, its output
  through `activation` if any."""
  x = module(x.permute(0, 2, 3, 1) if channels_last else x)
  return x if activation is None else activation(x)


# Conv kernels: Keras' HWIO <-> PyTorch's OIHW; dense kernels are transposed.
KERAS_TO_TORCH_CONV = (3, 2, 0, 1)
TORCH_TO_KERAS_CONV = (2, 3, 1, 0)


def relayout(
  weights: Sequence[np.ndarray], conv_axes: Sequence[int]
) -> list[np.ndarray]:
  """Kernels moved between Keras' and PyTorch's layouts; biases as they are."""
  return [
    np.ascontiguousarray(
      w.transpose(conv_axes) if w.ndim == 4 else w.T if w.ndim == 2 else w
    )
    for w in weights
  ]
