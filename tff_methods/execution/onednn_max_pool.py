"""MaxPool gradients on oneDNN's kernel in every build of a graph.

TensorFlow's oneDNN layout pass gives a MaxPool gradient oneDNN's kernel
only when its forward op is already rewritten (the gradient reads the
forward's workspace), and it rewrites nodes in the reverse post-order of a
depth-first search. In a training loop lowered to TensorFlow's control flow
the graph has a cycle, so that order is not a topological one: it depends on
where the graph's edges sit in memory, and in some builds of a graph a
gradient is visited before its forward op and keeps TensorFlow's generic
kernel, about 12 times slower (3.65 ms against oneDNN's 0.31 ms, forward and
backward, for a 64 x 28 x 28 x 16 pool on one thread). A TFF worker builds a
client's graph once per session; FedCKA's missed in about half of them
(docs/performance.md).

`pair_max_pool_gradients` makes the layout pass's choice before it runs: each
`MaxPool` whose output feeds a `MaxPoolGrad` becomes oneDNN's
`_MklNativeMaxPool` with its workspace, and the gradient oneDNN's
`_MklNativeMaxPoolGrad` reading it, as the pass itself writes them. Max
pooling does no arithmetic and both kernels send a window's gradient to its
first largest input, so the values are the same bits; only the kernel is
chosen. `runtime` applies it to the graphs its local worker runs
(`applies`): TFF's packaged worker, a CPU build with oneDNN's kernels, when
the environment does not turn oneDNN off.
"""

import os
import platform
from typing import Optional

import tensorflow as tf

# The attributes the layout pass gives the nodes it rewrites this way.
_KERNEL_LABEL = b'MklNameChangeOp'
_FORWARD, _GRADIENT = 'MaxPool', 'MaxPoolGrad'
_ONEDNN_FORWARD, _ONEDNN_GRADIENT = '_MklNativeMaxPool', '_MklNativeMaxPoolGrad'


def applies(worker_binary: Optional[str] = None) -> bool:
  """Whether a local worker runs oneDNN's MaxPool kernels: TFF's packaged
  worker (`worker_binary` None) on x86-64, `TF_ENABLE_ONEDNN_OPTS` not
  turning them off, and this TensorFlow built with them."""
  from tensorflow.python.framework import op_def_registry

  setting = os.environ.get('TF_ENABLE_ONEDNN_OPTS', '1').strip().lower()
  return (
    worker_binary is None
    and platform.machine() in ('x86_64', 'AMD64')
    and setting not in ('0', 'false')
    and op_def_registry.get(_ONEDNN_GRADIENT) is not None
  )


def may_have_max_pool_gradients(serialized_graph_def: bytes) -> bool:
  """False when a serialized GraphDef has no MaxPool gradient: its op
  type's name is not among the bytes (a cheap test before parsing it)."""
  return _GRADIENT.encode() in serialized_graph_def


def pair_max_pool_gradients(graph_def: tf.compat.v1.GraphDef) -> int:
  """Gives each MaxPool gradient of `graph_def` oneDNN's kernel, in place.

  Only the graph's own nodes (not its library's functions), and only the
  pools the layout pass would rewrite: float32, NHWC, pooling over neither
  the batch nor the depth, no explicit padding, on no device but the CPU.

  Returns:
    How many gradients it rewrote.
  """
  nodes = {node.name: node for node in graph_def.node}
  gradients_of = {}
  for node in graph_def.node:
    if node.op != _GRADIENT or len(node.input) < 2:
      continue
    forward_name, _, output = node.input[1].partition(':')
    forward = nodes.get(forward_name)
    if forward is not None and forward.op == _FORWARD and output in ('', '0'):
      gradients_of.setdefault(forward_name, []).append(node)
  rewritten = 0
  for forward_name, gradients in gradients_of.items():
    forward = nodes[forward_name]
    if not all(_rewritable(n) for n in [forward] + gradients):
      continue
    _relabel(forward, _ONEDNN_FORWARD)
    for gradient in gradients:
      _relabel(gradient, _ONEDNN_GRADIENT)
      data = [i for i in gradient.input if not i.startswith('^')]
      control = [i for i in gradient.input if i.startswith('^')]
      del gradient.input[:]
      gradient.input.extend(data + [f'{forward_name}:1'] + control)
      rewritten += 1
  return rewritten


def _rewritable(node) -> bool:
  attr = node.attr
  ksize, strides = list(attr['ksize'].list.i), list(attr['strides'].list.i)
  return (
    attr['T'].type == tf.float32.as_datatype_enum
    and attr['data_format'].s in (b'', b'NHWC')
    and attr['padding'].s in (b'SAME', b'VALID')
    and len(ksize) == 4
    and len(strides) == 4
    and ksize[0] == ksize[3] == strides[0] == strides[3] == 1
    and 'GPU' not in node.device.upper()
  )


def _relabel(node, op: str) -> None:
  node.op = op
  node.attr['workspace_enabled'].b = True
  node.attr['_kernel'].s = _KERNEL_LABEL
