"""Tests for Fed2: grouped models, feature-paired averaging, interpretation."""

import collections
import sys

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tasks import models
from tff_methods import fed2
from tff_methods import local_training
from tff_methods import model_lib
from tff_methods import optimizers
from tooling import analysis
from tooling import experiment

pytestmark = pytest.mark.usefixtures('tff_worker')


def _plan(name, input_shape=(32, 32, 3)):
  return fed2.LayerPlan(**models.fed2_plan(name, input_shape))


def test_class_groups_are_fixed_by_the_seed_and_cover_every_class():
  groups = fed2.class_groups(10, 3, seed=4)
  assert groups == fed2.class_groups(10, 3, seed=4)
  assert sorted(c for g in groups for c in g) == list(range(10))
  assert [len(g) for g in groups] == [4, 3, 3]  # several classes a group
  assert groups != fed2.class_groups(10, 3, seed=5)
  with pytest.raises(ValueError, match=r'groups must be in \[1, 10\]'):
    fed2.class_groups(10, 11)


@pytest.mark.parametrize(
  'name, shape, groups',
  [
    ('fedcka_cnn', (8, 8, 1), 5),
    ('vgg9', (32, 32, 3), 10),
    ('mobilenet', (32, 32, 3), 10),
  ],
)
def test_logits_of_a_class_depend_only_on_shared_and_its_group(
  name, shape, groups
):
  model_fn = lambda: fed2.grouped_model(
    _plan(name, shape), 10, shape, groups, seed=1
  )
  tensor_groups = fed2.tensor_groups(model_fn)
  assert -1 in tensor_groups
  model = model_fn()
  assignment = fed2.class_groups(10, groups, seed=1)
  x = np.random.default_rng(0).normal(size=(3,) + shape).astype(np.float32)
  for c in (0, 7):
    with tf.GradientTape() as tape:
      logit = tf.reduce_sum(model(x)['logits'][:, c])
    gradients = tape.gradient(logit, model.trainable_variables)
    own = next(g for g, classes in enumerate(assignment) if c in classes)
    # Each group's gradients, whether in tensors of their own or in slices
    # of stacked ones (axis 0 the group).
    by_group = collections.defaultdict(list)
    for gradient, group in zip(gradients, tensor_groups):
      gradient = np.zeros(1) if gradient is None else gradient.numpy()
      if group == fed2.STACKED:
        for g in range(groups):
          by_group[g].append(gradient[g])
      else:
        by_group[group].append(gradient)
    assert sorted(by_group) == [-1] + list(range(groups))
    for group, group_gradients in by_group.items():
      if group not in (-1, own):
        assert not any(np.any(g) for g in group_gradients)
    # ... while its own group does get gradient.
    assert any(np.any(g) for g in by_group[own])


def test_decoupled_layers_are_grouped_and_shared_ones_are_not():
  model_fn = lambda: fed2.grouped_model(
    _plan('vgg9'), 10, (32, 32, 3), 10, seed=0
  )
  groups = fed2.tensor_groups(model_fn)
  shapes = [tuple(v.shape) for v in model_fn().trainable_variables]
  # The first 3 layers shared; the last 6 (3 convs, 2 dense, classifier)
  # in 10 groups each: the convs a kernel, a bias and their group norm's
  # scale and offset per group, the dense layers one stacked kernel and
  # bias, group first. Every conv block has group normalization: in a
  # decoupled layer, one per Fed2 group over that group's channels.
  assert groups.count(-1) == 3 * 4
  assert [groups.count(g) for g in range(10)] == [3 * 4] * 10
  norms = [
    layer
    for layer in model_fn().layers
    if isinstance(layer, tf.keras.layers.GroupNormalization)
  ]
  assert len(norms) == 3 + 3 * 10
  assert {n.groups for n in norms if n.name.startswith('fed2_group')} == {1}
  # A group's dense kernel reads only its own block of the layer before:
  # 256 / 10 -> 26 channels of 4x4 for the first, 512 / 10 -> 52 units.
  stacked = [shape for shape, g in zip(shapes, groups) if g == fed2.STACKED]
  assert stacked == [
    (10, 4 * 4 * 26, 52),
    (10, 52),
    (10, 52, 52),
    (10, 52),
    (10, 52, 1),
    (10, 1),
  ]
  with pytest.raises(ValueError, match='Fed2 supports models'):
    models.fed2_plan('resnet18', (32, 32, 3))
  with pytest.raises(ValueError, match='decouple depth for vgg9 must be in'):
    fed2.grouped_model(_plan('vgg9'), 10, (32, 32, 3), decouple_depth=20)


def _aggregate(tensor_groups, updates, weights):
  value_type = tff.types.tensorflow_to_type(
    [tf.TensorSpec(np.shape(u), tf.float32) for u in updates[0]]
  )
  weight_type = tff.TensorType(np.float32, [len(weights[0])])
  process = fed2.FeaturePairedMeanFactory(tensor_groups).create(
    value_type, weight_type
  )
  output = process.next(
    process.initialize(),
    [[np.asarray(t, np.float32) for t in u] for u in updates],
    [np.asarray(w, np.float32) for w in weights],
  )
  return [np.asarray(t) for t in output.result]


def test_feature_paired_mean_by_hand():
  # Tensors: shared, group 0, group 1. Client A: 30 examples, 30 of group
  # 0's classes, none of group 1's. Client B: 10 examples, 4 / 6.
  updates = [[[1.0, 2.0], [10.0], [5.0]], [[3.0, 4.0], [20.0], [7.0]]]
  weights = [[30, 30, 0], [10, 4, 6]]
  shared, group0, group1 = _aggregate([-1, 0, 1], updates, weights)
  np.testing.assert_allclose(
    shared, [(30 * 1 + 10 * 3) / 40, (30 * 2 + 10 * 4) / 40], rtol=1e-6
  )
  np.testing.assert_allclose(group0, [(30 * 10 + 4 * 20) / 34], rtol=1e-6)
  # Client A never saw group 1's classes: only B counts.
  np.testing.assert_allclose(group1, [7.0], rtol=1e-6)


def test_feature_paired_mean_weighs_each_slice_of_a_stacked_tensor():
  # One stacked tensor, groups 0 and 1 along axis 0; the same clients as
  # above.
  updates = [[[[10.0, 1.0], [5.0, 1.0]]], [[[20.0, 3.0], [7.0, 3.0]]]]
  weights = [[30, 30, 0], [10, 4, 6]]
  (stacked,) = _aggregate([fed2.STACKED], updates, weights)
  np.testing.assert_allclose(
    stacked,
    [[(30 * 10 + 4 * 20) / 34, (30 * 1 + 4 * 3) / 34], [7.0, 3.0]],
    rtol=1e-6,
  )


def test_feature_paired_mean_is_fedavg_when_clients_hold_classes_equally():
  updates = [
    [[1.0, -1.0], [2.0], [4.0]],
    [[3.0, 5.0], [6.0], [0.0]],
    [[0.5, 0.0], [1.0], [2.0]],
  ]
  sizes = [20, 40, 60]
  # Every client holds every class in equal shares: half in each group.
  weights = [[n, n / 2, n / 2] for n in sizes]
  result = _aggregate([-1, 0, 1], updates, weights)
  for i, tensor in enumerate(result):
    fedavg = sum(n * np.asarray(u[i]) for n, u in zip(sizes, updates)) / sum(
      sizes
    )
    np.testing.assert_allclose(tensor, fedavg, rtol=1e-6)


def test_group_weights_sum_the_clients_label_counts_per_group():
  groups = [[0, 2], [1]]
  weight_fn = fed2.group_weight_fn(groups, num_classes=3)
  counts = tf.constant([2.0, 1.0, 3.0])  # labels 0, 0, 1, 2, 2, 2
  np.testing.assert_array_equal(
    weight_fn(counts, tf.constant(6.0)).numpy(), [6, 5, 1]
  )
  np.testing.assert_array_equal(
    weight_fn(counts, tf.constant(0.0)).numpy(), [0, 0, 0]
  )


def test_client_work_counts_the_labels_it_trains_on():
  def record_counts(counts, default_weight):
    return tf.concat([[default_weight], counts], 0)

  model_fn = lambda: models.get_model('mlp', 3, (2,))
  labels = np.array([0, 0, 1, 2, 2, 2], np.int32)
  dataset = (
    tf.data.Dataset.from_tensor_slices(
      collections.OrderedDict(x=np.zeros((6, 2), np.float32), y=labels)
    )
    .repeat(2)
    .batch(4)
  )
  client_work = local_training.build_local_training_client_work(
    model_fn,
    dataset.element_spec,
    optimizers.build_client_sgd(0.1),
    client_weight_fn=record_counts,
  )
  weights = model_lib.initial_weights(model_fn, seed=0)
  output = client_work.next(client_work.initialize(), [weights], [dataset])
  # Two epochs: every label counted twice; the example count comes first.
  np.testing.assert_array_equal(output.result[0].update_weight, [12, 4, 2, 6])


def test_total_variance_by_hand():
  assert np.isclose(
    fed2.layer_total_variance(np.array([[1.0, 0.0], [0.0, 1.0]])), 0.5
  )
  assert fed2.layer_total_variance(np.ones((4, 3)) / 3) == 0.0


def test_class_preference_and_layer_report(tmp_path):
  model = fed2.grouped_model(
    _plan('fedcka_cnn', (8, 8, 1)), 10, (8, 8, 1), 5, seed=0
  )
  x = np.random.default_rng(0).random((16, 8, 8, 1)).astype(np.float32)
  preference = fed2.class_preference(model, x, 'layer_1')
  assert preference.shape == (16, 10)  # 16 filters x 10 classes
  assert np.allclose(
    np.abs(preference).sum(1)[np.abs(preference).sum(1) > 0], 1.0
  )
  variances = fed2.total_variance_by_layer(model, x)
  assert list(variances)[:2] == ['layer_1', 'layer_2']
  assert all(v >= 0 for v in variances.values())
  csv_path, png_path = analysis.write_total_variance_report(
    variances, str(tmp_path)
  )
  assert open(csv_path).read().startswith('layer,total_variance\nlayer_1,')
  assert open(png_path, 'rb').read(4) == b'\x89PNG'


def test_short_fed2_run_trains_on_digits(tmp_path):
  config = experiment.ExperimentConfig(
    method='fed2',
    task='digits',
    model='fedcka_cnn',
    fed2_groups=5,
    num_clients=4,
    clients_per_round=4,
    rounds=4,
    local_epochs=2,
    output_dir=str(tmp_path / 'run'),
    cache_dir=str(tmp_path / 'cache'),
  )
  experiment.run(config, progress=False)
  import csv

  with open(tmp_path / 'run' / 'metrics.csv') as f:
    losses = [float(r['client_work/train/loss']) for r in csv.DictReader(f)]
  assert losses[-1] < losses[0] - 0.2


def test_paired_averaging_trains_better_than_class_weighting(tmp_path):
  # Digits, 2 classes per client, with group normalization (the paper's
  # model): the paper's pairing (by examples) trains. Weighting group g by
  # each client's examples of g's classes drops the push-down its logits
  # get from the other clients: it ends well above (it stays finite).
  import csv

  losses = {}
  for pairing in ('uniform', 'class_weighted'):
    config = experiment.ExperimentConfig(
      method='fed2',
      task='digits',
      model='fedcka_cnn',
      fed2_groups=10,
      fed2_pairing=pairing,
      partition='pathological',
      classes_per_client=2,
      num_clients=10,
      clients_per_round=10,
      rounds=5,
      local_epochs=2,
      client_learning_rate=0.05,
      client_momentum=0.9,
      output_dir=str(tmp_path / pairing),
      cache_dir=str(tmp_path / 'c'),
    )
    results = experiment.run(config, progress=False)
    with open(tmp_path / pairing / 'metrics.csv') as f:
      losses[pairing] = [
        float(r['client_work/train/loss']) for r in csv.DictReader(f)
      ]
    losses[pairing + '_rejected'] = results['rejected_rounds']
  assert max(losses['uniform']) < 3.0
  assert losses['uniform'][-1] < losses['uniform'][0] - 0.3
  assert losses['class_weighted'][-1] > losses['uniform'][-1] + 0.3
  assert losses['class_weighted_rejected'] == 0


def test_paired_averaging_weighs_each_group_by_the_clients_examples():
  # Two clients of 30 and 10 examples; one round each alone gives w0, w1,
  # and one round of both must give (30 w0 + 10 w1) / 40 in every group.
  rng = np.random.default_rng(6)
  sizes = {'big': 30, 'small': 10}
  client_data = tff.simulation.datasets.TestClientData(
    {
      name: collections.OrderedDict(
        x=rng.normal(size=(n, 6)).astype(np.float32),
        y=rng.integers(0, 4, size=n).astype(np.int32),
      )
      for name, n in sizes.items()
    }
  ).preprocess(lambda ds: ds.batch(5))
  model_fn = fed2.grouped_model_fn(
    fed2.LayerPlan('fed2_mlp', (('fc', 8), ('fc', 8)), decouple_depth=2),
    4,
    (6,),
    num_groups=2,
  )
  process = fed2.build_fed2(
    model_fn,
    client_data.element_type_structure,
    client_optimizer_fn=optimizers.build_client_sgd(0.1),
    num_groups=2,
    dataset_computation=client_data,
  )
  initial = process.set_model_weights(
    process.initialize(), model_lib.initial_weights(model_fn, 0)
  )

  def one_round(clients):
    return process.get_model_weights(
      process.next(initial, clients).state
    ).trainable

  alone = {name: one_round([name]) for name in sizes}
  both = one_round(list(sizes))
  groups = fed2.tensor_groups(model_fn)
  assert -1 in groups and fed2.STACKED in groups  # shared, and grouped
  for t, group in enumerate(groups):
    expected = (30 * alone['big'][t] + 10 * alone['small'][t]) / 40
    # A stacked tensor holds group g's weights in slice g.
    slices = range(2) if group == fed2.STACKED else [slice(None)]
    for g in slices:
      np.testing.assert_allclose(
        both[t][g],
        expected[g],
        rtol=1e-5,
        atol=1e-6,
        err_msg=f'tensor {t}, {g}',
      )


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
