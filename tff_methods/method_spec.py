"""What a method declares, in its own module, for the registry (`methods`).

A method is one of two kinds:

- A component of the shared local-training loop: it brings a local term
  (`term`, built from the run's settings), a server rule
  (`server_optimizer`), or both. Components combine with '+', as in the
  FedCos paper's `fedprox+fedcos`; whether a combination keeps per-client
  state is what its terms supply (`regularizers.needs_client_state`).
- A method with a process of its own (`build`): SCAFFOLD, Fed2 and TFF's
  algorithms. It stands alone, and declares whether its clients keep state
  between rounds (`keeps_client_state`).

A method's own settings are a frozen dataclass of its module's (`settings`,
e.g. FedProx's `mu`), each field made with `setting`: its default, its help
and what values it takes. The binaries' flags (`--fedprox_mu`), their checks
and the docs' table of them derive from these declarations; a term is built
from its method's settings, a process of its own from the run's
`hyperparameters.Hyperparameters` (which hold every method's settings).
"""

import dataclasses
from typing import Any, Callable, Optional, Sequence

from tff_methods import regularizers


def setting(
  default: Any,
  help_text: str,
  *,
  choices: Optional[Sequence[Any]] = None,
  minimum: Optional[float] = None,
  above: Optional[float] = None,
) -> Any:
  """A field of a method's settings: its default, help, and the values it
  takes (one of `choices`, at least `minimum`, or above `above`)."""
  return dataclasses.field(
    default=default,
    metadata=dict(
      help=help_text,
      choices=None if choices is None else tuple(choices),
      minimum=minimum,
      above=above,
    ),
  )


@dataclasses.dataclass(frozen=True)
class NoSettings:
  """The settings of a method that has none of its own."""


def problems(spec: 'MethodSpec', settings: Any) -> list[str]:
  """What is wrong with `settings` (`spec`'s), each naming its flag."""
  found = []
  for field in dataclasses.fields(settings):
    value = getattr(settings, field.name)
    meta = field.metadata
    flag = f'--{spec.flag(field.name)}={value!r}'
    if meta.get('choices') is not None and value not in meta['choices']:
      found.append(
        f'{flag} is unknown; choose one of '
        f'{", ".join(map(str, meta["choices"]))}.'
      )
    elif value is None or isinstance(value, (str, bool)):
      continue
    elif meta.get('minimum') is not None and not value >= meta['minimum']:
      found.append(f'{flag} must be >= {meta["minimum"]:g}.')
    elif meta.get('above') is not None and not value > meta['above']:
      found.append(f'{flag} must be > {meta["above"]:g}.')
  return found


# (keras_model_fn, element_spec, settings, *, dataset_computation, loss_fn,
# tff_model_fn) -> the method's process.
BuildFn = Callable[..., Any]


@dataclasses.dataclass(frozen=True)
class MethodSpec:
  """One method, as its module declares it.

  Attributes:
    name: The name in `--method` and in combinations ('fedprox').
    display_name: The name in tables and messages ('FedProx').
    settings: Its own settings, a frozen dataclass whose fields are made
      with `setting` (`NoSettings` if it has none).
    term: Its settings -> the local term it adds to every client's
      objective.
    server_optimizer: The server rule it brings: 'sgd', 'sgdm', 'adam' or
      'yogi' (`optimizers.build_server_optimizer`).
    build: For a method with a process of its own: builds it (`BuildFn`).
    keeps_client_state: With `build`: whether its clients keep state
      between rounds, so that `next` takes client keys naming the round.
    prepare_clients: `(settings, process, client_ids, keras_model_fn,
      seed)`, run once the process is built and before its first round:
      writes what the clients start from (MOON's own initial models).
    notes: `(settings, hparams)` -> messages about shared settings the
      method does not use as given (SCAFFOLD's plain SGD), for the user.
    model_fn: `(settings, hparams, layer_plan, num_classes, input_shape)` ->
      the Keras model factory of the form of a model the method trains,
      for a method that trains its own form (Fed2's grouped model);
      `layer_plan()` describes the user's model layer by layer.
    weighting_setting: With `build`: the name of its setting that chooses
      how its process weighs clients in the model average (SCAFFOLD's
      `weighting`), which the run's checks read as they read the shared
      `--client_weighting`.
    client_reports: With `build`: what its clients send the server beside
      their model updates, summed without the model aggregator's clip or
      noise (SCAFFOLD's control-variate changes), in words; a DP run
      refuses such a method, since its guarantee would not cover them. A
      term declares the same by a server state that records client
      reports.
  """

  name: str
  display_name: str
  settings: type = NoSettings
  term: Optional[Callable[[Any], regularizers.Regularizer]] = None
  server_optimizer: Optional[str] = None
  build: Optional[BuildFn] = None
  keeps_client_state: bool = False
  prepare_clients: Optional[Callable[..., None]] = None
  notes: Optional[Callable[[Any, Any], Sequence[str]]] = None
  model_fn: Optional[Callable[..., Any]] = None
  weighting_setting: Optional[str] = None
  client_reports: Optional[str] = None

  def __post_init__(self):
    if not self.name or '+' in self.name:
      raise ValueError(
        f'A method name is a non-empty word without +, got {self.name!r}.'
      )
    if self.build is None and self.term is None and not self.server_optimizer:
      raise ValueError(
        f'Method {self.name!r} brings nothing: give it a term, a server '
        'optimizer, or a build function.'
      )
    if self.build is not None and (self.term or self.server_optimizer):
      raise ValueError(
        f'Method {self.name!r} has a process of its own (build): it takes '
        'no term or server optimizer.'
      )
    if not (
      isinstance(self.settings, type)
      and dataclasses.is_dataclass(self.settings)
      and all('help' in f.metadata for f in dataclasses.fields(self.settings))
    ):
      raise ValueError(
        f'Method {self.name!r}: settings must be a dataclass whose fields '
        'are made with method_spec.setting(default, help), got '
        f'{self.settings!r}.'
      )
    if self.weighting_setting is not None and (
      self.build is None
      or self.weighting_setting
      not in {f.name for f in dataclasses.fields(self.settings)}
    ):
      raise ValueError(
        f'Method {self.name!r}: weighting_setting names one of its settings, '
        f'for a method with a build function; got {self.weighting_setting!r}.'
      )
    if self.client_reports is not None and self.build is None:
      raise ValueError(
        f'Method {self.name!r}: client_reports is for a method with a build '
        "function; a term declares its reports by its server state's "
        'record_client_reports.'
      )
    if self.keeps_client_state and self.build is None:
      raise ValueError(
        f'Method {self.name!r}: keeps_client_state is for a method with a '
        'build function; a term keeps client state by supplying it.'
      )

  def flag(self, field_name: str) -> str:
    """The flag of one of its settings: 'fedprox_mu' for FedProx's mu."""
    return f'{self.name}_{field_name}'

  @property
  def stands_alone(self) -> bool:
    """Whether it has a process of its own, and so combines with nothing."""
    return self.build is not None
