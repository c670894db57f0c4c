"""The settings every method's builder is called with, by `methods`.

`Hyperparameters` holds what every method shares (the optimizers, the
aggregator, the federation) and the settings each method declares in its
own module (`method_spec.setting`), given by method name: a method's
defaults are defined once, in its module.
"""

import dataclasses
from typing import Any, Mapping, Optional

import tensorflow_federated as tff

from tff_methods.algorithms import method_spec
from tff_methods.templates import aggregation
from tff_methods.templates import optimizers


@dataclasses.dataclass(frozen=True)
class Hyperparameters:
  """Optimizer settings and method strengths shared by every method.

  Attributes:
    client_learning_rate: Local SGD learning rate.
    client_momentum: Local SGD momentum (0 for plain SGD).
    weight_decay: Local L2 weight decay, added to the gradient.
    server_learning_rate: The server optimizer's learning rate; None picks
      the method's default (1.0 for averaging, 0.01 for FedAdam/FedYogi).
    server_momentum: FedAvgM's server momentum.
    server_epsilon: FedAdam's / FedYogi's epsilon (Reddi et al. tune it per
      task; 1e-3 is their default).
    mu: The strength (a setting named `mu`) of every named component that
      `method_settings` gives none (FedProx, MOON, FedCKA, FedCos); None
      leaves each its own default.
    method_settings: Each method's own settings by method name, as field
      name -> value, e.g. {'fedprox': {'mu': 0.01}, 'moon': {'temperature':
      0.5}}; what is not given is the method's default (`settings_of`).
    num_clients: All clients, N (SCAFFOLD's |S|/N update).
    client_state_dir: Where methods with per-client state keep its files
      (None: a temporary directory).
    client_states_in_memory: Whether those methods keep them in this
      Python process, written to `client_state_dir` at each checkpoint:
      for a process the in-process context runs (`execution.in_process`).
    seed: Fixes Fed2's class -> group assignment.
    server_momentum_form: FedAvgM's 'heavy_ball' (TFF, default) or 'ema'
      (the FedCos code).
    client_weighting: How client updates are weighted in the mean, a name
      in `aggregation.CLIENT_WEIGHTINGS`: 'num_examples' (TFF's default),
      'uniform', or 'num_tokens' (Reddi et al.'s text tasks). An unweighted
      (DP) aggregator weighs clients uniformly whatever this says.
    aggregator: TFF's model aggregator family, a name in
      `aggregation.AGGREGATORS` ('mean', the weighted mean, by default).
    dp_noise_multiplier: 'dp': the Gaussian noise over the clip.
    dp_clip: 'dp': a fixed L2 clip, or None for TFF's adaptive clipping.
    dp_clipped_count_stddev: 'dp', adaptive clip: the noise on the count of
      clipped clients (None: TFF's 0.05 x clients_per_round).
    dp_target_quantile: 'dp', adaptive clip: the share of clients left
      unclipped that the clip aims at (TFF's 0.5).
    clients_per_round: 'dp': the expected clients per round.
  """

  client_learning_rate: float = 0.05
  client_momentum: float = 0.9
  weight_decay: float = 0.0
  server_learning_rate: Optional[float] = None
  server_momentum: float = 0.9
  server_epsilon: float = 1e-3
  mu: Optional[float] = None
  method_settings: Any = ()
  num_clients: int = 10
  client_state_dir: Optional[str] = None
  client_states_in_memory: bool = False
  seed: int = 0
  server_momentum_form: str = 'heavy_ball'
  client_weighting: str = 'num_examples'
  aggregator: str = 'mean'
  dp_noise_multiplier: float = 0.5
  dp_clip: Optional[float] = None
  dp_clipped_count_stddev: Optional[float] = None
  dp_target_quantile: float = 0.5
  clients_per_round: int = 10

  def __post_init__(self):
    # Kept as sorted pairs, so that the settings stay hashable and equal
    # however they were given.
    given = self.method_settings
    if isinstance(given, Mapping):
      given = given.items()
    object.__setattr__(
      self,
      'method_settings',
      tuple(
        sorted(
          (str(name), tuple(sorted(dict(values).items())))
          for name, values in given
        )
      ),
    )

  def settings_of(self, spec: method_spec.MethodSpec) -> Any:
    """`spec`'s own settings (its `settings` dataclass): those given in
    `method_settings`, then `mu` for a strength named mu, then its defaults.

    Raises:
      ValueError: naming a setting the method does not have, or a value it
        does not take.
    """
    given = dict(dict(self.method_settings).get(spec.name, ()))
    names = {f.name for f in dataclasses.fields(spec.settings)}
    unknown = sorted(set(given) - names)
    if unknown:
      raise ValueError(
        f'{spec.display_name} has no setting {", ".join(unknown)}; its '
        f'settings are {", ".join(sorted(names)) or "none"}.'
      )
    if self.mu is not None and 'mu' in names:
      given.setdefault('mu', self.mu)
    settings = spec.settings(**given)
    problems = method_spec.problems(spec, settings)
    if problems:
      raise ValueError(' '.join(problems))
    return settings

  def model_aggregator(self) -> Optional[aggregation.ModelAggregator]:
    """TFF's model aggregator of `aggregator` (None: the weighted mean)."""
    return aggregation.build_model_aggregator(
      self.aggregator,
      noise_multiplier=self.dp_noise_multiplier,
      clients_per_round=self.clients_per_round,
      clip=self.dp_clip,
      clipped_count_stddev=self.dp_clipped_count_stddev,
      target_unclipped_quantile=self.dp_target_quantile,
    )

  def weighting(self) -> Optional[aggregation.ClientWeighting]:
    """The builders' `client_weighting`: None (their default) for
    'num_examples', so that an unweighted aggregator stays uniform."""
    if self.client_weighting == 'num_examples':
      return None
    return aggregation.CLIENT_WEIGHTINGS[self.client_weighting]

  def client_optimizer(self) -> tff.learning.optimizers.Optimizer:
    return optimizers.build_client_sgd(
      self.client_learning_rate, self.client_momentum, self.weight_decay
    )

  def server_optimizer(self, name: str) -> tff.learning.optimizers.Optimizer:
    default = 0.01 if name in ('adam', 'yogi') else 1.0
    lr = self.server_learning_rate
    return optimizers.build_server_optimizer(
      name,
      default if lr is None else lr,
      momentum=self.server_momentum,
      momentum_form=self.server_momentum_form,
      epsilon=self.server_epsilon,
    )
