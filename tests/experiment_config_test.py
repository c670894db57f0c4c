"""Tests for tff_methods_tooling.experiment_config: the methods' own settings
as config fields and flags, and runs saved under their earlier names."""

import dataclasses
import importlib.util
import json
import os
import re
import sys

from absl import flags
import pytest

from tff_methods.algorithms import methods
from tff_methods_binaries import experiment_flags
from tff_methods_tooling import experiment
from tff_methods_tooling import experiment_config
from tff_methods_tooling import run_directory

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SPEC = importlib.util.spec_from_file_location(
  'docs_tables', os.path.join(REPO, 'tools', 'docs_tables.py')
)
docs_tables = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(docs_tables)


def test_each_methods_settings_are_fields_named_after_it():
  names = {f.name for f in dataclasses.fields(experiment.ExperimentConfig)}
  assert {
    'fedprox_mu',
    'moon_mu',
    'moon_temperature',
    'fedcka_layers',
    'fedcka_similarity',
    'fedmax_beta',
    'fed2_groups',
    'scaffold_weighting',
  } <= names
  assert not {'beta', 'temperature', 'cka_layers', 'similarity'} & names
  config = experiment.ExperimentConfig(
    method='moon', mu=2.0, moon_temperature=0.2
  )
  moon = config.settings_of('moon')
  assert (moon.mu, moon.temperature) == (2.0, 0.2)  # --mu, its own flag.
  assert config.settings_of('fedcka').mu == 2.0
  assert experiment.ExperimentConfig().settings_of('fedcka').mu == 3.0


def test_the_earlier_flag_names_still_set_the_settings():
  flag_values = flags.FlagValues()
  experiment_flags.define_config_flags(flag_values)
  for old, new in experiment_config.RENAMED_SETTINGS.items():
    flags.DEFINE_alias(old, new, flag_values=flag_values)
  flag_values(['prog', '--beta=7', '--cka_layers=3', '--similarity=cosine'])
  assert flag_values.fedmax_beta == 7.0
  assert flag_values.fedcka_layers == 3
  assert flag_values.fedcka_similarity == 'cosine'


def test_a_run_saved_under_the_earlier_names_resumes(tmp_path):
  # experiment.json as runs wrote it before the settings were renamed: the
  # same experiment, so no difference; another value is one.
  config = experiment.ExperimentConfig(output_dir=str(tmp_path))
  saved = dataclasses.asdict(config)
  for old, new in experiment_config.RENAMED_SETTINGS.items():
    saved[old] = saved.pop(new)
  saved['beta'] = None  # FedMAX's default was written as None.
  for name in ('moon_mu', 'fedcka_mu'):  # Did not exist.
    del saved[name]
  with open(tmp_path / run_directory.CONFIG_FILE, 'w') as f:
    json.dump(saved, f)
  assert experiment.saved_settings_differences(config) == []
  other = dataclasses.replace(config, fedcka_layers=4)
  assert experiment.saved_settings_differences(other) == [
    'fedcka_layers: saved 2, now 4'
  ]


def test_a_run_saved_when_sampling_was_named_resumes_unless_dp_differs(
  tmp_path,
):
  # Saved before the sampling and accountant defaulted by the aggregator.
  def saved_as(config, **names):
    saved = {**dataclasses.asdict(config), **names}
    for name in ('dp_release_non_private', 'sampling_seed'):
      del saved[name]  # Did not exist.
    with open(tmp_path / run_directory.CONFIG_FILE, 'w') as f:
      json.dump(saved, f)

  plain = experiment.ExperimentConfig(output_dir=str(tmp_path))
  saved_as(plain, client_sampling='without_replacement', dp_accountant='rdp')
  assert experiment.saved_settings_differences(plain) == []
  # A DP run then sampled without replacement; now it samples Poisson
  # unless told to sample as it did.
  dp = dataclasses.replace(plain, aggregator='dp')
  saved_as(dp, client_sampling='without_replacement', dp_accountant='rdp')
  assert experiment.saved_settings_differences(dp) == [
    "client_sampling: saved 'without_replacement', now None"
  ]
  as_saved = dataclasses.replace(dp, client_sampling='without_replacement')
  assert experiment.saved_settings_differences(as_saved) == []


def test_the_docs_table_of_the_methods_settings_is_current():
  with open(os.path.join(REPO, 'docs', 'flags.md')) as f:
    docs = f.read()
  table = experiment_config.method_settings_table(methods.REGISTRY)
  assert (
    docs_tables.with_table(docs, table) == docs
  ), 'docs/flags.md is out of date: run python tools/docs_tables.py.'
  assert '| `--fedcka_similarity` | FedCKA | `linear_cka` |' in table
  # Each flag's row says where it is defined: a file whose settings class
  # has the field.
  for row in table.splitlines()[2:]:
    declared = row.split('|')[-2]
    path, field = re.fullmatch(
      r' `(.+)`: `Settings\.(\w+)` ', declared
    ).groups()
    with open(os.path.join(REPO, path)) as f:
      assert re.search(rf'^  {field}: ', f.read(), re.M), row


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
