"""What a client computation receives, and how it gets its batches.

A client's data reach its computation in one of two forms: its batches
(TFF's usual client data), or a key from which it makes them inside its own
computation (`ClientBatches`): a client id for a TFF `ClientData`'s
`dataset_computation`, or a `client_keys` key for data that change with the
round. Batches are `OrderedDict(x, y)` or TFF's `(x, y)` tuples.
"""

import collections
import collections.abc
from typing import Any, Mapping, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_methods.clients import batches_in_memory
from tff_methods.clients import client_keys


def named_batch(batch) -> Mapping[str, Any]:
  """A batch as `OrderedDict(x, y, ...)`: TFF's `(x, y)` tuples too."""
  if isinstance(batch, collections.abc.Mapping):
    return batch
  if isinstance(batch, (tuple, list)) and len(batch) == 2:
    return collections.OrderedDict(x=batch[0], y=batch[1])
  raise TypeError(
    'A batch of client data must be OrderedDict(x=..., y=...) '
    f'or an (x, y) tuple, not {batch!r}.'
  )


def check_element_spec(
  element_spec: Any, model_input_shape: Optional[tf.TensorShape] = None
) -> None:
  """Refuses, at build time, client data the loop can't read.

  With the model's input shape, also unbatched client data: elements of
  one example where the model takes batches.
  """
  if isinstance(element_spec, collections.abc.Mapping):
    missing = [k for k in ('x', 'y') if k not in element_spec]
    if missing:
      raise ValueError(
        f'Client data elements must hold x and y; these have '
        f'{sorted(element_spec)} (missing {missing}).'
      )
    x = element_spec['x']
  elif isinstance(element_spec, (tuple, list)) and len(element_spec) == 2:
    x = element_spec[0]
  else:
    raise TypeError(
      'Client data elements must be OrderedDict(x=..., y=...) '
      f'or (x, y) tuples; their spec is {element_spec!r}.'
    )
  shape = getattr(x, 'shape', None)
  if model_input_shape is None or shape is None:
    return
  model_input_shape = tf.TensorShape(model_input_shape)
  shape = tf.TensorShape(shape)
  if (
    shape.rank is not None
    and model_input_shape.rank == shape.rank + 1
    and model_input_shape[1:].is_compatible_with(shape)
  ):
    raise ValueError(
      f'Client data elements hold x of shape {shape.as_list()}, one '
      f'example, where the model takes batches of shape '
      f'{model_input_shape.as_list()}: batch the client data, e.g. '
      'client_data.preprocess(lambda ds: ds.batch(32)).'
    )


# The attribute of a dataset computation (a client's key -> its batches)
# that gives the same batches as (the round's examples in training order,
# each batch's size in turn), in a graph: `tff_methods_tasks.datasets.
# round_dataset_computation`'s have it.
ROUND_EXAMPLES_FN = 'round_examples_fn'


class ClientBatches:
  """What a client computation receives, and how it gets its batches.

  With a dataset computation (a client's key -> its batches), the client
  computation receives the key and calls it: the batches are made where they
  are trained on. Passed between two TFF computations instead, a data set is
  serialized with its data (TFF 0.87's worker turns it into a graph and back),
  and copied several times per client and round. From a dataset
  computation that has `ROUND_EXAMPLES_FN`, the client takes the same
  batches as slices of the round's examples (`batches_in_memory.
  SlicedBatches`), without making a data set and reading it back. Without
  a dataset computation, the client computation receives its batches.
  """

  def __init__(
    self, dataset_computation: Optional[tff.Computation], data_type: tff.Type
  ):
    dataset_computation = as_dataset_computation(dataset_computation)
    self._dataset_computation = dataset_computation
    self._round_examples_fn = getattr(
      dataset_computation, ROUND_EXAMPLES_FN, None
    )
    if dataset_computation is None:
      self.client_data_type = data_type
    else:
      self.client_data_type = dataset_computation.type_signature.parameter
      made = dataset_computation.type_signature.result
      if not data_type.is_assignable_from(made):
        raise TypeError(
          f'The dataset computation makes {made}, but the '
          f'process trains on {data_type}.'
        )

  def __call__(self, client_data):
    """The client's batches (inside its TFF computation): a data set, or
    the same batches in memory (`batches_in_memory.SlicedBatches`)."""
    if self._dataset_computation is None:
      return client_data
    if self._round_examples_fn is not None:
      return batches_in_memory.SlicedBatches(
        *self._round_examples_fn(client_data)
      )
    return self._dataset_computation(client_data)


def as_dataset_computation(data: Any) -> Optional[tff.Computation]:
  """A dataset computation from itself, or from a TFF `ClientData` (its
  `dataset_computation`: a client id -> its data set); None stays None."""
  if data is None or isinstance(data, tff.Computation):
    return data
  if isinstance(data, tff.simulation.datasets.ClientData):
    return data.dataset_computation
  raise TypeError(
    'dataset_computation must be a tff.Computation (a client key -> its '
    'batches) or a tff.simulation.datasets.ClientData (preprocessed into '
    f'batches), got {type(data).__name__}.'
  )


def key_dataset_computation(data: Any) -> tff.Computation:
  """A computation from a client's `client_keys` key to its batches.

  Args:
    data: A computation of such keys
      (`tff_methods_tasks.datasets.round_dataset_computation`: the batches may
      change with the round); or TFF's client-id form, a batched
      `tff.simulation.datasets. ClientData` or its `dataset_computation`, whose
      data set the key's client id picks (the same every round).

  Raises:
    TypeError: naming what was given and what is taken.
  """
  computation = as_dataset_computation(data)
  if computation is None:
    raise TypeError(
      'A process with per-client state needs dataset_computation: a '
      'batched tff.simulation.datasets.ClientData, its '
      'dataset_computation, or a [client id, round] key -> batches '
      'computation (tff_methods_tasks.datasets.round_dataset_computation).'
    )
  key_type = computation.type_signature.parameter
  if key_type == client_keys.CLIENT_KEY_TYPE:
    return computation
  if key_type == tff.TensorType(np.str_):

    @tff.tensorflow.computation(client_keys.CLIENT_KEY_TYPE)
    def dataset_for_key(key):
      return computation(key[0])

    return dataset_for_key
  raise TypeError(
    'A process with per-client state needs a dataset computation that '
    'takes a client id (ClientData.dataset_computation) or [client id, '
    'round] keys (a string tensor of shape [2], e.g. '
    'tff_methods_tasks.datasets.round_dataset_computation); this one takes '
    f'{key_type}.'
  )
