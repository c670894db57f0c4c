"""Tests for tff_methods.templates.model_checks: what a builder checks of a
model."""

import sys
import warnings

import pytest
import tensorflow as tf

from tff_methods.algorithms import fedcka
from tff_methods.algorithms import fedmax
from tff_methods.algorithms import moon
from tff_methods.templates import model_checks
from tff_methods.templates import model_lib
from tff_methods.templates import regularizers as regularizers_lib


def _plain_model():
  inputs = tf.keras.Input((3,))
  hidden = tf.keras.layers.Dense(4, activation='relu', name='hidden')(inputs)
  return tf.keras.Model(inputs, tf.keras.layers.Dense(2, name='scores')(hidden))


class _ReadsZ(regularizers_lib.Regularizer):
  name = 'reads_z'
  display_name = 'ReadsZ'
  outputs = ('z',)

  def __call__(self, step):
    return tf.constant(0.0)


def test_a_missing_output_is_named_with_who_reads_it():
  model_fn = model_lib.contract_model_fn(_plain_model)
  model_checks.check_outputs(
    model_lib.scratch_model(model_fn), {'logits': ['FedAvg']}
  )
  with pytest.raises(
    ValueError,
    match=r"MOON reads the model's 'z' output .*outputs \['logits'\]",
  ):
    model_checks.check_outputs(
      model_lib.scratch_model(model_fn), {'z': ['MOON']}
    )


def test_a_regularizer_reading_an_output_the_model_lacks_is_refused():
  with pytest.raises(ValueError, match=r"ReadsZ reads the model's 'z'"):
    model_checks.checked_model(_plain_model, [_ReadsZ()])
  with pytest.raises(TypeError, match='Pass a function that builds'):
    model_checks.checked_model(_plain_model(), [])


def test_a_builder_checks_and_reads_the_model_from_one_build():
  # A large model takes seconds to build: the checks, the input's shape and
  # the weights' shapes all come from one scratch build.
  builds = []

  def counted_model():
    builds.append(1)
    inputs = tf.keras.Input((3,))
    normed = tf.keras.layers.BatchNormalization()(inputs)
    return tf.keras.Model(inputs, tf.keras.layers.Dense(2)(normed))

  with pytest.warns(UserWarning, match='2 non-trainable variables'):
    model_fn, model = model_checks.checked_model(counted_model, [])
  assert len(builds) == 1
  assert model_checks.input_shape(model).as_list() == [None, 3]
  zeros = model_lib.zeros_like_weights(model)
  assert [z.shape for z in zeros.trainable] == [(3,), (3,), (3, 2), (2,)]
  assert [z.shape for z in zeros.non_trainable] == [(3,), (3,)]
  assert not any(z.any() for z in zeros.trainable + zeros.non_trainable)
  # The function returned builds the model in the contract's form.
  with tf.Graph().as_default():
    assert sorted(model_fn().output) == ['logits']
  assert len(builds) == 2


def test_needed_outputs_are_the_terms_declared_and_the_deepest_layer_leads():
  terms = [
    fedcka.CKAContrastiveTerm(1.0, layers=3),
    moon.ModelContrastiveTerm(1.0),
    fedmax.ActivationEntropyTerm(1.0),
  ]
  needed = model_checks.needed_outputs(terms)
  assert needed == {
    'layer_1': ['FedCKA'],
    'layer_2': ['FedCKA'],
    'layer_3': ['FedCKA'],
    'z': ['MOON'],
    'features': ['FedMAX'],
  }
  has = ('logits', 'features', 'layer_1', 'layer_2')
  # Of the missing ones, the deepest layer: it says how many are read.
  assert model_checks.missing_output(needed, has) == 'layer_3'
  assert model_checks.missing_output(needed, has + ('layer_3',)) == 'z'
  assert model_checks.missing_output(needed, has + ('layer_3', 'z')) is None


def test_the_input_shape_is_the_models_batched_x():
  assert model_checks.input_shape(
    model_lib.scratch_model(_plain_model)
  ).as_list() == [None, 3]


def test_only_a_model_with_non_trainable_variables_gets_the_warning():
  def with_batch_norm():
    inputs = tf.keras.Input((3,))
    normed = tf.keras.layers.BatchNormalization()(inputs)
    return tf.keras.Model(inputs, tf.keras.layers.Dense(2)(normed))

  with pytest.warns(UserWarning, match='2 non-trainable variables'):
    model_checks.warn_of_unaveraged_variables(
      model_lib.scratch_model(with_batch_norm)
    )
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter('always')
    model_checks.warn_of_unaveraged_variables(
      model_lib.scratch_model(_plain_model)
    )
  assert not [w for w in caught if 'non-trainable' in str(w.message)]


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
