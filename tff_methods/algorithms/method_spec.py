"""What a method declares, in its own module, for the registry (`methods`).

A method is one of two kinds:

- A component of the shared local-training loop: it brings a local term
  (`term`, made from its settings by name), a server rule
  (`server_optimizer`), or both. Components combine with '+', as in the
  FedCos paper's `fedprox+fedcos`; whether a combination keeps per-client
  state is what its terms supply (`regularizers.needs_client_state`).
- A method with a process of its own (`build`): SCAFFOLD, Fed2 and TFF's
  algorithms. It stands alone, and declares whether its clients keep state
  between rounds (`keeps_client_state`).

A method's own settings are a frozen dataclass of its module's (`settings`,
e.g. FedProx's `mu`), each field made with `setting`: its default, its help
and what values it takes. The binaries' flags (`--fedprox_mu`), their checks
and the docs' table of them derive from these declarations; a term is made
from the settings its parameters name, a process of its own from the run's
`hyperparameters.Hyperparameters` (which hold every method's settings).

A component's public builder is generated from its declaration
(`builder`): `fedprox.build_fedprox = method_spec.builder(fedprox.METHOD)`
takes TFF's builder arguments and the settings its term takes, by name, and
is what the registry and every binary build.
"""

import dataclasses
import functools
import inspect
import textwrap
from typing import Any, Callable, Optional, Sequence

import tensorflow_federated as tff

from tff_methods.templates import processes
from tff_methods.templates import regularizers


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


def problems(
  spec: 'MethodSpec',
  settings: Any,
  label: Optional[Callable[[str], str]] = None,
) -> list[str]:
  """What is wrong with `settings` (`spec`'s), each naming the setting as
  `label(field name)` does: its flag (`--fedprox_mu`) by default."""
  label = label or (lambda name: f'--{spec.flag(name)}')
  found = []
  for field in dataclasses.fields(settings):
    value = getattr(settings, field.name)
    meta = field.metadata
    flag = f'{label(field.name)}={value!r}'
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


# (keras_model_fn, element_spec, hparams, *, dataset_computation, loss_fn,
# tff_model_fn) -> the method's process; `hparams` is the run's
# `hyperparameters.Hyperparameters`, whose `settings_of(spec)` are the
# method's own settings.
BuildFn = Callable[..., Any]


@dataclasses.dataclass(frozen=True)
class MethodSpec:
  """One method, as its module declares it.

  Attributes:
    name: The name in `--method` and in combinations ('fedprox').
    display_name: The name in tables and messages ('FedProx').
    settings: Its own settings, a frozen dataclass whose fields are made
      with `setting` (`NoSettings` if it has none).
    term: Makes the local term it adds to every client's objective (a
      `regularizers.Regularizer` class, say) from the settings its
      parameters name: `ProximalTerm(mu)` is given FedProx's `mu`.
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

    if self.term is not None:
      fields = {f.name for f in dataclasses.fields(self.settings)}
      unknown = [p for p in term_parameters(self) if p not in fields]
      if unknown:
        raise ValueError(
          f'Method {self.name!r}: its term takes {", ".join(unknown)}, '
          'which its settings do not have; a term takes its settings by '
          f'name (settings: {", ".join(sorted(fields)) or "none"}).'
        )

  def flag(self, field_name: str) -> str:
    """The flag of one of its settings: 'fedprox_mu' for FedProx's mu."""
    return f'{self.name}_{field_name}'

  @property
  def stands_alone(self) -> bool:
    """Whether it has a process of its own, and so combines with nothing."""
    return self.build is not None


def term_parameters(spec: MethodSpec) -> tuple[str, ...]:
  """The names of the settings `spec`'s term takes (none without a term)."""
  if spec.term is None:
    return ()
  return tuple(inspect.signature(spec.term).parameters)


def make_term(spec: MethodSpec, settings: Any) -> regularizers.Regularizer:
  """`spec`'s term, made from the settings (its dataclass) it takes."""
  return spec.term(
    **{name: getattr(settings, name) for name in term_parameters(spec)}
  )


_SHARED_ARGS_DOC = """\
    keras_model_fn: Builds a Keras model: one of `tff_methods_tasks.models`,
      a user's single-output model (taken as the logits), or one whose
      layers `model_lib.named_outputs` names.
    element_spec: The spec of one batch of client data.
    client_optimizer_fn: The client optimizer.
    server_optimizer_fn: Applied to the mean client update; SGD with
      learning rate 1 (plain averaging) by default; another server rule for
      a combination such as FedAvgM + FedProx.
    base_regularizers: Other methods' terms to add before this one (a
      combination: `fedprox.ProximalTerm(0.1)`, ...).
    dataset_computation: A client's key -> its batches
      (`tff_methods_tasks.datasets.round_dataset_computation`), or a batched
      TFF `ClientData` (`client_data.key_dataset_computation`); when given,
      `next` takes the clients' keys and each client makes its batches in
      its own computation. Clients that keep state need it, with keys
      naming the client and the round.
    client_state_dir: For clients that keep state: where their state files
      live; a temporary directory by default, which a resumed program can't
      use (`next` refuses to start past round 1 with it).
    client_states_in_memory: For clients that keep state: read and write
      them in this Python process, and `client_state_dir` at each
      checkpoint, for a process the in-process context runs
      (`execution.in_process`); files in `client_state_dir` by default.
    model_aggregator: TFF's model aggregator, weighted or unweighted
      (`tff.learning.robust_aggregator()`, `dp_aggregator(...)`, ...;
      `tff_methods.templates.aggregation`); the weighted mean by default.
    metrics_aggregator: TFF's metrics aggregator;
      `tff.learning.metrics.sum_then_finalize` by default.
    client_weighting: `tff.learning.ClientWeighting` or
      `aggregation.NumTokens()`; NUM_EXAMPLES by default, UNIFORM with an
      unweighted `model_aggregator`.
    loss_fn: The data term, `(labels, model outputs) -> scalar`;
      cross-entropy on `logits` by default.
    client_learning_rate_fn: Round number (from 0) -> the client learning
      rate, as TFF's `build_weighted_fed_avg_with_optimizer_schedule`; None
      for the client optimizer's own, which `get_hparams`/`set_hparams`
      read and set."""

# TFF's builder arguments, after `keras_model_fn` and `element_spec`, with
# their defaults.
_SHARED_ARGS = (
  ('client_optimizer_fn', inspect.Parameter.empty),
  ('server_optimizer_fn', None),
  ('base_regularizers', ()),
  ('dataset_computation', None),
  ('client_state_dir', None),
  ('client_states_in_memory', False),
  ('model_aggregator', None),
  ('metrics_aggregator', None),
  ('client_weighting', None),
  ('loss_fn', None),
  ('client_learning_rate_fn', None),
)


@functools.lru_cache(maxsize=None)
def builder(spec: MethodSpec) -> Callable[..., Any]:
  """The public builder of a component of the shared loop, generated from
  its declaration: `build_<name>(keras_model_fn, element_spec, *,
  client_optimizer_fn, ..., <the settings its term takes>)`.

  It builds `processes.build_local_training_process` with
  `base_regularizers` and then `spec`'s term, made from the settings given
  by name (the declared defaults for the rest). It is what the registry
  builds (`methods`), so a method has one build path. A settings value the
  declaration does not take is refused before anything is built, naming
  it and what is allowed.
  """
  if spec.stands_alone:
    raise ValueError(
      f'Method {spec.name!r} has a process of its own: its module defines '
      'its builder.'
    )
  fields = {f.name: f for f in dataclasses.fields(spec.settings)}
  setting_names = term_parameters(spec)

  def build(keras_model_fn, element_spec, **kwargs):
    given = {k: kwargs.pop(k) for k in setting_names if k in kwargs}
    allowed = [name for name, _ in _SHARED_ARGS] + list(setting_names)
    unknown = sorted(set(kwargs) - set(allowed))
    if unknown:
      raise TypeError(
        f'build_{spec.name}() got unknown arguments {", ".join(unknown)}; '
        f'it takes {", ".join(allowed)}.'
      )
    if 'client_optimizer_fn' not in kwargs:
      raise TypeError(f'build_{spec.name}() needs client_optimizer_fn.')
    args = {name: kwargs.get(name, default) for name, default in _SHARED_ARGS}
    terms = list(args.pop('base_regularizers'))
    if spec.term is not None:
      settings = spec.settings(**given)
      found = problems(spec, settings, label=lambda name: name)
      if found:
        raise ValueError(f'{spec.display_name}: {" ".join(found)}')
      terms.append(make_term(spec, settings))
    return processes.build_local_training_process(
      keras_model_fn,
      element_spec,
      args.pop('client_optimizer_fn'),
      args.pop('server_optimizer_fn'),
      regularizers=terms,
      **args,
    )

  build.__name__ = build.__qualname__ = f'build_{spec.name}'
  if spec.term is not None:  # Where help() and tracebacks say it is.
    build.__module__ = spec.term.__module__
  build.__signature__ = _signature(fields, setting_names)
  build.__doc__ = _docstring(spec, fields, setting_names)
  return build


def _signature(fields, setting_names) -> inspect.Signature:
  """A generated builder's signature: TFF's builder arguments, then the
  settings its term takes, with their declared defaults."""
  keyword = inspect.Parameter.KEYWORD_ONLY
  positional = inspect.Parameter.POSITIONAL_OR_KEYWORD
  return inspect.Signature(
    [
      inspect.Parameter('keras_model_fn', positional),
      inspect.Parameter('element_spec', positional),
      *(
        inspect.Parameter(name, keyword, default=default)
        for name, default in _SHARED_ARGS
      ),
      *(
        inspect.Parameter(
          name,
          keyword,
          default=fields[name].default,
          annotation=fields[name].type,
        )
        for name in setting_names
      ),
    ],
    return_annotation=tff.learning.templates.LearningProcess,
  )


def _docstring(spec, fields, setting_names) -> str:
  """A generated builder's docstring: the shared arguments' and each
  setting's help, default and flag."""
  settings_doc = ''.join(
    '\n'
    + textwrap.fill(
      f'{name}: {fields[name].metadata["help"].rstrip(".")} (default '
      f'{fields[name].default!r}; flag `--{spec.flag(name)}`).',
      width=78,
      initial_indent='    ',
      subsequent_indent='      ',
    )
    for name in setting_names
  )
  returns = textwrap.fill(
    'A `tff.learning.templates.LearningProcess`; when its clients keep '
    'state (a term reads their previous model or keeps a `ClientState`: '
    'MOON, FedCKA) a `stateful.StatefulClientsLearningProcess`, whose '
    '`next` takes `[client id, round]` keys.',
    width=78,
    initial_indent='    ',
    subsequent_indent='    ',
  )
  term = f" with {spec.display_name}'s term" if spec.term else ''
  return (
    f'Builds {spec.display_name} as a `tff.learning.templates.'
    f'LearningProcess`: the shared local-training loop{term}.\n\n'
    '  Generated from its declaration (`method_spec.builder`); the '
    'registry and the binaries build it.\n\n  Args:\n'
    + _SHARED_ARGS_DOC
    + settings_doc
    + '\n\n  Returns:\n'
    + returns
    + '\n'
  )
