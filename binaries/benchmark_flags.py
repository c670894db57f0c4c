"""The benchmark binary's own flags (`binaries.benchmark`) and their checks:
what it times, at which sizes, and where; `runtime_flags` has the flags
every training binary shares."""

from absl import flags

from tff_methods_tasks import models as task_models
from tff_methods_tooling import benchmark_processes

flags.DEFINE_list(
  'models',
  ['fedcka_cnn', 'resnet18'],
  'Models to time every method on (resnet50 too, slowly).',
)
flags.DEFINE_list(
  'methods',
  list(benchmark_processes.BENCHMARK_METHODS),
  'Methods to time (fedavg and tff_fedavg are always ' 'included).',
)
flags.DEFINE_integer('num_clients', 10, 'Clients, all taking part.')
flags.DEFINE_integer(
  'examples_per_client', 500, 'Examples per client for the CNN and the floor.'
)
flags.DEFINE_integer(
  'resnet_examples_per_client',
  50,
  'Examples per client for ResNets (CPU time).',
)
flags.DEFINE_integer('local_epochs', 5, 'Local epochs when timing methods.')
flags.DEFINE_integer(
  'floor_local_epochs',
  5,
  'Local epochs of the TFF-vs-plain-TF comparison ' '(0 skips it).',
)
flags.DEFINE_integer('batch_size', 64, 'Local batch size.')
flags.DEFINE_float('client_learning_rate', 0.01, 'Client SGD learning rate.')
flags.DEFINE_float('client_momentum', 0.9, 'Client SGD momentum.')
flags.DEFINE_integer('repeats', 3, 'Timed rounds per method (median).')
flags.DEFINE_integer(
  'passes',
  1,
  'Independent passes of the interleaved rounds, and of the floor '
  'comparison, each in a new local worker; ratios are judged on the '
  'median of the passes.',
)
flags.DEFINE_integer(
  'memory_rounds', 200, 'FedAvg rounds of the memory-growth run (0 skips it).'
)
flags.DEFINE_integer(
  'loopback_workers',
  2,
  'Time FedAvg over 1..N TFF workers on 127.0.0.1 ' '(0 skips it).',
)
flags.DEFINE_list(
  'scaling_clients',
  ['10', '100', '1000'],
  'Cohort sizes of the clients-per-round table (FedAvg and '
  'the plain TF loop, one local epoch; empty skips it).',
)
flags.DEFINE_integer(
  'scaling_examples_per_client',
  20,
  'Examples per client in the clients-per-round table '
  '(one batch of --batch_size or less).',
)
flags.DEFINE_integer(
  'cross_device_rounds', 100, 'Rounds of the cross-device run (0 skips it).'
)
flags.DEFINE_list(
  'cross_device_methods',
  ['fedavg', 'scaffold', 'moon'],
  'Methods of the cross-device run.',
)
flags.DEFINE_integer(
  'cross_device_clients',
  3400,
  'Clients of the cross-device run (EMNIST has 3,400 ' 'writers).',
)
flags.DEFINE_integer(
  'cross_device_clients_per_round',
  100,
  'Clients sampled per round in the cross-device run.',
)
flags.DEFINE_integer(
  'cross_device_min_examples', 100, 'Fewest examples of a cross-device client.'
)
flags.DEFINE_integer(
  'cross_device_max_examples', 300, 'Most examples of a cross-device client.'
)
flags.DEFINE_string(
  'cross_device_model',
  'fedcka_cnn',
  'Model of the cross-device run (MOON needs one with a '
  'projection head `z`: fedcka_cnn or a ResNet).',
)
flags.DEFINE_list(
  'client_profile_methods',
  [],
  'Methods whose client computation to time op by op, on the CNN '
  'at --num_clients x --examples_per_client, in this process with '
  "the TFF worker's session options (empty skips it).",
)
flags.DEFINE_string(
  'pytorch_python',
  None,
  'Python interpreter that times the PyTorch loops: the floor '
  "comparison's and each method's twin (a virtual environment with "
  "torch, e.g. `make pytorch-setup`'s .venv/torch/bin/python; default: "
  'that one if it exists, else this one). Without torch the PyTorch '
  'figures are reported as not measured.',
)
flags.DEFINE_bool(
  'twins',
  True,
  "Time each method's PyTorch twin (its reference code's loop, "
  'tff_methods_tooling.pytorch_methods) on the CNN beside it, in every '
  'pass.',
)
flags.DEFINE_bool(
  'in_process',
  True,
  'Also time every method in this process '
  '(tff_methods.execution.in_process, on --in_process_devices) beside the '
  "worker: the models' tables and the clients-per-round table, in as many "
  'passes.',
)
flags.DEFINE_list(
  'in_process_devices',
  [],
  'Devices of the in-process timings (cpu:N, gpu:N); empty: every GPU, '
  'else the CPU.',
)
flags.DEFINE_integer('seed', 0, 'Fixes the generated data and weights.')
flags.DEFINE_string('output_dir', 'runs/benchmark', 'Where results go.')


FLAGS = flags.FLAGS


def check() -> list[str]:
  """The benchmark's own flags' errors (before any work starts)."""
  errors = []
  for name in FLAGS.models:
    if name not in task_models.MODEL_NAMES:
      errors.append(
        f'--models: {name!r} is not one of '
        f'{", ".join(task_models.MODEL_NAMES)}'
      )
  for name in FLAGS.methods:
    if name not in benchmark_processes.BENCHMARK_METHODS:
      errors.append(
        f'--methods: {name!r} is not one of '
        f'{", ".join(benchmark_processes.BENCHMARK_METHODS)}'
      )
  for name in (
    'num_clients',
    'examples_per_client',
    'resnet_examples_per_client',
    'local_epochs',
    'batch_size',
    'repeats',
    'passes',
  ):
    if FLAGS[name].value < 1:
      errors.append(f'--{name}={FLAGS[name].value} must be >= 1')
  for name in FLAGS.client_profile_methods:
    if name not in benchmark_processes.BENCHMARK_METHODS:
      errors.append(
        f'--client_profile_methods: {name!r} is not one of '
        f'{", ".join(benchmark_processes.BENCHMARK_METHODS)}'
      )
  for name in FLAGS.cross_device_methods:
    if name not in benchmark_processes.BENCHMARK_METHODS:
      errors.append(
        f'--cross_device_methods: {name!r} is not one of '
        f'{", ".join(benchmark_processes.BENCHMARK_METHODS)}'
      )
  if FLAGS.cross_device_model not in task_models.MODEL_NAMES:
    errors.append(
      f'--cross_device_model={FLAGS.cross_device_model!r} is not '
      f'one of {", ".join(task_models.MODEL_NAMES)}'
    )
  needs_z = benchmark_processes.needing_projection(
    FLAGS.cross_device_methods, FLAGS.cross_device_model
  )
  if needs_z:
    errors.append(
      f'--cross_device_model={FLAGS.cross_device_model!r} has no '
      f'projection head, which {", ".join(needs_z)} need: use '
      f'one of {", ".join(benchmark_processes.PROJECTION_MODELS)}'
    )
  for value in FLAGS.scaling_clients:
    if not value.isdigit() or int(value) < 1:
      errors.append(
        f'--scaling_clients: {value!r} is not a whole number ' '>= 1'
      )
  for name in (
    'scaling_examples_per_client',
    'cross_device_clients',
    'cross_device_clients_per_round',
    'cross_device_min_examples',
  ):
    if FLAGS[name].value < 1:
      errors.append(f'--{name}={FLAGS[name].value} must be >= 1')
  if FLAGS.cross_device_max_examples < FLAGS.cross_device_min_examples:
    errors.append(
      f'--cross_device_max_examples='
      f'{FLAGS.cross_device_max_examples} must be >= '
      f'--cross_device_min_examples='
      f'{FLAGS.cross_device_min_examples}'
    )
  if FLAGS.cross_device_clients_per_round > FLAGS.cross_device_clients:
    errors.append(
      f'--cross_device_clients_per_round='
      f'{FLAGS.cross_device_clients_per_round} must be <= '
      f'--cross_device_clients={FLAGS.cross_device_clients}'
    )
  for name in (
    'floor_local_epochs',
    'memory_rounds',
    'loopback_workers',
    'cross_device_rounds',
  ):
    if FLAGS[name].value < 0:
      errors.append(f'--{name}={FLAGS[name].value} must be >= 0')
  if 0 < FLAGS.memory_rounds < 21:
    errors.append(
      f'--memory_rounds={FLAGS.memory_rounds} must be 0 or > 20 '
      '(growth is measured from round 20)'
    )
  if FLAGS.execution == 'in_process':
    errors.append(
      f'--execution={FLAGS.execution}: the benchmark times the worker, and '
      'the in-process path beside it (--in_process, on --in_process_devices)'
    )
  if FLAGS.client_learning_rate <= 0:
    errors.append(
      f'--client_learning_rate={FLAGS.client_learning_rate} ' 'must be > 0'
    )
  if not 0 <= FLAGS.client_momentum < 1:
    errors.append(
      f'--client_momentum={FLAGS.client_momentum} must be in ' '[0, 1)'
    )
  return errors
