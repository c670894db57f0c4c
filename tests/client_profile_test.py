"""Tests for tff_methods_tooling.client_profile: a client computation, op by
op."""

import functools
import sys

import pytest
import tensorflow_federated as tff

from tff_methods.algorithms import fedavg
from tff_methods.algorithms import hyperparameters
from tff_methods_tasks import datasets
from tff_methods_tasks import models as task_models
from tff_methods_tooling import benchmark
from tff_methods_tooling import client_profile


@pytest.fixture(scope='module')
def profile(tiny_cifar):
  return benchmark.profile_methods(
    'fedcka_cnn',
    ['fedavg', 'scaffold'],
    tiny_cifar,
    6,
    hyperparameters.Hyperparameters(num_clients=3),
    local_epochs=1,
    batch_size=4,
    rounds=2,
    traced_clients=2,
  )


def test_state_files_are_scaffolds_alone(profile):
  fedavg_ops = profile['methods']['fedavg']['op_seconds']
  scaffold_ops = profile['methods']['scaffold']['op_seconds']
  # SCAFFOLD reads and writes each client's control variate; FedAvg keeps
  # no client state (its one `ReadFile` is the client's examples). Both
  # train the same convolutions.
  for op in ('ReadFile', 'ParseTensor', 'SerializeTensor', 'WriteFile'):
    assert scaffold_ops.get(op, 0) > 0, op
  for op in ('ParseTensor', 'SerializeTensor', 'WriteFile'):
    assert op not in fedavg_ops, op
  for ops in (fedavg_ops, scaffold_ops):
    assert any('Conv2D' in op and s > 0 for op, s in ops.items())
  for timing in profile['methods'].values():
    assert timing['seconds_per_client'] > 0
    assert timing['traced_clients'] == 2


def test_extras_over_fedavg_are_the_methods_own(profile):
  extras = dict(
    client_profile.extra_over(
      profile['methods']['scaffold']['op_seconds'],
      profile['methods']['fedavg']['op_seconds'],
      top=100,
    )
  )
  assert extras['WriteFile'] == pytest.approx(
    profile['methods']['scaffold']['op_seconds']['WriteFile']
  )
  assert all(seconds > 0 for seconds in extras.values())
  report = client_profile.report_markdown(profile)
  assert '| op | fedavg | scaffold |' in report
  # The report's line lists the largest extras in order, whatever the
  # timings were (which ops lead depends on this machine's load).
  largest = client_profile.extra_over(
    profile['methods']['scaffold']['op_seconds'],
    profile['methods']['fedavg']['op_seconds'],
  )
  assert largest == list(extras.items())[: len(largest)]
  assert (
    '- scaffold beyond FedAvg: '
    + ', '.join(f'{op} +{1000 * s:.2f}' for op, s in largest)
    + '.'
  ) in report


def test_refuses_bad_rounds_and_clients(tiny_cifar):
  ids = list(tiny_cifar.client_data.client_ids)
  sessions = {}  # Never used: the checks come first.
  with pytest.raises(ValueError, match='rounds must be >= 2'):
    client_profile.profile_clients(sessions, ids, rounds=1)
  with pytest.raises(ValueError, match=r'traced_clients must be in \[1, 3\]'):
    client_profile.profile_clients(sessions, ids, traced_clients=4)


def test_refuses_a_process_whose_clients_take_data_sets(tiny_cifar):
  batches = datasets.LocalBatches(4, 1)
  process = fedavg.build_fedavg(
    functools.partial(
      task_models.get_model,
      'fedcka_cnn',
      tiny_cifar.num_classes,
      tiny_cifar.input_shape,
    ),
    batches.element_spec(tiny_cifar.client_data.element_type_structure),
    client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1),
  )
  with pytest.raises(ValueError, match='takes a client key'):
    client_profile.ClientSession(process, None)


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
