"""Where an in-process client's time goes, before and after many clients a
call (docs/performance.md, "Where an in-process client's time goes").

  python tools/in_process_costs.py --method=fedavg

The benchmark's process and data (CIFAR-shaped, 100 clients of 20
examples, one local step of 20 by default; `--num_clients`,
`--examples_per_client`, `--local_epochs` and `--batch_size` as the
benchmark's) on the CPU split into two logical devices,
a warm-up round in-process, then each device's share of a round's clients
trained on both devices at once, two ways:

- one call a client: the client's `work` and `accumulate` as one session
  call, its variables initialized by a call before it, the running sum
  fetched and fed again (the path before many clients a call);
- many a call: `session_graphs.ClientLoopGraph`, every client of the
  device in one call.

For each, per client: the wall time (the median of `--passes`), and, from
one traced call on one device, the time of its ops by part: data and state
(the host's ops: files, parsing, strings, data sets), the arithmetic (every
other kernel) and the session call (wall time beyond the ops, one call).
Run with `TF_OVERRIDE_GLOBAL_THREADPOOL=0` for the sessions sharing one
pool of every core. `--top_ops=N` also lists the op types taking
most of the many-a-call trace.
"""

import argparse
import concurrent.futures
import statistics
import time

from tff_methods.execution import in_process

DEVICES = ('cpu:0', 'cpu:1')


def _per_client_step(plan, device):
  from tff_methods.execution import session_graphs

  form = plan._form  # pylint: disable=protected-access
  summed = len(session_graphs.leaves_of_type(form.zero.type_signature.result))
  updates = len(
    session_graphs.leaves_of_type(form.work.type_signature.result[0])
  )
  return session_graphs.SessionGraph(
    [
      (form.work, {}),
      (form.accumulate, {summed + k: k for k in range(updates)}),
    ],
    device,
    plan._step[device].threads,  # pylint: disable=protected-access
  )


def _op_shares(graph, leaves):
  """The shares of a traced call's op time by part
  (`benchmark_in_process.op_time_shares`; its second trace: the first
  builds the kernels), and each op type's share."""
  from tff_methods_tooling import benchmark_in_process

  for _ in range(2):
    graph.run(leaves, trace=True)
  total = sum(graph.op_micros.values())
  return benchmark_in_process.op_time_shares(graph.op_micros), {
    op: micros / total for op, micros in graph.op_micros.most_common()
  }


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument('--method', default='fedavg')
  parser.add_argument('--passes', type=int, default=5)
  parser.add_argument(
    '--top_ops',
    type=int,
    default=0,
    help="Also list the op types taking most of a many-a-call trace's time.",
  )
  parser.add_argument('--num_clients', type=int, default=100)
  parser.add_argument('--examples_per_client', type=int, default=20)
  parser.add_argument('--local_epochs', type=int, default=1)
  parser.add_argument('--batch_size', type=int, default=20)
  args = parser.parse_args()
  least = dict(
    num_clients=len(DEVICES),  # a client for each device at least
    examples_per_client=1,
    local_epochs=1,
    batch_size=1,
  )
  for name, smallest in least.items():
    if getattr(args, name) < smallest:
      parser.error(f'--{name}={getattr(args, name)}: at least {smallest}.')
  context = in_process.set_in_process_execution_context(
    list(DEVICES), fallback_fn=False
  )
  import tempfile

  from tff_methods.algorithms import hyperparameters
  from tff_methods.execution import session_graphs
  from tff_methods_tasks import datasets
  from tff_methods_tooling import benchmark_processes

  data = datasets.generated_like(
    'cifar10',
    args.num_clients,
    args.examples_per_client,
    tempfile.mkdtemp(),
    seed=0,
  )
  hparams = hyperparameters.Hyperparameters(
    num_clients=args.num_clients, client_states_in_memory=True
  )
  process, _ = benchmark_processes.benchmark_process(
    args.method,
    'fedcka_cnn',
    data,
    hparams,
    args.local_epochs,
    args.batch_size,
    0,
  )
  ids = list(data.client_data.client_ids)
  state = process.initialize()
  state = process.next(state, benchmark_processes.keys(ids, 1)).state
  (plan,) = [
    p
    for _, p in context._plans.values()  # pylint: disable=protected-access
    if isinstance(p, in_process._MapReduceRound)  # pylint: disable=protected-access
  ]
  form_type = plan._form.type_signature.parameter  # pylint: disable=protected-access
  broadcast = list(
    plan._prepare.run(session_graphs.flatten(state, form_type[0]))  # pylint: disable=protected-access
  )
  devices = plan._devices  # pylint: disable=protected-access
  per_client = {d: _per_client_step(plan, d) for d in devices}
  pool = concurrent.futures.ThreadPoolExecutor(len(devices))
  round_num = [2]

  def share(device, round_num):
    keys = benchmark_processes.keys(ids, round_num)[devices.index(device) :: 2]
    return [session_graphs.flatten(k, form_type[1].member) for k in keys]

  def one_a_call(device):
    total = list(plan._zero[device].run([]))  # pylint: disable=protected-access
    for client in share(device, round_num[0]):
      total = per_client[device].run(client + broadcast + total)

  def many_a_call(device):
    total = list(plan._zero[device].run([]))  # pylint: disable=protected-access
    plan._step[device].run(  # pylint: disable=protected-access
      session_graphs.stack(share(device, round_num[0])) + broadcast + total
    )

  rows = {}
  for name, train in (
    ('one call a client', one_a_call),
    ('many a call', many_a_call),
  ):
    alone, both = [], []
    for _ in range(args.passes):
      round_num[0] += 1
      start = time.perf_counter()
      train(devices[0])
      alone.append(time.perf_counter() - start)
      round_num[0] += 1
      start = time.perf_counter()
      list(pool.map(train, devices))
      both.append(time.perf_counter() - start)
    rows[name] = dict(
      alone=statistics.median(alone) * 1000 / (len(ids) // len(devices)),
      both=statistics.median(both) * 1000 / len(ids),
    )
  device = devices[0]
  clients = share(device, round_num[0] + 1)
  total = list(plan._zero[device].run([]))  # pylint: disable=protected-access
  rows['one call a client'].update(
    _op_shares(per_client[device], clients[0] + broadcast + total)[0]
  )
  shares, ops = _op_shares(
    plan._step[device],  # pylint: disable=protected-access
    session_graphs.stack(clients) + broadcast + total,
  )
  rows['many a call'].update(shares)
  threads = plan._step[device].threads  # pylint: disable=protected-access
  print(
    f'{args.method}, {args.num_clients} clients of '
    f'{args.examples_per_client}, {args.local_epochs} epoch(s) of batches '
    f'of {args.batch_size} on {", ".join(devices)} '
    f'({threads or "shared"} threads a device):'
  )
  print(
    '| path | ms a client, one device | ms a client, both devices at once '
    "| a traced call's op time: data and state / arithmetic / framework |"
  )
  print('|---|---|---|---|')
  for name, row in rows.items():
    print(
      f"| {name} | {row['alone']:.2f} | {row['both']:.2f} | "
      f"{row.get('data and state', 0):.0%} / {row.get('arithmetic', 0):.0%} / "
      f"{row.get('framework', 0):.0%} |"
    )
  if args.top_ops:
    print(f'\nThe {args.top_ops} op types taking most of a many-a-call trace:')
    print(
      ', '.join(
        f'{op} {share:.0%}' for op, share in list(ops.items())[: args.top_ops]
      )
    )


if __name__ == '__main__':
  main()
