"""What every timed part of the benchmark builds: the methods it times, a
method's process on a client-data set's keys, and the models' arguments."""

import dataclasses
import statistics
from typing import Sequence

from tff_methods.algorithms import methods as methods_lib
from tff_methods.clients import client_keys
from tff_methods.execution import in_process
from tff_methods_tasks import datasets
from tff_methods_tasks import models as task_models
from tff_methods_tooling import experiment

# TFF's own `build_weighted_fed_avg`: the same weights as the project's
# `fedavg` (tests/algorithms/fedavg_test.py), timed beside it for reference.
TFF_FEDAVG = 'tff_fedavg'

# FedAvg, TFF's FedAvg, and every method that brings a term or a process of
# its own (the server rules' cost is FedAvg's), as the registry declares
# them.
BENCHMARK_METHODS = ('fedavg', TFF_FEDAVG) + tuple(
  name
  for name, spec in methods_lib.REGISTRY.items()
  if spec.term is not None
  or (spec.stands_alone and name not in methods_lib.TFF_ALGORITHMS)
)


def applicable_methods(
  model_name: str, names: Sequence[str] = BENCHMARK_METHODS
) -> list[str]:
  """The methods that run on `model_name`: a method that trains its own
  form of the model (Fed2) needs one with a layer plan."""
  return [
    m
    for m in names
    if not methods_lib.trains_own_form(m)
    or model_name in task_models.FED2_MODELS
  ]


def model_kwargs(model_name: str) -> dict:
  """Models that take one get MOON's projection head, for every method."""
  if model_name in task_models.TAKES_PROJECTION_DIM:
    return {'projection_dim': 128}
  return {}


# Models that output MOON's projection head `z` as the benchmark builds them.
PROJECTION_MODELS = tuple(
  name
  for name in task_models.MODEL_NAMES
  if task_models.has_projection_head(name, **model_kwargs(name))
)


def needing_projection(method_names, model_name: str) -> list[str]:
  """The methods of `method_names` that read MOON's projection head `z`
  (`methods.reads_outputs`), if the benchmark's `model_name` has none."""
  if model_name in PROJECTION_MODELS:
    return []
  return [m for m in method_names if 'z' in methods_lib.reads_outputs(m)]


def median(values):
  return float(statistics.median(values))


def ratio_with_range(
  ratio: float, pass_ratios: Sequence[float], unit: str = ''
) -> str:
  """A ratio as the reports print it, with its range over the passes
  when several ran."""
  if len(pass_ratios) < 2:
    return f'{ratio:.2f}{unit}'
  return f'{ratio:.2f}{unit} ({min(pass_ratios):.2f}-{max(pass_ratios):.2f})'


def ratio_cell(timing: dict) -> str:
  """A timing's `ratio` with its range over its `pass_ratios`."""
  return ratio_with_range(timing['ratio'], timing.get('pass_ratios', []))


def benchmark_process(
  name, model_name, data, hparams, local_epochs, batch_size, seed
):
  """(Method `name`'s process on `data`'s client keys, its model function),
  as every timed part of the benchmark builds them."""
  batches = datasets.LocalBatches(
    batch_size,
    local_epochs,
    seed=seed,
    with_index=methods_lib.wants_example_index(name, local_epochs),
  )
  model_fn = experiment.model_fn_for(
    name,
    model_name,
    data.num_classes,
    data.input_shape,
    hparams,
    **model_kwargs(model_name),
  )
  process = methods_lib.build_method_for_client_ids(
    name,
    model_fn,
    *round_datasets(data, batches),
    dataclasses.replace(
      hparams, client_states_in_memory=in_process.is_current()
    ),
  )
  return process, model_fn


def round_datasets(
  data: datasets.FederatedData, batches: datasets.LocalBatches
):
  """The dataset computation and batch spec of `data` batched as `batches`."""
  return (
    datasets.round_dataset_computation(data.client_data, batches),
    batches.element_spec(data.client_data.element_type_structure),
  )


def keys(client_ids, round_num):
  return [client_keys.client_key(c, round_num) for c in client_ids]
