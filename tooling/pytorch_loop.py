"""FedAvg as a plain PyTorch loop: the reference code's way.

The FedCKA, MOON and NIID-Bench reference implementations train clients
with a PyTorch loop like this one. `binaries/benchmark` times it beside
`plain_loops.PlainTFFedAvg` (the same local training in plain TensorFlow) and
FedAvg through TFF, so the project's speed can be judged against the code
researchers would otherwise run.

It computes what `plain_loops.PlainTFFedAvg` computes for a chain-shaped model
of `tff_methods_tasks.models` (such as `fedcka_cnn`), built in PyTorch from the
Keras model's layers (`layer_plan`): every client starts from the global
weights, takes momentum-SGD steps (m = momentum * m + g; w -= lr * m, which is
`torch.optim.SGD` with dampening 0) on shuffled in-memory batches, and the new
global weights are the example-weighted mean of the clients' weights.

PyTorch is optional and not in requirements.txt: its Linux wheels pull
several GB of CUDA libraries, and current releases need newer packages
than TensorFlow 2.14 allows (typing-extensions). So the loop runs in an
interpreter of its own, which may be another virtual environment's
(`run_in`: the clients go over in an .npz file, the seconds come back as
JSON and the final weights in another .npz); this module imports only
numpy at its top.

  python -m tff_methods_tooling.pytorch_loop --clients=clients.npz \
      --model_plan=plan.json
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Callable, Optional, Sequence

import numpy as np

# The loop runs as this file, in the other interpreter: it imports nothing of
# the project, so it runs from a repository or an installed package alike.
_THIS_FILE = os.path.abspath(__file__)


def torch_import_error(python: str) -> Optional[str]:
  """None if `python` imports torch, else the reason (last error line)."""
  try:
    result = subprocess.run(
      [python, '-c', 'import torch'],
      capture_output=True,
      text=True,
      timeout=300,
    )
  except OSError as e:
    return f'{python} does not run: {e}'
  if result.returncode == 0:
    return None
  lines = result.stderr.strip().splitlines()
  return f'{python} cannot import torch: {lines[-1] if lines else "?"}'


# Keras layers the PyTorch loop can build, by class name.
_PLAN_LAYERS = ('Conv2D', 'MaxPooling2D', 'Flatten', 'Dense')


def layer_plan(keras_model) -> dict:
  """A chain-shaped Keras model as data the PyTorch interpreter can build.

  The architecture stays defined once, in `tff_methods_tasks.models`: this reads
  the layers on the path from the input to `logits` (Conv2D, MaxPooling2D,
  Flatten, Dense; side outputs such as `layer_k` or `z` are on that path or
  ignored) and `_torch_model` builds the same network in PyTorch. Needs no
  TensorFlow import of its own: it reads the model's layers and configs.

  Raises:
    ValueError: for a model that is not such a chain (e.g. a ResNet).
  """
  layers = []
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
    layers.append(entry)
  return dict(
    name=keras_model.name,
    input_shape=list(keras_model.input_shape[1:]),
    layers=layers,
  )


def _torch_model(plan: dict):
  """The network of `layer_plan` in PyTorch (NCHW inputs); its parameters
  are in Keras' weight order."""
  import torch
  from torch import nn

  activations = {None: None, 'linear': None, 'relu': torch.relu}
  height, width, channels = plan['input_shape']
  shape = [channels, height, width]
  modules, steps = nn.ModuleList(), []
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
    steps.append(
      _step(
        module,
        activations[layer['activation']],
        channels_last=kind == 'Flatten',
      )
    )
    with torch.no_grad():
      shape = list(steps[-1](torch.zeros([1] + shape)).shape[1:])

  class KerasChain(nn.Module):
    def __init__(self):
      super().__init__()
      self.layers = modules

    def forward(self, x):
      return _run(steps, x)

  return KerasChain()


def _step(module, activation, channels_last=False):
  """`module` as one step: its input permuted to NHWC first if
  `channels_last`, its output through `activation` if any."""

  def step(x):
    x = module(x.permute(0, 2, 3, 1) if channels_last else x)
    return x if activation is None else activation(x)

  return step


def _run(steps, x):
  for step in steps:
    x = step(x)
  return x


# Conv kernels: Keras' HWIO <-> PyTorch's OIHW; dense kernels are transposed.
_KERAS_TO_TORCH_CONV = (3, 2, 0, 1)
_TORCH_TO_KERAS_CONV = (2, 3, 1, 0)


def _relayout(
  weights: Sequence[np.ndarray], conv_axes: Sequence[int]
) -> list[np.ndarray]:
  """Kernels moved between Keras' and PyTorch's layouts; biases as they are."""
  return [
    np.ascontiguousarray(
      w.transpose(conv_axes) if w.ndim == 4 else w.T if w.ndim == 2 else w
    )
    for w in weights
  ]


class PyTorchFedAvg:
  """FedAvg of a `layer_plan` model, clients trained by a plain PyTorch loop.

  Clients are `(x, y)` numpy arrays, x in (N, H, W, C) as in TensorFlow;
  `global_weights` are in Keras' order and layout, so the result can be
  compared with `plain_loops.PlainTFFedAvg` and TFF's FedAvg.
  """

  def __init__(
    self,
    clients,
    model_plan: dict,
    local_epochs: int,
    batch_size: int,
    learning_rate: float,
    momentum: float,
    seed: int = 0,
    initial_weights: Optional[Sequence[np.ndarray]] = None,
  ):
    import torch

    self._torch = torch
    torch.manual_seed(seed)
    self._model = _torch_model(model_plan)
    self._params = list(self._model.parameters())
    self._optimizer = torch.optim.SGD(
      self._params, lr=learning_rate, momentum=momentum
    )
    # NCHW tensors made once: the loop reads batches from memory.
    self._clients = [
      (
        torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2))),
        torch.from_numpy(y.astype(np.int64).reshape(-1)),
      )
      for x, y in clients
    ]
    self._local_epochs = local_epochs
    self._batch_size = batch_size
    self._rng = np.random.default_rng(seed)
    if initial_weights is not None:
      self._global = _relayout(initial_weights, _KERAS_TO_TORCH_CONV)
    else:
      self._global = [p.detach().numpy().copy() for p in self._params]

  @property
  def global_weights(self) -> list[np.ndarray]:
    return _relayout(self._global, _TORCH_TO_KERAS_CONV)

  def run_round(self) -> None:
    torch = self._torch
    loss_fn = torch.nn.functional.cross_entropy
    total = 0
    weighted = [np.zeros_like(w) for w in self._global]
    for x, y in self._clients:
      with torch.no_grad():
        for p, w in zip(self._params, self._global):
          p.copy_(torch.from_numpy(w))
      self._optimizer.state.clear()  # Each client's momentum starts at 0.
      for _ in range(self._local_epochs):
        order = torch.from_numpy(self._rng.permutation(len(y)))
        for i in range(0, len(y), self._batch_size):
          batch = order[i : i + self._batch_size]
          self._optimizer.zero_grad(set_to_none=True)
          loss_fn(self._model(x[batch]), y[batch]).backward()
          self._optimizer.step()
      for acc, p in zip(weighted, self._params):
        acc += len(y) * p.detach().numpy()
      total += len(y)
    self._global = [w / total for w in weighted]


def time_rounds(run_round: Callable[[], None], repeats: int) -> list[float]:
  """Seconds of each of `repeats` calls of `run_round`, after a warm-up one."""
  run_round()
  seconds = []
  for _ in range(repeats):
    start = time.perf_counter()
    run_round()
    seconds.append(time.perf_counter() - start)
  return seconds


def run_in(
  python: str,
  clients,
  model_plan: dict,
  local_epochs: int,
  batch_size: int,
  learning_rate: float,
  momentum: float,
  repeats: int = 3,
  seed: int = 0,
  initial_weights: Optional[Sequence[np.ndarray]] = None,
) -> tuple[list[float], list[np.ndarray]]:
  """`PyTorchFedAvg` timed by the interpreter `python` (one with torch).

  Args:
    python: Path of a Python interpreter that imports torch and numpy.
    clients: Each client's (x, y) numpy arrays, x in (N, H, W, C).
    model_plan: The model, `layer_plan` of a Keras model.
    local_epochs: Local epochs per round.
    batch_size: Local batch size.
    learning_rate: Client SGD learning rate.
    momentum: Client SGD momentum.
    repeats: Timed rounds, after one untimed warm-up round.
    seed: Fixes the initialization (if no `initial_weights`) and shuffling.
    initial_weights: Global weights to start from, in Keras' order and
      layout.

  Returns:
    The seconds of each timed round, and the global weights after the last
    round (Keras' order and layout).

  Raises:
    RuntimeError: if that interpreter fails; the message has its stderr.
  """
  with tempfile.TemporaryDirectory() as tmp:
    clients_path = os.path.join(tmp, 'clients.npz')
    weights_in = os.path.join(tmp, 'initial_weights.npz')
    weights_out = os.path.join(tmp, 'final_weights.npz')
    plan_path = os.path.join(tmp, 'model_plan.json')
    with open(plan_path, 'w') as f:
      json.dump(model_plan, f)
    np.savez(
      clients_path,
      **{f'x{i}': x for i, (x, _) in enumerate(clients)},
      **{f'y{i}': y for i, (_, y) in enumerate(clients)},
    )
    command = [
      python,
      _THIS_FILE,
      f'--clients={clients_path}',
      f'--model_plan={plan_path}',
      f'--local_epochs={local_epochs}',
      f'--batch_size={batch_size}',
      f'--learning_rate={learning_rate}',
      f'--momentum={momentum}',
      f'--repeats={repeats}',
      f'--seed={seed}',
      f'--weights_out={weights_out}',
    ]
    if initial_weights is not None:
      _save_weights(weights_in, initial_weights)
      command.append(f'--initial_weights={weights_in}')
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
      raise RuntimeError(f'{" ".join(command)} failed:\n{result.stderr}')
    seconds = json.loads(result.stdout.strip().splitlines()[-1])['seconds']
    return seconds, _load_weights(weights_out)


def _save_weights(path: str, weights: Sequence[np.ndarray]) -> None:
  np.savez(path, **{f'w{i}': np.asarray(w) for i, w in enumerate(weights)})


def _load_weights(path: str) -> list[np.ndarray]:
  with np.load(path) as arrays:
    return [arrays[f'w{i}'] for i in range(len(arrays.files))]


def _load_clients(path: str):
  with np.load(path) as arrays:
    count = len([k for k in arrays.files if k.startswith('x')])
    return [(arrays[f'x{i}'], arrays[f'y{i}']) for i in range(count)]


def main(argv: Optional[Sequence[str]] = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument(
    '--clients',
    required=True,
    help='.npz with x0, y0, x1, y1, ... (x as NHWC).',
  )
  parser.add_argument(
    '--model_plan', required=True, help='.json of layer_plan(keras_model).'
  )
  parser.add_argument('--local_epochs', type=int, default=5)
  parser.add_argument('--batch_size', type=int, default=64)
  parser.add_argument('--learning_rate', type=float, default=0.01)
  parser.add_argument('--momentum', type=float, default=0.9)
  parser.add_argument(
    '--repeats',
    type=int,
    default=3,
    help='Timed rounds after one warm-up round.',
  )
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument(
    '--initial_weights', help='.npz of w0, w1, ... ' '(Keras order and layout).'
  )
  parser.add_argument(
    '--weights_out', help='Where the final global weights go (.npz).'
  )
  args = parser.parse_args(argv)
  with open(args.model_plan) as f:
    model_plan = json.load(f)
  loop = PyTorchFedAvg(
    _load_clients(args.clients),
    model_plan,
    args.local_epochs,
    args.batch_size,
    args.learning_rate,
    args.momentum,
    args.seed,
    initial_weights=(
      _load_weights(args.initial_weights) if args.initial_weights else None
    ),
  )
  seconds = time_rounds(loop.run_round, args.repeats)
  if args.weights_out:
    _save_weights(args.weights_out, loop.global_weights)
  print(json.dumps(dict(seconds=seconds)))
  return 0


if __name__ == '__main__':
  sys.exit(main())
