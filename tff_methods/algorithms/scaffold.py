"""SCAFFOLD (Karimireddy et al., ICML 2020), option II.

Paper: Karimireddy et al., "SCAFFOLD: Stochastic Controlled Averaging for
Federated Learning", ICML 2020. https://arxiv.org/abs/1910.06378

Server state: the global model `w_g` and the server control variate `c`;
client state: each client's control variate `c_i` (zeros at first).

Local step: the optimizer's step on the data loss's gradient `g`, then
the correction `w <- w - eta (c - c_i)`, applied after the step and
outside the optimizer, as NIID-Bench's `train_net_scaffold` applies it
after `optimizer.step()`. With plain SGD (the paper) that is the step on
`g + c - c_i`; with momentum the correction does not pass through the
momentum buffer. After K local steps with learning rate eta:

  c_i_new = c_i - c + (w_g - w) / (K * eta).

Server rule, over the sampled clients S of N in all:

  w_g += eta_g * mean(w - w_g),
  c   += (|S| / N) * mean(c_i_new - c_i).

By default client updates are averaged uniformly and clients train with
plain SGD, as in the paper; `client_weighting=NUM_EXAMPLES` and
`client_momentum` give NIID-Bench's variant (models averaged by data size,
local SGD with momentum, the same `c_i` formula with K the steps taken).
Either way `c` moves by the unweighted mean over the clients with a finite
update. Needs per-client state (`tff_methods.templates.stateful`).
"""

import dataclasses
from typing import Any, Callable, Optional

import tensorflow as tf
import tensorflow_federated as tff

from tff_methods.algorithms import method_spec
from tff_methods.templates import aggregation
from tff_methods.templates import client_hparams
from tff_methods.templates import local_training
from tff_methods.templates import model_lib
from tff_methods.templates import optimizers
from tff_methods.templates import processes
from tff_methods.templates import regularizers
from tff_methods.templates import stateful


class ControlVariateCorrection(regularizers.Regularizer):
  """Moves the weights by `-eta (c - c_i)` after every optimizer step.

  Keeps `c` as server state (broadcast every round) and `c_i` on each
  client; a client reports `c_i_new - c_i`, whose mean moves `c`.

  Args:
    client_learning_rate: eta, the local learning rate in the correction
      and in `c_i_new`, where a step does not carry the round's
      (`LocalStep.learning_rate`: the client optimizer's, scheduled or set
      by `set_hparams`), which the processes' steps do.
    num_clients: N, all clients (for the |S|/N update of `c`).
  """

  name = 'scaffold'
  display_name = 'SCAFFOLD'

  def __init__(self, client_learning_rate: float, num_clients: int):
    if not isinstance(num_clients, int) or num_clients < 1:
      raise ValueError(
        f'SCAFFOLD num_clients must be >= 1, got ' f'{num_clients!r}.'
      )
    self.client_learning_rate = client_learning_rate
    self.num_clients = num_clients
    # No term in the objective: the correction is a move of the weights.
    self.server_state = regularizers.ServerState(
      initial=lambda zeros: [tf.constant(z) for z in zeros],
      broadcast=self._broadcast,
      record_client_reports=self._record_client_reports,
    )
    self.client_state = regularizers.ClientState(
      initial=list, update=self._next_control
    )

  def _broadcast(self, server_state, global_weights):
    del global_weights
    return [tf.identity(c) for c in server_state], server_state

  def _eta(self, learning_rate):
    if learning_rate is None:
      return self.client_learning_rate
    return learning_rate

  def weight_correction(self, step: regularizers.LocalStep):
    eta = self._eta(step.learning_rate)
    return [
      eta * (c - ci)
      for c, ci in zip(step.broadcast[self.name], step.client_state[self.name])
    ]

  def _next_control(
    self, client_state, *, update, num_steps, broadcast, learning_rate=None
  ):
    steps = tf.maximum(num_steps, 1.0)
    eta = self._eta(learning_rate)
    # A learning rate of 0 moves nothing: c_i then keeps c_i - c.
    new_control = [
      ci - c + tf.math.divide_no_nan(u, steps * eta)
      for ci, c, u in zip(client_state, broadcast, update)
    ]
    return new_control, [n - o for n, o in zip(new_control, client_state)]

  def _record_client_reports(self, server_state, mean_report, num_reports):
    share = num_reports / float(self.num_clients)
    return [
      c + share * tf.where(tf.math.is_finite(d), d, tf.zeros_like(d))
      for c, d in zip(server_state, mean_report)
    ]


# The hyperparameters of the client optimizers SCAFFOLD's option II holds
# to: SGD, with momentum in NIID-Bench's variant.
_SGD_HPARAMS = frozenset({'learning_rate', 'momentum'})


def _client_sgd(
  client_optimizer_fn, client_learning_rate, client_momentum, weight_decay
) -> tff.learning.optimizers.Optimizer:
  """The client optimizer from TFF's argument or the learning rate's."""
  if client_optimizer_fn is None:
    if client_learning_rate is None:
      raise ValueError(
        "SCAFFOLD needs client_optimizer_fn (TFF's SGD, e.g. "
        'tff.learning.optimizers.build_sgdm(0.1)) or client_learning_rate.'
      )
    return optimizers.build_client_sgd(
      client_learning_rate, momentum=client_momentum, weight_decay=weight_decay
    )
  if client_learning_rate is not None or client_momentum or weight_decay:
    raise ValueError(
      "Pass SCAFFOLD's client_optimizer_fn or client_learning_rate "
      '(with client_momentum and weight_decay), not both: e.g. '
      'client_optimizer_fn=tff_methods.templates.optimizers.'
      'build_client_sgd(lr, momentum, weight_decay).'
    )
  client_optimizer_fn = client_hparams.as_optimizer(client_optimizer_fn)
  hparams = client_hparams.initial_hparams(client_optimizer_fn)
  if 'learning_rate' not in hparams or set(hparams) - _SGD_HPARAMS:
    raise ValueError(
      "SCAFFOLD's control variates assume SGD steps of learning rate eta "
      '(option II); the client optimizer has hyperparameters '
      f'{sorted(hparams)}: use tff.learning.optimizers.build_sgdm '
      "(with momentum for NIID-Bench's variant)."
    )
  return client_optimizer_fn


def build_scaffold(
  keras_model_fn: model_lib.KerasModelFn,
  element_spec: Any,
  *,
  dataset_computation: tff.Computation,
  num_clients: int,
  client_optimizer_fn: Optional[tff.learning.optimizers.Optimizer] = None,
  server_optimizer_fn: Optional[tff.learning.optimizers.Optimizer] = None,
  client_learning_rate: Optional[float] = None,
  server_learning_rate: Optional[float] = None,
  weight_decay: float = 0.0,
  client_state_dir: Optional[str] = None,
  client_states_in_memory: bool = False,
  client_momentum: float = 0.0,
  model_aggregator: Optional[aggregation.ModelAggregator] = None,
  metrics_aggregator: Optional[aggregation.MetricsAggregator] = None,
  client_weighting: Optional[aggregation.ClientWeighting] = None,
  loss_fn: Optional[local_training.LossFn] = None,
  client_learning_rate_fn: Optional[Callable[[Any], Any]] = None,
) -> stateful.StatefulClientsLearningProcess:
  """Builds SCAFFOLD (option II) as a stateful-client learning process.

  The shared loop with clients that keep state
  (`processes.build_local_training_process`) with one term,
  `ControlVariateCorrection`: `c` lives in the process's distributor state
  (`state.distributor['scaffold']`), each `c_i` in the client's state files
  (`client_states.get(id)['scaffold']`). The client optimizer is SGD, given as
  TFF's builders take it (`client_optimizer_fn`) or by its learning rate
  (`client_learning_rate`, `client_momentum`, `weight_decay`); eta in the
  correction and in `c_i`'s update is its learning rate of the round, so a
  schedule (`client_learning_rate_fn`) or `set_hparams` changes both.

  Args:
    keras_model_fn: Builds a Keras model: one of `tff_methods_tasks.models`, a
      user's single-output model (taken as the logits), or one whose layers
      `model_lib.named_outputs` names.
    element_spec: The spec of one batch of client data.
    dataset_computation: A client's `[client id, round]` key -> its
      batches (`tff_methods_tasks.datasets.round_dataset_computation`), or TFF's
      client-id form: a batched `ClientData` or its `dataset_computation`
      (`client_data.key_dataset_computation`).
    num_clients: N, all clients (for the |S|/N update of `c`).
    client_optimizer_fn: TFF's SGD (`tff.learning.optimizers.build_sgdm`,
      with momentum for NIID-Bench's variant, or
      `optimizers.build_client_sgd` with weight decay); or pass
      `client_learning_rate`.
    server_optimizer_fn: The server optimizer; SGD at
      `server_learning_rate` (1.0 by default: `w_g += eta_g mean(w - w_g)`).
    client_learning_rate: eta, the local SGD learning rate, in place of
      `client_optimizer_fn`.
    server_learning_rate: eta_g, in place of `server_optimizer_fn`.
    weight_decay: Local L2 weight decay, with `client_learning_rate`.
    client_state_dir: Where the clients' state files live; a temporary
      directory by default, which a resumed program can't use (`next`
      refuses to start past round 1 with it).
    client_states_in_memory: Keep the states in this Python process,
      written to `client_state_dir` at each checkpoint, for a process run
      in this process (`execution.in_process`).
    client_momentum: Local SGD momentum (0, plain SGD, is the paper's),
      with `client_learning_rate`.
    model_aggregator: TFF's model aggregator, weighted or unweighted
      (`tff_methods.templates.aggregation`); it averages the model
      updates, while `c` moves by the plain mean of the clients'
      control-variate changes: a DP aggregator leaves those un-noised, so
      the process is not differentially private (the binaries refuse
      SCAFFOLD under DP).
    metrics_aggregator: TFF's metrics aggregator;
      `tff.learning.metrics.sum_then_finalize` by default.
    client_weighting: How client models are averaged: UNIFORM (the paper,
      default) or NUM_EXAMPLES (NIID-Bench).
    loss_fn: The data term; cross-entropy by default.
    client_learning_rate_fn: Round number (from 0) -> eta, as TFF's
      `build_weighted_fed_avg_with_optimizer_schedule`.

  Raises:
    ValueError: both or neither of the client optimizer's forms, both of
      the server's, a client optimizer that is not SGD.
  """
  client_optimizer = _client_sgd(
    client_optimizer_fn, client_learning_rate, client_momentum, weight_decay
  )
  if server_optimizer_fn is not None and server_learning_rate is not None:
    raise ValueError(
      "Pass SCAFFOLD's server_optimizer_fn or server_learning_rate, not both."
    )
  if server_optimizer_fn is None:
    server_optimizer_fn = optimizers.build_server_optimizer(
      'sgd', 1.0 if server_learning_rate is None else server_learning_rate
    )
  eta = client_hparams.initial_hparams(client_optimizer)['learning_rate']
  correction = ControlVariateCorrection(eta, num_clients)
  if client_weighting is None:
    client_weighting = tff.learning.ClientWeighting.UNIFORM
  process = processes.build_local_training_process(
    keras_model_fn,
    element_spec,
    dataset_computation=dataset_computation,
    client_optimizer_fn=client_optimizer,
    server_optimizer_fn=server_optimizer_fn,
    regularizers=[correction],
    client_state_dir=client_state_dir,
    client_states_in_memory=client_states_in_memory,
    model_aggregator=model_aggregator,
    metrics_aggregator=metrics_aggregator,
    client_weighting=client_weighting,
    loss_fn=loss_fn,
    client_learning_rate_fn=client_learning_rate_fn,
  )
  process.expect_population(num_clients, 'SCAFFOLD num_clients')
  return process


# The model average: the paper's, or NIID-Bench's by data size (or tokens).
WEIGHTINGS = {
  'uniform': tff.learning.ClientWeighting.UNIFORM,
  'num_examples': tff.learning.ClientWeighting.NUM_EXAMPLES,
  'num_tokens': aggregation.NumTokens(),
}


def _build_from_hparams(
  keras_model_fn,
  element_spec,
  hparams,
  *,
  dataset_computation=None,
  loss_fn=None,
  tff_model_fn=None,
):
  del tff_model_fn  # The project's loop trains the Keras model.
  own = hparams.settings_of(METHOD)
  return build_scaffold(
    keras_model_fn,
    element_spec,
    dataset_computation=dataset_computation,
    client_learning_rate=hparams.client_learning_rate,
    num_clients=hparams.num_clients,
    server_learning_rate=(
      1.0
      if hparams.server_learning_rate is None
      else hparams.server_learning_rate
    ),
    weight_decay=hparams.weight_decay,
    client_state_dir=hparams.client_state_dir,
    client_states_in_memory=hparams.client_states_in_memory,
    client_momentum=hparams.client_momentum if own.momentum else 0.0,
    client_weighting=WEIGHTINGS[own.weighting],
    model_aggregator=hparams.model_aggregator(),
    loss_fn=loss_fn,
  )


@dataclasses.dataclass(frozen=True)
class Settings:
  """SCAFFOLD's settings (flags `--scaffold_<name>`)."""

  weighting: str = method_spec.setting(
    'uniform',
    'The model average: uniform (the paper), num_examples (NIID-Bench) or '
    'num_tokens.',
    choices=tuple(WEIGHTINGS),
  )
  momentum: bool = method_spec.setting(
    False,
    'Clients use the client momentum (NIID-Bench, the MOON repo); by '
    'default plain SGD (the paper).',
  )


def _notes(settings, hparams):
  if hparams.client_momentum and not settings.momentum:
    return [
      'SCAFFOLD trains clients with plain SGD, as the paper does: the '
      f'client momentum {hparams.client_momentum} is not used (its '
      'momentum setting, --scaffold_momentum, uses it, as NIID-Bench does).'
    ]
  return []


METHOD = method_spec.MethodSpec(
  name='scaffold',
  display_name='SCAFFOLD',
  settings=Settings,
  notes=_notes,
  build=_build_from_hparams,
  keeps_client_state=True,
  weighting_setting='weighting',
  client_reports="the control variates' changes c_i_new - c_i",
)
