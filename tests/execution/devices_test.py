"""Device names, the CPU split, and what belongs on the host
(`tff_methods.execution.devices`)."""

import subprocess
import sys
import textwrap

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
    'PyFunc',
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


def test_a_split_cpu_gives_each_device_a_share_of_the_cores_not_the_workers():
  # A fresh process: the split has to come before TensorFlow starts.
  script = textwrap.dedent(
    """
    import os
    from tff_methods.execution import devices, workers
    names = devices.configure_devices(['cpu:0', 'cpu:1'])
    cores = len(os.sched_getaffinity(0))
    print(os.environ.get('TF_OVERRIDE_GLOBAL_THREADPOOL'))
    print(devices.intra_op_threads(names[1], names) == max(1, cores // 2))
    print(devices.intra_op_threads('/device:GPU:0', names + ['/device:GPU:0']))
    print(devices.intra_op_threads(names[0], names[:1]))
    print('TF_OVERRIDE_GLOBAL_THREADPOOL' in workers.worker_environment())
    """
  )
  result = subprocess.run(
    [sys.executable, '-c', script],
    capture_output=True,
    text=True,
    timeout=120,
    check=True,
  )
  # Sessions get pools of their own; the two devices half the cores each;
  # a GPU, or one CPU device alone, keeps TensorFlow's default (0); the
  # worker this process starts does not inherit the setting.
  assert result.stdout.split() == ['1', 'True', '0', '0', 'False']


def test_without_the_split_sessions_share_the_process_threads():
  tf.constant(0)  # TensorFlow has started: too late for pools of their own.
  names = devices.configure_devices(None)
  assert devices.intra_op_threads(names[0], names + ['/device:CPU:1']) == 0


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
