"""Tests for tff_methods.execution.bind_address: a TFF worker held to one
address."""

import os
import subprocess
import sys
import time

import pytest

from tff_methods.execution import bind_address
from tff_methods.execution import workers

# /proc/net/tcp{,6}'s local addresses: IPv4 127.0.0.1, the same mapped into
# IPv6 (an IPv6 socket held to it), and IPv6's any-address.
_LOOPBACK_V4 = '0100007F'
_LOOPBACK_MAPPED = '0000000000000000FFFF00000100007F'
_ANY_V6 = '0' * 32


def _listening(port):
  """The local addresses (hex, as /proc/net shows them) listening on `port`."""
  found = set()
  for table in ('/proc/net/tcp', '/proc/net/tcp6'):
    with open(table) as f:
      for line in f.readlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, hex_port = local.split(':')
        if state == '0A' and int(hex_port, 16) == port:
          found.add(address)
  return found


def _serving(process, port):
  deadline = time.monotonic() + 60
  while not _listening(port):
    assert process.poll() is None, 'the worker exited'
    assert time.monotonic() < deadline, 'the worker never listened'
    time.sleep(0.1)
  return _listening(port)


def test_hosts_are_checked_by_name():
  assert bind_address.check_host('10.0.0.5') == '10.0.0.5'
  assert bind_address.check_host('[::1]') == '::1'
  with pytest.raises(ValueError, match="'hostA' is not an IP address"):
    bind_address.check_host('hostA')
  assert bind_address.is_any_address('0.0.0.0')
  assert bind_address.is_any_address('[::]')
  assert not bind_address.is_any_address('127.0.0.1')


def test_the_environment_preloads_the_library_for_one_host_only():
  held = bind_address.environment('127.0.0.1', {'LD_PRELOAD': '/other.so'})
  library = bind_address.library()
  assert library and os.path.exists(library)  # Built with the compiler.
  assert held['LD_PRELOAD'] == f'{library}:/other.so'
  assert bind_address.held_to_host(held)
  assert bind_address.environment('0.0.0.0', {}) == {}


@pytest.mark.slow
def test_a_local_worker_listens_on_loopback_only():
  process, port = workers.start_worker(max_concurrent_computation_calls=1)
  try:
    # TFF's binary asks for [::]: it gets 127.0.0.1 (mapped into IPv6, or
    # IPv4's own where gRPC falls back to it).
    assert _serving(process, port) <= {_LOOPBACK_MAPPED, _LOOPBACK_V4}
  finally:
    process.kill()
    process.wait()


@pytest.mark.slow
def test_a_worker_for_every_interface_is_left_as_tffs():
  port = workers.portpicker.pick_unused_port()
  process = subprocess.Popen(
    [workers.packaged_worker_binary(), f'--port={port}'],
    env=workers.worker_environment(1, host='0.0.0.0'),
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
  )
  try:
    assert _serving(process, port) <= {_ANY_V6, '00000000'}
  finally:
    process.kill()
    process.wait()


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
