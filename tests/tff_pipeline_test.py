"""A TFF user's own pieces: their Keras model, client data and program.

The code of docs/tff_pipeline.md and of the README's quick start runs as a
user runs it (a fresh Python, the project's runtime); the model contract,
the client-data forms and the stateful process's key checks are tested
one by one.
"""

import ast
import collections
import os
import re
import subprocess
import sys
import warnings

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_methods import privacy
from tff_methods.algorithms import fedavg
from tff_methods.algorithms import fedcka
from tff_methods.algorithms import fedmax
from tff_methods.algorithms import fedprox
from tff_methods.algorithms import moon
from tff_methods.algorithms import scaffold
from tff_methods.clients import client_keys
from tff_methods.templates import model_lib
from tff_methods.templates import optimizers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _python_blocks(path):
  with open(os.path.join(ROOT, path)) as f:
    return '\n'.join(re.findall(r'```python\n(.*?)```', f.read(), re.S))


def _run_as_a_user(path, cwd):
  """Runs a document's Python blocks in a new interpreter."""
  result = subprocess.run(
    [sys.executable, '-c', _python_blocks(path)],
    cwd=cwd,
    capture_output=True,
    text=True,
    timeout=600,
    check=False,
  )
  assert result.returncode == 0, result.stderr[-3000:]
  assert 'Traceback' not in result.stderr, result.stderr[-3000:]
  return result.stdout


@pytest.mark.slow
def test_the_pipeline_page_runs_as_written(tmp_path):
  out = _run_as_a_user('docs/tff_pipeline.md', tmp_path)
  # The builder's refusal of a model without MOON's `z`, printed by the page.
  assert "MOON reads the model's 'z' output" in out
  assert "named_outputs(model, z='<layer name>')" in out
  # build_fed_eval's metrics, after training.
  assert 'sparse_categorical_accuracy' in out
  # The DP-FedCKA run's guarantee, as dp_accounting gives it.
  epsilon = privacy.epsilon(0.3, 4, 4, 2, 1e-5)
  assert f'(epsilon, delta) = ({epsilon:.1f}, 1e-5)' in out


@pytest.mark.slow
def test_the_readme_quick_start_runs_as_written(tmp_path):
  out = _run_as_a_user('README.md', tmp_path)
  losses = [
    float(line.split()[1])
    for line in out.splitlines()
    if re.match(r'^[123] [0-9.]+$', line)
  ]
  assert len(losses) == 3 and all(np.isfinite(losses))
  assert os.listdir(tmp_path / 'runs' / 'quick_start_states')


def _sequential(softmax=False):
  return tf.keras.Sequential(
    [
      tf.keras.Input((4,)),
      tf.keras.layers.Dense(8, activation='relu', name='hidden'),
      tf.keras.layers.Dense(
        3, activation='softmax' if softmax else None, name='scores'
      ),
    ]
  )


SPEC = collections.OrderedDict(
  x=tf.TensorSpec([None, 4], tf.float32), y=tf.TensorSpec([None], tf.int32)
)


def test_named_outputs_names_the_layers_a_method_reads():
  model = model_lib.named_outputs(
    _sequential(), features='hidden', layers=['hidden', 'scores']
  )
  assert sorted(model.output) == ['features', 'layer_1', 'layer_2', 'logits']
  x = np.ones((2, 4), np.float32)
  outputs = model(x)
  np.testing.assert_allclose(outputs['layer_2'], outputs['logits'])
  assert outputs['features'].shape == (2, 8)
  # The same variables as the user's model, in the same order.
  assert len(model.trainable_variables) == 4


def test_named_outputs_lists_the_layers_when_one_is_missing():
  with pytest.raises(
    ValueError,
    match=r"no layer 'dense'; its layers are " r"\['hidden', 'scores'\]",
  ):
    model_lib.named_outputs(_sequential(), features='dense')


def test_a_single_output_model_is_taken_as_logits_and_a_softmax_refused():
  model = model_lib.contract_model(_sequential())
  assert list(model.output) == ['logits']
  with pytest.raises(ValueError, match='softmax'):
    model_lib.contract_model(_sequential(softmax=True))


def test_a_softmax_gets_advice_that_applies_where_it_is():
  # Inside the last Dense layer no layer before it can be named as logits.
  with pytest.raises(ValueError) as refused:
    fedprox.build_fedprox(
      lambda: _sequential(softmax=True),
      SPEC,
      client_optimizer_fn=optimizers.build_client_sgd(0.1),
    )
  message = str(refused.value)
  assert 'without_softmax(model)' in message
  assert 'from_keras_model(model, loss=' in message
  assert 'named_outputs(model, logits=' not in message

  def softmax_layer():
    inputs = tf.keras.Input((4,))
    scores = tf.keras.layers.Dense(3, name='scores')(inputs)
    return tf.keras.Model(inputs, tf.keras.layers.Softmax()(scores))

  with pytest.raises(
    ValueError, match=r"named_outputs\(model, logits='scores'\)"
  ):
    fedprox.build_fedprox(
      softmax_layer, SPEC, client_optimizer_fn=optimizers.build_client_sgd(0.1)
    )


@pytest.mark.parametrize(
  'build, output, argument',
  [
    (
      lambda fn: fedmax.build_fedmax(
        fn, SPEC, client_optimizer_fn=optimizers.build_client_sgd(0.1)
      ),
      'features',
      "features='<layer name>'",
    ),
    (
      lambda fn: fedcka.build_fedcka(
        fn,
        SPEC,
        dataset_computation=_ids_computation(),
        client_optimizer_fn=optimizers.build_client_sgd(0.1),
        layers=2,
      ),
      'layer_1',
      "layers=['<layer 1>', '<layer 2>']",
    ),
    (
      lambda fn: moon.build_moon(
        fn,
        SPEC,
        dataset_computation=_ids_computation(),
        client_optimizer_fn=optimizers.build_client_sgd(0.1),
      ),
      'z',
      "z='<layer name>'",
    ),
  ],
  ids=['fedmax', 'fedcka', 'moon'],
)
def test_a_builder_names_the_output_its_method_reads(build, output, argument):
  with pytest.raises(ValueError) as error:
    build(_sequential)
  message = str(error.value)
  assert f"'{output}' output" in message
  assert f'named_outputs(model, {argument})' in message
  # The hint is Python a user can edit in place.
  hint = re.search(r'named_outputs\(model, .*?\)\.', message).group(0)
  ast.parse(hint[:-1])


def test_methods_that_read_weights_and_logits_take_a_plain_model():
  for build in (
    lambda: fedavg.build_fedavg(
      _sequential, SPEC, client_optimizer_fn=optimizers.build_client_sgd(0.1)
    ),
    lambda: scaffold.build_scaffold(
      _sequential,
      SPEC,
      dataset_computation=_ids_computation(),
      client_learning_rate=0.1,
      num_clients=2,
    ),
  ):
    assert isinstance(build(), tff.learning.templates.LearningProcess)


def test_a_keras_model_instead_of_its_builder_is_refused():
  with pytest.raises(TypeError, match='function that builds the Keras'):
    fedavg.build_fedavg(
      _sequential(), SPEC, client_optimizer_fn=optimizers.build_client_sgd(0.1)
    )


def test_elements_that_are_neither_dicts_nor_pairs_are_refused():
  with pytest.raises(
    TypeError, match=r'OrderedDict\(x=\.\.\., y=\.\.\.\) ' r'or \(x, y\) tuples'
  ):
    fedavg.build_fedavg(
      _sequential,
      tf.TensorSpec([None, 4]),
      client_optimizer_fn=optimizers.build_client_sgd(0.1),
    )


@pytest.mark.parametrize('build', [fedavg.build_fedavg, moon.build_moon])
def test_unbatched_client_data_is_refused_with_the_batching_named(build):
  # Keras would say "Negative dimension size..." deep inside the client.
  unbatched = collections.OrderedDict(
    x=tf.TensorSpec([4], tf.float32), y=tf.TensorSpec([], tf.int32)
  )
  kwargs = dict(client_optimizer_fn=optimizers.build_client_sgd(0.1))
  if build is moon.build_moon:
    kwargs['dataset_computation'] = _ids_computation()
  with pytest.raises(
    ValueError,
    match=r'x of shape \[4\], one example.*\[None, 4\].*ds\.batch\(32\)',
  ):
    build(model_lib.named_outputs(_sequential, z='hidden'), unbatched, **kwargs)


@pytest.mark.usefixtures('tff_worker')
def test_data_sets_given_to_a_process_that_makes_its_batches_are_refused():
  client_data = _raw_client_data()
  process = fedavg.build_fedavg(
    _sequential,
    client_data.element_type_structure,
    client_optimizer_fn=optimizers.build_client_sgd(0.1),
    dataset_computation=client_data,
  )
  data_sets = [
    client_data.create_tf_dataset_for_client(c) for c in ['client_0']
  ]
  with pytest.raises(
    TypeError, match=r'built with a dataset_computation.*Pass the client ids'
  ):
    process.next(process.initialize(), data_sets)


def test_batch_norm_statistics_get_a_warning_that_they_are_not_averaged():
  def with_batch_norm():
    return tf.keras.Sequential(
      [
        tf.keras.Input((4,)),
        tf.keras.layers.Dense(8, name='hidden'),
        tf.keras.layers.BatchNormalization(name='norm'),
        tf.keras.layers.Dense(3, name='scores'),
      ]
    )

  build = lambda model_fn: fedavg.build_fedavg(
    model_fn, SPEC, client_optimizer_fn=optimizers.build_client_sgd(0.1)
  )
  with pytest.warns(UserWarning, match=r'2 non-trainable variables.*moving'):
    build(with_batch_norm)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter('always')
    build(_sequential)
  assert not [w for w in caught if 'non-trainable' in str(w.message)]


def test_a_non_factory_aggregator_and_a_weighted_dp_are_refused():
  with pytest.raises(TypeError, match='model_aggregator must be'):
    fedavg.build_fedavg(
      _sequential,
      SPEC,
      client_optimizer_fn=optimizers.build_client_sgd(0.1),
      model_aggregator='dp',
    )
  with pytest.raises(ValueError, match='unweighted factory'):
    fedavg.build_fedavg(
      _sequential,
      SPEC,
      client_optimizer_fn=optimizers.build_client_sgd(0.1),
      model_aggregator=tff.learning.dp_aggregator(0.1, 10),
      client_weighting=tff.learning.ClientWeighting.NUM_EXAMPLES,
    )


def _raw_client_data(num_clients=3, tuples=False):
  rng = np.random.default_rng(0)
  data = {}
  for i in range(num_clients):
    x = rng.normal(size=(24, 4)).astype(np.float32)
    y = rng.integers(0, 3, size=24).astype(np.int32)
    data[f'client_{i}'] = (
      (x, y) if tuples else collections.OrderedDict(x=x, y=y)
    )
  return tff.simulation.datasets.TestClientData(data).preprocess(
    lambda ds: ds.batch(8)
  )


def _ids_computation():
  return _raw_client_data().dataset_computation


def _train(process, clients, rounds=2, keys=False):
  state = process.set_model_weights(
    process.initialize(), model_lib.initial_weights(_sequential, 0)
  )
  for round_num in range(1, rounds + 1):
    data = (
      [client_keys.client_key(c, round_num) for c in clients]
      if keys
      else clients
    )
    state = process.next(state, data).state
  return model_lib.flat_trainable(process.get_model_weights(state))


@pytest.mark.usefixtures('tff_worker')
def test_tuple_elements_train_as_dict_elements_do():
  weights = {}
  for tuples in (False, True):
    client_data = _raw_client_data(tuples=tuples)
    process = fedavg.build_fedavg(
      _sequential,
      client_data.element_type_structure,
      client_optimizer_fn=optimizers.build_client_sgd(0.1),
    )
    weights[tuples] = _train(
      process,
      [
        client_data.create_tf_dataset_for_client(c)
        for c in client_data.client_ids
      ],
    )
  np.testing.assert_array_equal(weights[True], weights[False])


@pytest.mark.usefixtures('tff_worker')
def test_training_accuracy_with_column_labels_equals_tffs():
  # TFF's tutorials shape labels (B, 1): the training accuracy must read as
  # TFF's own builder reports it on the same data, not a broadcast (B, B).
  client_data = _raw_client_data().preprocess(
    lambda ds: ds.map(
      lambda b: collections.OrderedDict(x=b['x'], y=tf.reshape(b['y'], [-1, 1]))
    )
  )
  data = [
    client_data.create_tf_dataset_for_client(c) for c in client_data.client_ids
  ]
  spec = client_data.element_type_structure
  ours = fedavg.build_fedavg(
    _sequential, spec, client_optimizer_fn=optimizers.build_client_sgd(0.5)
  )
  theirs = tff.learning.algorithms.build_weighted_fed_avg(
    model_lib.tff_model_fn(_sequential, spec),
    client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.5),
  )
  accuracies = []
  for process in (ours, theirs):
    state = process.set_model_weights(
      process.initialize(), model_lib.initial_weights(_sequential, 0)
    )
    train = process.next(state, data).metrics['client_work']['train']
    accuracies.append(train['sparse_categorical_accuracy'])
  assert 0.2 < accuracies[1] < 1.0
  assert accuracies[0] == pytest.approx(accuracies[1], abs=1e-6)


@pytest.mark.usefixtures('tff_worker')
def test_a_stateful_method_takes_tffs_client_data_by_id(tmp_path):
  # FedCKA at mu = 0 is FedAvg: given the ClientData itself, each key's
  # client id must reach that client's data.
  client_data = _raw_client_data()
  ids = client_data.client_ids
  model_fn = model_lib.named_outputs(_sequential, layers=['hidden'])
  expected = _train(
    fedavg.build_fedavg(
      model_fn,
      client_data.element_type_structure,
      client_optimizer_fn=optimizers.build_client_sgd(0.1),
      dataset_computation=client_data,
    ),
    ids,
  )
  process = fedcka.build_fedcka(
    model_fn,
    client_data.element_type_structure,
    dataset_computation=client_data,
    client_optimizer_fn=optimizers.build_client_sgd(0.1),
    mu=0.0,
    layers=1,
    client_state_dir=str(tmp_path),
  )
  np.testing.assert_allclose(
    _train(process, ids, keys=True), expected, rtol=1e-6, atol=1e-6
  )
  assert process.client_states.versions(ids[0]) == [1, 2]


@pytest.fixture(scope='module')
def moon_process():
  return moon.build_moon(
    model_lib.named_outputs(_sequential, z='hidden'),
    SPEC,
    dataset_computation=_ids_computation(),
    client_optimizer_fn=optimizers.build_client_sgd(0.1),
  )


def test_stateful_next_refuses_data_sets(moon_process):
  datasets = [
    tf.data.Dataset.from_tensor_slices(
      collections.OrderedDict(
        x=np.ones((4, 4), np.float32), y=np.zeros(4, np.int32)
      )
    ).batch(2)
  ]
  with pytest.raises(
    TypeError,
    match=r'takes client keys, \[client id, ' r'round\].*given data sets',
  ):
    moon_process.next(moon_process.initialize(), datasets)


@pytest.mark.usefixtures('tff_worker')
def test_stateful_next_names_the_key_source_for_tffs_client_id_source(
  moon_process,
):
  # What train_model hands `next` from TFF's ClientIdDataSource: ids alone.
  ids = tff.program.ClientIdDataSource(['a', 'b']).iterator().select(2)
  with pytest.raises(
    TypeError, match=r'stateful\.ClientRoundDataSource.*train_data_source'
  ):
    moon_process.next(moon_process.initialize(), ids)
  keys = client_keys.ClientRoundDataSource(['a', 'b'], seed=0).iterator()
  assert [k[1] for k in keys.select(2)] == [b'1', b'1']


def test_stateful_next_refuses_round_zero_and_a_lost_temporary_store(
  moon_process,
):
  with pytest.raises(ValueError, match='rounds from 1 on; got round 0'):
    moon_process.check_keys([client_keys.client_key('client_0', 0)])
  with pytest.raises(
    ValueError,
    match='starts at round 4 but keeps its '
    r"clients' states in a temporary directory.*"
    'client_state_dir',
  ):
    moon_process.check_keys([client_keys.client_key('client_0', 4)])


def test_stateful_next_warns_when_the_round_does_not_advance(tmp_path):
  process = moon.build_moon(
    model_lib.named_outputs(_sequential, z='hidden'),
    SPEC,
    dataset_computation=_ids_computation(),
    client_optimizer_fn=optimizers.build_client_sgd(0.1),
    client_state_dir=str(tmp_path),
  )
  process.check_keys([client_keys.client_key('client_0', 3)])  # resumed: fine
  process.check_keys([client_keys.client_key('client_0', 4)])
  with warnings.catch_warnings():
    warnings.simplefilter('error')
    # Once again is a retry (TFF's train_model retries a discarded round).
    process.check_keys([client_keys.client_key('client_0', 4)])
  with pytest.warns(
    UserWarning,
    match=r'name round 4, but this process ' r'last ran round 4 \(3 times\)',
  ):
    process.check_keys([client_keys.client_key('client_0', 4)])
  with pytest.warns(
    UserWarning, match='name round 2, but this process ' 'last ran round 4'
  ):
    process.check_keys([client_keys.client_key('client_0', 2)])


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
