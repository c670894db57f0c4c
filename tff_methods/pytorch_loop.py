"""FedAvg of the FedCKA CNN as a plain PyTorch loop: the reference code's way.

The FedCKA, MOON and NIID-Bench reference implementations train clients
with a PyTorch loop like this one. `binaries/benchmark` times it beside
`benchmark.PlainTFFedAvg` (the same local training in plain TensorFlow) and
FedAvg through TFF, so the project's speed can be judged against the code
researchers would otherwise run.

It computes what `benchmark.PlainTFFedAvg` computes for `fedcka_cnn`: every
client starts from the global weights, takes momentum-SGD steps
(m = momentum * m + g; w -= lr * m, which is `torch.optim.SGD` with
dampening 0) on shuffled in-memory batches, and the new global weights are
the example-weighted mean of the clients' weights.

PyTorch is optional (not in requirements.txt: its Linux wheels pull several
GB of CUDA libraries): `available()` says whether it imports, and the
benchmark reports the PyTorch figure as not measured when it does not.
"""

import time
from typing import Optional, Sequence

import numpy as np


def available() -> bool:
  """Whether PyTorch imports in this environment."""
  try:
    import torch  # pylint: disable=g-import-not-at-top,unused-import
  except Exception:  # pylint: disable=broad-except
    # Not installed, or installed without the CUDA libraries it links to.
    return False
  return True


def _fedcka_cnn(num_classes: int, input_shape: Sequence[int]):
  """`tasks.models.fedcka_cnn` ('valid' convs, 32x32 inputs) in PyTorch."""
  import torch  # pylint: disable=g-import-not-at-top
  from torch import nn  # pylint: disable=g-import-not-at-top

  height, width, channels = input_shape
  if min(height, width) < 20:
    raise ValueError(f'input_shape={tuple(input_shape)}: the PyTorch CNN '
                     'uses valid convs and needs inputs of at least 20x20.')
  # Sizes after conv5 (valid) and 2x2 pooling (ceil, as Keras' 'same').
  size = lambda n: -(-(n - 4) // 2)
  flat = 32 * size(size(height)) * size(size(width))

  class FedCKACNN(nn.Module):

    def __init__(self):
      super().__init__()
      self.conv1 = nn.Conv2d(channels, 16, 5)
      self.conv2 = nn.Conv2d(16, 32, 5)
      self.pool = nn.MaxPool2d(2, ceil_mode=True)
      self.dense = nn.ModuleList([nn.Linear(flat, 120), nn.Linear(120, 84),
                                  nn.Linear(84, 84)])
      self.projection = nn.Linear(84, 256)
      self.classifier = nn.Linear(256, num_classes)

    def forward(self, x):
      x = self.pool(torch.relu(self.conv1(x)))
      x = self.pool(torch.relu(self.conv2(x)))
      # Flatten in Keras' (H, W, C) order, so Keras weights load unchanged.
      x = x.permute(0, 2, 3, 1).flatten(1)
      for layer in self.dense:
        x = torch.relu(layer(x))
      return self.classifier(self.projection(x))

  return FedCKACNN()


def _from_keras(weights: Sequence[np.ndarray]) -> list[np.ndarray]:
  """Keras kernels (HWIO conv, IO dense) in PyTorch's layout (OIHW, OI)."""
  converted = []
  for w in weights:
    if w.ndim == 4:
      w = w.transpose(3, 2, 0, 1)
    elif w.ndim == 2:
      w = w.T
    converted.append(np.ascontiguousarray(w))
  return converted


def _to_keras(weights: Sequence[np.ndarray]) -> list[np.ndarray]:
  converted = []
  for w in weights:
    if w.ndim == 4:
      w = w.transpose(2, 3, 1, 0)
    elif w.ndim == 2:
      w = w.T
    converted.append(np.ascontiguousarray(w))
  return converted


class PyTorchFedAvg:
  """FedAvg of the FedCKA CNN, clients trained by a plain PyTorch loop.

  Clients are `(x, y)` numpy arrays, x in (N, H, W, C) as in TensorFlow;
  `global_weights` are in Keras' order and layout, so the result can be
  compared with `benchmark.PlainTFFedAvg` and TFF's FedAvg.
  """

  def __init__(self, clients, num_classes: int, local_epochs: int,
               batch_size: int, learning_rate: float, momentum: float,
               seed: int = 0,
               initial_weights: Optional[Sequence[np.ndarray]] = None):
    import torch  # pylint: disable=g-import-not-at-top
    self._torch = torch
    torch.manual_seed(seed)
    self._model = _fedcka_cnn(num_classes, clients[0][0].shape[1:])
    self._params = list(self._model.parameters())
    self._optimizer = torch.optim.SGD(self._params, lr=learning_rate,
                                      momentum=momentum)
    # NCHW tensors made once: the loop reads batches from memory.
    self._clients = [
        (torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2))),
         torch.from_numpy(y.astype(np.int64).reshape(-1)))
        for x, y in clients]
    self._local_epochs = local_epochs
    self._batch_size = batch_size
    self._rng = np.random.default_rng(seed)
    if initial_weights is not None:
      self._global = _from_keras(initial_weights)
    else:
      self._global = [p.detach().numpy().copy() for p in self._params]

  @property
  def global_weights(self) -> list[np.ndarray]:
    return _to_keras(self._global)

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
          batch = order[i:i + self._batch_size]
          self._optimizer.zero_grad(set_to_none=True)
          loss_fn(self._model(x[batch]), y[batch]).backward()
          self._optimizer.step()
      for acc, p in zip(weighted, self._params):
        acc += len(y) * p.detach().numpy()
      total += len(y)
    self._global = [w / total for w in weighted]


def round_seconds(clients, num_classes: int, local_epochs: int,
                  batch_size: int, learning_rate: float, momentum: float,
                  repeats: int = 3, seed: int = 0) -> list[float]:
  """Seconds per `PyTorchFedAvg` round, per repeat, after a warm-up round."""
  loop = PyTorchFedAvg(clients, num_classes, local_epochs, batch_size,
                       learning_rate, momentum, seed)
  loop.run_round()
  seconds = []
  for _ in range(repeats):
    start = time.perf_counter()
    loop.run_round()
    seconds.append(time.perf_counter() - start)
  return seconds
