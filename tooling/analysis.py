"""The papers' analysis figures, from a fresh short run of a method.

`analyze(config, output_dir)` trains `config.method` for `config.rounds`
rounds through its TFF process and, before every round, trains each
probed client's local model from the round's global model (eagerly, with
the method's stateless regularizers; methods with per-client or server
state and Fed2's aggregator fall back to plain local training, which is
what the figures compare against). Each figure is a PNG plus its numbers as
CSV:

1. `cka_layers`: linear CKA, per layer, of the local models against the
   global model and against each other on the test set (FedCKA Fig. 2);
2. `activation_divergence`: per round, the mean KL between each local
   model's and the global model's mean activation (`features`,
   normalized to a distribution) on the test set (FedMAX Fig. 2);
3. `update_angles`: per round, the mean angle between clients' updates and
   between each update and the global model's last move (FedCos Figs. 3,
   12);
4. `partition`: the partition heatmap (FedCKA Fig. 4);
5. `total_variance`: Fed2's per-layer feature total variance of the final
   global model (Fed2 Eq. 17), for every method's model.
"""

import csv
import itertools
import os
from typing import Mapping

import numpy as np
import tensorflow as tf

from tff_methods.algorithms import fed2_interpretation
from tff_methods.algorithms import methods
from tff_methods.algorithms import similarity
from tff_methods.clients import client_keys
from tff_methods.templates import local_training
from tff_methods.templates import model_lib
from tff_methods_tasks import datasets
from tff_methods_tasks import report
from tff_methods_tooling import experiment


def _flat(weights) -> np.ndarray:
  return model_lib.flat_trainable(weights)


def angle_degrees(a: np.ndarray, b: np.ndarray) -> float:
  """The angle between two vectors, in degrees (nan if either is 0)."""
  norms = np.linalg.norm(a) * np.linalg.norm(b)
  if norms == 0:
    return float('nan')
  return float(np.degrees(np.arccos(np.clip(a @ b / norms, -1.0, 1.0))))


def activation_kl(
  local_features: np.ndarray, global_features: np.ndarray
) -> float:
  """KL(p_local || p_global) of the mean activations, each normalized."""

  def distribution(features):
    mean = (
      np.abs(
        np.asarray(features, np.float64).reshape(-1, features.shape[-1])
      ).mean(0)
      + 1e-12
    )
    return mean / mean.sum()

  p, q = distribution(local_features), distribution(global_features)
  return float(np.sum(p * np.log(p / q)))


def _write_csv(path, header, rows):
  with open(path, 'w', newline='') as f:
    writer = csv.writer(f)
    writer.writerow(header)
    writer.writerows(rows)


def _plot(path, title, xlabel, ylabel, series, xticks=None):
  import matplotlib

  matplotlib.use('Agg')
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(6, 3.8))
  for label, (xs, ys) in series.items():
    ax.plot(xs, ys, 'o-', label=label)
  if xticks is not None:
    ax.set_xticks(range(1, len(xticks) + 1), xticks)
  ax.set_title(title)
  ax.set_xlabel(xlabel)
  ax.set_ylabel(ylabel)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path


def _local_regularizers(config, hparams):
  """The method's regularizers that eager local training can apply."""
  return [
    term
    for term in methods.local_terms(config.method, hparams)
    if not (term.previous_outputs or term.server_state or term.client_state)
  ]


def analyze(
  config: experiment.ExperimentConfig,
  output_dir: str,
  max_clients: int = 5,
  test_examples: int = 256,
) -> dict:
  """Runs the analysis; writes the figures and CSVs to `output_dir`.

  Needs a TFF execution context (`tff_methods.execution.runtime`).

  Returns:
    The paths written, by figure name.
  """
  experiment.validate(config)
  os.makedirs(output_dir, exist_ok=True)
  data = experiment.load_data(config)
  process, keras_model_fn = experiment.build_process(config, data)
  hparams = config.hyperparameters(len(data.client_data.client_ids))
  batches = config.local_batches()
  probed = list(data.client_data.client_ids[:max_clients])
  local_update = local_training.build_client_update_fn(
    keras_model_fn,
    hparams.client_optimizer(),
    _local_regularizers(config, hparams),
    local_training.tff.learning.ClientWeighting.NUM_EXAMPLES,
  )
  probe_model = keras_model_fn()
  x_test = data.test_x[:test_examples]
  layers = model_lib.layer_names(probe_model)

  def outputs_of(weights):
    model_lib.assign_weights(probe_model, weights)
    out = probe_model(tf.constant(x_test), training=False)
    return {k: out[k].numpy() for k in layers + ['features']}

  state = process.initialize()
  state = process.set_model_weights(
    state, model_lib.initial_weights(keras_model_fn, config.seed)
  )
  previous_global = None
  kl_rows, angle_rows, cka_rows = [], [], []
  for round_num in range(1, config.rounds + 1):
    global_weights = process.get_model_weights(state)
    global_flat = _flat(global_weights)
    tensors = tf.nest.map_structure(tf.constant, global_weights)
    local_weights = [
      local_update(
        tensors,
        batches(data.client_data.create_tf_dataset_for_client(c), c, round_num),
      )[2]
      for c in probed
    ]
    updates = [_flat(w) - global_flat for w in local_weights]
    global_out = outputs_of(global_weights)
    local_out = [outputs_of(w) for w in local_weights]
    kl_rows.append(
      [
        round_num,
        float(
          np.mean(
            [
              activation_kl(o['features'], global_out['features'])
              for o in local_out
            ]
          )
        ),
      ]
    )
    pairwise = [
      angle_degrees(a, b) for a, b in itertools.combinations(updates, 2)
    ]
    to_global = (
      [angle_degrees(u, global_flat - previous_global) for u in updates]
      if previous_global is not None
      else []
    )
    angle_rows.append(
      [
        round_num,
        float(np.nanmean(pairwise)) if pairwise else np.nan,
        float(np.nanmean(to_global)) if to_global else np.nan,
      ]
    )
    for layer in layers:
      with_global = np.mean(
        [
          similarity.linear_cka(o[layer], global_out[layer]).numpy()
          for o in local_out
        ]
      )
      between = [
        similarity.linear_cka(a[layer], b[layer]).numpy()
        for a, b in itertools.combinations(local_out, 2)
      ]
      cka_rows.append(
        [
          round_num,
          layer,
          float(with_global),
          float(np.mean(between)) if between else np.nan,
        ]
      )
    previous_global = global_flat
    state = process.next(
      state,
      [
        client_keys.client_key(c, round_num)
        for c in datasets.sample_clients(
          data.client_data.client_ids,
          config.clients_per_round,
          round_num,
          config.seed,
        )
      ],
    ).state

  paths = {}
  path = os.path.join(output_dir, 'activation_divergence')
  _write_csv(path + '.csv', ['round', 'mean_kl_local_global'], kl_rows)
  paths['activation_divergence'] = _plot(
    path + '.png',
    f'{config.method}: activation divergence',
    'round',
    'KL(local || global)',
    {'mean over clients': ([r[0] for r in kl_rows], [r[1] for r in kl_rows])},
  )
  path = os.path.join(output_dir, 'update_angles')
  _write_csv(
    path + '.csv',
    ['round', 'between_clients_deg', 'to_global_direction_deg'],
    angle_rows,
  )
  paths['update_angles'] = _plot(
    path + '.png',
    f'{config.method}: angles of client updates',
    'round',
    'degrees',
    {
      'between clients': (
        [r[0] for r in angle_rows],
        [r[1] for r in angle_rows],
      ),
      'to the global move': (
        [r[0] for r in angle_rows],
        [r[2] for r in angle_rows],
      ),
    },
  )
  path = os.path.join(output_dir, 'cka_layers')
  _write_csv(
    path + '.csv',
    ['round', 'layer', 'cka_local_global', 'cka_between_locals'],
    cka_rows,
  )
  last = [r for r in cka_rows if r[0] == config.rounds]
  positions = list(range(1, len(last) + 1))
  paths['cka_layers'] = _plot(
    path + '.png',
    f'{config.method}: layer-wise CKA (round ' f'{config.rounds})',
    'layer (from the input)',
    'linear CKA',
    {
      'local vs global': (positions, [r[2] for r in last]),
      'local vs local': (positions, [r[3] for r in last]),
    },
    xticks=[str(p) for p in positions],
  )
  if data.train_labels is not None:
    paths['partition'] = report.write_partition_report(
      data.class_counts(), output_dir
    )[1]
  model_lib.assign_weights(probe_model, process.get_model_weights(state))
  variances = fed2_interpretation.total_variance_by_layer(
    probe_model, x_test[:64]
  )
  paths['total_variance'] = write_total_variance_report(variances, output_dir)[
    1
  ]
  return paths


def write_total_variance_report(
  variances: Mapping[str, float], output_dir: str
) -> tuple[str, str]:
  """Writes `total_variance.csv` and `total_variance.png` (per layer)."""
  import matplotlib

  matplotlib.use('Agg')
  import matplotlib.pyplot as plt

  os.makedirs(output_dir, exist_ok=True)
  csv_path = os.path.join(output_dir, 'total_variance.csv')
  with open(csv_path, 'w') as f:
    f.write('layer,total_variance\n')
    for layer, value in variances.items():
      f.write(f'{layer},{value:.6g}\n')
  fig, ax = plt.subplots(figsize=(6, 3.5))
  ax.plot(range(1, len(variances) + 1), list(variances.values()), 'o-')
  ax.set_xticks(range(1, len(variances) + 1))
  ax.set_xlabel('layer (1 = nearest the input)')
  ax.set_ylabel('feature total variance (Eq. 17)')
  ax.set_title('Fed2: layer-wise feature divergence')
  fig.tight_layout()
  png_path = os.path.join(output_dir, 'total_variance.png')
  fig.savefig(png_path, dpi=100)
  plt.close(fig)
  return csv_path, png_path
