"""Tests for tff_methods.algorithms.fed2_interpretation: the paper's Eq. 9 class
preferences and Eq. 17 layer total variance."""

import sys

import numpy as np
import pytest

from tff_methods.algorithms import fed2
from tff_methods.algorithms import fed2_interpretation
from tff_methods_tasks import models
from tff_methods_tooling import analysis

pytestmark = pytest.mark.usefixtures('tff_worker')


def test_total_variance_by_hand():
  assert np.isclose(
    fed2_interpretation.layer_total_variance(
      np.array([[1.0, 0.0], [0.0, 1.0]])
    ),
    0.5,
  )
  assert fed2_interpretation.layer_total_variance(np.ones((4, 3)) / 3) == 0.0


def test_class_preference_and_layer_report(tmp_path):
  model = fed2.grouped_model(
    fed2.LayerPlan(**models.fed2_plan('fedcka_cnn', (8, 8, 1))),
    10,
    (8, 8, 1),
    5,
    seed=0,
  )
  x = np.random.default_rng(0).random((16, 8, 8, 1)).astype(np.float32)
  preference = fed2_interpretation.class_preference(model, x, 'layer_1')
  assert preference.shape == (16, 10)  # 16 filters x 10 classes
  assert np.allclose(
    np.abs(preference).sum(1)[np.abs(preference).sum(1) > 0], 1.0
  )
  variances = fed2_interpretation.total_variance_by_layer(model, x)
  assert list(variances)[:2] == ['layer_1', 'layer_2']
  assert all(v >= 0 for v in variances.values())
  csv_path, png_path = analysis.write_total_variance_report(
    variances, str(tmp_path)
  )
  assert open(csv_path).read().startswith('layer,total_variance\nlayer_1,')
  assert open(png_path, 'rb').read(4) == b'\x89PNG'


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
