"""Partitioners: split a label array into one index array per client.

Every partitioner takes the labels of a centralized training set and returns
a list of `num_clients` sorted `int64` index arrays into it. All randomness
comes from `seed`, so a partition is reproducible. The settings are those of
the papers this project ports:

- `iid`: a uniform random split into near-equal parts.
- `dirichlet`: per class, client shares drawn from Dir(alpha) (MOON,
  NIID-Bench, FedCKA), redrawn until every client holds `min_size` examples.
- `pathological`: k classes per client, NIID-Bench's `#C=k` ("N x C" in
  Fed2).
- `shards`: label-sorted shards, s per client (FedAvg; FedCos "totally
  non-IID" is one shard per client).
- `mixed`: shards whose given fraction is replaced by an IID slice (FedCos
  "x% non-IID").
"""

from typing import Sequence

import numpy as np

# The most redraws `dirichlet` makes before it gives up on `min_size`.
_MAX_DIRICHLET_DRAWS = 1000


def _check_labels(labels: np.ndarray) -> np.ndarray:
  labels = np.asarray(labels)
  if labels.ndim != 1 or labels.size == 0:
    raise ValueError(
      f'labels must be a non-empty 1-D array, got shape {labels.shape}.'
    )
  return labels


def _check_num_clients(num_clients: int, num_examples: int) -> None:
  if not isinstance(num_clients, (int, np.integer)) or num_clients < 1:
    raise ValueError(
      f'num_clients must be a positive integer, got ' f'{num_clients!r}.'
    )
  if num_clients > num_examples:
    raise ValueError(
      f'num_clients={num_clients} is more than the {num_examples} examples '
      'to split: some client would have no data.'
    )


def _finish(parts: Sequence[np.ndarray]) -> list[np.ndarray]:
  return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


def iid(
  labels: np.ndarray, num_clients: int, seed: int = 0
) -> list[np.ndarray]:
  """Splits the examples uniformly at random into near-equal parts."""
  labels = _check_labels(labels)
  _check_num_clients(num_clients, labels.size)
  rng = np.random.default_rng(seed)
  return _finish(np.array_split(rng.permutation(labels.size), num_clients))


def dirichlet(
  labels: np.ndarray,
  num_clients: int,
  alpha: float,
  min_size: int = 10,
  seed: int = 0,
) -> list[np.ndarray]:
  """Label-skewed split with Dirichlet(alpha) class shares per client.

  For each class, the class's examples are divided among the clients in
  proportions drawn from Dir(alpha); a client that already holds its equal
  share of the data (N / num_clients) gets no more of the next classes, as
  in MOON's and NIID-Bench's code. The whole draw is repeated until every
  client holds at least `min_size` examples. Small alpha means strong skew.

  Args:
    labels: The integer class label of every training example.
    num_clients: How many clients to split into.
    alpha: The Dirichlet concentration, > 0.
    min_size: The fewest examples any client may end up with.
    seed: Fixes the draw.

  Returns:
    One sorted index array per client.

  Raises:
    ValueError: on alpha <= 0, a `min_size` that no split can meet, or one
      that 1000 draws did not meet.
  """
  labels = _check_labels(labels)
  _check_num_clients(num_clients, labels.size)
  if not alpha > 0:
    raise ValueError(f'alpha must be > 0, got {alpha!r}.')
  if min_size < 0:
    raise ValueError(f'min_size must be >= 0, got {min_size!r}.')
  if min_size * num_clients > labels.size:
    raise ValueError(
      f'min_size={min_size} x num_clients={num_clients} is more than the '
      f'{labels.size} examples: lower min_size or the number of clients.'
    )
  rng = np.random.default_rng(seed)
  classes = np.unique(labels)
  by_class = [np.flatnonzero(labels == c) for c in classes]
  cap = labels.size / num_clients
  smallest = -1
  for _ in range(_MAX_DIRICHLET_DRAWS):
    parts = [[] for _ in range(num_clients)]
    sizes = np.zeros(num_clients)
    for idx in by_class:
      idx = rng.permutation(idx)
      shares = rng.dirichlet(np.full(num_clients, alpha))
      # A client that is already full takes no more (MOON / NIID-Bench).
      shares = shares * (sizes < cap)
      total = shares.sum()
      if total == 0:
        shares = np.full(num_clients, 1.0 / num_clients)
      else:
        shares = shares / total
      cuts = (np.cumsum(shares) * idx.size).astype(int)[:-1]
      for client, piece in enumerate(np.split(idx, cuts)):
        parts[client].extend(piece.tolist())
        sizes[client] += piece.size
    smallest = int(sizes.min())
    if smallest >= min_size:
      return _finish(parts)
  raise ValueError(
    f'dirichlet(alpha={alpha}, num_clients={num_clients}) left a client '
    f'with {smallest} < min_size={min_size} examples in each of '
    f'{_MAX_DIRICHLET_DRAWS} draws: raise alpha, or lower min_size or '
    'num_clients.'
  )


def pathological(
  labels: np.ndarray, num_clients: int, classes_per_client: int, seed: int = 0
) -> list[np.ndarray]:
  """Gives each client k classes: NIID-Bench's `noniid-#label{k}` ("#C=k").

  Client i holds class `i mod C` (of the sorted classes) and k-1 other
  distinct classes drawn at random; each class's examples are shuffled and
  split evenly among the clients that hold it. A class no client drew is
  left out (NIID-Bench's code fails there instead: it splits the class
  into 0 parts). Fed2's "N x C" splits are this partition.
  """
  labels = _check_labels(labels)
  _check_num_clients(num_clients, labels.size)
  classes = np.unique(labels)
  if not 1 <= classes_per_client <= classes.size:
    raise ValueError(
      f'classes_per_client must be in [1, {classes.size}] (the number of '
      f'classes), got {classes_per_client!r}.'
    )
  rng = np.random.default_rng(seed)
  owners = {c: [] for c in classes}
  for i in range(num_clients):
    own = classes[i % classes.size]
    others = rng.choice(
      np.delete(classes, i % classes.size),
      classes_per_client - 1,
      replace=False,
    )
    for c in (own, *others):
      owners[c].append(i)
  parts = [[] for _ in range(num_clients)]
  for c in classes:
    if not owners[c]:
      continue
    idx = rng.permutation(np.flatnonzero(labels == c))
    for client, piece in zip(owners[c], np.array_split(idx, len(owners[c]))):
      parts[client].extend(piece.tolist())
  return _finish(_check_nonempty(parts, 'pathological'))


def shards(
  labels: np.ndarray,
  num_clients: int,
  shards_per_client: int = 2,
  seed: int = 0,
) -> list[np.ndarray]:
  """Sorts the examples by label, cuts them into equal shards, deals them out.

  Each client receives `shards_per_client` shards chosen at random (FedAvg's
  pathological non-IID split; with one shard per client, FedCos's "totally
  non-IID" scene).
  """
  labels = _check_labels(labels)
  _check_num_clients(num_clients, labels.size)
  if shards_per_client < 1:
    raise ValueError(
      f'shards_per_client must be >= 1, got {shards_per_client!r}.'
    )
  num_shards = num_clients * shards_per_client
  if num_shards > labels.size:
    raise ValueError(
      f'{num_clients} clients x {shards_per_client} shards is more shards '
      f'than the {labels.size} examples.'
    )
  rng = np.random.default_rng(seed)
  # Ties within a label are broken at random, so shards of one class differ.
  order = np.lexsort((rng.random(labels.size), labels))
  pieces = np.array_split(order, num_shards)
  dealt = rng.permutation(num_shards).reshape(num_clients, shards_per_client)
  return _finish([np.concatenate([pieces[s] for s in row]) for row in dealt])


def mixed(
  labels: np.ndarray, num_clients: int, non_iid_fraction: float, seed: int = 0
) -> list[np.ndarray]:
  """FedCos's "x% non-IID": label-sorted shards partly replaced by IID data.

  The examples are dealt into one label-sorted shard per client; then each
  shard keeps a `non_iid_fraction` of its examples and the rest of all
  shards is pooled, shuffled and dealt back evenly. 1.0 is "totally
  non-IID", 0.0 is IID.
  """
  labels = _check_labels(labels)
  _check_num_clients(num_clients, labels.size)
  if not 0.0 <= non_iid_fraction <= 1.0:
    raise ValueError(
      f'non_iid_fraction must be in [0, 1], got {non_iid_fraction!r}.'
    )
  rng = np.random.default_rng(seed)
  sorted_shards = shards(labels, num_clients, 1, seed)
  kept, pool = [], []
  for shard in sorted_shards:
    shard = rng.permutation(shard)
    keep = int(round(non_iid_fraction * shard.size))
    kept.append(shard[:keep])
    pool.append(shard[keep:])
  pool = rng.permutation(np.concatenate(pool))
  iid_slices = np.array_split(pool, num_clients)
  return _finish([np.concatenate([k, s]) for k, s in zip(kept, iid_slices)])


def _check_nonempty(parts, name):
  for i, p in enumerate(parts):
    if len(p) == 0:
      raise ValueError(f'{name} partition left client {i} with no data.')
  return parts


PARTITIONERS = ('iid', 'dirichlet', 'pathological', 'shards', 'mixed')


def class_counts(
  labels: np.ndarray, parts: Sequence[np.ndarray], num_classes: int
) -> np.ndarray:
  """A (num_clients, num_classes) matrix of examples per client and class."""
  labels = np.asarray(labels)
  return np.stack(
    [np.bincount(labels[p], minlength=num_classes) for p in parts]
  )
