"""Writes the docs' generated tables: `python tools/docs_tables.py`.

docs/flags.md's table of the methods' own settings comes from the methods'
declarations (`experiment_config.method_settings_table`), between the
markers below; `tests/experiment_config_test.py` checks it is current.

  python tools/docs_tables.py           # rewrites the tables
  python tools/docs_tables.py --check   # exits 1 if one is out of date
"""

import os
import sys

from tff_methods.algorithms import methods
from tff_methods_tooling import experiment_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLAGS_DOC = os.path.join(REPO, 'docs', 'flags.md')
BEGIN = '<!-- method settings: written by tools/docs_tables.py -->\n'
END = '<!-- end of method settings -->\n'


def with_table(text: str, table: str) -> str:
  """`text` with what lies between the markers replaced by `table`."""
  start = text.index(BEGIN) + len(BEGIN)
  return text[:start] + table + text[text.index(END, start) :]


def main(argv):
  with open(FLAGS_DOC) as f:
    text = f.read()
  updated = with_table(
    text, experiment_config.method_settings_table(methods.REGISTRY)
  )
  if '--check' in argv[1:]:
    if updated != text:
      print('docs/flags.md is out of date: run python tools/docs_tables.py.')
      return 1
    return 0
  with open(FLAGS_DOC, 'w') as f:
    f.write(updated)
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv))
