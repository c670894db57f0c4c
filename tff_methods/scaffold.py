"""SCAFFOLD (Karimireddy et al., ICML 2020), option II.

Paper: Karimireddy et al., "SCAFFOLD: Stochastic Controlled Averaging for
Federated Learning", ICML 2020. https://arxiv.org/abs/1910.06378

Server state: the global model `w_g` and the server control variate `c`;
client state: each client's control variate `c_i` (zeros at first).

Local objective: the data loss plus the linear term `<w, c - c_i>` (no
gradient through `c - c_i`), so every local SGD step uses `g + c - c_i`.
After K local steps with learning rate eta:

  c_i_new = c_i - c + (w_g - w) / (K * eta).

Server rule, over the sampled clients S of N in all:

  w_g += eta_g * mean(w - w_g),
  c   += (|S| / N) * mean(c_i_new - c_i).

By default client updates are averaged uniformly and clients train with
plain SGD, as in the paper; `client_weighting=NUM_EXAMPLES` and
`client_momentum` give NIID-Bench's variant (models averaged by data size,
local SGD with momentum, the same `c_i` formula with K the steps taken).
Either way `c` moves by the unweighted mean over the clients with a finite
update. Needs per-client state (`tff_methods.stateful`).
"""

import collections
from typing import Any, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_methods import local_training
from tff_methods import model_lib
from tff_methods import optimizers
from tff_methods import regularizers
from tff_methods import stateful


class ControlVariateCorrection(regularizers.Regularizer):
  """`<w, c - c_i>` with `c - c_i` constant: adds `c - c_i` to the gradient."""

  name = 'scaffold'

  def __call__(self, step: regularizers.LocalStep) -> tf.Tensor:
    server_control = step.broadcast[self.name]
    return tf.add_n([
        tf.reduce_sum(w * tf.stop_gradient(c - ci))
        for w, c, ci in zip(step.weights, server_control, step.client_state)])


def build_scaffold(
    keras_model_fn: model_lib.KerasModelFn,
    element_spec: Any,
    *,
    dataset_computation: tff.Computation,
    client_learning_rate: float,
    num_clients: int,
    server_learning_rate: float = 1.0,
    weight_decay: float = 0.0,
    client_state_dir: Optional[str] = None,
    loss_fn: Optional[local_training.LossFn] = None,
    client_momentum: float = 0.0,
    client_weighting: tff.learning.ClientWeighting = (
        tff.learning.ClientWeighting.UNIFORM),
) -> stateful.StatefulClientsLearningProcess:
  """Builds SCAFFOLD (option II) as a stateful-client learning process.

  Args:
    keras_model_fn: Builds one of the project's models.
    element_spec: The spec of one batch of client data.
    dataset_computation: A client's (client_id, round_num) key -> its
      batches (`tasks.datasets.round_dataset_computation`).
    client_learning_rate: eta, the local SGD learning rate.
    num_clients: N, all clients (for the |S|/N update of `c`).
    server_learning_rate: eta_g.
    weight_decay: Local L2 weight decay.
    client_state_dir: Keep the control variates in files here
      (default: a temporary directory).
    loss_fn: The data term; cross-entropy by default.
    client_momentum: Local SGD momentum (0, plain SGD, is the paper's).
    client_weighting: How client models are averaged: UNIFORM (the paper)
      or NUM_EXAMPLES (NIID-Bench).
  """
  if not isinstance(num_clients, int) or num_clients < 1:
    raise ValueError(f'SCAFFOLD num_clients must be >= 1, got '
                     f'{num_clients!r}.')
  key_type = stateful.check_client_key_type(dataset_computation)
  client_optimizer = optimizers.build_client_sgd(
      client_learning_rate, momentum=client_momentum,
      weight_decay=weight_decay)
  server_optimizer = optimizers.build_server_optimizer('sgd',
                                                       server_learning_rate)
  correction = ControlVariateCorrection()
  weights_type = model_lib.weights_type(keras_model_fn, element_spec)
  control_type = weights_type.trainable
  data_type = tff.SequenceType(tff.types.tensorflow_to_type(element_spec))
  zeros = [np.asarray(z) for z in model_lib.zero_weights(
      keras_model_fn).trainable]
  client_states = stateful.ClientStateFiles(zeros, client_state_dir)

  initial_model_weights_fn = model_lib.initial_weights_computation(
      keras_model_fn)

  @tff.tensorflow.computation
  def initial_control_fn():
    return collections.OrderedDict(
        control_variate=[tf.constant(z) for z in zeros])

  @tff.tensorflow.computation(weights_type, control_type, key_type,
                              data_type)
  def client_update_computation(weights, server_control, key, dataset):
    client_id, round_num = stateful.split_client_key(key)
    client_control = client_states.read(client_id, round_num)
    client_update = local_training.build_client_update_fn(
        keras_model_fn, client_optimizer, [correction], client_weighting,
        loss_fn)
    result, sums, _ = client_update(
        weights, dataset, broadcast={correction.name: server_control},
        client_state=client_control)
    steps = tf.maximum(sums['num_batches'], 1.0)
    trained = [ci - c + u / (steps * client_learning_rate) for ci, c, u in
               zip(client_control, server_control, result.update)]
    # A diverged client (weight 0) keeps its control variate.
    new_control = tf.cond(result.update_weight > 0, lambda: trained,
                          lambda: [tf.identity(ci) for ci in client_control])
    control_delta = [n - o for n, o in zip(new_control, client_control)]
    written = client_states.write(client_id, round_num, new_control)
    # Only clients with a finite update count in |S|.
    counted = tf.cast(result.update_weight > 0, tf.float32)
    return result, sums, written, control_delta, counted

  server_state_type = initial_control_fn.type_signature.result

  @tff.tensorflow.computation(server_state_type, control_type, tf.float32)
  def update_server_control(state, mean_delta, num_sampled):
    share = num_sampled / float(num_clients)
    return collections.OrderedDict(control_variate=[
        c + share * tf.where(tf.math.is_finite(d), d, tf.zeros_like(d))
        for c, d in zip(state['control_variate'], mean_delta)])

  distributor = tff.learning.templates.build_broadcast_process(weights_type)
  aggregator = tff.aggregators.MeanFactory().create(
      weights_type.trainable, tff.TensorType(np.float32))
  finalizer = tff.learning.templates.build_apply_optimizer_finalizer(
      server_optimizer, weights_type)

  @tff.federated_computation
  def initialize_fn():
    return tff.federated_zip(tff.learning.templates.LearningAlgorithmState(
        tff.federated_eval(initial_model_weights_fn, tff.SERVER),
        distributor.initialize(),
        tff.federated_eval(initial_control_fn, tff.SERVER),
        aggregator.initialize(), finalizer.initialize()))

  state_type = initialize_fn.type_signature.result

  @tff.federated_computation(state_type, tff.FederatedType(key_type,
                                                           tff.CLIENTS))
  def next_fn(state, keys):
    client_data = tff.federated_map(dataset_computation, keys)
    distributed = distributor.next(state.distributor,
                                   state.global_model_weights)
    server_control = tff.federated_broadcast(
        state.client_work.control_variate)
    result, sums, written, deltas, counted = tff.federated_map(
        client_update_computation,
        (distributed.result, server_control, keys, client_data))
    aggregated = aggregator.next(state.aggregator, result.update,
                                 result.update_weight)
    finalized = finalizer.next(state.finalizer, state.global_model_weights,
                               aggregated.result)
    mean_delta = tff.federated_mean(deltas, weight=counted)
    new_control = tff.federated_map(
        update_server_control,
        (state.client_work, mean_delta, tff.federated_sum(counted)))
    new_state = tff.federated_zip(tff.learning.templates.LearningAlgorithmState(
        finalized.result, distributed.state, new_control, aggregated.state,
        finalized.state))
    metrics = tff.federated_zip(collections.OrderedDict(
        distributor=distributed.measurements,
        client_work=local_training.sum_train_metrics(sums),
        aggregator=aggregated.measurements,
        finalizer=finalized.measurements,
        client_states=stateful.client_states_metrics(written)))
    return tff.learning.templates.LearningProcessOutput(new_state, metrics)

  return stateful.build_process(initialize_fn, next_fn, client_states)
