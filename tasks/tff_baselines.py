"""TFF's own benchmark tasks (`tff.simulation.baselines`) for every method.

The tasks of Reddi et al., "Adaptive Federated Optimization", ICLR 2021
(https://openreview.net/forum?id=LkFG3lB13U5), as TFF builds them: EMNIST
character recognition, CIFAR-100 image classification (ResNet-18 with
group norm), Shakespeare next-character prediction and Stack Overflow
next-word prediction. Each is named `tff_baselines/<task>` (Reddi et al.'s
task names in google-research/federated), and each is TFF's `BaselineTask`
with four adapters for the project's methods:

- **Data**: the task's clients as TFF splits them, through TFF's training
  preprocessing (`ClientSpec`: batch size, max elements; its element
  mapping and batching). TFF's shuffle takes no seed on three of the four
  tasks, so it is replaced by a seeded one: a client's examples are put in
  a random order for each of its local epochs, a stateless function of
  (seed, client, round, epoch), before TFF's preprocessing (with TFF's
  shuffle buffer set to 1) repeats nothing and batches the stream. TFF's
  algorithms (`tff_fedavg`, ...) get the very same batches.
- **Model**: TFF's Keras model with its final softmax left out
  (`model_lib.without_softmax`) and, named by its structure, the outputs
  the methods read (`model_lib.named_outputs`): `layer_k` the blocks
  nearest the input (the convolutions and dense layers, the LSTMs, or a
  ResNet's stem and four stages), `features` the input of the classifier
  (past any dropout), and `z` the same vector: MOON's code contrasts that
  representation when a model has no projection head
  (`ModelFedCon_noheader` in QinbinLi/MOON).
- **Loss**: TFF's: sparse cross-entropy on the logits, averaged over every
  position (TFF's `from_keras_model` does not apply the text models'
  padding masks to the loss), with the model's weight regularization added
  (as TFF adds `keras_model.losses`; the ResNet has L2 on every layer).
- **Evaluation**: TFF's model's own metrics (`VariableModel.forward_pass`
  and its finalizers) on the task's centralized test data, after TFF's
  evaluation preprocessing; `accuracy` is the task's accuracy metric.

`use_synthetic_data=True` is TFF's own synthetic data for each task: a few
clients with a handful of examples, for running everything offline. The real
data downloads on first use; without a network, `load` raises
`datasets.DataUnavailableError` with a one-line message.
"""

import collections
import dataclasses
import functools
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_methods.templates import model_lib
from tff_methods_tasks import datasets
from tff_methods_tasks import tff_baseline_models

PREFIX = 'tff_baselines/'
_BASELINES = tff.simulation.baselines
# Reddi et al.'s Stack Overflow validation set: its first 10,000 examples.
_STACKOVERFLOW_EVAL_EXAMPLES = 10_000


@dataclasses.dataclass(frozen=True)
class TaskSpec:
  """How one of TFF's baseline tasks is built here.

  Attributes:
    description: What the task is, for listings and messages.
    data: The data set's name, for messages.
    build: `(train_client_spec, model_id, use_synthetic_data, cache_dir,
      seed) -> tff.simulation.baselines.BaselineTask`.
    models: TFF's model ids for the task, its default first.
    layer_outputs: Model id -> how many `layer_k` outputs it names.
    parameters: Model id -> its parameter count on the real data.
    accuracy: The name of TFF's accuracy metric for the task.
    eval_examples: Test examples evaluated (None: all).
  """

  description: str
  data: str
  build: Callable[..., Any]
  models: tuple[str, ...]
  layer_outputs: Mapping[str, int]
  parameters: Mapping[str, int]
  accuracy: str = 'sparse_categorical_accuracy'
  eval_examples: Optional[int] = None


def _emnist_character(spec, model_id, use_synthetic_data, cache_dir, seed):
  # `debug_seed` makes TFF's batch mapping ordered; it also seeds the
  # model's initializers (the runs' initial weights are set by the seed).
  return _BASELINES.emnist.create_character_recognition_task(
    spec,
    model_id=model_id,
    only_digits=False,
    cache_dir=cache_dir,
    use_synthetic_data=use_synthetic_data,
    debug_seed=seed,
  )


def _cifar100_image(spec, model_id, use_synthetic_data, cache_dir, seed):
  del seed  # TFF's CIFAR-100 task takes none.
  return _BASELINES.cifar100.create_image_classification_task(
    spec,
    model_id=model_id,
    cache_dir=cache_dir,
    use_synthetic_data=use_synthetic_data,
  )


def _shakespeare_character(spec, model_id, use_synthetic_data, cache_dir, seed):
  del model_id, seed  # One model; no seed.
  return _BASELINES.shakespeare.create_character_prediction_task(
    spec, cache_dir=cache_dir, use_synthetic_data=use_synthetic_data
  )


def _stackoverflow_word(spec, model_id, use_synthetic_data, cache_dir, seed):
  del model_id, seed  # One model; no seed.
  return _BASELINES.stackoverflow.create_word_prediction_task(
    spec, cache_dir=cache_dir, use_synthetic_data=use_synthetic_data
  )


TASKS = {
  'emnist_character': TaskSpec(
    'EMNIST-62 character recognition, by writer (3,400 clients)',
    'EMNIST',
    _emnist_character,
    ('cnn_dropout', 'cnn', '2nn'),
    {'cnn_dropout': 3, 'cnn': 3, '2nn': 2},
    {'cnn_dropout': 1_206_590, 'cnn': 1_690_046, '2nn': 209_662},
  ),
  'cifar100_image': TaskSpec(
    'CIFAR-100 image classification, 500 clients split by TFF (Pachinko '
    'allocation), 24x24 crops',
    'CIFAR-100',
    _cifar100_image,
    ('resnet18', 'resnet34', 'resnet50'),
    {'resnet18': 5, 'resnet34': 5, 'resnet50': 5},
    {'resnet18': 11_227_812, 'resnet34': 21_335_972, 'resnet50': 23_712_932},
  ),
  'shakespeare_character': TaskSpec(
    'Shakespeare next-character prediction, by speaking role (715 ' 'clients)',
    'Shakespeare',
    _shakespeare_character,
    ('lstm',),
    {'lstm': 2},
    {'lstm': 820_522},
    accuracy='accuracy',
  ),
  'stackoverflow_word': TaskSpec(
    'Stack Overflow next-word prediction, by user (342,477 clients)',
    'Stack Overflow',
    _stackoverflow_word,
    ('lstm',),
    {'lstm': 2},
    # A 10,000-word vocabulary (TFF's synthetic data has a smaller one).
    {'lstm': 4_050_748},
    accuracy='accuracy',
    eval_examples=_STACKOVERFLOW_EVAL_EXAMPLES,
  ),
}
TASK_NAMES = tuple(PREFIX + name for name in TASKS)
# The next-token tasks, whose labels are tokens with padding id 0 (what
# `aggregation.NumTokens()` counts; their models' `num_tokens` metric).
TEXT_TASK_NAMES = (
  PREFIX + 'shakespeare_character',
  PREFIX + 'stackoverflow_word',
)


def is_baseline_task(name: str) -> bool:
  """Whether `name` is one of TFF's baseline tasks (`tff_baselines/...`)."""
  return str(name).startswith(PREFIX)


def spec(name: str) -> TaskSpec:
  """The task's `TaskSpec`; raises naming the tasks there are."""
  short = str(name)[len(PREFIX) :] if is_baseline_task(name) else None
  if short not in TASKS:
    raise ValueError(
      f'--task={name!r} is unknown; TFF\'s baseline tasks are '
      f'{", ".join(TASK_NAMES)}.'
    )
  return TASKS[short]


# ---------------------------------------------------------------------------
# The data.


@dataclasses.dataclass(frozen=True)
class TaskBatches:
  """A client's batches of a round: TFF's preprocessing, seeded.

  Called as `tff_methods_tasks.datasets.LocalBatches` is
  (`round_dataset_computation` takes either): (client's examples, client id,
  round) -> batches.

  Attributes:
    preprocess_fn: TFF's training preprocessing (shuffle buffer 1, one
      epoch): maps the stream of examples to batches.
    batch_spec: The spec of one batch it makes.
    local_epochs: Passes over the client's examples per round, E.
    seed: The experiment's seed.
  """

  preprocess_fn: Callable[[tf.data.Dataset], tf.data.Dataset]
  batch_spec: Any
  local_epochs: int = 1
  seed: int = 0

  def element_spec(self, example_spec: Any = None) -> Any:
    del example_spec  # TFF's preprocessing decides.
    return self.batch_spec

  def __call__(
    self, dataset: tf.data.Dataset, client_id: Any = '', round_num: Any = 0
  ) -> tf.data.Dataset:
    examples = datasets.read_all(dataset)
    size = tf.shape(tf.nest.flatten(examples)[0], out_type=tf.int64)[0]
    # One fresh order per epoch, as TFF's shuffle before its repeat gives:
    # the client's passes numbered across rounds, as `LocalBatches` does.
    first_pass = tf.cast(round_num, tf.int64) * self.local_epochs
    positions = tf.concat(
      [
        datasets.pass_order(size, self.seed, client_id, first_pass + epoch)
        for epoch in range(self.local_epochs)
      ],
      0,
    )
    stream = tf.data.Dataset.from_tensor_slices(
      tf.nest.map_structure(lambda v: tf.gather(v, positions), examples)
    )
    return self.preprocess_fn(stream)


# ---------------------------------------------------------------------------
# The evaluation.


class TaskEvaluator:
  """TFF's metrics of the task's model on centralized examples, after the
  task's evaluation preprocessing."""

  def __init__(
    self,
    tff_task,
    accuracy: str,
    examples: tf.data.Dataset,
    eval_examples: Optional[int] = None,
  ):
    self._model = tff_task.model_fn()
    self._keras_model = tff_baseline_models.keras_model_of(self._model)
    self._accuracy = accuracy
    if eval_examples is not None:
      examples = examples.take(eval_examples)
    self._test = tff_task.datasets.eval_preprocess_fn(examples)

    @tf.function
    def accumulate(dataset):
      for batch in dataset:
        self._model.forward_pass(batch, training=False)

    self._accumulate = accumulate

  def __call__(self, weights) -> collections.OrderedDict:
    model_lib.assign_weights(self._keras_model, weights)
    self._model.reset_metrics()
    self._accumulate(self._test)
    # The model's Keras metrics (the task's, and TFF's loss and counts)
    # hold what its finalizers would compute.
    metrics = collections.OrderedDict(
      (metric.name, float(metric.result()))
      for metric in self._model.get_metrics()
    )
    metrics['accuracy'] = metrics[self._accuracy]
    return metrics


# ---------------------------------------------------------------------------


@dataclasses.dataclass
class BaselineTask:
  """One of TFF's baseline tasks, ready for the methods and TFF's own.

  Attributes:
    name: `tff_baselines/<task>`.
    tff_task: TFF's `BaselineTask`.
    client_data: The training clients' raw examples (TFF's split).
    batches: A client's round of batches (`TaskBatches`).
    keras_model_fn: The methods' model (`methods_model`).
    tff_model_fn: TFF's `VariableModel` of the task, for TFF's algorithms.
    loss_fn: The methods' data term (`task_loss`).
    evaluator: Global weights -> TFF's test metrics (`TaskEvaluator`).
  """

  name: str
  tff_task: Any
  client_data: tff.simulation.datasets.ClientData
  batches: TaskBatches
  keras_model_fn: model_lib.KerasModelFn
  tff_model_fn: Callable[[], tff.learning.models.VariableModel]
  loss_fn: Callable[..., tf.Tensor]
  evaluator: Callable[[Any], Mapping[str, float]]


def load(
  name: str,
  *,
  batch_size: int,
  local_epochs: int = 1,
  max_elements: Optional[int] = None,
  model: Optional[str] = None,
  seed: int = 0,
  use_synthetic_data: bool = False,
  cache_dir: Optional[str] = None,
  validation_fraction: float = 0.0,
) -> BaselineTask:
  """Builds TFF's baseline task `name` for the methods.

  Args:
    name: One of `TASK_NAMES`.
    batch_size: TFF's client batch size.
    local_epochs: Passes over a client's examples per round.
    max_elements: TFF's cap on a client's examples per round (None: all).
    model: One of the task's TFF model ids (`TaskSpec.models`); its default
      when None.
    seed: Fixes each client's order of examples per round (and TFF's
      EMNIST initializers).
    use_synthetic_data: TFF's synthetic data (offline).
    cache_dir: Where TFF caches the downloaded data (TFF's default
      `~/.tff` when None).
    validation_fraction: If > 0, this seeded share of the training
      clients (at least one, and one left to train) is held out and
      evaluated on instead of the test data: for tuning without looking at
      the test set. The clients are natural, so whole clients are held out.

  Raises:
    ValueError: an unknown task or model.
    DataUnavailableError: the real data can't be had (no network).
  """
  task_spec = spec(name)
  model_id = model or task_spec.models[0]
  if model_id not in task_spec.models:
    raise ValueError(
      f'--model={model_id!r} is not a model of {name}; TFF builds '
      f'{", ".join(task_spec.models)}.'
    )
  client_spec = _BASELINES.ClientSpec(
    num_epochs=1,
    batch_size=batch_size,
    max_elements=max_elements,
    shuffle_buffer_size=1,
  )
  try:
    tff_task = task_spec.build(
      client_spec, model_id, use_synthetic_data, cache_dir, seed
    )
  except Exception as e:
    if use_synthetic_data:
      raise
    raise datasets.DataUnavailableError(
      f'{name}: could not load {task_spec.data} through '
      f'tff.simulation.datasets ({e!r:.200}); it downloads on first use '
      'and needs a network then. --use_synthetic_data runs the task on '
      "TFF's synthetic data offline."
    ) from e
  task_datasets = tff_task.datasets
  train_data = task_datasets.train_data
  test_examples = task_datasets.test_data.create_tf_dataset_from_all_clients()
  if validation_fraction:
    train_data, test_examples = _hold_out_clients(
      train_data, validation_fraction, seed
    )
  batches = TaskBatches(
    task_datasets.train_preprocess_fn,
    task_datasets.element_type_structure,
    local_epochs,
    seed,
  )
  return BaselineTask(
    name=name,
    tff_task=tff_task,
    client_data=train_data,
    batches=batches,
    keras_model_fn=functools.partial(
      tff_baseline_models.methods_model, tff_task
    ),
    tff_model_fn=tff_task.model_fn,
    loss_fn=tff_baseline_models.task_loss,
    evaluator=TaskEvaluator(
      tff_task, task_spec.accuracy, test_examples, task_spec.eval_examples
    ),
  )


def _hold_out_clients(train_data, fraction: float, seed: int):
  """(the clients left to train, the held-out clients' examples)."""
  client_ids = list(train_data.client_ids)
  if not 0 < fraction < 1 or len(client_ids) < 2:
    raise ValueError(
      f'validation_fraction={fraction} must be in (0, 1), with at least 2 '
      f'clients to split ({len(client_ids)} here).'
    )
  held = int(round(fraction * len(client_ids)))
  held = min(max(held, 1), len(client_ids) - 1)
  order = np.random.default_rng([seed, 7]).permutation(len(client_ids))
  held_ids = sorted(client_ids[i] for i in order[:held])
  kept = sorted(client_ids[i] for i in order[held:])
  training = tff.simulation.datasets.ClientData.from_clients_and_tf_fn(
    kept, train_data.serializable_dataset_fn
  )
  examples = functools.reduce(
    lambda a, b: a.concatenate(b),
    [train_data.create_tf_dataset_for_client(c) for c in held_ids],
  )
  return training, examples


def layer_outputs(name: str, model: Optional[str] = None) -> int:
  """How many `layer_k` outputs the task's model names (FedCKA's M at most)."""
  task_spec = spec(name)
  return task_spec.layer_outputs[model or task_spec.models[0]]


def output_names(name: str, model: Optional[str] = None) -> tuple[str, ...]:
  """The named outputs of the task's model as the project names them
  (`tff_baseline_models`): `z` is its `features`."""
  layers = range(1, layer_outputs(name, model) + 1)
  return ('logits', 'features', 'z') + tuple(f'layer_{k}' for k in layers)


def models(name: str) -> Sequence[str]:
  """The task's TFF model ids, its default first."""
  return spec(name).models


def parameter_count(name: str, model: Optional[str] = None) -> int:
  """The parameter count of the task's model on the real data."""
  task_spec = spec(name)
  return task_spec.parameters[model or task_spec.models[0]]
