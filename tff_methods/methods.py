"""The methods by name: one place that turns a name into a process.

A method name is one component or several joined by '+', as in the FedCos
paper's tables (`fedprox+fedcos`, `fedavgm+fedcos`, `fedadam+fedcos`). A
component brings a server optimizer (`fedavg`, `fedavgm`, `fedadam`,
`fedyogi`), a regularizer of the shared local-training loop (`fedprox`,
`fedmax`, `fedcos`, `moon`, `fedcka`), or both. SCAFFOLD (its own server
rule), Fed2 (its own model structure and aggregator) and TFF's own
algorithms stand alone: `tff_fedavg`, `tff_fedavgm`, `tff_fedadam` and
`tff_fedyogi` are TFF's `build_weighted_fed_avg` with the server optimizer
of the project's `fedavg`, `fedavgm`, `fedadam` and `fedyogi`, to compare
with TFF's baselines literally.

Every method is built by its own module's builder (`fedprox.build_fedprox`,
`moon.build_moon`, ...), which is the code that runs. A combination is built
by the builder of its main component (`_BUILDER_ORDER`), given the other
components' terms and the one server optimizer named (FedAvg's by default):
no combination is special-cased. Whether a method keeps per-client state is
learned from its terms (`Regularizer.previous_outputs`), not listed.

- `build_method(name, keras_model_fn, element_spec, hparams)`: a
  `tff.learning.templates.LearningProcess` over client datasets, for every
  method without per-client state. A plain `fedavg`/`fedavgm`/`fedadam`/
  `fedyogi` is the shared local-training loop with no regularizer (the
  process `fedavg.build_fedavg` builds: TFF's FedAvg computed faster);
  `tff_fedavg` (and `tff_fedavgm`, ...) is TFF's `build_weighted_fed_avg`
  itself.
- `build_method_for_client_ids(name, keras_model_fn, client_data, hparams)`:
  a `LearningProcess` whose `next` takes client keys, for every method;
  methods with per-client state (`moon`, `fedcka`, `scaffold`) keep it in
  files their clients read and write (`tff_methods.stateful`).
"""

import dataclasses
import functools
from typing import Any, Callable, Optional, Sequence

import tensorflow_federated as tff

from tff_methods import aggregation
from tff_methods import fed2
from tff_methods import fedavg
from tff_methods import fedcka
from tff_methods import fedcos
from tff_methods import fedmax
from tff_methods import fedprox
from tff_methods import hyperparameters
from tff_methods import local_training
from tff_methods import model_lib
from tff_methods import moon
from tff_methods import regularizers as regularizers_lib
from tff_methods import scaffold

TffModelFn = Callable[[], tff.learning.models.VariableModel]

# The settings and strengths every builder is called with (defined in
# `hyperparameters`, named here for the registry's users).
DEFAULT_STRENGTHS = hyperparameters.DEFAULT_STRENGTHS
Hyperparameters = hyperparameters.Hyperparameters


@dataclasses.dataclass(frozen=True)
class Component:
  """What one name in a method brings."""

  server_optimizer: Optional[str] = None
  regularizer: Optional[
    Callable[[Hyperparameters], regularizers_lib.Regularizer]
  ] = None


COMPONENTS = {
  'fedavg': Component(server_optimizer='sgd'),
  'fedavgm': Component(server_optimizer='sgdm'),
  'fedadam': Component(server_optimizer='adam'),
  'fedyogi': Component(server_optimizer='yogi'),
  'fedprox': Component(
    regularizer=lambda h: fedprox.ProximalTerm(h.strength('fedprox'))
  ),
  'fedmax': Component(
    regularizer=lambda h: fedmax.ActivationEntropyTerm(
      fedmax.DEFAULT_BETA if h.beta is None else h.beta
    )
  ),
  'fedcos': Component(
    regularizer=lambda h: fedcos.DirectionPenalty(
      h.strength('fedcos'), h.fedcos_direction
    )
  ),
  'moon': Component(
    regularizer=lambda h: moon.ModelContrastiveTerm(
      h.strength('moon'), h.temperature
    )
  ),
  'fedcka': Component(
    regularizer=lambda h: fedcka.CKAContrastiveTerm(
      h.strength('fedcka'), h.cka_layers, h.similarity
    )
  ),
}
# TFF's own algorithms: `build_weighted_fed_avg` with a server rule.
TFF_ALGORITHMS = {
  'tff_fedavg': 'sgd',
  'tff_fedavgm': 'sgdm',
  'tff_fedadam': 'adam',
  'tff_fedyogi': 'yogi',
}
STANDALONE = ('scaffold', 'fed2') + tuple(TFF_ALGORITHMS)
# SCAFFOLD's model average: the paper's, or NIID-Bench's by data size.
SCAFFOLD_WEIGHTINGS = {
  'uniform': tff.learning.ClientWeighting.UNIFORM,
  'num_examples': tff.learning.ClientWeighting.NUM_EXAMPLES,
  'num_tokens': aggregation.NumTokens(),
}
SINGLE_METHODS = tuple(COMPONENTS) + STANDALONE
# The single methods, and the combinations of the FedCos paper.
METHOD_NAMES = SINGLE_METHODS + (
  'fedprox+fedcos',
  'fedavgm+fedcos',
  'fedadam+fedcos',
)


def parse_method(name: str) -> list[str]:
  """Splits `name` into components and checks them (once per name).

  Raises:
    ValueError: naming the bad part and what is allowed.
  """
  return list(_parse(str(name)))


@functools.lru_cache(maxsize=None)
def _parse(name: str) -> tuple[str, ...]:
  parts = [p.strip() for p in str(name).split('+')]
  allowed = ', '.join(list(COMPONENTS) + list(STANDALONE))
  for part in parts:
    if part not in COMPONENTS and part not in STANDALONE:
      raise ValueError(
        f'Unknown method {name!r} ({part!r} is not one of '
        f'{allowed}; join several with +, e.g. '
        'fedprox+fedcos).'
      )
  if len(set(parts)) != len(parts):
    raise ValueError(f'Method {name!r} names a component twice.')
  standalone = [p for p in parts if p in STANDALONE]
  if standalone and len(parts) > 1:
    raise ValueError(f'Method {name!r}: {standalone[0]} cannot be ' 'combined.')
  servers = [
    p for p in parts if COMPONENTS.get(p, Component()).server_optimizer
  ]
  if len(servers) > 1:
    raise ValueError(
      f'Method {name!r} names {len(servers)} server rules '
      f'({", ".join(servers)}); name at most one.'
    )
  return tuple(parts)


def _terms(
  parts: Sequence[str], hparams: Hyperparameters
) -> list[regularizers_lib.Regularizer]:
  return [
    COMPONENTS[p].regularizer(hparams)
    for p in parts
    if p in COMPONENTS and COMPONENTS[p].regularizer is not None
  ]


def reads_reference_outputs(name: str) -> bool:
  """Whether the method reads the global or previous model's outputs."""
  return any(
    r.global_outputs or r.previous_outputs
    for r in _terms(parse_method(name), Hyperparameters())
  )


def wants_example_index(
  name: str, local_epochs: int, local_steps: Optional[int] = None
) -> bool:
  """Whether to index examples (`LocalBatches(with_index=True)`).

  Methods that read reference models' outputs cache them per example when a
  client passes over its data more than once (`local_epochs` > 1); with
  `local_steps` or one epoch there is nothing to reuse.
  """
  return (
    reads_reference_outputs(name) and local_steps is None and local_epochs > 1
  )


def is_stateful(name: str) -> bool:
  """Whether the method keeps per-client state: SCAFFOLD (its control
  variates), or a term that reads the client's previous model."""
  parts = parse_method(name)
  return parts == ['scaffold'] or regularizers_lib.needs_previous_model(
    _terms(parts, Hyperparameters())
  )


# A combination is built by the builder of its first component in this
# order, given the other components' terms: a stateful term's builder
# (it keeps the client state), then FedCos's, FedMAX's, FedProx's.
_BUILDER_ORDER = ('moon', 'fedcka', 'fedcos', 'fedmax', 'fedprox')


def _server_optimizer(parts, hparams):
  rule = next(
    (
      COMPONENTS[p].server_optimizer
      for p in parts
      if p in COMPONENTS and COMPONENTS[p].server_optimizer
    ),
    'sgd',
  )
  return hparams.server_optimizer(rule)


def _main_and_others(parts, hparams):
  """The component whose module builds the method, and the others' terms."""
  main = next((p for p in _BUILDER_ORDER if p in parts), None)
  others = _terms([p for p in parts if p != main], hparams)
  return main, others


def build_method(
  name: str,
  keras_model_fn: model_lib.KerasModelFn,
  element_spec: Any,
  hparams: Hyperparameters,
  dataset_computation: Optional[tff.Computation] = None,
  loss_fn: Optional[local_training.LossFn] = None,
  tff_model_fn: Optional[TffModelFn] = None,
) -> tff.learning.templates.LearningProcess:
  """Builds method `name` as a `tff.learning.templates.LearningProcess`.

  Args:
    name: A method without per-client state (see the module docstring).
    keras_model_fn: Builds one of the project's multi-output Keras models.
    element_spec: The spec of one batch of client data.
    hparams: Optimizer settings and strengths.
    dataset_computation: A client's key -> its batches; when given, `next`
      takes the clients' keys (see `build_method_for_client_ids`).
    loss_fn: The methods' data term; cross-entropy on `logits` by default.
    tff_model_fn: The `VariableModel` TFF's algorithms (`tff_fedavg`, ...)
      train (a baseline task's own); by default `keras_model_fn`'s logits
      with cross-entropy.
  """
  parts = parse_method(name)
  if is_stateful(name):
    raise ValueError(
      f'{name} keeps per-client state and is not a tff.learning '
      'LearningProcess; use build_method_for_client_ids.'
    )
  client_optimizer = hparams.client_optimizer()
  server_optimizer = _server_optimizer(parts, hparams)
  model_aggregator = hparams.model_aggregator()
  if parts == ['fed2']:
    return fed2.build_fed2(
      keras_model_fn,
      element_spec,
      client_optimizer_fn=client_optimizer,
      num_groups=hparams.fed2_groups,
      server_optimizer_fn=server_optimizer,
      dataset_computation=dataset_computation,
      model_aggregator=model_aggregator,
      client_weighting=hparams.weighting(),
      loss_fn=loss_fn,
    )
  if parts[0] in TFF_ALGORITHMS:
    # TFF's builder as a TFF user composes it: the batches are made by one
    # computation and passed to the client's.
    process = fedavg.build_tff_fedavg(
      keras_model_fn,
      element_spec,
      client_optimizer_fn=client_optimizer,
      server_optimizer_fn=hparams.server_optimizer(TFF_ALGORITHMS[parts[0]]),
      model_aggregator=model_aggregator,
      client_weighting=hparams.weighting(),
      tff_model_fn=tff_model_fn,
    )
    if dataset_computation is None:
      return process
    return tff.simulation.compose_dataset_computation_with_learning_process(
      dataset_computation, process
    )
  main, others = _main_and_others(parts, hparams)
  shared = dict(
    client_optimizer_fn=client_optimizer,
    server_optimizer_fn=server_optimizer,
    dataset_computation=dataset_computation,
    model_aggregator=model_aggregator,
    client_weighting=hparams.weighting(),
    loss_fn=loss_fn,
  )
  if main is None:
    return fedavg.build_fedavg(keras_model_fn, element_spec, **shared)
  if main == 'fedcos':
    return fedcos.build_fedcos(
      keras_model_fn,
      element_spec,
      mu=hparams.strength('fedcos'),
      direction=hparams.fedcos_direction,
      base_regularizers=others,
      **shared,
    )
  if main == 'fedmax':
    return fedmax.build_fedmax(
      keras_model_fn,
      element_spec,
      beta=(fedmax.DEFAULT_BETA if hparams.beta is None else hparams.beta),
      base_regularizers=others,
      **shared,
    )
  return fedprox.build_fedprox(
    keras_model_fn,
    element_spec,
    mu=hparams.strength('fedprox'),
    base_regularizers=others,
    **shared,
  )


def build_method_for_client_ids(
  name: str,
  keras_model_fn: model_lib.KerasModelFn,
  datasets_by_id: tff.Computation,
  spec: Any,
  hparams: Hyperparameters,
  loss_fn: Optional[local_training.LossFn] = None,
  tff_model_fn: Optional[TffModelFn] = None,
):
  """Builds method `name` as a process whose `next` takes client keys.

  Args:
    name: Any method (see the module docstring).
    keras_model_fn: Builds one of the project's multi-output Keras models.
    datasets_by_id: A client's key (its id, or its id and the round, as
      `tasks.datasets.round_dataset_computation` takes) -> its batches.
    spec: The spec of one batch.
    hparams: Optimizer settings and strengths.
    loss_fn: The methods' data term; cross-entropy on `logits` by default.
    tff_model_fn: The `VariableModel` TFF's algorithms train (see
      `build_method`).

  Returns:
    A `tff.learning.templates.LearningProcess` driven as `next(state,
    client_keys)`; for methods with per-client state (`moon`, `fedcka`,
    `scaffold`) a `stateful.StatefulClientsLearningProcess`, whose keys
    must name the client and the round.
  """
  parts = parse_method(name)
  if parts == ['scaffold']:
    return scaffold.build_scaffold(
      keras_model_fn,
      spec,
      dataset_computation=datasets_by_id,
      client_learning_rate=hparams.client_learning_rate,
      num_clients=hparams.num_clients,
      server_learning_rate=(
        1.0
        if hparams.server_learning_rate is None
        else hparams.server_learning_rate
      ),
      weight_decay=hparams.weight_decay,
      client_state_dir=hparams.client_state_dir,
      client_momentum=(
        hparams.client_momentum if hparams.scaffold_momentum else 0.0
      ),
      client_weighting=SCAFFOLD_WEIGHTINGS[hparams.scaffold_weighting],
      model_aggregator=hparams.model_aggregator(),
      loss_fn=loss_fn,
    )
  if not is_stateful(name):
    return build_method(
      name,
      keras_model_fn,
      spec,
      hparams,
      dataset_computation=datasets_by_id,
      loss_fn=loss_fn,
      tff_model_fn=tff_model_fn,
    )
  main, others = _main_and_others(parts, hparams)
  shared = dict(
    dataset_computation=datasets_by_id,
    client_optimizer_fn=hparams.client_optimizer(),
    server_optimizer_fn=_server_optimizer(parts, hparams),
    client_state_dir=hparams.client_state_dir,
    base_regularizers=others,
    model_aggregator=hparams.model_aggregator(),
    client_weighting=hparams.weighting(),
    loss_fn=loss_fn,
  )
  if main == 'moon':
    return moon.build_moon(
      keras_model_fn,
      spec,
      mu=hparams.strength('moon'),
      temperature=hparams.temperature,
      **shared,
    )
  return fedcka.build_fedcka(
    keras_model_fn,
    spec,
    mu=hparams.strength('fedcka'),
    num_layers=hparams.cka_layers,
    similarity=hparams.similarity,
    **shared,
  )


# Every named method without per-client state.
STATELESS_METHODS = tuple(m for m in METHOD_NAMES if not is_stateful(m))
