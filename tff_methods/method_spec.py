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

`settings` below is a `hyperparameters.Hyperparameters`: a spec reads the
settings it needs by name, and takes its defaults from its own module
(`settings.strength('fedprox', DEFAULT_MU)`).
"""

import dataclasses
from typing import Any, Callable, Optional

from tff_methods import regularizers

# (keras_model_fn, element_spec, settings, *, dataset_computation, loss_fn,
# tff_model_fn) -> the method's process.
BuildFn = Callable[..., Any]


@dataclasses.dataclass(frozen=True)
class MethodSpec:
  """One method, as its module declares it.

  Attributes:
    name: The name in `--method` and in combinations ('fedprox').
    display_name: The name in tables and messages ('FedProx').
    term: `settings` -> the local term it adds to every client's objective.
    server_optimizer: The server rule it brings: 'sgd', 'sgdm', 'adam' or
      'yogi' (`optimizers.build_server_optimizer`).
    build: For a method with a process of its own: builds it (`BuildFn`).
    keeps_client_state: With `build`: whether its clients keep state
      between rounds, so that `next` takes client keys naming the round.
  """

  name: str
  display_name: str
  term: Optional[Callable[[Any], regularizers.Regularizer]] = None
  server_optimizer: Optional[str] = None
  build: Optional[BuildFn] = None
  keeps_client_state: bool = False

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
    if self.keeps_client_state and self.build is None:
      raise ValueError(
        f'Method {self.name!r}: keeps_client_state is for a method with a '
        'build function; a term keeps client state by supplying it.'
      )

  @property
  def stands_alone(self) -> bool:
    """Whether it has a process of its own, and so combines with nothing."""
    return self.build is not None
