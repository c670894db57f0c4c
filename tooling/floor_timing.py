"""How the floors (`benchmark_floors`) time a method's own work: a
function's least share of the machine when called as the TFF worker runs
clients, less the cost of a call that computes nothing."""

import threading
import time
from typing import Callable

import tensorflow as tf


def share_of_one_call(
  fn: Callable[[], tf.Tensor], repeats: int, concurrent_clients: int
) -> float:
  """Seconds of one call when `concurrent_clients` threads call at once.

  As the TFF worker runs clients: several at a time, so a client's share of
  the machine is the wall time over the calls.
  """

  def calls():
    for _ in range(repeats):
      fn().numpy()

  threads = [threading.Thread(target=calls) for _ in range(concurrent_clients)]
  start = time.perf_counter()
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join()
  return (time.perf_counter() - start) / (repeats * concurrent_clients)


def least_shares(
  fns: dict[str, Callable[[], tf.Tensor]], repeats: int, concurrent_clients: int
) -> dict[str, float]:
  """Each function's least share of three runs after a warm-up call, less
  the least share of a call that computes nothing: the call itself (about
  0.2 ms a call on 2 cores), which a round does not pay for each part of
  a method's work."""

  def least(fn):
    fn()  # Warm-up: tracing.
    return min(
      share_of_one_call(fn, repeats, concurrent_clients) for _ in range(3)
    )

  one = tf.constant(1.0)
  call = least(tf.function(lambda: one + 1.0))
  figures = {name: max(0.0, least(fn) - call) for name, fn in fns.items()}
  figures['extra_seconds'] = sum(figures[name] for name in fns)
  return figures
