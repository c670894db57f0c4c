"""What every builder checks of the model it is given, before any work.

The outputs its methods read (`check_outputs`, which names the one missing
and the `model_lib.named_outputs` argument that adds it), the input shape
client data must be batched to (`input_shape`), and a warning of
variables no method averages (`warn_of_unaveraged_variables`).
`checked_model` runs them for a builder, on one build of the model.
"""

import collections
import collections.abc
from typing import Any, Mapping, Optional, Sequence
import warnings

import tensorflow as tf

from tff_methods.templates import model_lib
from tff_methods.templates import regularizers as regularizers_lib

# What each named output is, and `named_outputs`' argument that names it.
OUTPUT_MEANINGS = {
  'logits': ('the unnormalized class scores', 'logits'),
  'features': ('the last post-ReLU hidden vector', 'features'),
  'z': ("a projection head's output", 'z'),
}


def _meaning(name: str) -> tuple[str, str]:
  if name.startswith('layer_'):
    k = int(name.split('_', 1)[1])
    names = ', '.join(f"'<layer {i}>'" for i in range(1, k + 1))
    return (f'the activation of layer {k} from the input', f'layers=[{names}]')
  meaning, argument = OUTPUT_MEANINGS.get(name, ('an output', name))
  return meaning, f"{argument}='<layer name>'"


def needed_outputs(
  regularizers: Sequence[regularizers_lib.Regularizer],
) -> dict[str, list[str]]:
  """Each output the regularizers read of the model (or of the global and
  previous models) -> the methods that read it."""
  needed = collections.defaultdict(list)
  for r in regularizers:
    for name in (
      tuple(r.outputs) + tuple(r.global_outputs) + tuple(r.previous_outputs)
    ):
      if r.display_name not in needed[name]:
        needed[name].append(r.display_name)
  return dict(needed)


def missing_output(
  needed: Mapping[str, Sequence[str]], has: Sequence[str]
) -> Optional[str]:
  """The first output of `needed` not in `has`, or None; of several
  `layer_k`, the deepest, which names how many layers are read."""
  missing = sorted(n for n in needed if n not in has)
  layers = [n for n in missing if n.startswith('layer_')]
  if layers:
    return max(layers, key=lambda n: int(n.split('_')[1]))
  return missing[0] if missing else None


def describe_output(name: str) -> str:
  """What a named output is, for messages."""
  return _meaning(name)[0]


def check_outputs(
  model: tf.keras.Model, needed: Mapping[str, Sequence[str]]
) -> None:
  """Raises if the model lacks an output a method reads.

  Args:
    model: The model in the contract's form (`model_lib.scratch_model` of
      the builder's function).
    needed: Output name -> the methods (regularizers) that read it.

  Raises:
    ValueError: naming the output, what it is, who reads it, the model's
      outputs and how to name it (`named_outputs`).
  """
  has = sorted(model.output)
  for name in sorted(needed):
    if name in has:
      continue
    meaning, _ = _meaning(name)
    # FedCKA's M layers are named together: the hint lists all M.
    deepest = max(
      (n for n in needed if n.startswith('layer_')),
      key=lambda n: int(n.split('_')[1]),
      default=name,
    )
    _, argument = _meaning(deepest if name.startswith('layer_') else name)
    raise ValueError(
      f'{", ".join(sorted(set(needed[name])))} reads the model\'s {name!r} '
      f'output ({meaning}); model {model.name!r} outputs {has}. Name it '
      f'with tff_methods.templates.model_lib.named_outputs(model, {argument}).'
    )


def input_shape(model: tf.keras.Model) -> Optional[tf.TensorShape]:
  """The shape of `model`'s input `x`; None for a model of several inputs."""
  inputs = model.input
  if isinstance(inputs, (list, tuple, collections.abc.Mapping)):
    return None  # Several inputs: no single shape to compare with.
  return inputs.shape


def warn_of_unaveraged_variables(model: tf.keras.Model) -> None:
  """Warns when the model has non-trainable variables, which no method
  averages (as in TFF's own builders): the global model keeps their
  initial values."""
  names = [v.name for v in model.non_trainable_variables]
  if names:
    warnings.warn(
      f'Model {model.name!r} has {len(names)} non-trainable variables '
      f'({", ".join(names[:3])}{", ..." if len(names) > 3 else ""}), such '
      "as BatchNormalization's moving statistics. As in TFF's own "
      'builders, only trainable weights are averaged: the global model '
      'keeps their initial values, so evaluating it (build_fed_eval, '
      'keras_model_with_weights) uses untrained statistics. '
      'GroupNormalization or LayerNormalization has none.',
      stacklevel=3,
    )


def checked_model(
  keras_model_fn: Any, regularizers: Sequence[regularizers_lib.Regularizer]
) -> tuple[model_lib.KerasModelFn, tf.keras.Model]:
  """`keras_model_fn` in the contract's form, checked for every output the
  regularizers read (`check_outputs`, and the warning of
  `warn_of_unaveraged_variables`) before any work; and the model it
  builds, built once in a scratch graph (`model_lib.scratch_model`), for
  what the builder reads of it (`input_shape`,
  `model_lib.zeros_like_weights`)."""
  if not callable(keras_model_fn) or isinstance(keras_model_fn, tf.keras.Model):
    raise TypeError(
      'Pass a function that builds the Keras model (it is called inside '
      f'TFF computations), not {type(keras_model_fn).__name__}; e.g. '
      'lambda: tff_methods.templates.model_lib.named_outputs('
      'make_model(), ...).'
    )
  keras_model_fn = model_lib.contract_model_fn(keras_model_fn)
  model = model_lib.scratch_model(keras_model_fn)
  check_outputs(model, needed_outputs(regularizers))
  warn_of_unaveraged_variables(model)
  return keras_model_fn, model
