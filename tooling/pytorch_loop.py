"""Every method as a plain PyTorch loop: the reference code's way.

The FedCKA, MOON and NIID-Bench reference implementations train clients
with a PyTorch loop like this one. `binaries/benchmark` times it, for FedAvg
and for each method (`pytorch_methods`: its objective and state as its
reference code has them, state in memory), beside the project's processes
and `plain_loops.PlainTFFedAvg`, so the project's speed can be judged
against the code researchers would otherwise run.

The model is a chain-shaped model of `tff_methods_tasks.models` (such as
`fedcka_cnn`), built in PyTorch from the Keras model's layers
(`pytorch_models`): every client starts from the global weights, takes
momentum-SGD steps (m = momentum * m + g; w -= lr * m, `torch.optim.SGD`
with dampening 0) on shuffled in-memory batches, and the new global weights
are the mean of the clients' weights, as the method averages them.

PyTorch is optional and not in requirements.txt: its Linux wheels pull
several GB of CUDA libraries, and current releases need newer packages
than TensorFlow 2.14 allows (typing-extensions). So the loop runs in an
interpreter of its own, which may be another virtual environment's
(`run_in`: the clients go over in an .npz file, the seconds come back as
JSON and the final weights in another .npz); this module imports only
numpy at its top.

  python -m tff_methods_tooling.pytorch_loop --clients=clients.npz \
      --model_plan=plan.json --method=fedprox --method_settings='{"mu": 0.01}'
"""

import argparse
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Callable, Optional, Sequence

import numpy as np

try:
  from tff_methods_tooling import pytorch_methods
  from tff_methods_tooling import pytorch_models
except ImportError:  # Run as a file by an interpreter without the project:
  # the siblings are on its path (this file's directory).
  pytorch_methods = importlib.import_module('pytorch_methods')
  pytorch_models = importlib.import_module('pytorch_models')

# The loop runs as this file, in the other interpreter: it imports nothing of
# the project but its sibling `pytorch_methods` (from this file's directory
# there), so it runs from a repository or an installed package alike.
_THIS_FILE = os.path.abspath(__file__)


def default_python() -> str:
  """The interpreter that runs the loops unless one is named:
  $TFF_METHODS_PYTORCH_PYTHON, else `make pytorch-setup`'s .venv/torch in
  the working directory, else this one."""
  named = os.environ.get('TFF_METHODS_PYTORCH_PYTHON')
  if named:
    return named
  made = os.path.join('.venv', 'torch', 'bin', 'python')
  return os.path.abspath(made) if os.path.exists(made) else sys.executable


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


class PyTorchFederation:
  """A method of `pytorch_methods` over a `layer_plan` model, its clients
  trained by a plain PyTorch loop: FedAvg's by default.

  Clients are `(x, y)` numpy arrays, x in (N, H, W, C) as in TensorFlow; all
  take part in every round. `global_weights` are in Keras' order and layout,
  so the result can be compared with `plain_loops.PlainTFFedAvg` and the
  project's processes. Every client starts from the global weights and
  takes momentum-SGD steps (m = momentum * m + g; w -= lr * m, which is
  `torch.optim.SGD` with dampening 0; its momentum starts at 0) on
  shuffled in-memory batches; the new global weights are the
  example-weighted mean of the clients' weights (the plain mean where the
  method averages uniformly, as SCAFFOLD by default).
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
    method: str = 'fedavg',
    method_settings: Optional[dict] = None,
  ):
    import torch

    self._torch = torch
    torch.manual_seed(seed)
    self._method = pytorch_methods.twin(
      method, method_settings, len(clients), learning_rate
    )
    self._model = pytorch_models.torch_model(model_plan)
    self._global_model = pytorch_models.torch_model(model_plan)
    self._global_model.requires_grad_(False)
    self._params = list(self._model.parameters())
    self._optimizer = torch.optim.SGD(
      self._params,
      lr=learning_rate,
      momentum=momentum if self._method.momentum else 0.0,
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
      self._global = pytorch_models.relayout(
        initial_weights, pytorch_models.KERAS_TO_TORCH_CONV
      )
    else:
      self._global = [p.detach().numpy().copy() for p in self._params]

  @property
  def global_weights(self) -> list[np.ndarray]:
    return pytorch_models.relayout(
      self._global, pytorch_models.TORCH_TO_KERAS_CONV
    )

  def run_round(self) -> None:
    torch = self._torch
    method = self._method
    loss_fn = torch.nn.functional.cross_entropy
    reads = ('logits',) + tuple(method.reads)
    with torch.no_grad():
      for p, w in zip(self._global_model.parameters(), self._global):
        p.copy_(torch.from_numpy(w))
    method.start_round(list(self._global_model.parameters()))
    total = 0
    weighted = [np.zeros_like(w) for w in self._global]
    for client, (x, y) in enumerate(self._clients):
      with torch.no_grad():
        for p, w in zip(self._params, self._global):
          p.copy_(torch.from_numpy(w))
      self._optimizer.state.clear()  # Each client's momentum starts at 0.
      method.start_client(client, self._model, self._global_model)
      steps = 0
      for _ in range(self._local_epochs):
        order = torch.from_numpy(self._rng.permutation(len(y)))
        for i in range(0, len(y), self._batch_size):
          batch = order[i : i + self._batch_size]
          self._optimizer.zero_grad(set_to_none=True)
          outputs = self._model.outputs(x[batch], reads)
          loss = method.loss(
            loss_fn(outputs['logits'], y[batch]),
            outputs,
            x[batch],
            self._params,
          )
          loss.backward()
          self._optimizer.step()
          method.after_step(self._params)
          steps += 1
      method.end_client(client, self._params, steps)
      weight = 1 if method.uniform else len(y)
      for acc, p in zip(weighted, self._params):
        acc += weight * p.detach().numpy()
      total += weight
    self._global = [w / total for w in weighted]
    method.end_round([torch.from_numpy(w) for w in self._global])


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
  method: str = 'fedavg',
  method_settings: Optional[dict] = None,
) -> tuple[list[float], list[np.ndarray]]:
  """`PyTorchFederation` timed by the interpreter `python` (one with torch).

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
    method: The method (`pytorch_methods.TWINS`), FedAvg by default.
    method_settings: Its settings, as `dataclasses.asdict` gives the
      project's (`{'mu': 0.01}` for FedProx).

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
      f'--method={method}',
      f'--method_settings={json.dumps(method_settings or {})}',
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
  parser.add_argument(
    '--method',
    default='fedavg',
    choices=sorted(pytorch_methods.TWINS),
    help='The method whose reference loop runs.',
  )
  parser.add_argument(
    '--method_settings',
    default='{}',
    type=json.loads,
    help='Its settings as JSON, e.g. {"mu": 0.01}.',
  )
  args = parser.parse_args(argv)
  with open(args.model_plan) as f:
    model_plan = json.load(f)
  loop = PyTorchFederation(
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
    method=args.method,
    method_settings=args.method_settings,
  )
  seconds = time_rounds(loop.run_round, args.repeats)
  if args.weights_out:
    _save_weights(args.weights_out, loop.global_weights)
  print(json.dumps(dict(seconds=seconds)))
  return 0


if __name__ == '__main__':
  sys.exit(main())
