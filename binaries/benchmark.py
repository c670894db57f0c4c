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
FedCKA paper's Table 4) to `--output_dir`. The logic lives in
`tff_methods_tooling.benchmark`.
"""

import functools
import json
import os
import sys

from absl import app
from absl import flags

from tff_methods.execution import runtime
from tff_methods.execution import workers
from tff_methods_binaries import binary_main
from tff_methods_tooling import process_setup

# Before TensorFlow is first imported (by the modules below).
process_setup.configure_process(process_setup.verbosity_from_argv(sys.argv))

import tensorflow_federated as tff

from tff_methods.algorithms import hyperparameters
from tff_methods.execution import devices as devices_lib
from tff_methods.execution import in_process
from tff_methods_binaries import benchmark_flags
from tff_methods_binaries import runtime_flags
from tff_methods_tasks import datasets
from tff_methods_tasks import models as task_models
from tff_methods_tooling import benchmark
from tff_methods_tooling import benchmark_floors
from tff_methods_tooling import benchmark_memory
from tff_methods_tooling import benchmark_processes
from tff_methods_tooling import benchmark_report
from tff_methods_tooling import benchmark_twins
from tff_methods_tooling import cross_device
from tff_methods_tooling import plain_loops
from tff_methods_tooling import pytorch_loop
from tff_methods_tooling import pytorch_models
from tff_methods_tooling import run_directory

FLAGS = flags.FLAGS


def _floor_pass(data, hparams, pytorch_python, pytorch_error) -> dict:
  """One pass of the floor comparison: FedAvg through TFF, TFF's builder,
  the plain TF loop and the PyTorch loop, on the same clients."""
  tff_timings = benchmark.time_methods(
    'fedcka_cnn',
    ['fedavg', benchmark_processes.TFF_FEDAVG],
    data,
    hparams,
    FLAGS.floor_local_epochs,
    FLAGS.batch_size,
    FLAGS.repeats,
    FLAGS.seed,
  )
  arrays = plain_loops.client_arrays(data)
  # Both loops train the same clients with the same settings.
  loop_settings = (
    FLAGS.floor_local_epochs,
    FLAGS.batch_size,
    FLAGS.client_learning_rate,
    FLAGS.client_momentum,
    FLAGS.repeats,
    FLAGS.seed,
  )
  plain = plain_loops.plain_tf_round_seconds(
    'fedcka_cnn', arrays, data.num_classes, *loop_settings
  )
  if pytorch_error is None:
    pytorch, _ = pytorch_loop.run_in(
      pytorch_python,
      arrays,
      pytorch_models.layer_plan(
        task_models.get_model('fedcka_cnn', data.num_classes, data.input_shape)
      ),
      *loop_settings,
    )
    pytorch_figures = dict(
      pytorch_seconds=float(sorted(pytorch)[len(pytorch) // 2]),
      pytorch_all=pytorch,
    )
  else:
    pytorch_figures = dict(pytorch_note=pytorch_error)
  return dict(
    model='fedcka_cnn',
    examples_per_client=FLAGS.examples_per_client,
    local_epochs=FLAGS.floor_local_epochs,
    fedavg_seconds=tff_timings['fedavg']['median'],
    fedavg_all=tff_timings['fedavg']['seconds'],
    tff_fedavg_seconds=tff_timings[benchmark_processes.TFF_FEDAVG]['median'],
    tff_fedavg_all=tff_timings[benchmark_processes.TFF_FEDAVG]['seconds'],
    plain_tf_seconds=float(sorted(plain)[len(plain) // 2]),
    plain_tf_all=plain,
    **pytorch_figures,
  )


def _with_twins(time_pass, time_twins) -> tuple[dict, dict]:
  """One pass: the methods' timings, then their twins' (if `time_twins`)."""
  timings = time_pass()
  if time_twins is None:
    return timings, {}
  print('  PyTorch twins', flush=True)
  return timings, time_twins()


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  process_setup.quiet(FLAGS.verbosity)
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
  cache_dir = os.path.join(FLAGS.output_dir, 'cache')
  hparams = hyperparameters.Hyperparameters(
    client_learning_rate=FLAGS.client_learning_rate,
    client_momentum=FLAGS.client_momentum,
    num_clients=FLAGS.num_clients,
    seed=FLAGS.seed,
  )
  method_names = ['fedavg', benchmark_processes.TFF_FEDAVG] + [
    m
    for m in FLAGS.methods
    if m not in ('fedavg', benchmark_processes.TFF_FEDAVG)
  ]
  results = dict(
    settings=dict(
      num_clients=FLAGS.num_clients,
      batch_size=FLAGS.batch_size,
      repeats=FLAGS.repeats,
      passes=FLAGS.passes,
      client_learning_rate=FLAGS.client_learning_rate,
      client_momentum=FLAGS.client_momentum,
      max_concurrent_clients=FLAGS.max_concurrent_clients,
      in_process_devices=', '.join(in_process_context.devices)
      if in_process_context
      else '',
    ),
    models={},
  )

  worker_threads = workers.threads_per_client(
    None, FLAGS.max_concurrent_clients
  )
  current_parameters = None  # The model size the worker was started for.

  def use_worker_for(model_parameters):
    """Restarts the local worker when a model needs other threads per
    client (`workers.threads_per_client`): ResNet-18 gets every core."""
    nonlocal worker_threads, current_parameters
    current_parameters = model_parameters
    threads = workers.threads_per_client(
      model_parameters, FLAGS.max_concurrent_clients
    )
    if FLAGS.tff_workers or threads == worker_threads:
      return threads
    restart_worker()
    worker_threads = threads
    return threads

  def restart_worker():
    """A new local worker with the same settings: a pass of its own."""
    if FLAGS.tff_workers:
      return
    workers.stop_workers()
    error = runtime_flags.start(current_parameters)
    if error:
      raise RuntimeError(error)

  def in_passes(run_pass):
    """`run_pass()`'s results in `--passes` independent passes, each after
    the first in a new worker."""
    outcomes = []
    for pass_num in range(FLAGS.passes):
      if pass_num:
        print(f'  pass {pass_num + 1} of {FLAGS.passes}', flush=True)
        restart_worker()
      outcomes.append(run_pass())
    return outcomes

  def in_process_passes(run_pass):
    """`run_pass()`'s results in `--passes` passes in this process; each
    pass's sessions end with it (its processes are built anew)."""
    outcomes = []
    for _ in range(FLAGS.passes):
      with tff.framework.get_context_stack().install(in_process_context):
        outcomes.append(run_pass())
      in_process_context.close()
    return outcomes

  def save():
    with open(os.path.join(FLAGS.output_dir, 'benchmark.json'), 'w') as f:
      json.dump(results, f, indent=2)
    with open(os.path.join(FLAGS.output_dir, 'benchmark.md'), 'w') as f:
      f.write(benchmark_report.report_markdown(results))

  # What the machine can do: the yardstick of every model's arithmetic.
  results['matmul_flops_per_second'] = plain_loops.matmul_flops_per_second()
  for model_name in FLAGS.models:
    examples = (
      FLAGS.resnet_examples_per_client
      if model_name.startswith('resnet')
      else FLAGS.examples_per_client
    )
    data = datasets.generated_like(
      'cifar10', FLAGS.num_clients, examples, cache_dir, seed=FLAGS.seed
    )
    names = benchmark_processes.applicable_methods(model_name, method_names)
    threads = use_worker_for(
      task_models.parameter_count(
        model_name,
        data.num_classes,
        data.input_shape,
        **benchmark_processes.model_kwargs(model_name),
      )
    )
    print(
      f'== {model_name}: {", ".join(names)} ({threads or "all"} '
      'threads per client)',
      flush=True,
    )
    benchmark_memory.reset_peak_memory()
    time_pass = functools.partial(
      benchmark.time_methods,
      model_name,
      names,
      data,
      hparams,
      FLAGS.local_epochs,
      FLAGS.batch_size,
      FLAGS.repeats,
      FLAGS.seed,
      on_round=lambda m, s: print(f'  {m}: {s:.2f} s', flush=True),
    )
    twins = (
      benchmark_twins.twin_methods(model_name, names)
      if FLAGS.twins and pytorch_error is None
      else []
    )

    time_twins = functools.partial(
      benchmark_twins.time_twins,
      pytorch_python,
      model_name,
      twins,
      data,
      hparams,
      FLAGS.local_epochs,
      FLAGS.batch_size,
      FLAGS.repeats,
      FLAGS.seed,
    )
    outcomes = in_passes(
      functools.partial(_with_twins, time_pass, time_twins if twins else None)
    )
    timings = benchmark.combine_passes([project for project, _ in outcomes])
    if in_process_context:
      print(f'== {model_name} in-process', flush=True)
      in_process_timings = benchmark.combine_passes(
        in_process_passes(time_pass)
      )
    results['models'][model_name] = dict(
      examples_per_client=examples,
      local_epochs=FLAGS.local_epochs,
      threads_per_client=threads,
      methods=timings,
      twins=(
        benchmark_twins.combine(*zip(*outcomes))
        if twins
        else dict(note=benchmark_twins.twin_note(pytorch_error))
      ),
      in_process=in_process_timings if in_process_context else None,
      peak_mb=benchmark_memory.resident_mb()['total_peak_mb'],
      training_flops_per_example=plain_loops.training_flops_per_example(
        task_models.get_model(
          model_name,
          data.num_classes,
          data.input_shape,
          **benchmark_processes.model_kwargs(model_name),
        )
      ),
    )
    for method, extra_seconds in (
      ('fedcka', benchmark_floors.fedcka_extra_seconds),
      ('moon', benchmark_floors.moon_extra_seconds),
      ('scaffold', benchmark_floors.scaffold_extra_seconds),
    ):
      if method in names:
        results['models'][model_name][f'{method}_extra'] = extra_seconds(
          model_name,
          data.num_classes,
          data.input_shape,
          examples,
          FLAGS.batch_size,
          FLAGS.local_epochs,
          repeats=FLAGS.repeats,
          # (Non-positive: no limit, every client at once.)
          concurrent_clients=(
            FLAGS.max_concurrent_clients
            if FLAGS.max_concurrent_clients > 0
            else FLAGS.num_clients
          ),
          seed=FLAGS.seed,
        )
    save()
  use_worker_for(None)  # The phases below time small models.
  # The CNN-sized data of the floor and the workers' phases (same files).
  cnn_data = lambda: datasets.generated_like(
    'cifar10',
    FLAGS.num_clients,
    FLAGS.examples_per_client,
    cache_dir,
    seed=FLAGS.seed,
  )
  if FLAGS.client_profile_methods:
    print(
      f'== client computations op by op: '
      f'{", ".join(FLAGS.client_profile_methods)}',
      flush=True,
    )
    results['client_profile'] = benchmark.profile_methods(
      'fedcka_cnn',
      FLAGS.client_profile_methods,
      cnn_data(),
      FLAGS.examples_per_client,
      hparams,
      FLAGS.local_epochs,
      FLAGS.batch_size,
      rounds=FLAGS.repeats + 1,
      seed=FLAGS.seed,
    )
    save()
  if FLAGS.floor_local_epochs:
    print('== FedAvg through TFF against a plain TF loop', flush=True)
    data = cnn_data()
    floor_passes = in_passes(
      lambda: _floor_pass(data, hparams, pytorch_python, pytorch_error)
    )
    results['floor'] = benchmark.combine_floor_passes(floor_passes)
    save()
  if FLAGS.scaling_clients:
    counts = [int(c) for c in FLAGS.scaling_clients]
    print(
      f'== FedAvg and the plain TF loop at {counts} clients per round',
      flush=True,
    )
    results['scaling'] = dict(
      model='fedcka_cnn',
      examples_per_client=FLAGS.scaling_examples_per_client,
      by_count=benchmark.scaling(
        counts,
        'fedcka_cnn',
        FLAGS.scaling_examples_per_client,
        FLAGS.batch_size,
        hparams,
        cache_dir,
        FLAGS.repeats,
        FLAGS.seed,
        in_process_context=in_process_context,
      ),
    )
    save()
  if FLAGS.cross_device_rounds:
    print(
      f'== cross-device: {FLAGS.cross_device_clients} clients, '
      f'{FLAGS.cross_device_clients_per_round} per round',
      flush=True,
    )
    results['cross_device'] = cross_device.cross_device(
      FLAGS.cross_device_methods,
      num_clients=FLAGS.cross_device_clients,
      min_examples=FLAGS.cross_device_min_examples,
      max_examples=FLAGS.cross_device_max_examples,
      clients_per_round=FLAGS.cross_device_clients_per_round,
      rounds=FLAGS.cross_device_rounds,
      model_name=FLAGS.cross_device_model,
      batch_size=FLAGS.batch_size,
      hparams=hparams,
      output_dir=os.path.join(FLAGS.output_dir, 'cross_device'),
      seed=FLAGS.seed,
      on_round=lambda m, r, s: print(f'  {m} round {r}: {s:.2f} s', flush=True),
    )
    save()
  if FLAGS.loopback_workers:
    print('== FedAvg over 1..N loopback TFF workers', flush=True)
    data = cnn_data()
    by_count = benchmark.loopback_worker_throughput(
      data,
      'fedcka_cnn',
      hparams,
      FLAGS.local_epochs,
      FLAGS.batch_size,
      range(1, FLAGS.loopback_workers + 1),
      FLAGS.repeats,
      FLAGS.max_concurrent_clients,
      FLAGS.seed,
    )
    results['workers'] = dict(
      model='fedcka_cnn',
      examples_per_client=FLAGS.examples_per_client,
      local_epochs=FLAGS.local_epochs,
      by_count=by_count,
    )
    save()
  if FLAGS.memory_rounds:
    print(f'== memory over {FLAGS.memory_rounds} rounds', flush=True)
    data = datasets.generated_like(
      'digits', FLAGS.num_clients, 50, cache_dir, seed=FLAGS.seed
    )
    memory = benchmark_memory.memory_growth(
      data, 'mlp', FLAGS.memory_rounds, hparams
    )
    results['memory'] = dict(
      memory,
      model='mlp on digits-shaped data, ' f'{FLAGS.num_clients} x 50 examples',
    )
    save()
  save()
  print(benchmark_report.report_markdown(results))
  print(f'Written to {FLAGS.output_dir}: benchmark.json, benchmark.md')
  return 0


def run():
  """The `tff-methods-benchmark` command."""
  binary_main.run(main, __name__)


if __name__ == '__main__':
  run()
