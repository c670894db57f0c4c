"""Devices for the in-process execution context
(`tff_methods.execution.in_process`).

Their names (`cpu:N`, `gpu:N`), the CPU split into logical devices so the
multi-device path runs without a GPU, TensorFlow's determinism switches,
and which ops belong on the host CPU whatever a client's device.
"""

import os
import re
from typing import Optional, Sequence

import tensorflow as tf

from tff_methods.execution import workers

DEVICE_PATTERN = re.compile(r'^(cpu|gpu):(\d+)$')
HOST = '/device:CPU:0'
# Ops that stay on the host CPU whatever the device: TFF's worker keeps its
# data sets and iterators there (its session provider); file IO, strings
# and the input pipeline's parsing have no kernel elsewhere. Those the
# project's clients run: data sets and their parsing and shuffling, a
# client key's strings, the client-state files and their serialization,
# and the numpy functions that read and write states kept in memory.
HOST_OP = re.compile(
  r'Dataset|Iterator|ReadFile|WriteFile|MatchingFiles|ParseExample|DecodeRaw|'
  r'StatelessShuffle|^String|^StaticRegex|^AsString$|^ParseTensor$|'
  r'^SerializeTensor$|^Substr$|^PyFunc$'
)


# What a graph's own device may hand to the host besides `HOST_OP`s: the
# arguments and results of the host's functions, and the control flow and
# constants around them.
PLUMBING = re.compile(
  r'^(_Arg|_Retval|_Send|_Recv|NoOp|Switch|Merge|Identity|Const|Enter|Exit|'
  r'NextIteration|LoopCond)$'
)


def is_host_op(op: str) -> bool:
  """Whether op type `op` stays on the host CPU whatever the device."""
  return bool(HOST_OP.search(op))


def runs_on_host(op: str) -> bool:
  """Whether op type `op` belongs on the host whatever the client's device:
  the input pipeline, files and strings, and the plumbing around them."""
  return bool(HOST_OP.search(op) or PLUMBING.match(op))


class DeviceError(ValueError):
  """Devices that can't be used as asked."""


def parse_devices(devices: Sequence[str]) -> list[str]:
  """`['cpu:0', 'gpu:1']` as TensorFlow's device names, checked.

  Raises:
    DeviceError: An entry is not `cpu:N` or `gpu:N`, or appears twice.
  """
  names = []
  for entry in devices:
    match = DEVICE_PATTERN.match(str(entry).strip().lower())
    if not match:
      raise DeviceError(
        f'devices: {entry!r} is not a device; allowed: cpu:N or gpu:N '
        '(e.g. gpu:0,gpu:1, or cpu:0,cpu:1 to split the CPU).'
      )
    name = f'/device:{match.group(1).upper()}:{match.group(2)}'
    if name in names:
      raise DeviceError(f'devices: {entry!r} is named twice.')
    names.append(name)
  if not names:
    raise DeviceError('devices: name at least one device.')
  return names


def configure_devices(devices: Optional[Sequence[str]] = None) -> list[str]:
  """Makes `devices` exist in this process; returns their TensorFlow names.

  `None` means every GPU, or the CPU where there is none. Asking for
  `cpu:N` beyond the one CPU device splits the CPU into N + 1 logical
  devices, so the multi-device path runs (and is tested) without a GPU.
  This has to happen before TensorFlow's runtime starts (before any op
  runs); afterwards only devices that already exist can be named.

  Raises:
    DeviceError: A device is not there (a GPU this machine lacks, or a CPU
      split asked for after TensorFlow started), naming what there is.
  """
  if devices is None:
    gpus = tf.config.list_physical_devices('GPU')
    return [f'/device:GPU:{k}' for k in range(len(gpus))] or [HOST]
  names = parse_devices(devices)
  cpus_needed = 1 + max(
    (int(n.rsplit(':', 1)[1]) for n in names if ':CPU:' in n), default=0
  )
  cpu = tf.config.list_physical_devices('CPU')[0]
  if cpus_needed > 1:
    _sessions_get_their_own_threads()
    configured = tf.config.get_logical_device_configuration(cpu) or []
    if len(configured) < cpus_needed:
      try:
        tf.config.set_logical_device_configuration(
          cpu, [tf.config.LogicalDeviceConfiguration()] * cpus_needed
        )
      except RuntimeError as e:
        raise DeviceError(
          f'devices: splitting the CPU into {cpus_needed} logical devices '
          'must happen before TensorFlow starts running ops; configure the '
          'devices first thing (configure_devices).'
        ) from e
  there = {
    d.name.replace('/physical_device:', '/device:')
    for d in tf.config.list_logical_devices()
  }
  there = {re.sub(r'^/job:[^/]*/replica:\d+/task:\d+', '', n) for n in there}
  missing = [n for n in names if n not in there]
  if missing:
    raise DeviceError(
      f'devices: {", ".join(missing)} not found; this process has '
      f'{", ".join(sorted(there))}.'
    )
  return names


# TensorFlow reads it once, when it makes its first device: with it, each
# session's CPU devices get an intra-op thread pool of the session's own
# size (`intra_op_threads`), not the one pool of the process.
_OWN_THREAD_POOLS = 'TF_OVERRIDE_GLOBAL_THREADPOOL'


def _sessions_get_their_own_threads() -> None:
  """Before TensorFlow starts: logical CPU devices that train clients at
  once each get threads of their own, as a TFF worker gives each of its
  clients (cores split between them), instead of every device's ops
  sharing one pool of every core."""
  from tensorflow.python.eager import context

  if _OWN_THREAD_POOLS in os.environ:
    return
  if not context.context()._initialized:  # pylint: disable=protected-access
    os.environ[_OWN_THREAD_POOLS] = '1'
    workers.not_for_workers(_OWN_THREAD_POOLS)


def intra_op_threads(device: str, devices: Sequence[str]) -> int:
  """The intra-op threads of a session whose clients run on `device`, one
  of `devices` that train at once: on a CPU split into logical devices
  (with their own pools, `configure_devices`), the cores split between
  them; 0 (TensorFlow's default, every core) otherwise."""
  cpus = [d for d in devices if ':CPU:' in d]
  if ':CPU:' not in device or len(cpus) < 2:
    return 0
  if os.environ.get(_OWN_THREAD_POOLS) != '1':
    return 0
  cores = (
    len(os.sched_getaffinity(0))
    if hasattr(os, 'sched_getaffinity')
    else (os.cpu_count() or 1)
  )
  return max(1, cores // len(cpus))


def configure_determinism(deterministic: bool) -> None:
  """With `deterministic`, TF32 off and TensorFlow's op determinism on: a
  GPU's results then repeat, and differ from the CPU's only by rounding
  (for equality checks; slower)."""
  if deterministic:
    tf.config.experimental.enable_tensor_float_32_execution(False)
    tf.config.experimental.enable_op_determinism()


def has_gpu_kernel(op: str) -> bool:
  """Whether TensorFlow has a kernel for `op` that runs on a GPU (the CUDA
  build registers them with or without a GPU)."""
  from tensorflow.python.framework import kernels

  registered = kernels.get_registered_kernels_for_op(op).kernel
  return any(k.device_type in ('GPU', 'DEFAULT') for k in registered)


def available_devices() -> list[str]:
  """This process's devices, as `cpu:N`/`gpu:N`."""
  return [
    re.sub(r'.*device:', '', d.name).lower()
    for d in tf.config.list_logical_devices()
    if d.device_type in ('CPU', 'GPU')
  ]
