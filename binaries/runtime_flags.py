"""Flags for where TFF runs computations: shared by every binary that trains.

- no flag: one local TFF worker, started and ended by the binary;
- `--tff_worker_binary=PATH`: that local worker is PATH (e.g. a CUDA build);
- `--tff_workers=host:port,...`: workers already running (started with
  `python -m binaries.worker --port=PORT`), each round's clients split
  between them (`tff_methods.runtime.set_remote_execution_context`).
"""

from typing import Optional

from absl import flags

from tff_methods import runtime

flags.DEFINE_list('tff_workers', [],
                  'host:port of running TFF workers (python -m '
                  'binaries.worker) to split every round\'s clients across; '
                  'empty: one local worker.')
flags.DEFINE_string('tff_worker_binary', None,
                    'The local TFF worker executable instead of the one in '
                    'the tensorflow-federated package (e.g. built with CUDA).')
flags.DEFINE_integer('max_concurrent_clients', 2,
                     'Client computations the local worker runs at once '
                     '(<= 0: no limit); with a limit, models under a million '
                     'parameters get the cores split between them.')
FLAGS = flags.FLAGS


def define_jobs_flag() -> None:
  """`--jobs`, for the binaries that run many experiments."""
  flags.DEFINE_integer(
      'jobs', 1, 'Runs at once, each in a process with its own local TFF '
      'worker (2 suits 2 cores: small models leave them idle between TFF '
      'calls). Not with --tff_workers.')


def check() -> list[str]:
  """The runtime flags' errors (before any work starts)."""
  errors = []
  if FLAGS.tff_workers:
    try:
      runtime.parse_worker_addresses(','.join(FLAGS.tff_workers))
    except ValueError as e:
      errors.append(str(e))
    if FLAGS.tff_worker_binary:
      errors.append(runtime.BINARY_WITH_REMOTE_WORKERS)
  elif FLAGS.tff_worker_binary:
    try:
      runtime.check_worker_binary(FLAGS.tff_worker_binary)
    except ValueError as e:
      errors.append(str(e))
  return errors


def start_for_runs() -> Optional[str]:
  """`start`, or with `--jobs` > 1 only the checks (each job starts its own
  worker)."""
  if FLAGS.jobs < 1:
    return f'--jobs={FLAGS.jobs} must be >= 1.'
  if FLAGS.jobs == 1:
    return start()
  runtime.discard_default_context()  # The jobs run TFF; this process won't.
  errors = check()
  if FLAGS.tff_workers or FLAGS.tff_worker_binary:
    errors.append(f'--jobs={FLAGS.jobs} runs local packaged workers: not '
                  'with --tff_workers or --tff_worker_binary.')
  return 'Bad flags:\n  ' + '\n  '.join(errors) if errors else None


def start(model_parameters: Optional[int] = None) -> Optional[str]:
  """Checks the flags and sets TFF's context from them.

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
  try:
    runtime.set_execution_context(
        tff_workers=FLAGS.tff_workers or None,
        worker_binary=FLAGS.tff_worker_binary,
        max_concurrent_clients=FLAGS.max_concurrent_clients,
        model_parameters=model_parameters)
  except RuntimeError as e:
    return str(e)
  return None
