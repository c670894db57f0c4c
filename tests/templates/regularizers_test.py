"""Tests for tff_methods.templates.regularizers: the contract a method's term
keeps."""

import sys

import pytest

from tff_methods.algorithms import fedcka
from tff_methods.algorithms import fedcos
from tff_methods.algorithms import fedprox
from tff_methods.algorithms import moon
from tff_methods.algorithms import scaffold
from tff_methods.templates import regularizers
from tff_methods.templates import stateful


def test_a_negative_strength_is_named():
  assert regularizers.check_strength('mu', 0.0) == 0.0
  with pytest.raises(ValueError, match='mu must be a number >= 0, got -0.5'):
    regularizers.check_strength('mu', -0.5)


def test_what_each_methods_term_needs_decides_its_process():
  # FedProx reads only the global weights: a plain learning process.
  prox = [fedprox.ProximalTerm(0.01)]
  assert not regularizers.needs_previous_model(prox)
  assert not regularizers.needs_client_state(prox)
  assert not regularizers.keeps_server_state(prox)
  # MOON reads the client's previous model: per-client state.
  contrast = [moon.ModelContrastiveTerm(1.0, 0.5)]
  assert regularizers.needs_previous_model(contrast)
  assert regularizers.needs_client_state(contrast)
  # FedCKA likewise, for its first layers.
  cka = [fedcka.CKAContrastiveTerm(3.0, 2)]
  assert regularizers.needs_previous_model(cka)
  # FedCos broadcasts the global model's last move: server state. The
  # FedCos code's direction learns the round's mean client update instead.
  cos = [fedcos.DirectionPenalty(0.02)]
  assert regularizers.keeps_server_state(cos)
  assert not regularizers.reads_mean_update(cos)
  assert not regularizers.needs_client_state(cos)
  code = [fedcos.DirectionPenalty(0.02, direction='mean_client_update')]
  assert regularizers.reads_mean_update(code)
  # SCAFFOLD keeps a control variate on the server and on each client.
  control = [scaffold.ControlVariateCorrection(0.1, 10)]
  assert regularizers.keeps_server_state(control)
  assert regularizers.needs_client_state(control)
  assert not regularizers.needs_previous_model(control)
  # Its correction is a move of the weights, nothing in the objective.
  assert control[0].weight_correction is not None
  assert control[0](None) is None
  assert prox[0].weight_correction is None


class _Reporting(regularizers.Regularizer):
  # Reads reports at the server, but keeps no client state to make them.
  name = 'reporting'
  previous_outputs = ('logits',)
  server_state = regularizers.ServerState(
    initial=list,
    broadcast=lambda state, weights: (state, state),
    record_client_reports=lambda state, mean, count: state,
  )


def test_a_term_declares_a_capability_by_supplying_it():
  term = _Reporting()
  assert regularizers.keeps_server_state([term])
  assert not regularizers.reads_mean_update([term])
  assert regularizers.needs_client_state([term])  # Its previous model.
  assert term(None) is None  # Nothing added to the objective.
  with pytest.raises(ValueError, match='reporting reads client reports'):
    stateful.build_stateful_client_work(
      None, None, None, None, regularizers=[term]
    )


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
