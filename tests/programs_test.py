"""Every method under TFF's own program logic
(`tff.learning.programs.train_model`).

The project's client data is a `tff.program.FederatedDataSource`
(`tff_methods_tasks.datasets.ClientRoundDataSource`); program state goes through
`tff.program.FileProgramStateManager`, metrics and the model through release
managers. A run interrupted mid-round and resumed ends with the uninterrupted
run's weights and client states.
"""

import asyncio
import os
import sys

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_methods.algorithms import methods
from tff_methods.clients import client_keys
from tff_methods.clients import client_states
from tff_methods.clients import state_files
from tff_methods.execution import in_process
from tff_methods.execution import runtime
from tff_methods.templates import model_lib
from tff_methods_tasks import datasets
from tff_methods_tooling import experiment

pytestmark = pytest.mark.usefixtures('tff_worker')

ROUNDS = 3
# A model each method can train (MOON needs `z`, Fed2 a model to group).
MODELS = {'moon': 'fedcka_cnn', 'fed2': 'fedcka_cnn'}


def _config(method, output_dir, cache_dir):
  return experiment.ExperimentConfig(
    method=method,
    model=MODELS.get(method, 'mlp'),
    task='digits',
    num_clients=4,
    clients_per_round=2,
    local_epochs=1,
    batch_size=32,
    fed2_groups=2,
    cache_dir=cache_dir,
    seed=3,
    output_dir=output_dir,
  )


def _diverged(output):
  # The project's rejection of a non-finite round (TFF retries it).
  return not model_lib.all_finite(output.state.global_model_weights)


def _train_model(
  process, data, root, total_rounds, keras_model_fn, sync_context=None
):
  state_manager = tff.program.FileProgramStateManager(
    os.path.join(root, 'program_state')
  )
  if hasattr(process, 'client_states'):
    # Writes the clients' states with each checkpoint (from memory, for a
    # process built in-process), and prunes what no checkpoint needs.
    state_manager = client_states.PruningProgramStateManager(
      state_manager, process.client_states
    )
  model_output = tff.program.MemoryReleaseManager()
  metrics = tff.program.MemoryReleaseManager()
  initial = process.set_model_weights(
    process.initialize(), model_lib.initial_weights(keras_model_fn, 3)
  )
  # Not asyncio.run: it would clear the thread's event loop for later tests.
  with tff.framework.get_context_stack().install(
    runtime.create_program_context(sync_context)
  ):
    asyncio.new_event_loop().run_until_complete(
      tff.learning.programs.train_model(
        train_process=process,
        initial_train_state=initial,
        train_data_source=datasets.ClientRoundDataSource(
          data.client_data.client_ids, seed=3
        ),
        train_per_round_clients=2,
        train_total_rounds=total_rounds,
        should_discard_round=_diverged,
        program_state_manager=state_manager,
        model_output_manager=model_output,
        train_metrics_manager=metrics,
        evaluation_manager=None,
        evaluation_periodicity=1,
      )
    )
  released = list(model_output.values().values())
  return (
    model_lib.flat_trainable(released[-1][0]) if released else None,
    metrics,
  )


@pytest.fixture(scope='module')
def cache_dir(tmp_path_factory):
  return str(tmp_path_factory.mktemp('cache'))


# TFF's FedOpt algorithms are `tff_fedavg` with another server optimizer.
# Every component and every kind of server state once: the combinations
# carry FedProx, FedCos and the momentum and Adam server optimizers (Yogi's
# state is Adam's), and every stateful or standalone method runs itself.
_PROGRAM_METHODS = (
  'fedadam+fedcos',
  'fedavgm+fedcos',
  'fedprox+fedcos',
  'fedmax',
  'moon',
  'fedcka',
  'scaffold',
  'fed2',
  'tff_fedavg',
)


def test_the_program_methods_cover_every_method():
  covered = {p for m in _PROGRAM_METHODS for p in methods.parse_method(m)}
  left = set(methods.SINGLE_METHODS) - covered - set(methods.TFF_ALGORITHMS)
  assert left <= {'fedavg', 'fedyogi'}, left


@pytest.mark.parametrize('method', _PROGRAM_METHODS)
def test_train_model_runs_and_resumes_every_method(method, cache_dir, tmp_path):
  runs = {}
  for name in ('whole', 'resumed'):
    config = _config(method, str(tmp_path / name), cache_dir)
    data = experiment.load_data(config)
    runs[name] = (data,) + experiment.build_process(config, data)
    if not methods.is_stateful(method):
      # Without client states the same process serves both runs.
      runs['resumed'] = runs['whole']
      break
  data, process, keras_model_fn = runs['whole']
  assert isinstance(process, tff.learning.templates.LearningProcess)
  whole, metrics = _train_model(
    process, data, str(tmp_path / 'whole'), ROUNDS, keras_model_fn
  )
  assert sorted(metrics.values()) == list(range(1, ROUNDS + 1))

  data, process, keras_model_fn = runs['resumed']
  root = str(tmp_path / 'resumed')
  # Round 1; then round 2 runs and writes its clients' states, and the
  # program dies before saving it; the rerun resumes from round 1.
  _train_model(process, data, root, 1, keras_model_fn)
  iterator = datasets.ClientRoundDataSource(
    data.client_data.client_ids, seed=3
  ).iterator()
  iterator.select(2)
  lost = process.next(process.initialize(), iterator.select(2))
  del lost
  resumed, _ = _train_model(process, data, root, ROUNDS, keras_model_fn)
  np.testing.assert_allclose(resumed, whole, rtol=1e-5, atol=1e-6)
  if hasattr(process, 'client_states'):
    whole_states = runs['whole'][1].client_states
    for client_id in data.client_data.client_ids:
      for a, b in zip(
        tf.nest.flatten(process.client_states.get(client_id)),
        tf.nest.flatten(whole_states.get(client_id)),
      ):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_train_model_in_process_resumes_and_equals_the_worker(
  cache_dir, tmp_path
):
  # In this process (no worker behind it): SCAFFOLD, whose clients keep
  # state and whose server keeps c. Built under the in-process context,
  # its clients' states stay in memory and reach the disk with each
  # checkpoint; a new process (a resumed program) reads them from there.
  context = in_process.InProcessExecutionContext(['cpu:0'], fallback_fn=None)

  def build(name, in_process_context):
    config = _config('scaffold', str(tmp_path / name), cache_dir)
    data = experiment.load_data(config)
    if in_process_context is None:
      return (data,) + experiment.build_process(config, data)
    with tff.framework.get_context_stack().install(in_process_context):
      return (data,) + experiment.build_process(config, data)

  data, process, keras_model_fn = build('worker', None)
  assert not process.client_states.in_memory
  on_worker, _ = _train_model(
    process, data, str(tmp_path / 'worker'), ROUNDS, keras_model_fn
  )
  data, process, keras_model_fn = build('whole', context)
  assert process.client_states.in_memory
  whole, metrics = _train_model(
    process, data, str(tmp_path / 'whole'), ROUNDS, keras_model_fn, context
  )
  assert sorted(metrics.values()) == list(range(1, ROUNDS + 1))
  np.testing.assert_allclose(whole, on_worker, rtol=1e-5, atol=1e-6)

  root = str(tmp_path / 'resumed')
  data, process, keras_model_fn = build('resumed', context)
  _train_model(process, data, root, 1, keras_model_fn, context)
  on_disk = process.client_states.directory
  assert state_files.has_client_states(on_disk)
  data, process, keras_model_fn = build('resumed', context)
  resumed, _ = _train_model(
    process, data, root, ROUNDS, keras_model_fn, context
  )
  np.testing.assert_array_equal(resumed, whole)
  assert context.on_fallback == []


def test_an_in_process_run_resumed_without_its_states_on_disk_is_refused(
  cache_dir, tmp_path
):
  context = in_process.InProcessExecutionContext(['cpu:0'], fallback_fn=None)
  config = _config('scaffold', str(tmp_path / 'run'), cache_dir)
  data = experiment.load_data(config)
  with tff.framework.get_context_stack().install(context):
    process, _ = experiment.build_process(config, data)
  ids = data.client_data.client_ids[:2]
  with pytest.raises(
    ValueError, match='were never written to .*' 'PruningProgramStateManager'
  ):
    process.next(
      process.initialize(), [client_keys.client_key(c, 3) for c in ids]
    )


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
