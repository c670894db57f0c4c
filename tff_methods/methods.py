"""The methods by name: one place that turns a name into a process.

- `build_method(name, keras_model_fn, element_spec, hparams)` returns a
  `tff.learning.templates.LearningProcess` over client datasets, for every
  stateless method (`STATELESS_METHODS`).
- `build_method_for_client_ids(name, keras_model_fn, client_data, hparams)`
  returns a process whose `next` takes client ids, for every method: the
  stateless ones composed with the data's dataset computation, the stateful
  ones (`STATEFUL_METHODS`, per-client state) as
  `tff_methods.stateful.StatefulLearningProcess`.

Methods join by adding a line to `_BUILDERS` or `_STATEFUL_BUILDERS`.
"""

import dataclasses
from typing import Any, Callable, Optional

import tensorflow_federated as tff

from tff_methods import fedavg
from tff_methods import fedcka
from tff_methods import fedprox
from tff_methods import model_lib
from tff_methods import moon
from tff_methods import optimizers
from tff_methods import stateful


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
    mu: The strength of the method's own term; None picks the method's
      default (`DEFAULT_MU`).
    temperature: MOON's temperature tau.
    cka_layers: FedCKA's M, the number of layers regularized.
    similarity: FedCKA's similarity ('linear_cka', 'kernel_cka', 'cosine',
      'frobenius').
    client_state_dir: Where stateful methods keep client states on disk
      (None: in memory).
  """
  client_learning_rate: float = 0.01
  client_momentum: float = 0.0
  weight_decay: float = 0.0
  server_learning_rate: Optional[float] = None
  server_momentum: float = 0.9
  mu: Optional[float] = None
  temperature: float = 0.5
  cka_layers: int = 2
  similarity: str = 'linear_cka'
  client_state_dir: Optional[str] = None

  def strength(self, method: str) -> float:
    return DEFAULT_MU.get(method, 0.0) if self.mu is None else self.mu

  def client_optimizer(self) -> tff.learning.optimizers.Optimizer:
    return optimizers.build_client_sgd(self.client_learning_rate,
                                       self.client_momentum,
                                       self.weight_decay)

  def server_optimizer(self, name: str, default_learning_rate: float
                       ) -> tff.learning.optimizers.Optimizer:
    lr = self.server_learning_rate
    return optimizers.build_server_optimizer(
        name, default_learning_rate if lr is None else lr,
        momentum=self.server_momentum)


def _fedopt(server_optimizer: str, default_learning_rate: float):

  def build(keras_model_fn, element_spec, hparams):
    return fedavg.build_fedavg(
        keras_model_fn, element_spec, hparams.client_optimizer(),
        hparams.server_optimizer(server_optimizer, default_learning_rate))

  return build


def _fedprox(keras_model_fn, element_spec, hparams):
  return fedprox.build_fedprox(keras_model_fn, element_spec,
                               hparams.client_optimizer(),
                               hparams.strength('fedprox'),
                               hparams.server_optimizer('sgd', 1.0))


def _moon(keras_model_fn, element_spec, dataset_computation, hparams):
  return moon.build_moon(
      keras_model_fn, element_spec, dataset_computation,
      hparams.client_optimizer(), hparams.strength('moon'),
      hparams.temperature, hparams.server_optimizer('sgd', 1.0),
      hparams.client_state_dir)


def _fedcka(keras_model_fn, element_spec, dataset_computation, hparams):
  return fedcka.build_fedcka(
      keras_model_fn, element_spec, dataset_computation,
      hparams.client_optimizer(), hparams.strength('fedcka'),
      hparams.cka_layers, hparams.similarity,
      hparams.server_optimizer('sgd', 1.0), hparams.client_state_dir)



_BUILDERS: dict[str, Callable[..., tff.learning.templates.LearningProcess]] = {
    'fedavg': _fedopt('sgd', 1.0),
    'fedavgm': _fedopt('sgdm', 1.0),
    'fedadam': _fedopt('adam', 0.01),
    'fedyogi': _fedopt('yogi', 0.01),
    'fedprox': _fedprox,
}
_STATEFUL_BUILDERS: dict[str, Callable[..., stateful.StatefulLearningProcess]] = {
    'moon': _moon,
    'fedcka': _fedcka,
}
# The paper's usual strength of each method's term, when --mu is not given.
DEFAULT_MU = {'fedprox': 0.01, 'moon': 1.0, 'fedcka': 3.0}
STATELESS_METHODS = tuple(_BUILDERS)
STATEFUL_METHODS = tuple(_STATEFUL_BUILDERS)
METHOD_NAMES = STATELESS_METHODS + STATEFUL_METHODS


def check_method(name: str) -> None:
  if name not in METHOD_NAMES:
    raise ValueError(f'Unknown method {name!r}; choose one of '
                     f'{", ".join(METHOD_NAMES)}.')


def build_method(name: str, keras_model_fn: model_lib.KerasModelFn,
                 element_spec: Any, hparams: Hyperparameters
                 ) -> tff.learning.templates.LearningProcess:
  """Builds method `name` as a `tff.learning.templates.LearningProcess`.

  Args:
    name: One of `METHOD_NAMES`.
    keras_model_fn: Builds one of the project's multi-output Keras models.
    element_spec: The spec of one batch of client data.
    hparams: Optimizer settings and strengths.
  """
  check_method(name)
  if name in _STATEFUL_BUILDERS:
    raise ValueError(
        f'{name} keeps per-client state and is not a tff.learning '
        'LearningProcess; use build_method_for_client_ids.')
  return _BUILDERS[name](keras_model_fn, element_spec, hparams)


def build_method_for_client_ids(
    name: str, keras_model_fn: model_lib.KerasModelFn,
    client_data: tff.simulation.datasets.ClientData,
    hparams: Hyperparameters):
  """Builds method `name` as a process whose `next` takes client ids.

  Args:
    name: One of `METHOD_NAMES`.
    keras_model_fn: Builds one of the project's multi-output Keras models.
    client_data: The clients' preprocessed (batched) data.
    hparams: Optimizer settings and strengths.

  Returns:
    A `LearningProcess` (stateless methods) or a
    `stateful.StatefulLearningProcess`, either driven as
    `next(state, client_ids)`.
  """
  check_method(name)
  spec = client_data.element_type_structure
  if name in _STATEFUL_BUILDERS:
    return _STATEFUL_BUILDERS[name](keras_model_fn, spec,
                                    client_data.dataset_computation, hparams)
  return tff.simulation.compose_dataset_computation_with_learning_process(
      client_data.dataset_computation,
      build_method(name, keras_model_fn, spec, hparams))
