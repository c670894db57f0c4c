"""A client's key: which client, in which round.

The clients of a key-taking process (every stateful process, and every
process built with a `dataset_computation`) receive keys, not data: each
client makes its own batches from its key inside its own computation, and
a stateful client finds its state by it. The key is two strings,
`[client id, round in decimal]`: a tensor, not a structure, so that TFF's
program platform passes a list of keys as CLIENTS-placed values (it would
read a list of structures as one structure).
"""

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
