"""Tests for Fed2: grouped models, feature-paired averaging, interpretation."""

import collections
import sys

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_methods.algorithms import fed2
from tff_methods.templates import model_lib
from tff_methods.templates import optimizers
from tff_methods_tasks import models
from tff_methods_tooling import experiment

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


def test_a_model_of_other_groups_than_num_groups_is_refused():
  # A user's own grouped model of 5 groups under the default num_groups=10
  # would train as if it were Fed2 with 10.
  model_fn = fed2.grouped_model_fn(
    fed2.LayerPlan('fed2_mlp', (('fc', 40),), decouple_depth=2),
    10,
    (8, 8, 1),
    num_groups=5,
  )
  spec = collections.OrderedDict(
    x=tf.TensorSpec([None, 8, 8, 1], tf.float32),
    y=tf.TensorSpec([None], tf.int32),
  )
  with pytest.raises(
    ValueError, match=r'model has 5 groups .* num_groups=10: pass num_groups=5'
  ):
    fed2.build_fed2(
      model_fn, spec, client_optimizer_fn=optimizers.build_client_sgd(0.1)
    )
  fed2.build_fed2(
    model_fn,
    spec,
    client_optimizer_fn=optimizers.build_client_sgd(0.1),
    num_groups=5,
  )


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


def test_paired_averaging_trains_under_strong_label_skew(tmp_path):
  # Digits, 2 classes per client, with group normalization (the paper's
  # model): the paper's pairing (group g with group g, by examples) trains.
  import csv

  config = experiment.ExperimentConfig(
    method='fed2',
    task='digits',
    model='fedcka_cnn',
    fed2_groups=10,
    partition='pathological',
    classes_per_client=2,
    num_clients=10,
    clients_per_round=10,
    rounds=5,
    local_epochs=2,
    client_learning_rate=0.05,
    client_momentum=0.9,
    output_dir=str(tmp_path / 'run'),
    cache_dir=str(tmp_path / 'c'),
  )
  results = experiment.run(config, progress=False)
  with open(tmp_path / 'run' / 'metrics.csv') as f:
    losses = [float(r['client_work/train/loss']) for r in csv.DictReader(f)]
  assert max(losses) < 3.0
  assert losses[-1] < losses[0] - 0.3
  assert results['rejected_rounds'] == 0


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
