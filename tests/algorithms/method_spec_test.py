"""Tests for tff_methods.algorithms.method_spec: what a method's module
declares."""

import dataclasses
import sys

import pytest

from tff_methods.algorithms import method_spec


def test_a_declaration_that_brings_nothing_or_too_much_is_refused():
  with pytest.raises(ValueError, match="'empty' brings nothing"):
    method_spec.MethodSpec(name='empty', display_name='Empty')
  with pytest.raises(ValueError, match='takes no term or server optimizer'):
    method_spec.MethodSpec(
      name='both', display_name='Both', build=print, server_optimizer='sgd'
    )
  with pytest.raises(ValueError, match='non-empty word without \\+'):
    method_spec.MethodSpec(
      name='a+b', display_name='AB', server_optimizer='sgd'
    )


def test_a_method_with_a_process_of_its_own_stands_alone():
  alone = method_spec.MethodSpec(name='own', display_name='Own', build=print)
  assert alone.stands_alone
  assert not method_spec.MethodSpec(
    name='rule', display_name='Rule', server_optimizer='sgd'
  ).stands_alone
  with pytest.raises(ValueError, match='keeps_client_state is for a method'):
    method_spec.MethodSpec(
      name='kept',
      display_name='Kept',
      server_optimizer='sgd',
      keeps_client_state=True,
    )


def test_a_weighting_setting_names_one_of_its_own_processes_settings():
  @dataclasses.dataclass(frozen=True)
  class Settings:
    weighting: str = method_spec.setting('uniform', 'How clients weigh.')

  spec = method_spec.MethodSpec(
    name='own',
    display_name='Own',
    settings=Settings,
    build=print,
    weighting_setting='weighting',
  )
  assert spec.flag(spec.weighting_setting) == 'own_weighting'
  with pytest.raises(ValueError, match='weighting_setting names one of'):
    method_spec.MethodSpec(
      name='own', display_name='Own', build=print, weighting_setting='w'
    )
  with pytest.raises(ValueError, match='for a method with a build function'):
    method_spec.MethodSpec(
      name='rule',
      display_name='Rule',
      settings=Settings,
      server_optimizer='sgd',
      weighting_setting='weighting',
    )


def test_a_term_takes_its_settings_by_name():
  @dataclasses.dataclass(frozen=True)
  class Settings:
    mu: float = method_spec.setting(0.1, 'The strength.')

  def term(mu, beta):
    return (mu, beta)

  with pytest.raises(ValueError, match='its term takes beta, which its'):
    method_spec.MethodSpec(
      name='pull', display_name='Pull', settings=Settings, term=term
    )
  spec = method_spec.MethodSpec(
    name='pull',
    display_name='Pull',
    settings=Settings,
    term=lambda mu: ('term', mu),
  )
  assert method_spec.term_parameters(spec) == ('mu',)
  assert method_spec.make_term(spec, Settings(mu=0.5)) == ('term', 0.5)
  with pytest.raises(ValueError, match='has a process of its own'):
    method_spec.builder(
      method_spec.MethodSpec(name='own', display_name='Own', build=print)
    )


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
