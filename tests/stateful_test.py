"""Tests for per-client state (tff_methods.stateful): MOON and FedCKA as
processes.

The TFF computations are built once per module.
"""

import collections
import dataclasses
import functools
import os
import sys

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tasks import datasets
from tasks import models
from tff_methods import batches_in_memory
from tff_methods import client_keys
from tff_methods import client_states
from tff_methods import fedavg
from tff_methods import fedcka
from tff_methods import local_training
from tff_methods import methods
from tff_methods import model_lib
from tff_methods import moon
from tff_methods import optimizers
from tff_methods import reference_outputs
from tff_methods import regularizers
from tooling import experiment
from tooling import training_loop

pytestmark = pytest.mark.usefixtures('tff_worker')


def _indexed_digits_like(epochs, batch_size=4):
  x = np.random.default_rng(2).normal(size=(10, 8, 8, 1)).astype(np.float32)
  dataset = tf.data.Dataset.from_tensor_slices(
    collections.OrderedDict(x=x, y=np.zeros(10, np.int32))
  )
  return datasets.LocalBatches(
    batch_size, local_epochs=epochs, with_index=True
  )(dataset)


class _CountingView:
  """A reference view that counts the examples it computes outputs for."""

  def __init__(self, view):
    self._view = view
    self.computed = tf.Variable(0)

  def __getattr__(self, name):
    return getattr(self._view, name)

  def __call__(self, x):
    self.computed.assign_add(tf.shape(x)[0])
    return self._view(x)


@pytest.mark.parametrize(
  'max_mb,batch_size,chunk_max,expected_computed',
  [
    # 3 passes of 10 examples in batches of 4 (8 batches, 30 examples): the
    # first 3 batches hold every example (batch 3 spans passes 1 and 2);
    # only first occurrences are computed, so 10 examples, each once, in
    # one chunk; the rest is read back.
    (1.0, 4, 512, 10),
    # The same in chunks of a batch (4, 4 and 2 examples).
    (1.0, 4, 1, 10),
    # Fewer examples than a batch: the first batch of 16 holds 6 examples
    # twice; they are computed once (10, not 16).
    (1.0, 16, 512, 10),
    # Tables too large for the cap: computed at every step.
    (0.0, 4, 512, 30),
  ],
)
# Batches read from a data set, or slices of the round's examples (the
# project's own clients).
@pytest.mark.parametrize('sliced', [False, True])
def test_reference_outputs_are_computed_once_per_example(
  max_mb, batch_size, chunk_max, expected_computed, sliced, monkeypatch
):
  monkeypatch.setattr(
    reference_outputs, 'REFERENCE_CHUNK_MAX_EXAMPLES', chunk_max
  )
  model_fn = functools.partial(
    models.get_model, 'mlp', 10, (8, 8, 1), hidden=(16, 8)
  )
  view = _CountingView(
    reference_outputs.ReferenceView(model_fn, ('layer_1', 'layer_2'))
  )
  one_round = _round_reading_tables(view, max_mb, sliced)
  for _ in range(2):  # A second round computes its own tables.
    # Equal up to float rounding (an example's row computed in another
    # batch).
    assert one_round(_indexed_digits_like(3, batch_size)).numpy() < 1e-5
    assert view.computed.numpy() == expected_computed


def _round_reading_tables(view, max_mb=1.0, sliced=False):
  """A round over a data set's batches (`sliced`: cut from the round's
  examples): the largest difference between the outputs
  `ReferenceOutputs` reads and `view`'s own."""
  reference = reference_outputs.ReferenceOutputs({'global': view}, max_mb)

  @tf.function
  def one_round(dataset):
    view.computed.assign(0)
    if sliced:
      batches = batches_in_memory.SlicedBatches(
        dataset.unbatch().batch(2**31 - 1).get_single_element(),
        dataset.reduce(
          tf.zeros([0], tf.int32),
          lambda sizes, b: tf.concat([sizes, tf.shape(b['y'])[:1]], 0),
        ),
      )
    else:
      batches = batches_in_memory.BatchesInMemory(dataset)
    tables = reference.tabulate(batches)

    def step(largest_error, batch):
      got = reference.outputs(batch, tables)['global']
      expected = view.model(batch['x'], training=False)
      return tf.maximum(
        largest_error,
        tf.reduce_max(
          [tf.reduce_max(tf.abs(got[k] - expected[k])) for k in expected]
        ),
      )

    return batches.reduce(tf.constant(0.0), step)

  return one_round


def _indexed_batches(num_examples, batches_rows, seed):
  """Batches of random 8x8 examples holding `rows`, each with its index."""
  x = (
    np.random.default_rng(seed)
    .normal(size=(num_examples, 8, 8, 1))
    .astype(np.float32)
  )
  dataset = None
  for rows in batches_rows:
    batch = tf.data.Dataset.from_tensors(
      collections.OrderedDict(
        x=x[rows],
        y=np.zeros(len(rows), np.int32),
        index=np.array(rows, np.int64),
      )
    )
    dataset = batch if dataset is None else dataset.concatenate(batch)
  return dataset


def _mlp_counting_view():
  return _CountingView(
    reference_outputs.ReferenceView(
      functools.partial(models.get_model, 'mlp', 10, (8, 8, 1), hidden=(16, 8)),
      ('layer_1', 'layer_2'),
    )
  )


def test_reference_tables_hold_examples_first_seen_after_partial_batches():
  # A round that starts at the end of a pass: batches of 4, 1, 1 and 4
  # examples, so example 9, first seen at position 9, is in the fourth
  # batch, not the third (9 // 4 + 1).
  dataset = _indexed_batches(
    10, ([0, 1, 2, 3], [4], [5], [6, 7, 8, 9], [9, 8, 7, 6]), seed=3
  )
  view = _mlp_counting_view()
  assert _round_reading_tables(view)(dataset).numpy() < 1e-5
  assert view.computed.numpy() == 10


def test_reference_tables_hold_examples_first_seen_after_a_repeat():
  # Example 1 comes twice before example 3 is first seen (as with
  # drop_last): each example's row is computed once, from its first
  # occurrence, and every step reads its own examples' rows.
  dataset = _indexed_batches(4, ([0, 1, 2, 1], [3, 0, 2, 3]), seed=4)
  view = _mlp_counting_view()
  assert _round_reading_tables(view)(dataset).numpy() < 1e-5
  assert view.computed.numpy() == 4


def test_reference_chunks_hold_at_most_the_cap_of_activations():
  cnn = reference_outputs.ReferenceView(
    functools.partial(models.get_model, 'fedcka_cnn', 10, (32, 32, 3)),
    ('layer_1', 'layer_2'),
  )
  # Its largest layer output: the first convolution's 28 x 28 x 16 floats.
  assert cnn.largest_layer_bytes() == 4 * 28 * 28 * 16
  assert reference_outputs.reference_chunk_examples([cnn, cnn]) == (
    reference_outputs.REFERENCE_CHUNK_MAX_EXAMPLES
  )
  resnet = reference_outputs.ReferenceView(
    functools.partial(models.get_model, 'resnet18', 10, (32, 32, 3)),
    ('layer_1', 'layer_2'),
  )
  # 32 x 32 x 64 floats, 256 KB an example: 64 MB hold 128 for two views.
  assert resnet.largest_layer_bytes() == 4 * 32 * 32 * 64
  assert reference_outputs.reference_chunk_examples([resnet, resnet]) == 128


def test_cached_reference_outputs_give_the_uncached_weights(tmp_path):
  base = dict(
    method='fedcka',
    model='mlp',
    task='digits',
    num_clients=3,
    clients_per_round=3,
    rounds=2,
    local_epochs=2,
    batch_size=64,
    cache_dir=str(tmp_path / 'cache'),
    seed=0,
    output_dir=str(tmp_path / 'unused'),
  )
  config = experiment.ExperimentConfig(**base)
  data = experiment.load_data(config)
  keras_model_fn = experiment.model_fn_for(
    'fedcka',
    'mlp',
    data.num_classes,
    data.input_shape,
    config.hyperparameters(3),
  )
  weights = []
  for with_index in (True, False):
    batches = datasets.LocalBatches(64, local_epochs=2, with_index=with_index)
    process = methods.build_method_for_client_ids(
      'fedcka',
      keras_model_fn,
      datasets.round_dataset_computation(data.client_data, batches),
      batches.element_spec(data.client_data.element_type_structure),
      config.hyperparameters(3),
    )
    state = process.set_model_weights(
      process.initialize(), model_lib.initial_weights(keras_model_fn, 0)
    )
    for round_num in (1, 2):  # Round 2 reads the previous models too.
      state = process.next(
        state,
        [
          client_keys.client_key(c, round_num)
          for c in data.client_data.client_ids
        ],
      ).state
    weights.append(model_lib.flat_trainable(process.get_model_weights(state)))
  # The experiment indexes FedCKA's examples when they are passed twice.
  assert methods.wants_example_index('fedcka', local_epochs=2)
  assert not methods.wants_example_index('fedcka', local_epochs=1)
  assert not methods.wants_example_index('fedprox', local_epochs=5)
  np.testing.assert_allclose(weights[0], weights[1], rtol=1e-5, atol=1e-6)


def test_bad_strengths_and_options_are_named():
  with pytest.raises(ValueError, match='MOON mu must be a number >= 0'):
    moon.ModelContrastiveTerm(-1.0)
  with pytest.raises(ValueError, match='temperature must be > 0'):
    moon.ModelContrastiveTerm(1.0, temperature=0.0)
  with pytest.raises(ValueError, match="Unknown similarity 'l1'"):
    fedcka.CKAContrastiveTerm(1.0, similarity='l1')
  with pytest.raises(ValueError, match='cka_layers must be >= 1'):
    fedcka.CKAContrastiveTerm(1.0, num_layers=0)


# ---------------------------------------------------------------------------
# The client state files.

INITIAL = dict(flag=np.int32(0), w=[np.zeros(2), np.zeros((1, 2))])


def _state(value):
  return dict(flag=np.int32(1), w=[np.full(2, value), np.full((1, 2), value)])


def test_a_client_reads_its_newest_version_written_before_the_round(tmp_path):
  files = client_states.ClientStateFiles(INITIAL, str(tmp_path / 'states'))
  files.put('a', _state(1.0), round_num=1)
  files.put('a', _state(3.0), round_num=3)
  files.put('b', _state(2.0), round_num=2)

  @tf.function
  def read(client_id, round_num):
    return files.read(tf.constant(client_id), tf.constant(round_num, tf.int64))

  # In TensorFlow, as the client computation reads it.
  assert read('a', 1)['flag'].numpy() == 0  # nothing before round 1
  assert read('a', 2)['w'][0].numpy()[0] == 1.0
  assert read('a', 3)['w'][0].numpy()[0] == 1.0  # round 3's own: not read
  assert read('a', 4)['w'][0].numpy()[0] == 3.0  # the last round's
  assert read('a', 9)['w'][0].numpy()[0] == 3.0
  assert read('b', 3)['w'][1].numpy()[0, 0] == 2.0
  assert read('new', 5)['flag'].numpy() == 0
  # Python sees the same.
  assert files.get('a', before_round=3)['w'][0][0] == 1.0
  assert files.get('a')['w'][0][0] == 3.0
  assert 'a' in files and 'new' not in files


def test_written_versions_are_discarded_and_pruned_by_round(tmp_path):
  files = client_states.ClientStateFiles(INITIAL, str(tmp_path / 'states'))
  for r in (1, 2, 4, 5):
    files.put('a', _state(float(r)), round_num=r)
  files.discard(['a'], 5)  # a rejected round
  assert files.versions('a') == [1, 2, 4]
  # A resumption from round 3 reads version 2; from round 4 on, version 4.
  files.prune(['a'], checkpoint_round=3)
  assert files.versions('a') == [2, 4]
  files.prune(['a'], checkpoint_round=4)
  assert files.versions('a') == [4]


def test_own_initial_state_is_read_from_the_second_round_on(tmp_path):
  files = client_states.ClientStateFiles(INITIAL, str(tmp_path / 'states'))
  files.put('a', _state(7.0), client_states.OWN_INITIAL_VERSION)
  read = lambda r: files.read(tf.constant('a'), tf.constant(r, tf.int64))
  assert read(1)['flag'].numpy() == 0
  assert read(2)['w'][0].numpy()[0] == 7.0


def test_clients_never_share_a_directory(tmp_path):
  files = client_states.ClientStateFiles(INITIAL, str(tmp_path / 'states'))
  files.put('a/b', _state(1.0), 1)
  files.put('a_b', _state(2.0), 1)
  assert files.get('a/b')['w'][0][0] == 1.0
  assert files.get('a_b')['w'][0][0] == 2.0


def test_files_reject_states_of_another_shape():
  files = client_states.ClientStateFiles(INITIAL)
  with pytest.raises(ValueError, match="State of client 'a' has 1 tensors"):
    files.put('a', dict(flag=np.int32(1)), 1)


# ---------------------------------------------------------------------------
# The processes.


@pytest.fixture(scope='module')
def setup(digits_task):
  batches = datasets.LocalBatches(batch_size=32, local_epochs=1, seed=0)
  model_fn = functools.partial(models.get_model, 'fedcka_cnn', 10, (8, 8, 1))
  return dict(
    client_data=digits_task.client_data,
    model_fn=model_fn,
    datasets_by_key=datasets.round_dataset_computation(
      digits_task.client_data, batches
    ),
    spec=batches.element_spec(digits_task.client_data.element_type_structure),
    optimizer=optimizers.build_client_sgd(0.05, 0.9),
    initial=model_lib.initial_weights(model_fn, seed=0),
  )


def _rounds(process, initial, cohorts):
  state = process.set_model_weights(process.initialize(), initial)
  outputs = []
  for round_num, cohort in enumerate(cohorts, start=1):
    output = process.next(
      state, [client_keys.client_key(c, round_num) for c in cohort]
    )
    state = output.state
    outputs.append(output)
  return process.get_model_weights(state), outputs


@pytest.fixture(scope='module')
def fedavg_two_rounds(setup):
  import tensorflow_federated as tff

  process = tff.simulation.compose_dataset_computation_with_learning_process(
    setup['datasets_by_key'],
    fedavg.build_tff_fedavg(
      setup['model_fn'], setup['spec'], client_optimizer_fn=setup['optimizer']
    ),
  )
  ids = setup['client_data'].client_ids[:2]
  return _rounds(process, setup['initial'], [ids, ids])[0]


@pytest.mark.parametrize(
  'build',
  [
    lambda s, mu: moon.build_moon(
      s['model_fn'],
      s['spec'],
      dataset_computation=s['datasets_by_key'],
      client_optimizer_fn=s['optimizer'],
      mu=mu,
    ),
    lambda s, mu: fedcka.build_fedcka(
      s['model_fn'],
      s['spec'],
      dataset_computation=s['datasets_by_key'],
      client_optimizer_fn=s['optimizer'],
      mu=mu,
    ),
  ],
  ids=['moon', 'fedcka'],
)
def test_mu_zero_gives_fedavg_and_mu_positive_differs(
  build, setup, fedavg_two_rounds
):
  ids = setup['client_data'].client_ids[:2]
  zero, _ = _rounds(build(setup, 0.0), setup['initial'], [ids, ids])
  np.testing.assert_allclose(
    model_lib.flat_trainable(zero),
    model_lib.flat_trainable(fedavg_two_rounds),
    rtol=1e-5,
    atol=1e-6,
  )
  process = build(setup, 5.0)
  weights, outputs = _rounds(process, setup['initial'], [ids, ids])
  first, second = [o.metrics['client_work']['train'] for o in outputs]
  # Round 1: no client has a previous model, so the term is 0.
  assert np.isclose(first['objective'], first['loss'])
  assert second['objective'] > second['loss'] + 1e-3
  assert not np.allclose(
    model_lib.flat_trainable(weights),
    model_lib.flat_trainable(fedavg_two_rounds),
  )
  # Each sampled client now holds its own previous model.
  store = process.client_states
  states = [store.get(c) for c in ids]
  assert all(s['has_previous'] == 1 for s in states)
  assert not np.allclose(
    states[0]['model'].trainable[0], states[1]['model'].trainable[0]
  )
  assert setup['client_data'].client_ids[3] not in store
  # The client computations wrote one version a round.
  assert store.versions(ids[0]) == [1, 2]
  assert isinstance(process, tff.learning.templates.LearningProcess)
  assert outputs[1].metrics['client_work']['client_states']['written'] == 2


@pytest.mark.parametrize('first_round', ['skip', 'initial_model'])
def test_moon_client_taking_part_late(setup, first_round):
  # Round 1: clients 0, 1 (no previous model anywhere, no term). Round 2:
  # clients 2, 3 take part for the first time.
  process = moon.build_moon(
    setup['model_fn'],
    setup['spec'],
    dataset_computation=setup['datasets_by_key'],
    client_optimizer_fn=setup['optimizer'],
    mu=1.0,
  )
  ids = setup['client_data'].client_ids
  if first_round == 'initial_model':
    moon.write_own_initial_models(
      process.client_states, ids, setup['model_fn'], seed=3
    )
  _, outputs = _rounds(process, setup['initial'], [ids[:2], ids[2:4]])
  first, second = [o.metrics['client_work']['train'] for o in outputs]
  assert np.isclose(first['objective'], first['loss'])
  if first_round == 'skip':
    assert np.isclose(second['objective'], second['loss'])
  else:
    # The MOON repo: contrasted against the client's own initial model.
    assert second['objective'] > second['loss'] + 1e-3
    # Each client its own model, seeded: the same again, another for another.
    files = process.client_states
    own = [files.get(c, before_round=1)['model'].trainable[0] for c in ids[2:4]]
    assert not np.allclose(own[0], own[1])
    again = client_states.ClientStateFiles(files.initial_state)
    moon.write_own_initial_models(again, ids[2:3], setup['model_fn'], seed=3)
    np.testing.assert_array_equal(
      again.get(ids[2])['model'].trainable[0], own[0]
    )


def test_a_client_keeps_only_the_layers_read_of_its_previous_model(setup):
  process = fedcka.build_fedcka(
    setup['model_fn'],
    setup['spec'],
    dataset_computation=setup['datasets_by_key'],
    client_optimizer_fn=setup['optimizer'],
    mu=1.0,
    num_layers=2,
  )
  full = setup['initial']
  ids = setup['client_data'].client_ids[:2]
  _, outputs = _rounds(process, full, [ids])
  kept = process.client_states.get(ids[0])['model']
  # FedCKA reads the previous model's first two layers: the two
  # convolutions' kernels and biases, of the CNN's fourteen tensors.
  assert len(full.trainable) == 14
  view = reference_outputs.ReferenceView(
    setup['model_fn'], fedcka.CKAContrastiveTerm(1.0, 2).previous_outputs
  )
  assert (
    [np.shape(w) for w in kept.trainable]
    == [tuple(v.shape) for v in view.model.trainable_variables]
    == [np.shape(w) for w in full.trainable[:4]]
  )
  # What it keeps is its local model's, not the initial weights.
  assert not np.allclose(kept.trainable[0], full.trainable[0])
  # MOON reads up to z: every layer but the classifier.
  moon_process = moon.build_moon(
    setup['model_fn'],
    setup['spec'],
    dataset_computation=setup['datasets_by_key'],
    client_optimizer_fn=setup['optimizer'],
    mu=1.0,
  )
  moon_kept = moon_process.client_states.initial_state['model']
  assert len(moon_kept.trainable) == 12


def test_a_state_of_another_shape_is_refused(setup, tmp_path):
  files = client_states.ClientStateFiles(
    collections.OrderedDict(w=np.zeros((2, 3), np.float32)), str(tmp_path)
  )
  with pytest.raises(
    ValueError, match=r'shape \(3, 2\) where the files hold \(2, 3\)'
  ):
    files.put('a', collections.OrderedDict(w=np.zeros((3, 2))), round_num=1)
  assert 'a' not in files


def test_a_rejected_round_restores_the_clients_states(setup, tmp_path):
  process = moon.build_moon(
    setup['model_fn'],
    setup['spec'],
    dataset_computation=setup['datasets_by_key'],
    client_optimizer_fn=setup['optimizer'],
    mu=1.0,
  )
  ids = setup['client_data'].client_ids[:2]

  class NonFiniteInRound2:
    """The process, with round 2's global model made NaN after training."""

    def __init__(self):
      self.rounds = 0

    def __getattr__(self, name):
      return getattr(process, name)

    def next(self, state, keys):
      output = process.next(state, keys)
      self.rounds += 1
      if self.rounds == 2:
        nan = tf.nest.map_structure(
          lambda a: np.full_like(a, np.nan),
          process.get_model_weights(output.state),
        )
        output = output._replace(
          state=process.set_model_weights(output.state, nan)
        )
      return output

  after_round_1 = {}

  def remember(round_num, metrics):
    del metrics
    if round_num == 1:
      after_round_1.update({c: process.client_states.get(c) for c in ids})

  results = training_loop.run_training(
    NonFiniteInRound2(),
    ids,
    2,
    2,
    str(tmp_path / 'run'),
    setup['initial'],
    progress=False,
    round_hook=remember,
    client_key_fn=client_keys.client_key,
  )
  assert results['rejected_rounds'] == 1
  for c in ids:
    state = process.client_states.get(c)
    assert state['has_previous'] == 1
    for got, kept in zip(
      tf.nest.flatten(state), tf.nest.flatten(after_round_1[c])
    ):
      np.testing.assert_array_equal(got, kept)
  # The rejected round's files are gone: round 1's are the clients' states.
  assert process.client_states.versions(ids[0]) == [1]


def test_stateful_run_resumes_exactly_with_client_states(tmp_path):
  base = dict(
    method='moon',
    task='digits',
    model='fedcka_cnn',
    mu=1.0,
    num_clients=4,
    clients_per_round=2,
    rounds=4,
    batch_size=32,
    client_learning_rate=0.05,
    seed=5,
    cache_dir=str(tmp_path / 'cache'),
  )
  whole = experiment.run(
    experiment.ExperimentConfig(output_dir=str(tmp_path / 'whole'), **base),
    progress=False,
  )

  class Interrupted(Exception):
    pass

  def stop_after_2(round_num, metrics):
    del metrics
    if round_num == 2:
      raise Interrupted()

  config = experiment.ExperimentConfig(
    output_dir=str(tmp_path / 'resumed'), client_state_dir=None, **base
  )
  with pytest.raises(Interrupted):
    experiment.run(config, progress=False, round_hook=stop_after_2)
  resumed = experiment.run(config, progress=False)
  np.testing.assert_allclose(
    model_lib.flat_trainable(resumed['final_weights']),
    model_lib.flat_trainable(whole['final_weights']),
    rtol=1e-5,
    atol=1e-6,
  )
  # The states live with the run, beside its program state.
  assert os.path.exists(
    tmp_path / 'resumed' / 'client_states' / 'initial.state'
  )


def test_a_given_state_directory_gives_the_default_ones_weights(tmp_path):
  base = dict(
    method='fedcka',
    task='digits',
    model='fedcka_cnn',
    mu=3.0,
    num_clients=4,
    clients_per_round=2,
    rounds=3,
    batch_size=32,
    seed=6,
    cache_dir=str(tmp_path / 'cache'),
  )
  memory = experiment.run(
    experiment.ExperimentConfig(output_dir=str(tmp_path / 'memory'), **base),
    progress=False,
  )
  disk = experiment.run(
    experiment.ExperimentConfig(
      output_dir=str(tmp_path / 'disk'),
      client_state_dir=str(tmp_path / 'states'),
      **base,
    ),
    progress=False,
  )
  np.testing.assert_allclose(
    model_lib.flat_trainable(disk['final_weights']),
    model_lib.flat_trainable(memory['final_weights']),
    rtol=1e-5,
    atol=1e-6,
  )
  assert os.listdir(tmp_path / 'states')


def test_moon_without_a_projection_head_is_refused(tmp_path):
  config = experiment.ExperimentConfig(
    method='moon', model='mlp', output_dir=str(tmp_path / 'x')
  )
  with pytest.raises(
    ValueError, match='--method=moon needs a model with a ' 'projection head'
  ):
    experiment.validate(config)
  experiment.validate(
    dataclasses.replace(config, model='resnet18', projection_dim=32)
  )
  with pytest.raises(
    ValueError,
    match='--projection_dim=32 must be >= 0, '
    'and is for --model=resnet18/resnet50 only',
  ):
    experiment.validate(
      dataclasses.replace(config, model='fedcka_cnn', projection_dim=32)
    )
  with pytest.raises(
    ValueError,
    match='--cka_layers=8 is more than ' "--model=fedcka_cnn's 7 layers",
  ):
    experiment.validate(
      dataclasses.replace(
        config, method='fedcka', model='fedcka_cnn', cka_layers=8
      )
    )
  experiment.validate(
    dataclasses.replace(
      config, method='fedcka', model='fedcka_cnn', cka_layers=7
    )
  )
  with pytest.raises(
    ValueError,
    match="--scaffold_weighting='examples' is "
    'unknown; choose one of uniform, num_examples',
  ):
    experiment.validate(
      dataclasses.replace(
        config, method='scaffold', scaffold_weighting='examples'
      )
    )
  with pytest.raises(
    ValueError,
    match="--server_momentum_form='nag' is "
    'unknown; choose one of heavy_ball, ema',
  ):
    experiment.validate(dataclasses.replace(config, server_momentum_form='nag'))


def test_regularizers_reading_previous_models_need_a_stateful_process(setup):
  with pytest.raises(ValueError, match='needs per-client state'):
    local_training.build_local_training_client_work(
      setup['model_fn'],
      setup['spec'],
      setup['optimizer'],
      [moon.ModelContrastiveTerm(1.0)],
    )
  assert regularizers.needs_previous_model([fedcka.CKAContrastiveTerm(1.0)])


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
