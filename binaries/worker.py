r"""Serves a TFF worker on this host, for other hosts' `--tff_workers`.

  tff-methods-worker --port=8000 --host=10.0.0.5 \
      [--max_concurrent_clients=2] [--tff_worker_binary=/path/to/worker_binary]

Runs TFF's C++ `worker_binary` (the one shipped in the tensorflow-federated
package unless `--tff_worker_binary` names another, e.g. one built with
CUDA) in the foreground until it is stopped (Ctrl-C). A binary started with
`--tff_workers=THIS_HOST:8000,...` then trains part of every round's clients
here. It listens on `--host` only: 127.0.0.1 by default (this host's
binaries only); the address of the interface the training hosts reach, or
0.0.0.0 for every interface. TFF's worker has no authentication: serve on a
trusted network, or firewall the port (TFF fixes its address at [::];
`tff_methods.execution.bind_address` binds it to the host). The workers read
clients' data by file path: run the
binaries and the workers with the same data cache (`--cache_dir`)
reachable at the same path.
"""

import errno
import os
import socket
import sys

from absl import app
from absl import flags

from tff_methods.execution import bind_address
from tff_methods.execution import workers
from tff_methods_binaries import binary_main
from tff_methods_tooling import process_setup

# The worker inherits this process's environment (oneDNN kernels on).
process_setup.configure_environment()

flags.DEFINE_integer('port', None, 'The port to serve on (1..65535).')
flags.DEFINE_string(
  'host',
  bind_address.LOOPBACK,
  'The address to listen on: 127.0.0.1 (this host only), an interface '
  "the training hosts reach, or 0.0.0.0 (every interface). TFF's worker "
  'has no authentication.',
)
flags.DEFINE_integer(
  'max_concurrent_clients',
  2,
  'Client computations run at once (<= 0: no limit); a '
  'limit also splits the cores between them.',
)
flags.DEFINE_string(
  'tff_worker_binary',
  None,
  'The worker executable; the packaged one by default.',
)
FLAGS = flags.FLAGS


def port_is_free(port: int) -> bool:
  """Whether nothing listens on `port` (on any interface, IPv4 or 6)."""
  for family, address in (
    (socket.AF_INET6, ('::', port)),
    (socket.AF_INET, ('0.0.0.0', port)),
  ):
    try:
      with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.bind(address)
    except OSError as e:
      if e.errno == errno.EADDRINUSE:
        return False
  return True


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  if FLAGS.port is None or not 1 <= FLAGS.port <= 65535:
    print(f'--port={FLAGS.port} must be a port in 1..65535', file=sys.stderr)
    return 2
  try:
    host = bind_address.check_host(FLAGS.host)
  except ValueError as e:
    print(f'--host: {e}', file=sys.stderr)
    return 2
  try:
    binary = (
      workers.check_worker_binary(FLAGS.tff_worker_binary)
      if FLAGS.tff_worker_binary
      else workers.packaged_worker_binary()
    )
  except ValueError as e:
    print(f'--tff_worker_binary: {e}', file=sys.stderr)
    return 2
  except RuntimeError as e:
    print(e, file=sys.stderr)
    return 2
  if not port_is_free(FLAGS.port):
    # gRPC binds with SO_REUSEPORT: a second worker would share the port.
    print(
      f'--port={FLAGS.port} is in use (another worker, or another program): '
      'stop it, or give another port.',
      file=sys.stderr,
    )
    return 2
  environment = workers.worker_environment(
    FLAGS.max_concurrent_clients, host=host
  )
  everywhere = not bind_address.held_to_host(environment)
  where = 'every interface' if everywhere else host
  print(
    f'TFF worker {binary} serving on {where}, port {FLAGS.port}', flush=True
  )
  if everywhere and not bind_address.is_any_address(host):
    print(
      f'warning: {host} could not be held to (no C compiler to build '
      "tff_methods/execution/bind_address.c): TFF's worker listens on every "
      'interface.',
      file=sys.stderr,
      flush=True,
    )
  if everywhere or host != bind_address.LOOPBACK:
    print(
      f"warning: TFF's worker has no authentication: anyone who reaches "
      f'{where} port {FLAGS.port} can run computations here. Serve only on '
      'a trusted network, or firewall the port to the hosts that train.',
      file=sys.stderr,
      flush=True,
    )
  # Become the worker: signals reach it directly and nothing is left behind.
  os.execve(
    binary,
    [
      binary,
      f'--port={FLAGS.port}',
      '--max_concurrent_computation_calls=' f'{FLAGS.max_concurrent_clients}',
    ],
    environment,
  )


def run():
  """The `tff-methods-worker` command."""
  binary_main.run(main, __name__)


if __name__ == '__main__':
  run()
