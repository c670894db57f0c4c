"""Learning processes whose clients keep state between rounds.

A `tff.learning.templates.LearningProcess` carries no per-client state, yet
MOON and FedCKA need each client's previous local model (the layers they
read of it, `reference_outputs.kept_previous_weights`), and SCAFFOLD its
control variate.
Here each client's state lives in files that the client's
own TensorFlow reads and writes (`client_states.ClientStateFiles`; in
memory with `client_states_in_memory=True`, for a process the in-process
context runs, and on disk with each checkpoint), and the
processes are ordinary `LearningProcess`es whose clients are keys,
`[client_id, round_num]` (`client_key`):

  next(server_state, keys@CLIENTS) -> (server_state, metrics)

So a client's state never passes through Python, TFF's value serialization
or the worker's gRPC channel (for ResNet-18, 11M floats in and out per
client and round: that transfer cost as much as the training), and TFF's
own program logic (`tff.learning.programs.train_model`) drives these
processes like any other. `next` checks the keys before a round runs
(`StatefulClientsLearningProcess.check_keys`).
"""

import collections
from typing import Any, Optional, Sequence
import warnings

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_methods.clients import client_data
from tff_methods.clients import client_keys
from tff_methods.clients import client_states as client_states_lib
from tff_methods.clients import state_files
from tff_methods.templates import aggregation
from tff_methods.templates import client_hparams
from tff_methods.templates import client_works
from tff_methods.templates import composers
from tff_methods.templates import distributors
from tff_methods.templates import local_training
from tff_methods.templates import reference_outputs
from tff_methods.templates import regularizers as regularizers_lib


class StatefulClientsLearningProcess(composers.ClientIdsLearningProcess):
  """A `LearningProcess` whose clients keep state in `client_states`.

  Its `next` takes each client's key, `(client_id, round_num)`; the clients
  read and write their state files themselves. Before a round runs, `next`
  checks the keys it is given (`check_keys`).
  """

  def __init__(
    self,
    initialize_fn,
    next_fn,
    get_model_weights,
    set_model_weights,
    client_states: client_states_lib.ClientStateFiles,
    get_hparams_fn: Optional[tff.Computation] = None,
    set_hparams_fn: Optional[tff.Computation] = None,
  ):
    super().__init__(
      initialize_fn,
      next_fn,
      get_model_weights,
      set_model_weights,
      get_hparams_fn=get_hparams_fn,
      set_hparams_fn=set_hparams_fn,
    )
    self.client_states = client_states
    self._last_round = None
    self._repeats = 0
    # (N, who needs it): the population a method's server rule assumes.
    self._population = None
    self._seen_clients = set()

  def check_clients(self, clients: Any) -> None:
    """`next`'s check before the round runs: `check_keys`."""
    self.check_keys(clients)

  def expect_population(self, num_clients: int, setting: str) -> None:
    """Makes `check_keys` refuse more distinct clients than
    `num_clients`, the population the method's `setting` assumes."""
    self._population = (num_clients, setting)

  def check_keys(self, keys: Any) -> None:
    """Refuses, before the round runs, what would read the wrong states.

    - Data sets instead of keys (the clients make their own batches from
      `(client id, round)` keys).
    - Rounds below 1.
    - A first round past 1 with a temporary state directory: a resumed
      program whose clients' states were in a directory that is gone.
    - More distinct clients than the population the method assumes
      (`expect_population`: SCAFFOLD's N).
    A round before the last round this process ran, or the same round a
    third time running, gets a warning: its clients read the states
    written before it, not those of the last round. (The same round twice
    is a retry, as `tff.learning.programs.train_model` retries a discarded
    round: it reads what the first try read.)
    """
    if not isinstance(keys, (list, tuple)):
      return  # A federated value of a program: TFF checks its type.
    rounds = [client_keys.round_of_key(key) for key in keys]
    if not rounds:
      return
    if min(rounds) < 1:
      raise ValueError(
        f'Client keys name rounds from 1 on; got round ' f'{min(rounds)}.'
      )
    if (
      self._last_round is None
      and self.client_states.temporary
      and max(rounds) > 1
    ):
      raise ValueError(
        f'This process starts at round {max(rounds)} but keeps its '
        "clients' states in a temporary directory, so a resumed run "
        'has lost them (MOON and FedCKA would train without previous '
        'models, SCAFFOLD with zero control variates). Pass '
        'client_state_dir=<a directory kept with the program state> to '
        'the builder.'
      )
    if (
      self._last_round is None
      and self.client_states.in_memory
      and max(rounds) > 1
      and not state_files.has_client_states(self.client_states.directory)
    ):
      raise ValueError(
        f'This process starts at round {max(rounds)}, but the states its '
        'clients kept in memory (it was built to run in-process) were never '
        f'written to {self.client_states.directory}, so a resumed run has '
        'lost them. A program that saves checkpoints passes '
        'client_states.PruningProgramStateManager(its manager, '
        'process.client_states), which writes them with each checkpoint.'
      )
    if self._population is not None:
      num_clients, setting = self._population
      seen = self._seen_clients | {np.asarray(k)[0] for k in keys}
      if len(seen) > num_clients:
        raise ValueError(
          f'{setting}={num_clients} is the number of all clients, but '
          f'{len(seen)} distinct clients have taken part by round '
          f'{max(rounds)}: build the process with the number of all clients.'
        )
      self._seen_clients = seen
    repeats = self._repeats + 1 if max(rounds) == self._last_round else 0
    if self._last_round is not None and (
      max(rounds) < self._last_round or repeats > 1
    ):
      warnings.warn(
        f'Client keys name round {max(rounds)}, but this process last ran '
        f'round {self._last_round}'
        + (f' ({repeats + 1} times)' if repeats else '')
        + f': its clients read the states written before round '
        f"{max(rounds)}, not the last round's. Give each round its own "
        'number (tff_methods.clients.client_keys.client_key(client_id, '
        'round_num)).',
        stacklevel=3,
      )
    self._last_round, self._repeats = max(rounds), repeats


def build_process(
  initialize_fn: tff.Computation,
  next_fn: tff.Computation,
  client_states: client_states_lib.ClientStateFiles,
  hparams_fns: Optional[tuple[tff.Computation, tff.Computation]] = None,
) -> StatefulClientsLearningProcess:
  """The learning process of a round's computations.

  Args:
    initialize_fn: Returns the SERVER-placed `LearningAlgorithmState`.
    next_fn: `(state, keys@CLIENTS) -> LearningProcessOutput`; each client
      reads and writes its state through `client_states`.
    client_states: The clients' state files.
    hparams_fns: `get_hparams` and `set_hparams`
      (`composers.hparams_computations`); TFF's empty ones when None.
  """
  get_hparams_fn, set_hparams_fn = hparams_fns or (None, None)
  return StatefulClientsLearningProcess(
    initialize_fn,
    next_fn,
    *composers.model_weights_computations(
      initialize_fn.type_signature.result.member
    ),
    client_states,
    get_hparams_fn=get_hparams_fn,
    set_hparams_fn=set_hparams_fn,
  )


def previous_model_client_state(weights: tff.learning.models.ModelWeights):
  """The initial state of a client that keeps its previous model."""
  return collections.OrderedDict(
    has_previous=np.int32(0),
    model=tf.nest.map_structure(np.zeros_like, weights),
  )


def initial_client_state(
  regularizers: Sequence[regularizers_lib.Regularizer],
  zero_weights: tff.learning.models.ModelWeights,
  kept_previous: Optional[reference_outputs.KeptWeights] = None,
):
  """A new client's state: what `regularizers` keep on each client.

  `has_previous` and `model` (what `kept_previous` keeps of its local model
  at the end of the last round it took part in,
  `reference_outputs.kept_previous_weights`) when a regularizer reads the
  previous model, and each regularizer's own state (`Regularizer.client_state`)
  under its name.
  """
  state = collections.OrderedDict()
  if regularizers_lib.needs_previous_model(regularizers):
    if kept_previous is None:
      raise ValueError(
        'The regularizers read the previous model: pass what a client '
        'keeps of it (reference_outputs.kept_previous_weights).'
      )
    state.update(previous_model_client_state(kept_previous(zero_weights)))
  for r in regularizers:
    if r.client_state is not None:
      if r.name in state:
        raise ValueError(
          f'Two regularizers named {r.name!r} keep client '
          'state; names must be unique.'
        )
      state[r.name] = tf.nest.map_structure(
        np.asarray, r.client_state.initial(zero_weights.trainable)
      )
  return state


def _check_terms(regularizers: Sequence[regularizers_lib.Regularizer]):
  """Refuses terms of which none keeps client state, and a term that reads
  client reports without the client state whose update makes them."""
  if not regularizers_lib.needs_client_state(regularizers):
    raise ValueError(
      'No regularizer keeps client state (reads the previous model or '
      'has a client_state); use '
      'client_works.build_local_training_client_work.'
    )
  for r in regularizers:
    if regularizers_lib.reads_client_reports([r]) and r.client_state is None:
      raise ValueError(
        f'{r.name} reads client reports (ServerState.'
        'record_client_reports), so it must keep the client state '
        '(a ClientState) whose update makes them.'
      )


def _new_state_and_reports(
  state_keepers, kept_model, client_state, result, **update_args
):
  """A client's state after it trained (its kept previous model, if a term
  reads it, and each term's own `ClientState.update`), and the reports of
  the terms that read them (`reads_client_reports`) with their count.

  A diverged client (update weight 0) keeps its old state and reports
  zeros, uncounted. The reports and their count are summed in one
  reduction: their mean is the sum over the count.
  """
  trained = collections.OrderedDict()
  if kept_model is not None:
    trained.update(has_previous=tf.constant(1), model=kept_model)
  reports = collections.OrderedDict()
  broadcast = update_args.pop('broadcast')
  for r in state_keepers:
    trained[r.name], report = r.client_state.update(
      client_state[r.name],
      update=result.update,
      broadcast=broadcast[r.name] if r.server_state else None,
      **update_args,
    )
    if regularizers_lib.reads_client_reports([r]):
      reports[r.name] = report
  finite = result.update_weight > 0
  new_state = tf.cond(finite, lambda: trained, lambda: client_state)
  if reports:
    reports = tf.cond(
      finite,
      lambda: reports,
      lambda: tf.nest.map_structure(tf.zeros_like, reports),
    )
  return new_state, collections.OrderedDict(
    reports=reports, reported=tf.cast(finite, tf.float32)
  )


def _report_recorders(distributor, reporters, report_sum_type) -> list:
  """The recorder that gives the terms' server state the sum of their
  clients' reports after aggregation, if a term reads them."""
  report_recorder = distributors.build_report_recorder(
    distributor, reporters, report_sum_type
  )
  if report_recorder is None:
    return []

  def record_reports(distributor_state, mean_update, client_outputs):
    del mean_update
    return tff.federated_map(
      report_recorder,
      (distributor_state, tff.federated_sum(client_outputs.report_sum)),
    )

  return [record_reports]


def _client_computation(
  setup, regularizers, hparams, client_batches, client_states, kept_previous
) -> tff.Computation:
  """A client's round, keyed by `[client id, round]`: its batches made from
  its key, its state read, its training (`local_training`), its new state
  written; -> (update, weight and reports; train metrics; state counts)."""
  keras_model_fn, loss_fn = setup.keras_model_fn, setup.loss_fn
  has_broadcast = regularizers_lib.keeps_server_state(regularizers)
  reads_previous = regularizers_lib.needs_previous_model(regularizers)
  state_keepers = [r for r in regularizers if r.client_state is not None]

  # The key last, as the benchmark's client profile finds it.
  @tff.tensorflow.computation(
    setup.received_type, hparams.hparams_type, client_keys.CLIENT_KEY_TYPE
  )
  def client_update_computation(received, optimizer_hparams, key):
    dataset = client_batches(key)
    client_id, round_num = client_keys.split_client_key(key)
    client_state, read_version = client_states.read_with_version(
      client_id, round_num
    )
    initial_weights, broadcast = distributors.split_received(
      received, has_broadcast
    )
    client_update = local_training.build_client_update_fn(
      keras_model_fn,
      hparams.optimizer,
      regularizers,
      setup.client_weighting,
      loss_fn,
    )
    own_states = {r.name: client_state[r.name] for r in state_keepers}
    result, sums, final_weights = client_update(
      initial_weights,
      dataset,
      client_state['model'] if reads_previous else None,
      client_state['has_previous'] > 0 if reads_previous else False,
      broadcast,
      own_states or None,
      optimizer_hparams,
    )
    new_state, report_sum = _new_state_and_reports(
      state_keepers,
      kept_previous(final_weights) if reads_previous else None,
      client_state,
      result,
      num_steps=sums['num_batches'],
      broadcast=broadcast,
      learning_rate=optimizer_hparams.get('learning_rate'),
    )
    written = client_states.write(client_id, round_num, new_state)
    client_output = collections.OrderedDict(
      update=result.update,
      update_weight=result.update_weight,
      report_sum=report_sum,
    )
    return (
      client_output,
      aggregation.unfinalized_train_metrics(sums),
      collections.OrderedDict(written=written, read_version_sum=read_version),
    )

  return client_update_computation


def build_stateful_client_work(
  setup: composers.LoopSetup,
  element_spec: Any,
  dataset_computation: tff.Computation,
  optimizer: tff.learning.optimizers.Optimizer,
  regularizers: Sequence[regularizers_lib.Regularizer],
  client_state_dir: Optional[str] = None,
  client_states_in_memory: bool = False,
  metrics_aggregator: Optional[aggregation.MetricsAggregator] = None,
  client_learning_rate_fn: Optional[client_hparams.LearningRateFn] = None,
) -> composers.LoopClientWork:
  """The shared loop's client work for clients that keep state between
  rounds, with what its process needs beside it.

  What a client keeps is what its regularizers ask for
  (`initial_client_state`): its previous local model (MOON, FedCKA), and
  state of their own (SCAFFOLD's control variate), read before the client
  trains (`local_training.build_client_update_fn`) and replaced after
  (`ClientState.update`). After aggregation the regularizers' server state
  learns the mean of the clients' reports (a recorder). A client whose
  update is not finite keeps its old state and reports nothing. The
  process is a `StatefulClientsLearningProcess` over the state files.

  Args:
    setup: The loop's pieces (`composers.set_up_loop`).
    element_spec: The spec of one batch of client data.
    dataset_computation: A client's `(client_id, round_num)` key -> its
      batches (`tff_methods_tasks.datasets.round_dataset_computation`), or
      TFF's client-id form (`key_dataset_computation`).
    optimizer: The client optimizer (as TFF's client works name it).
    regularizers: Terms added to every client's local objective; at least
      one keeps client state (`regularizers.needs_client_state`).
    client_state_dir: Where the clients' state files live (default: a
      temporary directory, removed at exit, which a resumed program can't
      use: `next` refuses to start past round 1 with it).
    client_states_in_memory: Keep the states in this Python process,
      written to `client_state_dir` at each checkpoint
      (`client_states.ClientStateFiles`): for a process run in this
      process (`execution.in_process`; a TFF worker can't run it).
    metrics_aggregator: TFF's metrics aggregator;
      `tff.learning.metrics.sum_then_finalize` by default.
    client_learning_rate_fn: Round number (from 0) -> the client learning
      rate (`client_hparams`); None for the client optimizer's own.
  """
  regularizers = tuple(regularizers)
  _check_terms(regularizers)
  dataset_computation = client_data.key_dataset_computation(dataset_computation)
  # Each client makes its batches from its key in its own computation
  # (`ClientBatches`); checked here, before any state file is written.
  client_batches = client_data.ClientBatches(
    dataset_computation,
    tff.SequenceType(tff.types.tensorflow_to_type(element_spec)),
  )
  state_keepers = [r for r in regularizers if r.client_state is not None]
  reporters = [
    r for r in state_keepers if regularizers_lib.reads_client_reports([r])
  ]
  kept_previous = reference_outputs.kept_previous_weights(
    setup.keras_model_fn, regularizers
  )
  client_states = client_states_lib.ClientStateFiles(
    initial_client_state(regularizers, setup.zero_weights, kept_previous),
    client_state_dir,
    in_memory=client_states_in_memory,
  )

  hparams = client_hparams.ClientHparams(optimizer, client_learning_rate_fn)

  client_update_computation = _client_computation(
    setup,
    regularizers,
    hparams,
    client_batches,
    client_states,
    kept_previous,
  )
  client_work = client_works.client_work(
    hparams,
    client_update_computation,
    metrics_aggregator,
    keyed=True,
    more_measurements=lambda state_counts: dict(
      client_states=client_states_lib.summed_counts(state_counts)
    ),
  )
  return composers.LoopClientWork(
    process=client_work,
    recorders=_report_recorders(
      setup.distributor,
      reporters,
      client_update_computation.type_signature.result[0]['report_sum'],
    ),
    make_process=lambda initialize_fn, next_fn, hparams_fns: build_process(
      initialize_fn, next_fn, client_states, hparams_fns
    ),
  )
