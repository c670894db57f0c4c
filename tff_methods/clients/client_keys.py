"""A client's key: which client, in which round.

The clients of a key-taking process (every stateful process, and every
process built with a `dataset_computation`) receive keys, not data: each
client makes its own batches from its key inside its own computation, and
a stateful client finds its state by it. The key is two strings,
`[client id, round in decimal]`: a tensor, not a structure, so that TFF's
program platform passes a list of keys as CLIENTS-placed values (it would
read a list of structures as one structure).

`ClientRoundDataSource` is TFF's program data source of such keys, for
`tff.learning.programs.train_model`: each round a seeded cohort
(`sample_clients`), numbered from 1.
"""

import json
from typing import Any, Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

CLIENT_KEY_TYPE = tff.TensorType(np.str_, [2])


def client_key(client_id: str, round_num: int) -> np.ndarray:
  """`client_id`'s `CLIENT_KEY_TYPE` key in `round_num` (from 1)."""
  return np.array([str(client_id).encode(), str(int(round_num)).encode()])


def split_client_key(key: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
  """(client id, round as int64) of a `CLIENT_KEY_TYPE` key, in TF."""
  return key[0], tf.strings.to_number(key[1], tf.int64)


def round_of_key(key: Any) -> int:
  """The round of one `[client id, round]` key; names a bad one."""
  if isinstance(key, tf.data.Dataset):
    raise TypeError(
      'A process with per-client state takes client keys, [client id, '
      'round] (tff_methods.clients.client_keys.client_key(client_id, '
      "round_num)), and makes each client's batches from its "
      'dataset_computation; it was given data sets.'
    )
  try:
    parts = np.asarray(key)
    if parts.shape != (2,):
      raise ValueError
    return int(parts[1])
  except (ValueError, TypeError):
    raise TypeError(
      f'A client key is [client id, round] (two strings, tff_methods.'
      f'client_keys.client_key(client_id, round_num)); got {key!r}. Under '
      'tff.learning.programs.train_model, use tff_methods.templates.stateful.'
      'ClientRoundDataSource(client_ids, seed) as the train_data_source: '
      'a client-id source (tff.program.ClientIdDataSource) gives no round.'
    ) from None


# How a round's cohort is drawn (`sample_clients`).
SAMPLINGS = ('without_replacement', 'poisson')


def check_sampling(sampling: str) -> None:
  """Raises ValueError for a `sampling` not in `SAMPLINGS`."""
  if sampling not in SAMPLINGS:
    raise ValueError(
      f'sampling {sampling!r} is unknown; choose one of '
      f'{", ".join(SAMPLINGS)}.'
    )


def sample_clients(
  client_ids: Sequence[str],
  clients_per_round: int,
  round_num: int,
  seed: int,
  sampling: str = 'without_replacement',
) -> list[str]:
  """The round's cohort, sorted, seeded by (seed, round) only, so a resumed
  run samples as the uninterrupted one.

  Args:
    client_ids: The population.
    clients_per_round: The cohort size ('without_replacement'), or its
      expectation ('poisson').
    round_num: The round, from 1.
    seed: The run's seed.
    sampling: 'without_replacement': exactly `clients_per_round` distinct
      clients. 'poisson': each client independently with probability
      clients_per_round / len(client_ids); the cohort may be empty, which
      DP accounting of Poisson sampling assumes (`tff_methods.privacy`).

  Raises:
    ValueError: an unknown `sampling`.
  """
  check_sampling(sampling)
  rng = np.random.default_rng([seed, round_num])
  if sampling == 'poisson':
    taken = rng.random(len(client_ids)) < clients_per_round / len(client_ids)
    return [c for c, t in zip(client_ids, taken) if t]
  chosen = rng.choice(len(client_ids), clients_per_round, replace=False)
  return [client_ids[i] for i in sorted(chosen)]


class ClientRoundDataSource(tff.program.FederatedDataSource):
  """The clients' data for TFF's program logic, as `(client, round)` keys.

  A `tff.program.FederatedDataSource` for `tff.learning.programs.
  train_model` and its kin: each `select(k)` is the next round's seeded
  cohort of k clients (`sample_clients`; k expected with `sampling=
  'poisson'`), as `CLIENT_KEY_TYPE` keys, which a stateful process's `next`
  takes. Its iterator is saved with the program state, so a resumed program
  samples as the uninterrupted one.
  """

  def __init__(
    self,
    client_ids: Sequence[str],
    seed: int = 0,
    sampling: str = 'without_replacement',
  ):
    check_sampling(sampling)
    self._client_ids = list(client_ids)
    self._seed = seed
    self._sampling = sampling

  @property
  def federated_type(self) -> tff.FederatedType:
    return tff.FederatedType(CLIENT_KEY_TYPE, tff.CLIENTS)

  def iterator(self) -> 'ClientRoundIterator':
    return ClientRoundIterator(self._client_ids, self._seed, 0, self._sampling)


class ClientRoundIterator(tff.program.FederatedDataSourceIterator):
  """`ClientRoundDataSource`'s iterator: the rounds selected so far."""

  def __init__(
    self,
    client_ids: Sequence[str],
    seed: int,
    round_num: int = 0,
    sampling: str = 'without_replacement',
  ):
    self._client_ids = list(client_ids)
    self._seed = seed
    self.round_num = round_num
    self._sampling = sampling

  @property
  def federated_type(self) -> tff.FederatedType:
    return tff.FederatedType(CLIENT_KEY_TYPE, tff.CLIENTS)

  def select(self, k: Optional[int] = None) -> list[np.ndarray]:
    if k is None or not 1 <= k <= len(self._client_ids):
      raise ValueError(
        f'select takes k in [1, {len(self._client_ids)}] '
        f'(the number of clients), got {k!r}.'
      )
    self.round_num += 1
    return [
      client_key(c, self.round_num)
      for c in sample_clients(
        self._client_ids, k, self.round_num, self._seed, self._sampling
      )
    ]

  def to_bytes(self) -> bytes:
    return json.dumps(
      dict(
        client_ids=self._client_ids,
        seed=self._seed,
        round_num=self.round_num,
        sampling=self._sampling,
      )
    ).encode()

  @classmethod
  def from_bytes(cls, buffer: bytes) -> 'ClientRoundIterator':
    saved = json.loads(buffer.decode())
    return cls(
      saved['client_ids'],
      saved['seed'],
      saved['round_num'],
      saved.get('sampling', 'without_replacement'),
    )

  def __eq__(self, other) -> bool:
    return (
      isinstance(other, ClientRoundIterator)
      and self.to_bytes() == other.to_bytes()
    )
