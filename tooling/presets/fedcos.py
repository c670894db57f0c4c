"""The presets of FedCos (Zhang et al., IEEE IoT-J 2022): its tables'
columns."""

from tff_methods_tooling.presets import base

PRESETS: list[base.Preset] = []

# FedCos (Zhang et al.), Tables I-V: local plain SGD, lr 0.01 by default.

_FEDCOS = 'FedCos (Zhang et al., IEEE IoT-J 2022)'
_FEDCOS_SCENES = (  # column name, partition settings
  ('totally', dict(partition='mixed', non_iid_fraction=1.0)),
  ('90pct', dict(partition='mixed', non_iid_fraction=0.9)),
  ('70pct', dict(partition='mixed', non_iid_fraction=0.7)),
  ('iid', dict(partition='iid')),
)
_FEDCOS_NOTES = (
  '"x% non-IID" is --partition=mixed --non_iid_fraction=x/100: one '
  'label-sorted shard per client with the rest replaced by an IID slice.',
  "FedAvgM rows use the FedCos code's form, m = beta m + (1 - beta) delta "
  "(--server_momentum_form=ema), not TFF's heavy ball.",
)
# Rows of Tables I and II: FedProx 0.1, FedAvgM momentum 0.5, FedOpt server
# learning rate 1.5, FedCos 0.01 / 0.02, and each baseline + FedCos(0.02).
_FEDCOS_SILO_ROWS = (
  ('fedavg', 'FedAvg', 'fedavg', {}),
  ('fedprox0.1', 'FedProx(0.1)', 'fedprox', {'fedprox_mu': 0.1}),
  (
    'fedavgm0.5',
    'FedAvgM(0.5)',
    'fedavgm',
    {'server_momentum': 0.5, 'server_momentum_form': 'ema'},
  ),
  ('fedopt1.5', 'FedOpt(1.5)', 'fedavg', {'server_learning_rate': 1.5}),
  ('fedcos0.01', 'FedCos(0.01)', 'fedcos', {'fedcos_mu': 0.01}),
  ('fedcos0.02', 'FedCos(0.02)', 'fedcos', {'fedcos_mu': 0.02}),
  (
    'fedprox0.1+fedcos0.02',
    'FedProx(0.1)+FedCos(0.02)',
    'fedprox+fedcos',
    {'fedprox_mu': 0.1, 'fedcos_mu': 0.02},
  ),
  (
    'fedavgm0.5+fedcos0.02',
    'FedAvgM(0.5)+FedCos(0.02)',
    'fedavgm+fedcos',
    {'server_momentum': 0.5, 'server_momentum_form': 'ema', 'fedcos_mu': 0.02},
  ),
  (
    'fedopt1.5+fedcos0.02',
    'FedOpt(1.5)+FedCos(0.02)',
    'fedcos',
    {'server_learning_rate': 1.5, 'fedcos_mu': 0.02},
  ),
)
_FEDCOS_T1_VALUES = (  # per row: totally, 90%, 70%, IID
  (49.56, 64.30, 66.82, 68.78),
  (44.75, 61.75, 65.30, 66.27),
  (48.35, 64.06, 66.38, 67.95),
  (51.21, 66.11, 68.94, 70.57),
  (54.54, 68.33, 70.50, 71.75),
  (54.80, 69.83, 71.46, 73.30),
  (50.85, 67.68, 70.65, 71.43),
  (54.30, 69.27, 71.01, 72.39),
  (54.46, 69.97, 72.64, 73.37),
)
_FEDCOS_T2_VALUES = (
  (74.91, 85.15, 86.83, 88.04),
  (74.47, 84.35, 86.12, 87.51),
  (74.76, 85.18, 86.65, 87.98),
  (75.47, 85.97, 87.60, 88.43),
  (79.21, 87.37, 88.69, 89.46),
  (80.63, 87.61, 89.08, 89.52),
  (78.23, 87.15, 88.56, 89.22),
  (78.72, 87.49, 88.67, 89.31),
  (80.76, 87.51, 89.03, 89.45),
)
_FEDCOS_SILO = dict(
  client_learning_rate=0.01,
  client_momentum=0.0,
  batch_size=128,
  local_steps=400,
  rounds=100,
)
for _table, _values, _data in (
  (
    'table1',
    _FEDCOS_T1_VALUES,
    dict(task='cifar10', model='lenet', num_clients=5, clients_per_round=5),
  ),
  (
    'table2',
    _FEDCOS_T2_VALUES,
    dict(task='fmnist', model='mlp1', num_clients=7, clients_per_round=7),
  ),
):
  for _i, (_scene, _partition) in enumerate(_FEDCOS_SCENES):
    base.add(
      PRESETS,
      base.Preset(
        name=f'fedcos_{_table}_{_scene}',
        paper=_FEDCOS,
        table=f'Table {"I" if _table == "table1" else "II"}, '
        f'{_data["task"]}, {_scene} non-IID'.replace('iid non-IID', 'IID'),
        settings=dict(_FEDCOS_SILO, **_data, **_partition),
        rows=tuple(
          base.Row(key, label, method, settings, {'accuracy': v[_i]})
          for (key, label, method, settings), v in zip(
            _FEDCOS_SILO_ROWS, _values
          )
        ),
        main='fedcos0.02',
        notes=_FEDCOS_NOTES
        + (
          '100 rounds: "500 epochs for each client (about 100 rounds)" '
          '(Table I; Table II "the same settings").',
          'FedOpt(eta_g) is FedAvg with server learning rate eta_g; '
          'FedAvgM(0.5) is server momentum 0.5.',
        )
        + (
          (
            'The FMNIST MLP is mlp1 (one hidden layer of 200, the '
            "reference code's MLP without its dropout).",
          )
          if _table == 'table2'
          else ()
        ),
      ),
    )

# Table III: ResNet-18 (GN) on CIFAR-100, 5 clients, batch 64, 200 steps.
_FEDCOS_T3 = (
  ('fedavg', 'FedAvg', 'fedavg', {}, 50.51, 52.84, 64.93),
  (
    'fedprox0.01',
    'FedProx(0.01)',
    'fedprox',
    {'fedprox_mu': 0.01},
    50.34,
    50.54,
    64.58,
  ),
  (
    'fedcos0.01',
    'FedCos(0.01)',
    'fedcos',
    {'fedcos_mu': 0.01},
    52.62,
    54.49,
    65.13,
  ),
  (
    'fedcos0.02',
    'FedCos(0.02)',
    'fedcos',
    {'fedcos_mu': 0.02},
    53.37,
    55.50,
    65.35,
  ),
)
for _i, (_scene, _partition) in enumerate(
  s for s in _FEDCOS_SCENES if s[0] != '70pct'
):
  base.add(
    PRESETS,
    base.Preset(
      name=f'fedcos_table3_{_scene}',
      paper=_FEDCOS,
      table=f'Table III, cifar100, {_scene} non-IID'.replace(
        'iid non-IID', 'IID'
      ),
      settings=dict(
        task='cifar100',
        model='resnet18',
        num_clients=5,
        clients_per_round=5,
        client_learning_rate=0.01,
        client_momentum=0.0,
        batch_size=64,
        local_steps=200,
        rounds=234,
        **_partition,
      ),
      rows=base.rows(_FEDCOS_T3, ('totally', '90pct', 'iid'), _i),
      main='fedcos0.02',
      notes=_FEDCOS_NOTES
      + (
        '234 rounds: "300 epochs for each client" at 200 steps of 64 from '
        '10,000 examples per client.',
      ),
    ),
  )

# Table IV (the text calls it V): cross-device, 100 clients, 10% / 20% per
# round, two label-sorted shards each, batch 64, 100 steps, 250 rounds; the
# best and the last accuracy.
_FEDCOS_T4 = (
  ('fedavg', 'FedAvg', 'fedavg', {}),
  ('fedprox0.1', 'FedProx(0.1)', 'fedprox', {'fedprox_mu': 0.1}),
  ('fedcos0.02', 'FedCos(0.02)', 'fedcos', {'fedcos_mu': 0.02}),
  ('fedcos0.05', 'FedCos(0.05)', 'fedcos', {'fedcos_mu': 0.05}),
)
_FEDCOS_T4_VALUES = {  # (best, last) per row
  ('cifar10', 10): (
    (49.91, 48.69),
    (49.38, 49.63),
    (54.90, 52.54),
    (59.36, 57.50),
  ),
  ('cifar10', 20): (
    (51.44, 50.61),
    (50.66, 50.38),
    (57.97, 56.15),
    (61.80, 59.07),
  ),
  ('fmnist', 10): (
    (82.69, 79.68),
    (82.44, 79.73),
    (84.49, 82.21),
    (85.69, 85.22),
  ),
  ('fmnist', 20): (
    (83.29, 79.96),
    (83.26, 79.68),
    (86.07, 84.35),
    (86.74, 85.87),
  ),
}
for (_task, _percent), _values in _FEDCOS_T4_VALUES.items():
  base.add(
    PRESETS,
    base.Preset(
      name=f'fedcos_table4_{_task}_{_percent}pct',
      paper=_FEDCOS,
      table=f'Table IV (cross-device), {_task}, {_percent}% of 100 clients '
      'per round',
      settings=dict(
        task=_task,
        model='lenet' if _task == 'cifar10' else 'mlp1',
        num_clients=100,
        clients_per_round=_percent,
        partition='shards',
        shards_per_client=2,
        client_learning_rate=0.01,
        client_momentum=0.0,
        batch_size=64,
        local_steps=100,
        rounds=250,
      ),
      rows=tuple(
        base.Row(
          key,
          label,
          method,
          settings,
          {'best_accuracy': v[0], 'accuracy': v[1]},
        )
        for (key, label, method, settings), v in zip(_FEDCOS_T4, _values)
      ),
      main='fedcos0.05',
      notes=(
        "The paper's text numbers this table V, as the Shakespeare " 'one.',
      ),
    ),
  )

# Table V: Shakespeare, batch 10, lr 0.5, 50 local steps.
_FEDCOS_T5 = (
  ('fedavg', 'FedAvg', 'fedavg', {}, 37.46, 38.08),
  (
    'fedprox0.01',
    'FedProx(0.01)',
    'fedprox',
    {'fedprox_mu': 0.01},
    35.60,
    35.64,
  ),
  (
    'fedcos0.005',
    'FedCos(0.005)',
    'fedcos',
    {'fedcos_mu': 0.005},
    40.25,
    40.91,
  ),
  ('fedcos0.01', 'FedCos(0.01)', 'fedcos', {'fedcos_mu': 0.01}, 41.80, 42.96),
)
for _i, (_percent, _per_round) in enumerate(((10, 72), (20, 143))):
  base.add(
    PRESETS,
    base.Preset(
      name=f'fedcos_table5_shakespeare_{_percent}pct',
      paper=_FEDCOS,
      table=f'Table V, Shakespeare, {_percent}% of clients per round',
      settings=dict(
        task='shakespeare',
        model='shakespeare_lstm100',
        clients_per_round=_per_round,
        client_learning_rate=0.5,
        client_momentum=0.0,
        batch_size=10,
        local_steps=50,
        rounds=250,
        rounds_per_eval=10,
      ),
      rows=base.rows(_FEDCOS_T5, ('10pct', '20pct'), _i),
      main='fedcos0.01',
      notes=(
        "The paper has 143 speaking roles; TFF's Shakespeare has 715, "
        f'so {_percent}% is {_per_round} clients per round.',
        '250 rounds and evaluation every 10 rounds are choices (the '
        'paper gives no round count for this table).',
      ),
    ),
  )
