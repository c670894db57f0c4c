"""The settings every method's builder is called with, by `methods`.

`Hyperparameters` holds the optimizers' settings and the methods'
strengths; each method's own default strength stays in its module (its
`DEFAULT_MU`), which passes it to `strength`, so that a default is defined
once.
"""

import dataclasses
from typing import Optional

import tensorflow_federated as tff

from tff_methods import aggregation
from tff_methods import optimizers


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
    mu: The strength of every named component's term (FedProx, MOON,
      FedCKA, FedCos) that has no strength of its own in `strengths`; None
      picks each one's default (its module's `DEFAULT_MU`).
    strengths: Per-component strengths, e.g. {'fedprox': 0.01,
      'fedcos': 0.05} for `fedprox+fedcos`.
    beta: FedMAX's strength (default 1000, the paper's CIFAR value).
    temperature: MOON's temperature tau.
    cka_layers: FedCKA's M, the number of layers regularized.
    similarity: FedCKA's similarity, a name in
      `similarity.SIMILARITIES`.
    num_clients: All clients, N (SCAFFOLD's |S|/N update).
    client_state_dir: Where methods with per-client state keep its files
      (None: a temporary directory).
    fed2_groups: Fed2's G.
    fed2_decouple_depth: How many final layers Fed2 groups (None: the
      model's default, 6 for VGG).
    seed: Fixes Fed2's class -> group assignment.
    server_momentum_form: FedAvgM's 'heavy_ball' (TFF, default) or 'ema'
      (the FedCos code).
    scaffold_weighting: SCAFFOLD's model average, 'uniform' (the paper,
      default) or 'num_examples' (NIID-Bench).
    scaffold_momentum: SCAFFOLD's clients use `client_momentum` (NIID-Bench,
      the MOON repo); by default plain SGD (the paper).
    fedcos_direction: FedCos's `d`, 'global_move' (the paper, default) or
      'mean_client_update' (the FedCos code).
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
  strengths: tuple[tuple[str, float], ...] = ()
  beta: Optional[float] = None
  temperature: float = 0.5
  cka_layers: int = 2
  similarity: str = 'linear_cka'
  num_clients: int = 10
  client_state_dir: Optional[str] = None
  fed2_groups: int = 10
  fed2_decouple_depth: Optional[int] = None
  seed: int = 0
  server_momentum_form: str = 'heavy_ball'
  scaffold_weighting: str = 'uniform'
  scaffold_momentum: bool = False
  fedcos_direction: str = 'global_move'
  client_weighting: str = 'num_examples'
  aggregator: str = 'mean'
  dp_noise_multiplier: float = 0.5
  dp_clip: Optional[float] = None
  dp_clipped_count_stddev: Optional[float] = None
  dp_target_quantile: float = 0.5
  clients_per_round: int = 10

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

  def strength(self, component: str, default: float) -> float:
    """`component`'s strength: its own in `strengths`, else `mu`, else
    `default` (the component's module's)."""
    own = dict(self.strengths)
    if component in own:
      return own[component]
    return default if self.mu is None else self.mu

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
