r"""Whether and how fast this machine's GPUs (or named devices) run the methods.

  tff-methods-device-check                 # every GPU, FedAvg
  tff-methods-device-check --devices=gpu:0,gpu:1 \
      --methods=fedavg,moon,scaffold --rounds=5

Each method trains a few rounds on the digits task twice from the same
initial model: on TFF's worker (CPU only) and in this process on the devices
(`--execution=in_process`). It prints the devices found, then a row per
method: seconds per round on each path (median of the rounds after the first,
which compiles), the largest relative difference of the two runs' weights, where
the in-process clients' nodes ran (TensorFlow's step stats), and any op of the
clients' graphs that has no GPU kernel. `make gpu-check` runs it. The logic
lives in `tff_methods_tooling.device_check`.
"""

import json
import sys

from absl import app
from absl import flags

from tff_methods_binaries import binary_main
from tff_methods_tooling import process_setup

# Before TensorFlow is first imported (by the modules below).
process_setup.configure_process(process_setup.verbosity_from_argv(sys.argv))

from tff_methods.algorithms import methods
from tff_methods.execution import devices as devices_lib
from tff_methods.execution import in_process

flags.DEFINE_list(
  'devices',
  [],
  'Devices the clients run on, e.g. gpu:0,gpu:1 (more cpu:N than one splits '
  'the CPU into logical devices); empty: every GPU, else the CPU.',
)
flags.DEFINE_list(
  'methods',
  ['fedavg'],
  'Methods to check (' + ', '.join(methods.METHOD_NAMES) + ').',
)
flags.DEFINE_integer('rounds', 3, 'Rounds per run (>= 2: the first compiles).')
flags.DEFINE_integer('num_clients', 4, 'Digits clients, all in every round.')
flags.DEFINE_bool(
  'deterministic', False, 'TF32 off and op determinism on (slower).'
)
flags.DEFINE_string(
  'json_output', None, 'Also write the rows as JSON to this file.'
)
FLAGS = flags.FLAGS


def _usage_error(message: str) -> int:
  print(f'error: {message}', file=sys.stderr)
  return 2


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  process_setup.quiet(FLAGS.verbosity)
  unknown = [m for m in FLAGS.methods if m not in methods.METHOD_NAMES]
  if unknown:
    return _usage_error(
      f'--methods: {", ".join(unknown)} not a method; allowed: '
      + ', '.join(methods.METHOD_NAMES)
    )
  if FLAGS.rounds < 2:
    return _usage_error(f'--rounds={FLAGS.rounds} must be >= 2.')
  if FLAGS.num_clients < 2:
    return _usage_error(f'--num_clients={FLAGS.num_clients} must be >= 2.')
  try:
    context = in_process.create_in_process_execution_context(
      FLAGS.devices or None, deterministic=FLAGS.deterministic
    )
  except devices_lib.DeviceError as e:
    return _usage_error(f'--{e}')
  from tff_methods_tooling import device_check

  rows = []
  for row in device_check.check_methods(
    FLAGS.methods,
    context,
    device_check.worker_context(),
    rounds=FLAGS.rounds,
    num_clients=FLAGS.num_clients,
  ):
    rows.append(row)
    print(
      f'{row.method}: worker {row.worker_seconds:.3f} s/round, in-process '
      f'{row.in_process_seconds:.3f} s/round',
      flush=True,
    )
  print(device_check.report(context.devices, rows))
  if FLAGS.json_output:
    with open(FLAGS.json_output, 'w') as f:
      json.dump([row.__dict__ for row in rows], f, indent=1)
  return 0


def run():
  """The `tff-methods-device-check` command."""
  binary_main.run(main, __name__)


if __name__ == '__main__':
  run()
