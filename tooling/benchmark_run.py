"""The benchmark's run, table by table (`run`), from its settings.

`binaries/benchmark.py` parses and checks the flags, sets up TFF's context
and hands over a `Settings`; `run` times each model's methods (each in
`--passes` independent passes: every pass after the first on a new local
worker) and then the optional tables (the op-by-op client profile, the
floor against plain TF and PyTorch loops, clients per round, the
cross-device run, loopback workers, memory), writing `benchmark.json` and
`benchmark.md` after each one, so a run cut short keeps what it timed.
"""

import dataclasses
import functools
import json
import os
from typing import Any, Callable, Optional, Sequence

import tensorflow_federated as tff

from tff_methods.algorithms import hyperparameters
from tff_methods.execution import workers
from tff_methods_tasks import datasets
from tff_methods_tasks import models as task_models
from tff_methods_tooling import benchmark
from tff_methods_tooling import benchmark_floors
from tff_methods_tooling import benchmark_in_process
from tff_methods_tooling import benchmark_memory
from tff_methods_tooling import benchmark_processes
from tff_methods_tooling import benchmark_report
from tff_methods_tooling import benchmark_tables
from tff_methods_tooling import benchmark_twins
from tff_methods_tooling import plain_loops

# (model parameters, or None) -> None, or why the local worker did not
# start: the binary's `runtime_flags.start`.
StartWorker = Callable[[Optional[int]], Optional[str]]


@dataclasses.dataclass(frozen=True)
class Settings:
  """What the benchmark times and how (the binary's flags, by name)."""

  output_dir: str
  models: Sequence[str]
  methods: Sequence[str]
  num_clients: int
  examples_per_client: int
  resnet_examples_per_client: int
  batch_size: int
  local_epochs: int
  repeats: int
  passes: int
  seed: int
  client_learning_rate: float
  client_momentum: float
  max_concurrent_clients: int
  # Remote workers given (--tff_workers): never restarted here.
  remote_workers: bool = False
  twins: bool = False
  pytorch_python: Optional[str] = None
  # Why PyTorch can't run (None: it can).
  pytorch_error: Optional[str] = None
  client_profile_methods: Sequence[str] = ()
  floor_local_epochs: int = 0
  scaling_clients: Sequence[int] = ()
  scaling_examples_per_client: int = 20
  cross_device_rounds: int = 0
  cross_device_methods: Sequence[str] = ()
  cross_device_clients: int = 0
  cross_device_clients_per_round: int = 0
  cross_device_min_examples: int = 0
  cross_device_max_examples: int = 0
  cross_device_model: str = 'mlp'
  loopback_workers: int = 0
  memory_rounds: int = 0

  def hyperparameters(self) -> hyperparameters.Hyperparameters:
    return hyperparameters.Hyperparameters(
      client_learning_rate=self.client_learning_rate,
      client_momentum=self.client_momentum,
      num_clients=self.num_clients,
      seed=self.seed,
    )

  def concurrent_clients(self) -> int:
    # (Non-positive: no limit, every client at once.)
    if self.max_concurrent_clients > 0:
      return self.max_concurrent_clients
    return self.num_clients


class _Passes:
  """Runs a timing in `passes` independent passes, on the local worker
  (a new one for each pass after the first) or in this process."""

  def __init__(self, settings, start_worker, in_process_context):
    self._settings = settings
    self._start_worker = start_worker
    self._in_process_context = in_process_context
    self._threads = workers.threads_per_client(
      None, settings.max_concurrent_clients
    )
    self._model_parameters = None  # The model the worker was started for.

  def use_worker_for(self, model_parameters: Optional[int]) -> Optional[int]:
    """Restarts the local worker when a model needs other threads per
    client (`workers.threads_per_client`): ResNet-18 gets every core.
    Returns the threads per client."""
    self._model_parameters = model_parameters
    threads = workers.threads_per_client(
      model_parameters, self._settings.max_concurrent_clients
    )
    if self._settings.remote_workers or threads == self._threads:
      return threads
    self._restart_worker()
    self._threads = threads
    return threads

  def _restart_worker(self):
    """A new local worker with the same settings: a pass of its own."""
    if self._settings.remote_workers:
      return
    workers.stop_workers()
    error = self._start_worker(self._model_parameters)
    if error:
      raise RuntimeError(error)

  def on_worker(self, run_pass: Callable[[], Any]) -> list:
    outcomes = []
    for pass_num in range(self._settings.passes):
      if pass_num:
        print(f'  pass {pass_num + 1} of {self._settings.passes}', flush=True)
        self._restart_worker()
      outcomes.append(run_pass())
    return outcomes

  def on_both(
    self, run_pass: Callable[[], Any], run_in_process: Callable[[], Any]
  ) -> tuple[list, list]:
    """Each pass on the worker, then in this process right after it: the
    two paths' figures of a pass are taken in the same minutes."""
    outcomes, in_process = [], []
    for pass_num in range(self._settings.passes):
      if pass_num:
        print(f'  pass {pass_num + 1} of {self._settings.passes}', flush=True)
        self._restart_worker()
      outcomes.append(run_pass())
      print('  in this process', flush=True)
      in_process += self.in_process(run_in_process, passes=1)
    return outcomes, in_process

  def in_process(self, run_pass: Callable[[], Any], passes=None) -> list:
    """In this process; each pass's sessions end with it (its processes
    are built anew)."""
    outcomes = []
    for _ in range(passes or self._settings.passes):
      with tff.framework.get_context_stack().install(self._in_process_context):
        outcomes.append(run_pass())
      self._in_process_context.close()
    return outcomes


def run(
  settings: Settings,
  start_worker: StartWorker,
  in_process_context: Optional[Any] = None,
) -> dict:
  """Times every table `settings` asks for; returns the results, which are
  also in `<output_dir>/benchmark.json` and `benchmark.md`.

  Args:
    settings: What to time.
    start_worker: Starts the local worker for a model of that many
      parameters (the binary's `runtime_flags.start`); the first is
      running already.
    in_process_context: With it, each model's methods are timed in this
      process too (`execution.in_process`).
  """
  hparams = settings.hyperparameters()
  cache_dir = os.path.join(settings.output_dir, 'cache')
  results = dict(
    settings=dict(
      num_clients=settings.num_clients,
      batch_size=settings.batch_size,
      repeats=settings.repeats,
      passes=settings.passes,
      client_learning_rate=settings.client_learning_rate,
      client_momentum=settings.client_momentum,
      max_concurrent_clients=settings.max_concurrent_clients,
      in_process_devices=', '.join(in_process_context.devices)
      if in_process_context
      else '',
    ),
    models={},
  )
  save = functools.partial(_save, settings.output_dir, results)
  passes = _Passes(settings, start_worker, in_process_context)
  # What the machine can do: the yardstick of every model's arithmetic.
  results['matmul_flops_per_second'] = plain_loops.matmul_flops_per_second()
  for model_name in settings.models:
    results['models'][model_name] = _time_model(
      settings, hparams, cache_dir, passes, model_name, in_process_context
    )
    save()
  passes.use_worker_for(None)  # The tables below time small models.

  def cnn_data():
    # The CNN-sized data of the floor and the workers' tables (same files).
    return datasets.generated_like(
      'cifar10',
      settings.num_clients,
      settings.examples_per_client,
      cache_dir,
      seed=settings.seed,
    )

  tables = (
    (
      'client_profile',
      settings.client_profile_methods,
      benchmark_tables.client_profile,
    ),
    ('floor', settings.floor_local_epochs, benchmark_tables.floor),
    ('scaling', settings.scaling_clients, benchmark_tables.scaling),
    (
      'cross_device',
      settings.cross_device_rounds,
      benchmark_tables.cross_device,
    ),
    ('workers', settings.loopback_workers, benchmark_tables.loopback_workers),
    ('memory', settings.memory_rounds, benchmark_tables.memory),
  )
  for key, wanted, table in tables:
    if wanted:
      results[key] = table(
        settings,
        hparams,
        cache_dir=cache_dir,
        cnn_data=cnn_data,
        passes=passes,
        in_process_context=in_process_context,
      )
      save()
  save()
  return results


def _over_worker(combined: dict, worker_passes, in_process_passes) -> dict:
  """`combined` (the in-process passes) with each method's `over_worker`:
  the median over the passes of its in-process median over its worker
  median of the same pass, and `over_worker_passes`."""
  for name, entry in combined.items():
    ratios = [
      ours[name]['median'] / worker[name]['median']
      for worker, ours in zip(worker_passes, in_process_passes)
    ]
    entry['over_worker'] = benchmark_processes.median(ratios)
    entry['over_worker_passes'] = ratios
  return combined


def _save(output_dir, results):
  with open(os.path.join(output_dir, 'benchmark.json'), 'w') as f:
    json.dump(results, f, indent=2)
  with open(os.path.join(output_dir, 'benchmark.md'), 'w') as f:
    f.write(benchmark_report.report_markdown(results))


def _time_model(
  settings, hparams, cache_dir, passes, model_name, in_process_context
) -> dict:
  """A model's methods against FedAvg (and their PyTorch twins), on the
  worker and, with a context, in this process."""
  examples = (
    settings.resnet_examples_per_client
    if model_name.startswith('resnet')
    else settings.examples_per_client
  )
  data = datasets.generated_like(
    'cifar10', settings.num_clients, examples, cache_dir, seed=settings.seed
  )
  method_names = ['fedavg', benchmark_processes.TFF_FEDAVG] + [
    m
    for m in settings.methods
    if m not in ('fedavg', benchmark_processes.TFF_FEDAVG)
  ]
  names = benchmark_processes.applicable_methods(model_name, method_names)
  model_kwargs = benchmark_processes.model_kwargs(model_name)
  threads = passes.use_worker_for(
    task_models.parameter_count(
      model_name, data.num_classes, data.input_shape, **model_kwargs
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
    settings.local_epochs,
    settings.batch_size,
    settings.repeats,
    settings.seed,
    on_round=lambda m, s: print(f'  {m}: {s:.2f} s', flush=True),
  )
  twins = (
    benchmark_twins.twin_methods(model_name, names)
    if settings.twins and settings.pytorch_error is None
    else []
  )
  time_twins = functools.partial(
    benchmark_twins.time_twins,
    settings.pytorch_python,
    model_name,
    twins,
    data,
    hparams,
    settings.local_epochs,
    settings.batch_size,
    settings.repeats,
    settings.seed,
  )
  with_twins = functools.partial(
    _with_twins, time_pass, time_twins if twins else None
  )
  in_process_timings = None
  if in_process_context:
    outcomes, in_process_passes = passes.on_both(with_twins, time_pass)
    in_process_timings = _over_worker(
      benchmark.combine_passes(in_process_passes),
      [project for project, _ in outcomes],
      in_process_passes,
    )
    # Where in-process FedAvg's time goes, by part: a traced round after
    # the passes (the report puts a miss of its target against it).
    (in_process_timings['fedavg']['op_time_shares'],) = passes.in_process(
      functools.partial(
        benchmark_in_process.fedavg_op_time_shares,
        in_process_context,
        model_name,
        data,
        hparams,
        settings.local_epochs,
        settings.batch_size,
        settings.seed,
      ),
      passes=1,
    )
  else:
    outcomes = passes.on_worker(with_twins)
  timed = dict(
    examples_per_client=examples,
    local_epochs=settings.local_epochs,
    threads_per_client=threads,
    methods=benchmark.combine_passes([project for project, _ in outcomes]),
    twins=(
      benchmark_twins.combine(*zip(*outcomes))
      if twins
      else dict(note=benchmark_twins.twin_note(settings.pytorch_error))
    ),
    in_process=in_process_timings,
    peak_mb=benchmark_memory.resident_mb()['total_peak_mb'],
    training_flops_per_example=plain_loops.training_flops_per_example(
      task_models.get_model(
        model_name, data.num_classes, data.input_shape, **model_kwargs
      )
    ),
  )
  # The floors of the methods that compute more than FedAvg.
  for method, extra_seconds in benchmark_floors.EXTRA_SECONDS.items():
    if method in names:
      timed[f'{method}_extra'] = extra_seconds(
        model_name,
        data.num_classes,
        data.input_shape,
        examples,
        settings.batch_size,
        settings.local_epochs,
        repeats=settings.repeats,
        concurrent_clients=settings.concurrent_clients(),
        seed=settings.seed,
      )
  return timed


def _with_twins(time_pass, time_twins) -> tuple[dict, dict]:
  """One pass: the methods' timings, then their twins' (if `time_twins`)."""
  timings = time_pass()
  if time_twins is None:
    return timings, {}
  print('  PyTorch twins', flush=True)
  return timings, time_twins()
