"""The methods by name: one place that turns a name into a LearningProcess.

`build_method(name, keras_model_fn, element_spec, hparams)` returns a
`tff.learning.templates.LearningProcess` for every stateless method. Methods
join by adding a line to `_BUILDERS`.
"""

import dataclasses
from typing import Any, Callable, Optional

import tensorflow_federated as tff

from tff_methods import fedavg
from tff_methods import fedprox
from tff_methods import model_lib
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
    mu: The regularization strength of the method's own term (FedProx's
      proximal mu).
  """
  client_learning_rate: float = 0.01
  client_momentum: float = 0.0
  weight_decay: float = 0.0
  server_learning_rate: Optional[float] = None
  server_momentum: float = 0.9
  mu: float = 0.01

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
                               hparams.client_optimizer(), hparams.mu,
                               hparams.server_optimizer('sgd', 1.0))


_BUILDERS: dict[str, Callable[..., tff.learning.templates.LearningProcess]] = {
    'fedavg': _fedopt('sgd', 1.0),
    'fedavgm': _fedopt('sgdm', 1.0),
    'fedadam': _fedopt('adam', 0.01),
    'fedyogi': _fedopt('yogi', 0.01),
    'fedprox': _fedprox,
}
METHOD_NAMES = tuple(_BUILDERS)


def check_method(name: str) -> None:
  if name not in _BUILDERS:
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
  return _BUILDERS[name](keras_model_fn, element_spec, hparams)
