"""Whether, where and how fast the in-process context runs the methods.

For each method, a few rounds on the digits task run twice from the same
initial model: on TFF's worker and in this process on the devices asked for
(`tff_methods.execution.in_process`). A row says how far apart the two runs'
weights ended, the seconds per round of each, where the in-process clients'
nodes ran (TensorFlow's step stats, first round), and which ops of the clients'
graphs have no GPU kernel (beside the host's input pipeline and files).
"""

import dataclasses
import os
import statistics
import tempfile
import time
from typing import Optional, Sequence

import numpy as np
import tensorflow_federated as tff

from tff_methods.algorithms import methods
from tff_methods.clients import client_keys
from tff_methods.execution import devices as devices_lib
from tff_methods.execution import in_process
from tff_methods.execution import runtime
from tff_methods.templates import model_lib
from tff_methods_tasks import models as task_models
from tff_methods_tooling import experiment

# Models the methods can train on digits (MOON reads a projection `z`, Fed2
# groups its model); the rest take the small MLP.


def _model_for(method: str) -> str:
  """The digits MLP, or the FedCKA CNN for a method that reads an output
  the MLP lacks (MOON's `z`) or trains its own form of a model (Fed2)."""
  if methods.trains_own_form(method) or not methods.reads_outputs(
    method
  ) <= set(task_models.output_names('mlp')):
    return 'fedcka_cnn'
  return 'mlp'


EVERY_METHOD = tuple(
  m for m in methods.SINGLE_METHODS if m not in methods.TFF_ALGORITHMS
) + ('tff_fedavg',)


@dataclasses.dataclass
class Row:
  """One method's check."""

  method: str
  relative_difference: float  # max |w_in - w_worker| / max |w_worker|
  worker_seconds: float  # per round, median of the rounds after the first
  in_process_seconds: float
  # {assigned device: {device that ran nodes: nodes}}, the first round.
  placement: dict
  # {assigned device: {op type: nodes}} that ran off it and don't belong
  # on the host (`devices.runs_on_host`); empty: every step on its device.
  off_device_ops: dict
  # Ops of the clients' graphs with no GPU kernel, but the host's.
  without_gpu_kernel: list
  metrics_equal: bool
  clients_per_round: int
  # Computations of the method's process the in-process context could not
  # compile (sent to its worker).
  on_fallback: list


def _config(method: str, output_dir: str, cache_dir: str, num_clients: int):
  return experiment.ExperimentConfig(
    method=method,
    model=_model_for(method),
    task='digits',
    num_clients=num_clients,
    clients_per_round=num_clients,
    local_epochs=1,
    batch_size=32,
    fed2_groups=2,
    cache_dir=cache_dir,
    seed=0,
    output_dir=output_dir,
  )


def run_rounds(process, context, initial, ids, rounds, trace_first=False):
  """`rounds` rounds of `process` in `context` from `initial` weights, all
  of `ids` in each: (final flat weights, last metrics, each round's
  seconds); with `trace_first`, the first round's placement is traced."""
  seconds = []
  with tff.framework.get_context_stack().install(context):
    state = process.set_model_weights(process.initialize(), initial)
    for round_num in range(1, rounds + 1):
      if trace_first:
        # The first round (compiling, not timed) shows the placement.
        context.trace = round_num == 1
      keys = [client_keys.client_key(c, round_num) for c in ids]
      start = time.perf_counter()
      output = process.next(state, keys)
      seconds.append(time.perf_counter() - start)
      state = output.state
    weights = model_lib.flat_trainable(process.get_model_weights(state))
  return weights, output.metrics, seconds


def _metrics_equal(a, b) -> bool:
  flat_a, flat_b = tff.structure.flatten(a), tff.structure.flatten(b)
  return len(flat_a) == len(flat_b) and all(
    np.allclose(x, y, rtol=1e-4, atol=1e-6) for x, y in zip(flat_a, flat_b)
  )


def check_methods(
  method_names: Sequence[str],
  context: in_process.InProcessExecutionContext,
  worker_context,
  rounds: int = 2,
  num_clients: int = 4,
  work_dir: Optional[str] = None,
):
  """Yields a `Row` per method (rounds >= 2: the first compiles)."""
  work_dir = work_dir or tempfile.mkdtemp(prefix='device_check_')
  cache_dir = os.path.join(work_dir, 'cache')
  for method in method_names:
    runs = {}
    fallen_back = len(context.on_fallback)
    for path, ctx in (('worker', worker_context), ('in_process', context)):
      # A process each for the stateful ones, built in their path's context
      # (in-process, their clients' states stay in memory); one serves
      # both paths otherwise.
      if path == 'worker' or methods.is_stateful(method):
        config = _config(
          method, os.path.join(work_dir, method, path), cache_dir, num_clients
        )
        data = experiment.load_data(config)
        with tff.framework.get_context_stack().install(ctx):
          process, keras_model_fn = experiment.build_process(config, data)
        initial = model_lib.initial_weights(keras_model_fn, seed=0)
      runs[path] = run_rounds(
        process,
        ctx,
        initial,
        data.client_data.client_ids[:num_clients],
        rounds,
        trace_first=path == 'in_process',
      )
    context.trace = False
    (worker, worker_metrics, worker_s), (ours, our_metrics, our_s) = (
      runs['worker'],
      runs['in_process'],
    )
    round_fn = getattr(process.next, '_computation', process.next)
    yield Row(
      method=method,
      relative_difference=float(
        np.max(np.abs(ours - worker)) / max(np.max(np.abs(worker)), 1e-12)
      ),
      worker_seconds=statistics.median(worker_s[1:] or worker_s),
      in_process_seconds=statistics.median(our_s[1:] or our_s),
      placement=context.placement(round_fn),
      off_device_ops=context.off_device_ops(round_fn),
      without_gpu_kernel=sorted(context.ops_without_gpu_kernel(round_fn)),
      metrics_equal=_metrics_equal(worker_metrics, our_metrics),
      clients_per_round=num_clients,
      on_fallback=context.on_fallback[fallen_back:],
    )


def on_own_device(placement: dict) -> dict:
  """{assigned device: the share of its clients' nodes that ran on it}."""
  return {
    device: ran.get(device, 0) / max(sum(ran.values()), 1)
    for device, ran in placement.items()
  }


def report(devices: Sequence[str], rows: Sequence[Row]) -> str:
  """The check's table, and the devices found."""
  lines = [
    'devices found: ' + ', '.join(devices_lib.available_devices()),
    "clients' devices: " + ', '.join(devices),
    '',
    'Sent to the worker (not compiled in-process): '
    + (
      '; '.join(f'{r.method}: {c}' for r in rows for c in r.on_fallback)
      or 'nothing'
    ),
    '',
    '| method | worker s/round | in-process s/round | ratio | in-process '
    'clients/s per device | max rel. weight difference | metrics equal | '
    "clients' nodes on their device | ops without a GPU kernel |",
    '|---|---|---|---|---|---|---|---|---|',
  ]
  for row in rows:
    share = on_own_device(row.placement)
    per_device = row.clients_per_round / row.in_process_seconds / len(devices)
    lines.append(
      f'| {row.method} | {row.worker_seconds:.3f} | '
      f'{row.in_process_seconds:.3f} | '
      f'{row.in_process_seconds / row.worker_seconds:.2f} | '
      f'{per_device:.3g} | '
      f'{row.relative_difference:.1e} | {"yes" if row.metrics_equal else "NO"}'
      ' | '
      + ', '.join(f'{d.split("device:")[-1]} {s:.0%}' for d, s in share.items())
      + f' | {", ".join(row.without_gpu_kernel) or "none"} |'
    )
  return '\n'.join(lines)


def worker_context():
  """The worker every row is compared with."""
  return runtime.create_local_execution_context(max_concurrent_clients=2)
