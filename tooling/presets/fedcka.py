"""The presets of FedCKA (Son, Kim and Chung, Applied Sciences 2022): its
tables' columns."""

from tff_methods_tooling.presets import base

PRESETS: list[base.Preset] = []

# FedCKA (Son, Kim and Chung, Applied Sciences 2022), Section 4: SGD lr 0.1,
# momentum 0.9, weight decay 1e-5, 10 local epochs, batch 128, 10 clients
# all taking part; mu tuned per column (the best one is the row's setting).

_FEDCKA = 'FedCKA (Son et al., Appl. Sci. 2022)'
_FEDCKA_SETTINGS = dict(
  partition='dirichlet',
  num_clients=10,
  clients_per_round=10,
  local_epochs=10,
  batch_size=128,
  client_learning_rate=0.1,
  client_momentum=0.9,
  weight_decay=1e-5,
  fedcka_layers=2,
  fedcka_similarity='linear_cka',
  moon_temperature=0.5,
)
_FEDCKA_NOTES = (
  'SCAFFOLD trains with plain SGD here (its control-variate update '
  'assumes it); the paper does not say.',
)


def _fedcka_rows(table, best_mu, column: int) -> tuple[base.Row, ...]:
  """One column of a FedCKA table whose methods carry their best mu there.

  `table` rows are (key, label, method, accuracy per column); `best_mu`
  maps a method to its best mu per column.
  """
  return tuple(
    base.Row(
      key,
      label,
      method,
      {'mu': best_mu[method][column]} if method in best_mu else {},
      {'accuracy': values[column]},
    )
    for key, label, method, *values in table
  )


# Table 1 (alpha = 5.0): the best mu of each method per data set (text).
_FEDCKA_T1_COLUMNS = ('cifar10', 'cifar100', 'tinyimagenet')
_FEDCKA_T1_SETTINGS = (
  dict(task='cifar10', model='fedcka_cnn', rounds=100),
  dict(task='cifar100', model='resnet50', projection_dim=256, rounds=40),
  dict(
    task='image_folder',
    image_size=64,
    model='resnet50',
    projection_dim=256,
    rounds=20,
  ),
)
_FEDCKA_T1_MU = {  # method -> best mu per column (Section 4.2)
  'fedprox': (0.001, 0.1, 0.1),
  'moon': (10.0, 5.0, 0.1),
  'fedcka': (3.0, 10.0, 3.0),
}
_FEDCKA_T1 = (  # key, label, method, value per column
  ('fedavg', 'FedAvg', 'fedavg', 64.37, 37.41, 19.49),
  ('fedprox', 'FedProx', 'fedprox', 64.58, 37.81, 20.93),
  ('scaffold', 'SCAFFOLD', 'scaffold', 64.33, 39.16, 21.18),
  ('moon', 'MOON', 'moon', 65.25, 38.37, 21.29),
  ('fedcka', 'FedCKA', 'fedcka', 67.86, 40.07, 21.46),
)
for _i, _column in enumerate(_FEDCKA_T1_COLUMNS):
  base.add(
    PRESETS,
    base.Preset(
      name=f'fedcka_table1_{_column}',
      paper=_FEDCKA,
      table=f'Table 1, {_column} (alpha = 5.0)',
      settings=dict(_FEDCKA_SETTINGS, alpha=5.0, **_FEDCKA_T1_SETTINGS[_i]),
      rows=_fedcka_rows(_FEDCKA_T1, _FEDCKA_T1_MU, _i),
      main='fedcka',
      notes=_FEDCKA_NOTES
      + (
        (
          'Tiny ImageNet: pass --data_dir=DIR holding train/ and val/ (or '
          'test/) with one sub-directory per class (move val/images into '
          'class folders using val_annotations.txt); images are read at '
          '64x64.',
        )
        if _column == 'tinyimagenet'
        else ()
      )
      + (
        (
          'ResNet-50 with group normalization (the project has no batch '
          "norm) and MOON's projection head (256) for every method.",
        )
        if _i > 0
        else ()
      ),
    ),
  )

# Table 2 (CIFAR-10, alpha 5.0 / 1.0 / 0.1). The text's best mu per alpha.
_FEDCKA_T2_ALPHAS = (5.0, 1.0, 0.1)
_FEDCKA_T2_MU = {
  'fedprox': (0.001, 0.1, 0.001),
  'moon': (0.1, 10.0, 10.0),
  'fedcka': (5.0, 3.0, 3.0),
}
_FEDCKA_T2 = (
  ('fedavg', 'FedAvg', 'fedavg', 64.37, 62.49, 50.43),
  ('fedprox', 'FedProx', 'fedprox', 64.58, 62.51, 51.07),
  ('scaffold', 'SCAFFOLD', 'scaffold', 64.33, 63.31, 40.53),
  ('moon', 'MOON', 'moon', 65.25, 62.60, 51.63),
  ('fedcka', 'FedCKA', 'fedcka', 67.86, 66.19, 52.35),
)
for _i, _alpha in enumerate(_FEDCKA_T2_ALPHAS):
  base.add(
    PRESETS,
    base.Preset(
      name=f'fedcka_table2_alpha{_alpha}',
      paper=_FEDCKA,
      table=f'Table 2, CIFAR-10, alpha = {_alpha}',
      settings=dict(
        _FEDCKA_SETTINGS,
        task='cifar10',
        model='fedcka_cnn',
        rounds=100,
        alpha=_alpha,
      ),
      rows=_fedcka_rows(_FEDCKA_T2, _FEDCKA_T2_MU, _i),
      main='fedcka',
      notes=_FEDCKA_NOTES
      + (
        "The paper's text gives other best mu values for alpha = 5.0 in "
        'Table 2 (FedCKA 5, MOON 0.1) than in Table 1 (3, 10) for the same '
        'numbers; each preset follows its own table.',
      ),
    ),
  )

# Table 3: similarity functions (CIFAR-10, alpha 5.0), accuracy and s/round.
base.add(
  PRESETS,
  base.Preset(
    name='fedcka_table3_similarity',
    paper=_FEDCKA,
    table='Table 3, similarity ablation (CIFAR-10, alpha = 5.0)',
    settings=dict(
      _FEDCKA_SETTINGS,
      task='cifar10',
      model='fedcka_cnn',
      rounds=100,
      alpha=5.0,
      mu=3.0,
    ),
    rows=(
      base.Row(
        'fedavg',
        'FedAvg',
        'fedavg',
        {},
        {'accuracy': 64.37, 'seconds_per_round': 54.82},
      ),
      base.Row(
        'frobenius',
        'Squared Frobenius norm',
        'fedcka',
        {'fedcka_similarity': 'frobenius'},
        {'accuracy': 65.54, 'seconds_per_round': 64.73},
      ),
      base.Row(
        'cosine',
        'Vectorized cosine',
        'fedcka',
        {'fedcka_similarity': 'cosine'},
        {'accuracy': 66.67, 'seconds_per_round': 65.75},
      ),
      base.Row(
        'kernel_cka',
        'Kernel CKA',
        'fedcka',
        {'fedcka_similarity': 'kernel_cka'},
        {'accuracy': 67.93, 'seconds_per_round': 122.41},
      ),
      base.Row(
        'linear_cka',
        'Linear CKA',
        'fedcka',
        {'fedcka_similarity': 'linear_cka'},
        {'accuracy': 67.86, 'seconds_per_round': 104.17},
      ),
    ),
    main='linear_cka',
    notes=(
      "mu = 3, Table 1's best for CIFAR-10 (Table 3's is not given).",
      "The paper's seconds per round are on a GTX Titan V.",
      "frobenius and cosine are the paper's forms read as "
      "similarities in CKA's place in Eq. 2, per element: "
      '-||a1 - a2||_F^2 / (B D) (negated: a distance there would push '
      'the local model away from the global one) and the inner '
      'product of the vectorized activations / (B D); '
      'normalized_cosine and normalized_frobenius are bounded '
      'variants.',
    ),
  ),
)

# Fig. 5 (arXiv version): accuracy against M, the layers regularized, M = 1
# .. 7 on CIFAR-10 with alpha = 5.0. Only M = 2 has a number in the text
# (Table 1's 67.86); the figure's other points are not given.
base.add(
  PRESETS,
  base.Preset(
    name='fedcka_fig5_layers',
    paper=_FEDCKA,
    table='Fig. 5, layers regularized (CIFAR-10, alpha = 5.0)',
    settings=dict(
      _FEDCKA_SETTINGS,
      task='cifar10',
      model='fedcka_cnn',
      rounds=100,
      alpha=5.0,
      mu=3.0,
    ),
    rows=tuple(
      base.Row(
        f'm{m}',
        f'FedCKA, M = {m}',
        'fedcka',
        {'fedcka_layers': m},
        {'accuracy': 67.86} if m == 2 else {},
      )
      for m in range(1, 8)
    ),
    main='m2',
    notes=(
      "mu = 3, Table 1's best for CIFAR-10.",
      "M counts the CNN's seven layers from the input: two conv "
      'blocks, FC 120, 84, 84, the projection (256) and the logits. '
      "The paper's upper bound, the same CNN trained centrally, is "
      '70%.',
    ),
  ),
)
