"""Where a client's time goes: a process's client computation, op by op.

TFF's worker runs each client's TensorFlow computation in a session of its
own, with Grappler's runtime optimizer off (TFF's session options), on the
graph TFF's native compiler produced in Python (its static Grappler pass,
control flow already lowered). A `ClientSession` takes that same compiled
graph (`worker_compilation.compile_for_simulation` of the process's
`next`) and runs it in a TensorFlow session in this process with the
worker's session options; `profile_clients` reads each op's time from
TensorFlow's step statistics. So a method's cost per client splits by op:
what it computes beyond FedAvg (its reference passes, Gram matrices,
corrections) and what its per-client state costs (`ReadFile`,
`ParseTensor`, `SerializeTensor`, `WriteFile`).

It runs rounds as the benchmark does, every client in every round, so each
client reads the state it wrote the round before. The times are one
client's on one thread; the worker runs several clients at once
(`workers.threads_per_client`), and this process feeds and fetches the
client's values as arrays, which the worker does not, so a whole client's
time here is not the worker's: compare ops. An op that works on threads of
its own (a data set's, `DatasetToSingleElement`, for client data that are
not the project's files) is charged its whole wall time, which overlaps
the ops run beside it.
"""

import collections
import dataclasses
import time
from typing import Any, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_methods.execution import onednn_max_pool
from tff_methods.execution import worker_compilation


def worker_session_config(
  intra_op_threads: int = 1,
) -> tf.compat.v1.ConfigProto:
  """The session options of TFF 0.87's worker (`session_provider.cc`):
  Grappler's meta optimizer off, graph optimizer at L0, no JIT, a static
  graph."""
  config = tf.compat.v1.ConfigProto(
    intra_op_parallelism_threads=intra_op_threads,
    inter_op_parallelism_threads=1,
    allow_soft_placement=True,
  )
  config.graph_options.rewrite_options.disable_meta_optimizer = True
  optimizer_options = config.graph_options.optimizer_options
  optimizer_options.opt_level = tf.compat.v1.OptimizerOptions.L0
  optimizer_options.global_jit_level = tf.compat.v1.OptimizerOptions.OFF
  config.experimental.optimize_for_static_graph = True
  return config


@dataclasses.dataclass
class ClientGraph:
  """A client's compiled TensorFlow computation: its graph, the tensors its
  parameter and result are bound to (flattened), and its initializer."""

  graph_def: tf.compat.v1.GraphDef
  parameter_names: list[str]
  result_names: list[str]
  initialize_op: str


def client_graph(process) -> ClientGraph:
  """The TensorFlow computation each client of `process.next` runs.

  The largest TensorFlow computation in `next`'s compiled form whose last
  parameter is a client key (a string vector): the client's batches,
  training and state, in one graph.

  Raises:
    ValueError: `next` has no such computation (its clients take data sets,
      not keys).
  """
  from tensorflow_federated.python.core.impl.computation import computation_impl

  # As the local worker's context compiles it.
  compiled = worker_compilation.compile_for_simulation(
    process.next, pair_max_pool_gradients=onednn_max_pool.applies()
  )
  proto = computation_impl.ConcreteComputation.get_proto(compiled)
  candidates = []
  for computation in worker_compilation.tensorflow_computations(proto):
    graph_def = tf.compat.v1.GraphDef()
    computation.tensorflow.graph_def.Unpack(graph_def)
    parameter_names = _bound_names(computation.tensorflow.parameter)
    if not parameter_names or not _is_key(graph_def, parameter_names[-1]):
      continue
    size = len(graph_def.node) + sum(
      len(f.node_def) for f in graph_def.library.function
    )
    candidates.append((size, computation, graph_def, parameter_names))
  if not candidates:
    raise ValueError(
      "The process's next has no client computation that takes a client "
      'key ([client id, round]); a client profile needs a process built '
      'with a dataset computation of keys (methods.'
      'build_method_for_client_ids).'
    )
  _, computation, graph_def, parameter_names = max(
    candidates, key=lambda c: c[0]
  )
  return ClientGraph(
    graph_def,
    parameter_names,
    _bound_names(computation.tensorflow.result),
    computation.tensorflow.initialize_op,
  )


class ClientSession:
  """A process's client computation in a TensorFlow session of its own,
  with the worker's options: `run` a client's round, or `trace` it.

  The computation receives `initial_weights` (and zeros for what a method
  broadcasts beside them) and the client's key. Close it with `close`.
  """

  def __init__(
    self,
    process,
    initial_weights: tff.learning.models.ModelWeights,
    intra_op_threads: int = 1,
  ):
    client = client_graph(process)
    graph = tf.Graph()
    with graph.as_default():
      tf.compat.v1.import_graph_def(client.graph_def, name='')
    self._parameter_names = client.parameter_names
    self._received = _received_values(
      graph, client.parameter_names, initial_weights
    )
    self._results = [graph.get_tensor_by_name(n) for n in client.result_names]
    self._session = tf.compat.v1.Session(
      graph=graph, config=worker_session_config(intra_op_threads)
    )
    if client.initialize_op:
      self._session.run(client.initialize_op)

  def _feed(self, client_id: str, round_num: int):
    key = np.array([client_id.encode(), str(round_num).encode()])
    return dict(zip(self._parameter_names, self._received + [key]))

  def run(self, client_id: str, round_num: int) -> None:
    self._session.run(self._results, self._feed(client_id, round_num))

  def trace(self, client_id: str, round_num: int) -> dict[str, float]:
    """The client's round, traced: seconds by op type."""
    metadata = tf.compat.v1.RunMetadata()
    self._session.run(
      self._results,
      self._feed(client_id, round_num),
      options=tf.compat.v1.RunOptions(
        trace_level=tf.compat.v1.RunOptions.FULL_TRACE
      ),
      run_metadata=metadata,
    )
    seconds = collections.Counter()
    for device in metadata.step_stats.dev_stats:
      for node in device.node_stats:
        seconds[_op_type(node)] += node.all_end_rel_micros / 1e6
    return dict(seconds)

  def close(self) -> None:
    self._session.close()


def profile_clients(
  sessions: dict[str, ClientSession],
  client_ids: Sequence[str],
  *,
  rounds: int = 3,
  traced_clients: int = 8,
) -> dict[str, dict[str, Any]]:
  """Times each session's client computation, in all and op by op.

  Rounds 1 to `rounds` train every client in turn (round 1 untimed), a
  last round traces the first `traced_clients`; the sessions take turns
  (a round of each, then each traced client in each), so that the
  machine's noise falls on all of them alike.

  Returns:
    By name: `seconds_per_client`, the median over the timed rounds of a
    round's time over its clients; `op_seconds`, each op type's median over
    the traced clients (largest first); `traced_clients`.

  Raises:
    ValueError: on fewer than 2 rounds or traced clients not in
      [1, len(client_ids)].
  """
  if rounds < 2:
    raise ValueError(f'rounds must be >= 2 (one untimed), got {rounds}.')
  if not 1 <= traced_clients <= len(client_ids):
    raise ValueError(
      f'traced_clients must be in [1, {len(client_ids)}] (the clients '
      f'given), got {traced_clients}.'
    )
  per_client = collections.defaultdict(list)
  for round_num in range(1, rounds + 1):
    for name, session in sessions.items():
      start = time.perf_counter()
      for client_id in client_ids:
        session.run(client_id, round_num)
      if round_num > 1:
        per_client[name].append((time.perf_counter() - start) / len(client_ids))
  traces = collections.defaultdict(list)
  for client_id in client_ids[:traced_clients]:
    for name, session in sessions.items():
      traces[name].append(session.trace(client_id, rounds + 1))
  profiles = {}
  for name in sessions:
    ops = {op for trace in traces[name] for op in trace}
    medians = {
      op: float(np.median([trace.get(op, 0.0) for trace in traces[name]]))
      for op in ops
    }
    profiles[name] = dict(
      seconds_per_client=float(np.median(per_client[name])),
      op_seconds=dict(sorted(medians.items(), key=lambda item: -item[1])),
      traced_clients=traced_clients,
    )
  return profiles


def extra_over(
  op_seconds: dict[str, float], reference: dict[str, float], top: int = 8
) -> list[tuple[str, float]]:
  """The ops a method spends most beyond `reference`'s (FedAvg's), in
  seconds per client, largest first (only those above the reference)."""
  extra = {
    op: seconds - reference.get(op, 0.0) for op, seconds in op_seconds.items()
  }
  return sorted(
    ((op, s) for op, s in extra.items() if s > 0), key=lambda item: -item[1]
  )[:top]


def report_markdown(profile: dict[str, Any], top: int = 15) -> str:
  """`profile` (the benchmark's `client_profile`) as a table of the ops
  that take longest, milliseconds per client, and each method's largest
  extras over FedAvg."""
  methods = profile['methods']
  names = list(methods)
  ops = collections.Counter()
  for timing in methods.values():
    for op, seconds in timing['op_seconds'].items():
      ops[op] = max(ops[op], seconds)
  shown = [op for op, _ in ops.most_common(top)]
  lines = [
    "## Where a client's time goes",
    '',
    f"{profile['model']}, {profile['examples_per_client']} examples per "
    f"client, {profile['local_epochs']} local epochs, batches of "
    f"{profile['batch_size']}: each method's client computation as TFF "
    "compiles it, run in a session with the worker's options on one "
    'thread (`tff_methods_tooling.client_profile`). Milliseconds per client.',
    '',
    '| op | ' + ' | '.join(names) + ' |',
    '|---|' + '---:|' * len(names),
    '| whole client | '
    + ' | '.join(
      f"{1000 * methods[n]['seconds_per_client']:.2f}" for n in names
    )
    + ' |',
  ]
  for op in shown:
    cells = [
      f"{1000 * methods[n]['op_seconds'].get(op, 0.0):.2f}" for n in names
    ]
    lines.append(f'| {op} | ' + ' | '.join(cells) + ' |')
  if 'fedavg' in methods:
    lines.append('')
    reference = methods['fedavg']['op_seconds']
    for name in names:
      if name == 'fedavg':
        continue
      extras = extra_over(methods[name]['op_seconds'], reference)
      lines.append(
        f'- {name} beyond FedAvg: '
        + ', '.join(f'{op} +{1000 * s:.2f}' for op, s in extras)
        + '.'
      )
  return '\n'.join(lines) + '\n'


def _bound_names(binding) -> list[str]:
  """The tensor names of a TensorFlow computation's binding, flattened."""
  kind = binding.WhichOneof('binding')
  if kind == 'tensor':
    return [binding.tensor.tensor_name]
  if kind == 'struct':
    return [n for e in binding.struct.element for n in _bound_names(e)]
  return []


def _is_key(graph_def, tensor_name: str) -> bool:
  node_name = tensor_name.split(':')[0]
  for node in graph_def.node:
    if node.name == node_name:
      return node.attr['dtype'].type == tf.string.as_datatype_enum
  return False


def _received_values(graph, parameter_names, initial_weights):
  """What a client receives: the weights, then zeros for the rest (a
  method's broadcast, and the client optimizer's hyperparameters: a zero
  learning rate runs the same ops) up to the key."""
  weights = [
    np.asarray(a)
    for a in tf.nest.flatten(
      (initial_weights.trainable, initial_weights.non_trainable)
    )
  ]
  values = []
  for i, name in enumerate(parameter_names[:-1]):
    tensor = graph.get_tensor_by_name(name)
    shape = [d if d is not None else 1 for d in tensor.shape.as_list()]
    if i < len(weights) and list(weights[i].shape) == shape:
      values.append(weights[i])
    else:
      values.append(np.zeros(shape, tensor.dtype.as_numpy_dtype))
  return values


def _op_type(node) -> str:
  """An op's type from its step statistics' label ('name = Type(...)')."""
  label = node.timeline_label
  if ' = ' in label:
    return label.split(' = ', 1)[1].split('(', 1)[0].strip()
  return node.node_name.split('/')[-1]
