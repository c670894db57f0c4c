"""The methods by name: the registry that turns a name into a process.

Each method declares itself in its own module (a `method_spec.MethodSpec`:
its name, the local term or server rule it brings, or a process of its own);
`REGISTRY` lists those declarations, one line each, and `register` adds a
method defined elsewhere. One builder builds any of them:

- A name is one method, or components joined by '+', as in the FedCos
  paper's tables (`fedprox+fedcos`, `fedavgm+fedcos`, `fedadam+fedcos`).
  A component brings a term of the shared local-training loop (`fedprox`,
  `fedmax`, `fedcos`, `moon`, `fedcka`), a server rule (`fedavg`,
  `fedavgm`, `fedadam`, `fedyogi`), or both. Their process is the loop
  with every named term, in the order named, and the one server rule named
  (FedAvg's by default): `processes.build_local_training_process`, whose
  clients keep state when a term asks for it (reads the previous model, or
  has a `ClientState`).
  No combination is special-cased.
- SCAFFOLD, Fed2 and TFF's own algorithms (`tff_fedavg`, `tff_fedavgm`,
  `tff_fedadam`, `tff_fedyogi`: TFF's `build_weighted_fed_avg` with the
  server rule of the project's `fedavg`, ...) have a process of their own
  and stand alone.

- `build_method(name, keras_model_fn, element_spec, hparams)`: a
  `tff.learning.templates.LearningProcess` over client datasets, for every
  method without per-client state.
- `build_method_for_client_ids(name, keras_model_fn, client_data, hparams)`:
  a `LearningProcess` whose `next` takes client keys, for every method;
  methods with per-client state (`moon`, `fedcka`, `scaffold`) keep it in
  files their clients read and write (`tff_methods.templates.stateful`).
"""

import functools
from typing import Any, Callable, Optional, Sequence

import tensorflow_federated as tff

from tff_methods.algorithms import fed2
from tff_methods.algorithms import fedavg
from tff_methods.algorithms import fedcka
from tff_methods.algorithms import fedcos
from tff_methods.algorithms import fedmax
from tff_methods.algorithms import fedprox
from tff_methods.algorithms import hyperparameters
from tff_methods.algorithms import method_spec
from tff_methods.algorithms import moon
from tff_methods.algorithms import scaffold
from tff_methods.templates import local_training
from tff_methods.templates import model_lib
from tff_methods.templates import regularizers as regularizers_lib

TffModelFn = Callable[[], tff.learning.models.VariableModel]

# Every method of the library, as its module declares it.
REGISTRY: dict[str, method_spec.MethodSpec] = {}


def register(spec: method_spec.MethodSpec) -> method_spec.MethodSpec:
  """Adds a method to the registry, so that every builder and binary that
  takes a method name takes it; returns it.

  Raises:
    ValueError: if the name is taken.
  """
  if spec.name in REGISTRY:
    raise ValueError(f'A method named {spec.name!r} is already registered.')
  REGISTRY[spec.name] = spec
  return spec


for _spec in (
  fedavg.FEDAVG,
  fedavg.FEDAVGM,
  fedavg.FEDADAM,
  fedavg.FEDYOGI,
  fedprox.METHOD,
  fedmax.METHOD,
  fedcos.METHOD,
  moon.METHOD,
  fedcka.METHOD,
  scaffold.METHOD,
  fed2.METHOD,
  *fedavg.TFF_ALGORITHMS,
):
  register(_spec)

# The library's methods by kind, as the binaries list them.
TFF_ALGORITHMS = tuple(spec.name for spec in fedavg.TFF_ALGORITHMS)
STANDALONE = tuple(n for n, spec in REGISTRY.items() if spec.stands_alone)
SINGLE_METHODS = tuple(REGISTRY)
# The single methods, and the combinations of the FedCos paper.
METHOD_NAMES = SINGLE_METHODS + fedcos.PAPER_COMBINATIONS


def parse_method(name: str) -> list[str]:
  """Splits `name` into components and checks them.

  Raises:
    ValueError: naming the bad part and what is allowed.
  """
  name = str(name)
  parts = [p.strip() for p in name.split('+')]
  for part in parts:
    if part not in REGISTRY:
      raise ValueError(
        f'Unknown method {name!r} ({part!r} is not one of '
        f'{", ".join(REGISTRY)}; join several with +, e.g. '
        'fedprox+fedcos).'
      )
  if len(set(parts)) != len(parts):
    raise ValueError(f'Method {name!r} names a component twice.')
  standalone = [p for p in parts if REGISTRY[p].stands_alone]
  if standalone and len(parts) > 1:
    raise ValueError(f'Method {name!r}: {standalone[0]} cannot be combined.')
  servers = [p for p in parts if REGISTRY[p].server_optimizer]
  if len(servers) > 1:
    raise ValueError(
      f'Method {name!r} names {len(servers)} server rules '
      f'({", ".join(servers)}); name at most one.'
    )
  return parts


def _specs(name: str) -> list[method_spec.MethodSpec]:
  return [REGISTRY[p] for p in parse_method(name)]


def _terms(
  specs: Sequence[method_spec.MethodSpec],
  hparams: hyperparameters.Hyperparameters,
) -> list[regularizers_lib.Regularizer]:
  return [
    method_spec.make_term(spec, hparams.settings_of(spec))
    for spec in specs
    if spec.term is not None
  ]


def local_terms(
  name: str, hparams: hyperparameters.Hyperparameters
) -> list[regularizers_lib.Regularizer]:
  """The terms method `name` adds to the local objective, in the order
  named (none for a method with a process of its own)."""
  return _terms(_specs(name), hparams)


@functools.lru_cache(maxsize=None)
def _default_term(
  spec: method_spec.MethodSpec,
) -> Optional[regularizers_lib.Regularizer]:
  # What a term reads and keeps does not depend on the settings: asked once
  # of its term at the default settings.
  if spec.term is None:
    return None
  return method_spec.make_term(spec, spec.settings())


def _default_terms(name: str) -> list[regularizers_lib.Regularizer]:
  return [t for t in map(_default_term, _specs(name)) if t is not None]


def reads_reference_outputs(name: str) -> bool:
  """Whether the method reads the global or previous model's outputs."""
  return any(
    r.global_outputs or r.previous_outputs for r in _default_terms(name)
  )


def reads_outputs(name: str) -> set[str]:
  """The model outputs (`z`, `features`, `layer_k`, ...) the method's terms
  read, of the model trained or of a reference model: what a model must
  expose to train it."""
  return {
    output
    for r in _default_terms(name)
    for output in (*r.outputs, *r.global_outputs, *r.previous_outputs)
  }


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
  """Whether the method keeps per-client state: one with a process of its
  own that says so (SCAFFOLD), or a term that supplies it (reads the
  client's previous model, or keeps a `ClientState`)."""
  return any(
    spec.keeps_client_state for spec in _specs(name)
  ) or regularizers_lib.needs_client_state(_default_terms(name))


def client_reports(name: str) -> list[str]:
  """What the named methods' clients send the server beside their model
  updates, outside the model aggregator (so without a DP aggregator's clip
  or noise), in words: empty for most methods."""
  reports = [
    f'{spec.display_name}: {spec.client_reports}'
    for spec in _specs(name)
    if spec.client_reports is not None
  ]
  reports.extend(
    f"{term.display_name}: its term's reports"
    for term in _default_terms(name)
    if regularizers_lib.reads_client_reports([term])
  )
  return reports


def prepare_clients(
  name: str,
  process: Any,
  hparams: hyperparameters.Hyperparameters,
  client_ids: Sequence[str],
  keras_model_fn: model_lib.KerasModelFn,
  seed: int,
) -> None:
  """Runs each named method's `prepare_clients` on its built `process`
  (MOON with `first_round='initial_model'` writes each client's own
  initial model): call it before the first round."""
  for spec in _specs(name):
    if spec.prepare_clients is not None:
      spec.prepare_clients(
        hparams.settings_of(spec), process, client_ids, keras_model_fn, seed
      )


def trains_own_form(name: str) -> bool:
  """Whether method `name` trains a form of its own of the model (declares
  `model_fn`), which it makes from the model's layer plan."""
  return any(spec.model_fn is not None for spec in _specs(name))


def model_fn(
  name: str,
  hparams: hyperparameters.Hyperparameters,
  layer_plan: Callable[[], Any],
  num_classes: int,
  input_shape: Sequence[int],
) -> Optional[model_lib.KerasModelFn]:
  """The model factory of the form of a model method `name` trains (Fed2's
  grouped model, from `layer_plan()`), or None: it trains the model as is."""
  for spec in _specs(name):
    if spec.model_fn is not None:
      return spec.model_fn(
        hparams.settings_of(spec),
        hparams,
        layer_plan,
        num_classes,
        input_shape,
      )
  return None


def notes(name: str, hparams: hyperparameters.Hyperparameters) -> list[str]:
  """What the named methods say of `hparams` that they do not use as given
  (e.g. SCAFFOLD's plain SGD beside a client momentum)."""
  return [
    note
    for spec in _specs(name)
    if spec.notes is not None
    for note in spec.notes(hparams.settings_of(spec), hparams)
  ]


def _server_optimizer(specs, hparams):
  rule = next(
    (spec.server_optimizer for spec in specs if spec.server_optimizer), 'sgd'
  )
  return hparams.server_optimizer(rule)


def build_method(
  name: str,
  keras_model_fn: model_lib.KerasModelFn,
  element_spec: Any,
  hparams: hyperparameters.Hyperparameters,
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
  if is_stateful(name):
    raise ValueError(
      f'{name} keeps per-client state and is not a tff.learning '
      'LearningProcess; use build_method_for_client_ids.'
    )
  return _build(
    name,
    keras_model_fn,
    element_spec,
    hparams,
    dataset_computation,
    loss_fn,
    tff_model_fn,
  )


def build_method_for_client_ids(
  name: str,
  keras_model_fn: model_lib.KerasModelFn,
  datasets_by_id: tff.Computation,
  element_spec: Any,
  hparams: hyperparameters.Hyperparameters,
  loss_fn: Optional[local_training.LossFn] = None,
  tff_model_fn: Optional[TffModelFn] = None,
):
  """Builds method `name` as a process whose `next` takes client keys.

  Args:
    name: Any method (see the module docstring).
    keras_model_fn: Builds one of the project's multi-output Keras models.
    datasets_by_id: A client's key (its id, or its id and the round, as
      `tff_methods_tasks.datasets.round_dataset_computation` takes) -> its
      batches.
    element_spec: The spec of one batch.
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
  return _build(
    name,
    keras_model_fn,
    element_spec,
    hparams,
    datasets_by_id,
    loss_fn,
    tff_model_fn,
  )


def _build(
  name,
  keras_model_fn,
  element_spec,
  hparams,
  dataset_computation,
  loss_fn,
  tff_model_fn,
):
  """The one builder: a method's own process, or the public builder of
  the last named component with a term (`method_spec.builder`), given the
  other components' terms before it and the server rule named."""
  specs = _specs(name)
  if specs[0].stands_alone:
    return specs[0].build(
      keras_model_fn,
      element_spec,
      hparams,
      dataset_computation=dataset_computation,
      loss_fn=loss_fn,
      tff_model_fn=tff_model_fn,
    )
  with_terms = [spec for spec in specs if spec.term is not None]
  last = with_terms[-1] if with_terms else specs[-1]
  settings = hparams.settings_of(last)
  return method_spec.builder(last)(
    keras_model_fn,
    element_spec,
    client_optimizer_fn=hparams.client_optimizer(),
    server_optimizer_fn=_server_optimizer(specs, hparams),
    base_regularizers=_terms(with_terms[:-1], hparams),
    dataset_computation=dataset_computation,
    client_state_dir=hparams.client_state_dir,
    client_states_in_memory=hparams.client_states_in_memory,
    model_aggregator=hparams.model_aggregator(),
    client_weighting=hparams.weighting(),
    loss_fn=loss_fn,
    **{
      name: getattr(settings, name)
      for name in method_spec.term_parameters(last)
    },
  )


# Every named method without per-client state.
STATELESS_METHODS = tuple(m for m in METHOD_NAMES if not is_stateful(m))
