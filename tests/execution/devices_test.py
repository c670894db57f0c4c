"""Device names, the CPU split, and what belongs on the host
(`tff_methods.execution.devices`)."""

import sys

import pytest
import tensorflow as tf

from tff_methods.execution import devices


def test_devices_are_checked_by_name():
  assert devices.parse_devices(['cpu:0', 'GPU:1']) == [
    '/device:CPU:0',
    '/device:GPU:1',
  ]
  for bad, says in (
    (['tpu:0'], "'tpu:0' is not a device; allowed: cpu:N or gpu:N"),
    (['gpu'], "'gpu' is not a device"),
    (['cpu:0', 'cpu:0'], "'cpu:0' is named twice"),
    ([], 'name at least one device'),
  ):
    with pytest.raises(devices.DeviceError, match=says):
      devices.parse_devices(bad)


def test_a_missing_gpu_or_a_late_cpu_split_is_named():
  tf.constant(0)  # TensorFlow has started.
  with pytest.raises(
    devices.DeviceError, match=r'/device:GPU:3 not found; .* /device:CPU:0'
  ):
    devices.configure_devices(['gpu:3'])
  with pytest.raises(devices.DeviceError, match='before TensorFlow starts'):
    devices.configure_devices(['cpu:0', 'cpu:7'])
  assert devices.configure_devices(None) == ['/device:CPU:0']


def test_host_ops_are_the_input_pipeline_files_and_their_plumbing():
  for op in (
    'TensorSliceDataset',
    'IteratorGetNext',
    'ReadFile',
    'WriteFile',
    'ParseTensor',
    'StringJoin',
    'ParseExampleV2',
  ):
    assert devices.is_host_op(op) and devices.runs_on_host(op), op
  for op in ('_Arg', '_Retval', 'Switch', 'Identity', 'Const'):
    assert devices.runs_on_host(op) and not devices.is_host_op(op), op
  for op in ('MatMul', 'Conv2D', 'AddV2', 'StatefulPartitionedCall'):
    assert not devices.runs_on_host(op), op
  # The CUDA build registers GPU kernels with or without a GPU.
  assert devices.has_gpu_kernel('MatMul')
  assert devices.has_gpu_kernel('Assert')  # A kernel for any device.
  assert not devices.has_gpu_kernel('ReadFile')


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
