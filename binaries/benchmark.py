r"""Speed and memory of every method against FedAvg and a plain TF loop.

  tff-methods-benchmark --output_dir=runs/benchmark

On CIFAR-shaped data generated with a fixed seed, 10 clients all taking
part: seconds per round of every method and its ratio to FedAvg (the project's,
and TFF's own builder's; measured interleaved in the same run) for the FedCKA
CNN and ResNet-18 (`--models` adds resnet50), clients per second and peak
memory; FedAvg through TFF against the same local training as a plain TF loop
and, when PyTorch imports, a plain PyTorch loop (the reference code's way) at 5
local epochs, with TFF's cost per client; the same comparison at 10, 100 and
1,000 small clients per round (`--scaling_clients`); a cross-device run
(EMNIST-shaped data, 3,400 clients of 100 to 300 examples, 100 sampled per
round: seconds per round, clients per second, memory growth, and for SCAFFOLD
and MOON the client-state store's size and read time); resident memory over 200
rounds of a small model; and, for `--client_profile_methods`, each method's
client computation op by op (`tff_methods_tooling.client_profile`). Writes
`benchmark.json` and `benchmark.md` (each figure beside its target and the
FedCKA paper's Table 4) to `--output_dir`. The run lives in
`tff_methods_tooling.benchmark_run`, the timings in
`tff_methods_tooling.benchmark`.
"""

import dataclasses
import sys

from absl import app
from absl import flags

from tff_methods.execution import runtime
from tff_methods_binaries import binary_main
from tff_methods_tooling import process_setup

# Before TensorFlow is first imported (by the modules below).
process_setup.configure_process(process_setup.verbosity_from_argv(sys.argv))


from tff_methods.execution import devices as devices_lib
from tff_methods.execution import in_process
from tff_methods_binaries import benchmark_flags
from tff_methods_binaries import runtime_flags
from tff_methods_tooling import benchmark_report
from tff_methods_tooling import benchmark_run
from tff_methods_tooling import pytorch_loop
from tff_methods_tooling import run_directory

FLAGS = flags.FLAGS


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  process_setup.quiet(FLAGS.verbosity)
  if FLAGS.execution == 'auto':
    # The benchmark times the worker, and the in-process path beside it.
    FLAGS.execution = 'worker'
  errors = benchmark_flags.check()
  in_process_context = None
  if FLAGS.in_process:
    try:  # Before TensorFlow runs an op (a CPU split).
      in_process_context = in_process.InProcessExecutionContext(
        FLAGS.in_process_devices or None,
        fallback_fn=runtime.create_local_execution_context,
      )
    except devices_lib.DeviceError as e:
      errors.append(f'--in_process_{e}')
  pytorch_python = FLAGS.pytorch_python or pytorch_loop.default_python()
  pytorch_error = None
  if (FLAGS.floor_local_epochs or FLAGS.twins) and not errors:
    pytorch_error = pytorch_loop.torch_import_error(pytorch_python)
    if pytorch_error and FLAGS.pytorch_python:
      errors.append(
        f'--pytorch_python={FLAGS.pytorch_python}: ' f'{pytorch_error}'
      )
  if not errors:  # Only a run with good flags creates its directory.
    try:
      run_directory.make_output_dir(FLAGS.output_dir)
    except ValueError as e:
      errors.append(str(e))
  if errors:
    runtime.discard_default_context()
    print('Bad flags:\n  ' + '\n  '.join(errors), file=sys.stderr)
    return 2
  error = runtime_flags.start()
  if error:
    runtime.discard_default_context()
    print(error, file=sys.stderr)
    return 2
  # The settings are the flags of the same names, and what was found here.
  found = dict(
    remote_workers=bool(FLAGS.tff_workers),
    pytorch_python=pytorch_python,
    pytorch_error=pytorch_error,
  )
  settings = benchmark_run.Settings(
    **{
      field.name: FLAGS[field.name].value
      for field in dataclasses.fields(benchmark_run.Settings)
      if field.name not in found
    },
    **found,
  )
  results = benchmark_run.run(
    settings, runtime_flags.start, in_process_context=in_process_context
  )
  print(benchmark_report.report_markdown(results))
  print(f'Written to {FLAGS.output_dir}: benchmark.json, benchmark.md')
  return 0


def run():
  """The `tff-methods-benchmark` command."""
  binary_main.run(main, __name__)


if __name__ == '__main__':
  run()
