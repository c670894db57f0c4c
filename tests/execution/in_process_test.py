"""The in-process execution context (`tff_methods.execution.in_process`).

Every method's rounds run in-process on the CPU split into two logical
devices (`binaries.device_check`, one subprocess: the split must happen
before TensorFlow starts) and equal the worker's; each device's clients run
on it; no op of a client's graph lacks a GPU kernel but the host's. The
rest runs in this test process on its one CPU.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_methods.execution import in_process
from tff_methods.templates import model_lib
from tff_methods_tooling import device_check

REPO = os.path.dirname(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)
DEVICES = ('/device:CPU:0', '/device:CPU:1')


@pytest.fixture(scope='module')
def rows(tmp_path_factory):
  """`binaries.device_check`'s rows for every method, 2 rounds, 4 clients
  on 2 logical CPU devices."""
  output = tmp_path_factory.mktemp('device_check') / 'rows.json'
  result = subprocess.run(
    [
      sys.executable,
      '-m',
      'binaries.device_check',
      '--devices=cpu:0,cpu:1',
      '--methods=' + ','.join(device_check.EVERY_METHOD),
      '--rounds=2',
      f'--json_output={output}',
    ],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=900,
    check=False,
  )
  assert result.returncode == 0, result.stderr[-3000:]
  assert "clients' devices: /device:CPU:0, /device:CPU:1" in result.stdout
  return {row['method']: row for row in json.loads(output.read_text())}


def test_the_check_covers_the_projects_methods_and_tffs_fedavg():
  assert len(device_check.EVERY_METHOD) == 12
  assert 'tff_fedavg' in device_check.EVERY_METHOD
  assert {'fed2', 'scaffold', 'moon', 'fedcka'} <= set(
    device_check.EVERY_METHOD
  )


@pytest.mark.slow
def test_every_method_in_process_equals_the_worker_on_its_devices(rows):
  # One test over every method's row (not one per method: pytest-xdist
  # would run the module's fixture again in each process taking one).
  wrong = {}
  for method in device_check.EVERY_METHOD:
    row = rows[method]
    # Nothing went to the worker: the rounds, initialize and the weights'
    # getters and setters all ran in-process. Both devices trained
    # clients, each on itself: whatever ran elsewhere is the input
    # pipeline, the state files and their plumbing, on the host.
    checks = {
      'weights': row['relative_difference'] < 1e-5,
      'metrics': row['metrics_equal'],
      'fallback': row['on_fallback'] == [],
      'devices': all(
        row['placement'].get(device, {}).get(device, 0) > 0
        for device in DEVICES
      ),
      'placement': row['off_device_ops'] == {},
      'host': set(row['placement'].get(DEVICES[1], {})) <= set(DEVICES),
      'kernels': row['without_gpu_kernel'] == [],
    }
    failed = [name for name, ok in checks.items() if not ok]
    if failed:
      wrong[method] = (failed, row)
  assert not wrong, wrong


@tff.tensorflow.computation(np.int32)
def _double(x):
  return x * 2


@tff.federated_computation(tff.FederatedType(np.int32, tff.CLIENTS))
def _double_on_clients(values):
  # Clients in and out: not a round of MapReduceForm.
  return tff.federated_map(_double, values)


@tff.federated_computation(
  tff.FederatedType(np.int32, tff.SERVER),
  tff.FederatedType(np.int32, tff.CLIENTS),
)
def _sum_round(state, values):
  total = tff.federated_sum(tff.federated_map(_double, values))
  new_state = tff.federated_map(
    tff.tensorflow.computation(lambda s, t: s + t), (state, total)
  )
  return new_state, total


def test_a_round_runs_in_process_and_sums_clients_from_every_device():
  context = in_process.InProcessExecutionContext(['cpu:0'], fallback_fn=None)
  with tff.framework.get_context_stack().install(context):
    state, total = _sum_round(10, [1, 2, 3, 4, 5])
  assert (state, total) == (40, 30)
  assert context.on_fallback == []


def test_a_traced_round_times_its_clients_ops_by_type_without_the_loop():
  context = in_process.InProcessExecutionContext(['cpu:0'], fallback_fn=None)
  with tff.framework.get_context_stack().install(context):
    _sum_round(10, [1, 2, 3])
    assert context.op_micros(_sum_round) == {'/device:CPU:0': {}}
    context.trace = True
    _sum_round(10, [1, 2, 3])
  (op_micros,) = context.op_micros(_sum_round).values()
  # The clients' doubling (Mul) and the running sum (AddV2), in the
  # device's loop (lowered to the executor's control flow).
  assert {'Mul', 'AddV2', 'LoopCond'} <= set(op_micros)
  assert all(micros >= 0 for micros in op_micros.values())


@tff.federated_computation(
  tff.FederatedType(np.float32, tff.SERVER),
  tff.FederatedType(np.float32, tff.CLIENTS),
)
def _float_sum_round(state, values):
  return state, tff.federated_sum(values)


@pytest.mark.parametrize('clients_per_call', [1, 2, 100])
def test_a_devices_clients_are_summed_in_their_order_whatever_the_calls(
  clients_per_call,
):
  context = in_process.InProcessExecutionContext(
    ['cpu:0'], fallback_fn=None, clients_per_call=clients_per_call
  )
  # In float32, in this order: 1e8 + 1 is 1e8, less 1e8 is 0, + 1 is 1; any
  # other order of the same clients gives 0 or 2.
  with tff.framework.get_context_stack().install(context):
    _, total = _float_sum_round(0.0, [1e8, 1.0, -1e8, 1.0])
  assert total == 1.0


def test_clients_per_call_below_one_is_refused_naming_it():
  with pytest.raises(ValueError, match=r'clients_per_call=0 must be >= 1'):
    in_process.InProcessExecutionContext(['cpu:0'], clients_per_call=0)


def test_what_does_not_compile_fails_in_one_line_or_goes_to_the_fallback():
  context = in_process.InProcessExecutionContext(['cpu:0'], fallback_fn=None)
  with tff.framework.get_context_stack().install(context):
    with pytest.raises(
      in_process.NotRunnableError,
      match=r'^in_process: \(\{int32\}@CLIENTS -> \{int32\}@CLIENTS\) '
      r'compiles neither .* run it with the worker',
    ):
      _double_on_clients([1, 2])

  calls = []

  class Fallback(tff.framework.SyncContext):
    def invoke(self, comp, arg):
      calls.append(comp.type_signature)
      return [2 * v for v in arg]

  context = in_process.InProcessExecutionContext(
    ['cpu:0'], fallback_fn=Fallback
  )
  with tff.framework.get_context_stack().install(context):
    assert _double_on_clients([1, 2]) == [2, 4]
    assert _double_on_clients([3]) == [6]  # The fallback made once.
  assert len(calls) == 2
  assert context.on_fallback == [str(_double_on_clients.type_signature)]


@pytest.mark.usefixtures('tff_worker')
def test_tffs_aggregators_run_in_process():
  # TFF's FedAvg on a tiny model under each of TFF's aggregator families,
  # 2 rounds of 3 clients, in this process and on the worker. DP's noise
  # differs between the runs; the rest is deterministic (compression's
  # rounding is seeded by its state, and leaves small tensors alone).
  def model_fn():
    keras_model = tf.keras.Sequential(
      [tf.keras.Input((4,)), tf.keras.layers.Dense(3)]
    )
    return tff.learning.models.from_keras_model(
      keras_model,
      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      input_spec=(
        tf.TensorSpec([None, 4], tf.float32),
        tf.TensorSpec([None], tf.int32),
      ),
    )

  rng = np.random.default_rng(0)
  clients = [
    tf.data.Dataset.from_tensor_slices(
      (
        rng.normal(size=(8, 4)).astype(np.float32),
        rng.integers(0, 3, 8).astype(np.int32),
      )
    ).batch(4)
    for _ in range(3)
  ]
  context = in_process.InProcessExecutionContext(['cpu:0'], fallback_fn=None)
  optimizer = tff.learning.optimizers.build_sgdm(0.1)
  for name, factory in (
    ('robust', tff.learning.robust_aggregator()),
    ('secure', tff.learning.secure_aggregator()),
    ('dp', tff.learning.dp_aggregator(0.1, clients_per_round=3)),
    ('compression', tff.learning.compression_aggregator()),
  ):
    # DP's factory is unweighted, the others weighted.
    build = (
      tff.learning.algorithms.build_unweighted_fed_avg
      if name == 'dp'
      else tff.learning.algorithms.build_weighted_fed_avg
    )
    process = build(
      model_fn, client_optimizer_fn=optimizer, model_aggregator=factory
    )
    weights = {}
    for path, ctx in (
      ('worker', tff.framework.get_context_stack().current),
      ('in_process', context),
    ):
      with tff.framework.get_context_stack().install(ctx):
        state = process.initialize()
        for _ in range(2):
          state = process.next(state, clients).state
        weights[path] = model_lib.flat_trainable(
          process.get_model_weights(state)
        )
    assert np.all(np.isfinite(weights['in_process'])), name
    difference = np.max(np.abs(weights['in_process'] - weights['worker']))
    if name == 'dp':  # The same model, moved by noise of a small size.
      assert 0 < difference < 0.5, name
    else:
      assert difference < 1e-5, name
  assert context.on_fallback == []


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
