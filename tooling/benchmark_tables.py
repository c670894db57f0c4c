"""The benchmark's tables after the models' (`benchmark_run.run` calls each
that its settings ask for): the op-by-op client profile, FedAvg against
plain TF and PyTorch loops (the floor), clients per round, the
cross-device run, loopback workers, and memory over rounds. Each takes the
run's settings and hyperparameters, and by keyword what it needs of the
run: `cache_dir`, `cnn_data` (the CNN-sized data), `passes`, the
`in_process_context`.
"""

import os

from tff_methods_tasks import datasets
from tff_methods_tasks import models as task_models
from tff_methods_tooling import benchmark
from tff_methods_tooling import benchmark_memory
from tff_methods_tooling import benchmark_processes
from tff_methods_tooling import cross_device as cross_device_lib
from tff_methods_tooling import plain_loops
from tff_methods_tooling import pytorch_loop
from tff_methods_tooling import pytorch_models


def client_profile(settings, hparams, *, cnn_data, **unused) -> dict:
  del unused
  print(
    f'== client computations op by op: '
    f'{", ".join(settings.client_profile_methods)}',
    flush=True,
  )
  return benchmark.profile_methods(
    'fedcka_cnn',
    settings.client_profile_methods,
    cnn_data(),
    settings.examples_per_client,
    hparams,
    settings.local_epochs,
    settings.batch_size,
    rounds=settings.repeats + 1,
    seed=settings.seed,
  )


def floor(settings, hparams, *, cnn_data, passes, **unused) -> dict:
  del unused
  print('== FedAvg through TFF against a plain TF loop', flush=True)
  data = cnn_data()
  return benchmark.combine_floor_passes(
    passes.on_worker(lambda: _floor_pass(settings, data, hparams))
  )


def _floor_pass(settings, data, hparams) -> dict:
  """One pass of the floor comparison: FedAvg through TFF, TFF's builder,
  the plain TF loop and the PyTorch loop, on the same clients."""
  tff_timings = benchmark.time_methods(
    'fedcka_cnn',
    ['fedavg', benchmark_processes.TFF_FEDAVG],
    data,
    hparams,
    settings.floor_local_epochs,
    settings.batch_size,
    settings.repeats,
    settings.seed,
  )
  arrays = plain_loops.client_arrays(data)
  # Both loops train the same clients with the same settings.
  loop_settings = (
    settings.floor_local_epochs,
    settings.batch_size,
    settings.client_learning_rate,
    settings.client_momentum,
    settings.repeats,
    settings.seed,
  )
  plain = plain_loops.plain_tf_round_seconds(
    'fedcka_cnn', arrays, data.num_classes, *loop_settings
  )
  if settings.pytorch_error is None:
    pytorch, _ = pytorch_loop.run_in(
      settings.pytorch_python,
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
    pytorch_figures = dict(pytorch_note=settings.pytorch_error)
  fedavg = tff_timings['fedavg']
  tff_fedavg = tff_timings[benchmark_processes.TFF_FEDAVG]
  return dict(
    model='fedcka_cnn',
    examples_per_client=settings.examples_per_client,
    local_epochs=settings.floor_local_epochs,
    fedavg_seconds=fedavg['median'],
    fedavg_all=fedavg['seconds'],
    tff_fedavg_seconds=tff_fedavg['median'],
    tff_fedavg_all=tff_fedavg['seconds'],
    plain_tf_seconds=float(sorted(plain)[len(plain) // 2]),
    plain_tf_all=plain,
    **pytorch_figures,
  )


def scaling(
  settings, hparams, *, cache_dir, in_process_context, **unused
) -> dict:
  del unused
  counts = [int(c) for c in settings.scaling_clients]
  print(
    f'== FedAvg and the plain TF loop at {counts} clients per round',
    flush=True,
  )
  return dict(
    model='fedcka_cnn',
    examples_per_client=settings.scaling_examples_per_client,
    by_count=benchmark.scaling(
      counts,
      'fedcka_cnn',
      settings.scaling_examples_per_client,
      settings.batch_size,
      hparams,
      cache_dir,
      settings.repeats,
      settings.seed,
      in_process_context=in_process_context,
    ),
  )


def cross_device(settings, hparams, **unused) -> dict:
  del unused
  print(
    f'== cross-device: {settings.cross_device_clients} clients, '
    f'{settings.cross_device_clients_per_round} per round',
    flush=True,
  )
  return cross_device_lib.cross_device(
    settings.cross_device_methods,
    num_clients=settings.cross_device_clients,
    min_examples=settings.cross_device_min_examples,
    max_examples=settings.cross_device_max_examples,
    clients_per_round=settings.cross_device_clients_per_round,
    rounds=settings.cross_device_rounds,
    model_name=settings.cross_device_model,
    batch_size=settings.batch_size,
    hparams=hparams,
    output_dir=os.path.join(settings.output_dir, 'cross_device'),
    seed=settings.seed,
    on_round=lambda m, r, s: print(f'  {m} round {r}: {s:.2f} s', flush=True),
  )


def loopback_workers(settings, hparams, *, cnn_data, **unused) -> dict:
  del unused
  print('== FedAvg over 1..N loopback TFF workers', flush=True)
  return dict(
    model='fedcka_cnn',
    examples_per_client=settings.examples_per_client,
    local_epochs=settings.local_epochs,
    by_count=benchmark.loopback_worker_throughput(
      cnn_data(),
      'fedcka_cnn',
      hparams,
      settings.local_epochs,
      settings.batch_size,
      range(1, settings.loopback_workers + 1),
      settings.repeats,
      settings.max_concurrent_clients,
      settings.seed,
    ),
  )


def memory(settings, hparams, *, cache_dir, **unused) -> dict:
  del unused
  print(f'== memory over {settings.memory_rounds} rounds', flush=True)
  data = datasets.generated_like(
    'digits', settings.num_clients, 50, cache_dir, seed=settings.seed
  )
  memory = benchmark_memory.memory_growth(
    data, 'mlp', settings.memory_rounds, hparams
  )
  return dict(
    memory,
    model='mlp on digits-shaped data, ' f'{settings.num_clients} x 50 examples',
  )
