"""Flags for where TFF runs computations: shared by every binary that trains.

- no flag: one local TFF worker, started and ended by the binary;
- `--tff_worker_binary=PATH`: that local worker is PATH (e.g. a CUDA build);
- `--tff_workers=host:port,...`: workers already running (started with
  `tff-methods-worker --port=PORT`), each round's clients split
  between them (`tff_methods.execution.runtime.set_remote_execution_context`);
- `--execution=in_process --devices=gpu:0,gpu:1`: the rounds' TensorFlow in
  this process, the clients spread over the devices
  (`tff_methods.execution.in_process`); what doesn't compile for it goes to a
  local worker.
- `--execution=auto` (the default): in this process on every GPU when there
  is one, or, on a CPU, split into `--max_concurrent_clients` logical
  devices when `IN_PROCESS_FASTER_ON_CPU` (the benchmark's figures,
  docs/performance.md); the worker with `--tff_workers`,
  `--tff_worker_binary` or `--jobs` > 1. The choice is printed in one line.
"""

import re
from typing import Optional

from absl import flags
import tensorflow as tf

from tff_methods.execution import bind_address
from tff_methods.execution import devices as devices_lib
from tff_methods.execution import in_process
from tff_methods.execution import runtime
from tff_methods.execution import workers
from tff_methods_tooling import commands

EXECUTIONS = ('auto', 'worker', 'in_process')

# What the benchmark measured on CPU-only machines (docs/performance.md,
# "The worker and in-process"): the in-process path, on the CPU split into
# a logical device per concurrent client, against TFF's worker at 100
# clients of 20 examples, 10 of 500, and ResNet-18. True: it was faster at
# every size, so `--execution=auto` takes it on a CPU too.
IN_PROCESS_FASTER_ON_CPU = True

flags.DEFINE_list(
  'tff_workers',
  [],
  'host:port of running TFF workers '
  f"({commands.command('worker')}) to split every round's "
  'clients across; '
  'empty: one local worker.',
)
flags.DEFINE_string(
  'tff_worker_binary',
  None,
  'The local TFF worker executable instead of the one in '
  'the tensorflow-federated package (e.g. built with CUDA).',
)
flags.DEFINE_integer(
  'max_concurrent_clients',
  2,
  'Client computations the local worker runs at once '
  '(<= 0: no limit); with a limit, models under a million '
  'parameters get the cores split between them.',
)
flags.DEFINE_enum(
  'execution',
  'auto',
  EXECUTIONS,
  "Where a round's TensorFlow runs: TFF's C++ worker (CPU only); "
  'in_process: in this process on --devices (GPUs too); auto: in this '
  'process on every GPU, or on the CPU where the benchmark found it faster '
  '(split into --max_concurrent_clients devices), else the worker; the '
  'worker with --tff_workers, --tff_worker_binary or --jobs > 1.',
)
flags.DEFINE_list(
  'devices',
  [],
  'In this process (--execution=in_process or auto): the devices clients '
  'run on, e.g. gpu:0,gpu:1; more cpu:N than one splits the CPU into '
  'logical devices. Empty: every GPU, else the CPU (auto: split).',
)
flags.DEFINE_bool(
  'deterministic',
  False,
  'In this process (--execution=in_process or auto): TF32 off and op '
  'determinism on, for results that repeat on a GPU (slower).',
)
FLAGS = flags.FLAGS

BINARY_WITH_REMOTE_WORKERS = (
  '--tff_worker_binary starts a local worker, but --tff_workers connects '
  f"to running ones: start each of those with {commands.command('worker')} "
  '--tff_worker_binary=PATH instead'
)


def parse_worker_addresses(text: str) -> list[str]:
  """`'host:port,host:port'` -> the list of addresses; names a bad one.

  Raises:
    ValueError: An address that is not `host:port` with a port in 1..65535,
      or the same address twice.
  """
  addresses = [a.strip() for a in text.split(',')]
  if not any(addresses):
    raise ValueError(
      f'--tff_workers={text!r} names no worker; give '
      'host:port[,host:port...]'
    )
  if '' in addresses:
    raise ValueError(
      f'--tff_workers={text!r} has an empty entry (a trailing or doubled '
      'comma); give host:port[,host:port...]'
    )
  for address in addresses:
    host, _, port = address.rpartition(':')
    if host.startswith('[') and host.endswith(']'):  # [IPv6]:port
      host = host[1:-1]
    if (
      not host
      or not port.isdigit()
      or not 1 <= int(port) <= 65535
      or not re.fullmatch(r'[A-Za-z0-9._-]+|[0-9A-Fa-f:]*:[0-9A-Fa-f:.]*', host)
      or host.endswith(':')
    ):
      raise ValueError(
        f'--tff_workers: {address!r} is not host:port with a port in '
        '1..65535 (e.g. 127.0.0.1:8000)'
      )
  duplicates = sorted({a for a in addresses if addresses.count(a) > 1})
  if duplicates:
    raise ValueError(f'--tff_workers names {duplicates} more than once')
  return addresses


def define_jobs_flag() -> None:
  """`--jobs`, for the binaries that run many experiments."""
  flags.DEFINE_integer(
    'jobs',
    1,
    'Runs at once, each in a process with its own local TFF '
    'worker (2 suits 2 cores: small models leave them idle between TFF '
    'calls). Not with --tff_workers.',
  )


def choose_execution() -> tuple[str, Optional[list[str]], str]:
  """Where this run's rounds run: ('worker' or 'in_process', the devices
  (None: the default ones), why), from --execution or auto's rule (the
  same flags give the same choice)."""
  devices = FLAGS.devices or None
  if FLAGS.execution != 'auto':
    return FLAGS.execution, devices, f'--execution={FLAGS.execution}'
  jobs = FLAGS['jobs'].value if 'jobs' in FLAGS else 1
  for given, why in (
    (FLAGS.tff_workers, '--tff_workers names running workers'),
    (FLAGS.tff_worker_binary, '--tff_worker_binary names a worker'),
    (jobs > 1, f'--jobs={jobs} runs a worker a job'),
  ):
    if given:
      return 'worker', None, f'auto: {why}'
  if devices or FLAGS.deterministic:
    return 'in_process', devices, 'auto: --devices or --deterministic given'
  gpus = tf.config.list_physical_devices('GPU')
  if gpus:
    return 'in_process', None, f'auto: {len(gpus)} GPU(s) visible'
  if not IN_PROCESS_FASTER_ON_CPU:
    return 'worker', None, 'auto: no GPU, and the worker is faster on a CPU'
  split = FLAGS.max_concurrent_clients
  split = split if split > 0 else workers.usable_cores()
  return (
    'in_process',
    [f'cpu:{k}' for k in range(split)],
    f'auto: no GPU; on the CPU split into {split} (--max_concurrent_clients) '
    'this path ran faster than the worker in the benchmark '
    '(docs/performance.md)',
  )


def check() -> list[str]:
  """The runtime flags' errors (before any work starts)."""
  errors = []
  execution, _, why = choose_execution()
  if execution == 'in_process':
    if FLAGS.tff_workers:
      errors.append(
        '--execution=in_process runs rounds in this process; --tff_workers '
        'runs them on workers: give one of them'
      )
    if FLAGS.devices:
      try:
        devices_lib.parse_devices(FLAGS.devices)
      except devices_lib.DeviceError as e:
        errors.append(f'--{e}')
  else:
    for name in ('devices', 'deterministic'):
      if FLAGS[name].value:
        errors.append(
          f'--{name} is for rounds in this process; this run uses the '
          f'worker ({why}), which runs on its CPU'
        )
  if FLAGS.tff_workers:
    try:
      parse_worker_addresses(','.join(FLAGS.tff_workers))
    except ValueError as e:
      errors.append(str(e))
    if FLAGS.tff_worker_binary:
      errors.append(BINARY_WITH_REMOTE_WORKERS)
  elif FLAGS.tff_worker_binary:
    try:
      workers.check_worker_binary(FLAGS.tff_worker_binary)
    except ValueError as e:
      errors.append(f'--tff_worker_binary: {e}')
  return errors


def prepare_devices() -> Optional[str]:
  """In this process, makes the devices exist (a CPU split into logical
  devices has to happen before TensorFlow runs an op: call this first in
  `main`); None, or the flag's error."""
  execution, devices, _ = choose_execution()
  if execution != 'in_process':
    return None
  try:
    devices_lib.configure_devices(devices)
  except devices_lib.DeviceError as e:
    return f'--{e}'
  return None


def _say_where(devices: Optional[list[str]] = None) -> None:
  execution, _, why = choose_execution()
  where = f' on {", ".join(devices)}' if devices else ''
  print(f'Execution: {execution}{where} ({why}).', flush=True)


def start_for_runs() -> Optional[str]:
  """`start`, or with `--jobs` > 1 only the checks (each job starts its own
  worker)."""
  if FLAGS.jobs < 1:
    return f'--jobs={FLAGS.jobs} must be >= 1.'
  if FLAGS.jobs == 1:
    return start()
  if FLAGS.execution == 'in_process':
    return (
      '--execution=in_process runs in one process: not with '
      f'--jobs={FLAGS.jobs} (its devices already run the clients at once).'
    )
  runtime.discard_default_context()  # The jobs run TFF; this process won't.
  errors = check()
  if FLAGS.tff_workers or FLAGS.tff_worker_binary:
    errors.append(
      f'--jobs={FLAGS.jobs} runs local packaged workers: not '
      'with --tff_workers or --tff_worker_binary.'
    )
  if errors:
    return 'Bad flags:\n  ' + '\n  '.join(errors)
  _say_where()
  return None


def start(model_parameters: Optional[int] = None) -> Optional[str]:
  """Checks the flags and sets TFF's context from them (`choose_execution`),
  saying where in one line.

  Args:
    model_parameters: The size of the model to train, which sets the local
      worker's threads per client (`runtime.threads_per_client`).

  Returns:
    None, or the message of a bad flag or an unreachable worker (nothing has
    run yet).
  """
  errors = check()
  if errors:
    return 'Bad flags:\n  ' + '\n  '.join(errors)
  error = prepare_devices()
  if error:
    return error
  execution, devices, _ = choose_execution()
  try:
    if execution == 'in_process':
      context = in_process.set_in_process_execution_context(
        devices,
        deterministic=FLAGS.deterministic,
        fallback_fn=lambda: runtime.create_local_execution_context(
          FLAGS.max_concurrent_clients,
          FLAGS.tff_worker_binary,
          model_parameters=model_parameters,
        ),
      )
      _say_where(context.devices)
      return None
    if FLAGS.tff_workers:
      runtime.set_remote_execution_context(FLAGS.tff_workers)
    else:
      runtime.set_local_execution_context(
        FLAGS.max_concurrent_clients,
        FLAGS.tff_worker_binary,
        model_parameters=model_parameters,
      )
  except workers.WorkerUnreachableError as e:
    return f'--tff_workers: {with_worker_command(e)}'
  except devices_lib.DeviceError as e:
    return f'--{e}'
  except RuntimeError as e:
    return str(e)
  _say_where()
  return None


def with_worker_command(error: workers.WorkerUnreachableError) -> str:
  """`error`'s message, with the command that starts the worker it names:
  on another host it must listen beyond loopback (`--host`)."""
  host, _, port = error.address.rpartition(':')
  command = f"{commands.command('worker')} --port={port}"
  if host.strip('[]') not in ('127.0.0.1', 'localhost', '::1'):
    try:
      bind_address.check_host(host)
      command += f' --host={host.strip("[]")}'
    except ValueError:  # A host name: its address there, or every one.
      command += ' --host=0.0.0.0'
  return f'{error} (On {host}: {command})'
