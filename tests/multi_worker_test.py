"""Several TFF workers on loopback: the results of one, and clear errors.

Two packaged workers are started on 127.0.0.1 ports; TFF's mergeable-
computation context (`runtime.create_remote_execution_context`) splits each
round's clients between them. Every method must give the single-worker
weights to float tolerance.
"""

import asyncio
import os
import stat
import subprocess
import sys

from absl import flags
from absl.testing import flagsaver
import numpy as np
import portpicker
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_methods.clients import client_keys
from tff_methods.execution import runtime
from tff_methods.execution import workers
from tff_methods.templates import model_lib
from tff_methods_binaries import runtime_flags
from tff_methods_tasks import datasets
from tff_methods_tooling import experiment

pytestmark = [pytest.mark.usefixtures('tff_worker'), pytest.mark.slow]

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROUNDS = 2
# Method, and a model it runs on (MOON needs a projection `z`, Fed2 a model
# it can group). Every server rule and kind of client work once: TFF's
# builder (fedavg, fedadam's server state), the shared loop with a
# regularizer (fedprox+fedcos; fedcos keeps server state), each stateful
# method and Fed2. (All twelve methods were checked this way when the
# runtime landed; fedavgm, fedyogi, fedprox and fedmax add no other shape.)
# One method of each way a round's clients are split over workers: the
# shared loop without and with server state, SCAFFOLD's, the stateful
# loop's (on a model of each size), Fed2's.
METHODS = [
  ('fedavg', 'mlp'),
  ('fedcos', 'mlp'),
  ('scaffold', 'mlp'),
  ('fedcka', 'mlp'),
  ('moon', 'fedcka_cnn'),
  ('fed2', 'fedcka_cnn'),
]


def _start_workers(count):
  started = [
    workers.start_worker(max_concurrent_computation_calls=2)
    for _ in range(count)
  ]
  return [p for p, _ in started], [f'127.0.0.1:{port}' for _, port in started]


def _stop(processes):
  for process in processes:
    process.kill()
    process.wait()


@pytest.fixture(scope='module')
def two_workers():
  processes, addresses = _start_workers(2)
  yield addresses
  _stop(processes)


@pytest.fixture(scope='module')
def cache_dir(tmp_path_factory):
  return str(tmp_path_factory.mktemp('cache'))


def _config(method, model, cache_dir, **overrides):
  settings = dict(
    method=method,
    model=model,
    task='digits',
    num_clients=4,
    clients_per_round=4,
    rounds=ROUNDS,
    local_epochs=1,
    batch_size=32,
    cache_dir=cache_dir,
    seed=0,
    output_dir=os.path.join(cache_dir, 'unused'),
  )
  settings.update(overrides)
  return experiment.ExperimentConfig(**settings)


def _run_rounds(process, keras_model_fn, client_ids):
  # A run from round 1 reads no state an earlier run wrote: round r reads
  # the versions written before r, which this run rewrites first.
  state = process.initialize()
  state = process.set_model_weights(
    state, model_lib.initial_weights(keras_model_fn, seed=0)
  )
  for round_num in range(1, ROUNDS + 1):
    # Every round its own batches: the same on one worker or two.
    state = process.next(
      state, [client_keys.client_key(c, round_num) for c in client_ids]
    ).state
  return process.get_model_weights(state).trainable


@pytest.mark.parametrize('method,model', METHODS)
def test_two_workers_give_the_single_worker_weights(
  method, model, two_workers, cache_dir
):
  config = _config(method, model, cache_dir)
  data = experiment.load_data(config)
  process, keras_model_fn = experiment.build_process(config, data)
  client_ids = data.client_data.client_ids
  # The conftest's local worker first, then the two loopback workers.
  single = _run_rounds(process, keras_model_fn, client_ids)
  remote = runtime.create_remote_execution_context(two_workers)
  with tff.framework.get_context_stack().install(remote):
    split = _run_rounds(process, keras_model_fn, client_ids)
  moved = max(np.abs(np.asarray(a)).max() for a in single)
  assert moved > 0
  for a, b in zip(single, split):
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)


def _train_model_weights(
  process, keras_model_fn, client_ids, root, sync_context
):
  model_output = tff.program.MemoryReleaseManager()
  initial = process.set_model_weights(
    process.initialize(), model_lib.initial_weights(keras_model_fn, 0)
  )
  with tff.framework.get_context_stack().install(
    runtime.create_program_context(sync_context)
  ):
    asyncio.new_event_loop().run_until_complete(
      tff.learning.programs.train_model(
        train_process=process,
        initial_train_state=initial,
        train_data_source=datasets.ClientRoundDataSource(client_ids),
        train_per_round_clients=4,
        train_total_rounds=ROUNDS,
        program_state_manager=tff.program.FileProgramStateManager(root),
        model_output_manager=model_output,
        evaluation_manager=None,
        evaluation_periodicity=1,
      )
    )
  return model_lib.flat_trainable(list(model_output.values().values())[-1][0])


@pytest.mark.parametrize(
  'method,model', [('moon', 'fedcka_cnn'), ('scaffold', 'mlp')]
)
def test_train_model_on_two_workers_gives_the_single_worker_weights(
  method, model, two_workers, cache_dir, tmp_path
):
  config = _config(method, model, cache_dir)
  data = experiment.load_data(config)
  process, keras_model_fn = experiment.build_process(config, data)
  client_ids = data.client_data.client_ids
  single = _train_model_weights(
    process,
    keras_model_fn,
    client_ids,
    str(tmp_path / 'single'),
    tff.framework.get_context_stack().current,
  )
  split = _train_model_weights(
    process,
    keras_model_fn,
    client_ids,
    str(tmp_path / 'split'),
    runtime.create_remote_execution_context(two_workers),
  )
  assert np.abs(single).max() > 0
  np.testing.assert_allclose(split, single, rtol=1e-5, atol=1e-6)


def test_a_computation_with_two_aggregations_is_named_not_mergeable(
  two_workers,
):
  @tff.tensorflow.computation(np.float32, np.float32)
  def add(x, y):
    return x + y

  @tff.federated_computation(tff.FederatedType(np.float32, tff.CLIENTS))
  def sum_twice(values):
    total = tff.federated_broadcast(tff.federated_sum(values))
    return tff.federated_sum(tff.federated_map(add, (values, total)))

  assert sum_twice([1.0, 2.0]) == pytest.approx(9.0)  # One worker: fine.
  remote = runtime.create_remote_execution_context(two_workers)
  with tff.framework.get_context_stack().install(remote):
    with pytest.raises(
      runtime.NotMergeableError,
      match="does not compile to TFF's mergeable form",
    ):
      sum_twice([1.0, 2.0])


def test_a_worker_dying_mid_run_is_named_and_the_run_resumes(
  tmp_path, cache_dir
):
  processes, addresses = _start_workers(2)
  try:
    config = _config(
      'fedavg',
      'mlp',
      cache_dir,
      rounds=3,
      rounds_per_checkpoint=1,
      output_dir=str(tmp_path / 'split'),
    )

    def kill_second_worker(round_num, metrics):
      del metrics
      if round_num == 1:
        processes[1].kill()
        processes[1].wait()

    remote = runtime.create_remote_execution_context(
      addresses, timeout_seconds=3
    )
    with tff.framework.get_context_stack().install(remote):
      with pytest.raises(
        RuntimeError, match=f'TFF worker at {addresses[1]} is not ' 'reachable'
      ):
        experiment.run(config, progress=False, round_hook=kill_second_worker)
      # Round 1's program state was saved before the worker died: with the
      # worker back, the same run resumes from it.
      processes[1], _ = workers.start_worker(
        port=int(addresses[1].rpartition(':')[2])
      )
      resumed = experiment.run(config, progress=False)
    assert resumed['rounds'] == 3
  finally:
    _stop(processes)
  uninterrupted = experiment.run(
    _config(
      'fedavg', 'mlp', cache_dir, rounds=3, output_dir=str(tmp_path / 'single')
    ),
    progress=False,
  )
  for a, b in zip(
    uninterrupted['final_weights'].trainable, resumed['final_weights'].trainable
  ):
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)


def test_addresses_and_worker_binaries_are_checked():
  assert runtime_flags.parse_worker_addresses(
    ' a:1,127.0.0.1:8000, [::1]:9 '
  ) == ['a:1', '127.0.0.1:8000', '[::1]:9']
  for bad, message in (
    ('localhost', 'not host:port'),
    ('localhost:0', 'not host:port'),
    ('h:70000', 'not host:port'),
    ('127.0.0.1::80', 'not host:port'),
    ('http://h:80', 'not host:port'),
    ('h:1,', 'empty entry'),
    ('h:1,h:1', 'more than once'),
    (',', 'names no'),
  ):
    with pytest.raises(ValueError, match=message):
      runtime_flags.parse_worker_addresses(bad)
  with pytest.raises(ValueError, match='/no/such/worker.*not an executable'):
    workers.check_worker_binary('/no/such/worker')


def _train(tmp_path, *flags):
  return subprocess.run(
    [
      sys.executable,
      '-m',
      'binaries.train',
      '--task=digits',
      '--model=mlp',
      '--num_clients=4',
      '--clients_per_round=4',
      '--rounds=1',
      f'--cache_dir={tmp_path / "cache"}',
      '--noprogress',
      f'--output_dir={tmp_path / "run"}',
      *flags,
    ],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=600,
    check=False,
  )


def test_train_binary_runs_on_the_given_workers(two_workers, tmp_path):
  result = _train(tmp_path, f'--tff_workers={",".join(two_workers)}')
  assert result.returncode == 0, result.stderr
  assert 'fedavg on digits: round 1' in result.stdout


def test_train_binary_names_a_bad_or_unreachable_worker(tmp_path):
  # (A malformed address is refused by the flag's parser, tested above.)
  result = _train(
    tmp_path, '--tff_workers=127.0.0.1:1', '--tff_worker_binary=/bin/true'
  )
  assert result.returncode == 2
  assert '--tff_worker_binary starts a local worker' in result.stderr
  # A port nobody listens on is named, with the command to start a worker
  # there: not the mid-run message about a round.
  port = portpicker.pick_unused_port()
  result = _train(tmp_path, f'--tff_workers=127.0.0.1:{port}')
  assert result.returncode == 2
  assert result.stderr.strip().splitlines() == [
    f'--tff_workers: No TFF worker serves at 127.0.0.1:{port} (for 10 s: '
    'Connection refused). Start one there, then run again; nothing has run '
    f'yet. (On 127.0.0.1: python -m binaries.worker --port={port})'
  ]
  assert not (tmp_path / 'run').exists()  # Nothing ran.


def test_tff_worker_binary_is_the_worker_started(tmp_path):
  marker = tmp_path / 'started_by_wrapper'
  wrapper = tmp_path / 'my_worker'
  wrapper.write_text(
    f'#!/bin/sh\necho "$@" > {marker}\n'
    f'exec {workers.packaged_worker_binary()} "$@"\n'
  )
  wrapper.chmod(wrapper.stat().st_mode | stat.S_IEXEC)
  result = _train(tmp_path, f'--tff_worker_binary={wrapper}')
  assert result.returncode == 0, result.stderr
  # The wrapper ran, with the worker's flags, and training went through it.
  assert '--port=' in marker.read_text()
  assert 'fedavg on digits: round 1' in result.stdout


def test_auto_runs_in_process_on_the_split_cpu_unless_workers_are_named():
  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()
  assert not tf.config.list_physical_devices('GPU')  # This machine: no GPU.
  with flagsaver.flagsaver(execution='auto', max_concurrent_clients=3):
    execution, devices, why = runtime_flags.choose_execution()
  # The benchmark's figures put the split CPU ahead of the worker here.
  assert runtime_flags.IN_PROCESS_FASTER_ON_CPU
  assert (execution, devices) == ('in_process', ['cpu:0', 'cpu:1', 'cpu:2'])
  assert 'no GPU' in why
  with flagsaver.flagsaver(execution='auto', devices=['cpu:0']):
    assert runtime_flags.choose_execution()[:2] == ('in_process', ['cpu:0'])
  for settings in (
    dict(tff_workers=['127.0.0.1:8000']),
    dict(tff_worker_binary='/bin/true'),
    dict(execution='worker'),
  ):
    with flagsaver.flagsaver(**settings):
      assert runtime_flags.choose_execution()[:2] == ('worker', None)


@pytest.mark.parametrize(
  'settings, says',
  [
    (dict(execution='in_process', devices=['tpu:0']), "'tpu:0' is not a"),
    (
      dict(execution='worker', devices=['cpu:0']),
      '--devices is for rounds in this process; this run uses the worker '
      '(--execution=worker)',
    ),
    (
      dict(tff_workers=['127.0.0.1:8000'], deterministic=True),
      '--deterministic is for rounds in this process; this run uses the '
      'worker (auto: --tff_workers names running workers)',
    ),
    (
      dict(execution='in_process', tff_workers=['127.0.0.1:8000']),
      '--execution=in_process runs rounds in this process; --tff_workers',
    ),
  ],
)
def test_execution_flags_are_checked_together(settings, says):
  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()
  with flagsaver.flagsaver(**settings):
    errors = runtime_flags.check()
  assert any(says in e for e in errors), errors
  with flagsaver.flagsaver(execution='in_process', devices=['cpu:0', 'gpu:1']):
    assert runtime_flags.check() == []


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
