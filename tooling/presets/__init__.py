"""Named presets: the papers' headline experiments, with their numbers.

A `Preset` is one column of a paper's results table: the settings every
method of that column shares (task, model, partition, clients, rounds,
optimizer) and one `Row` per method in the table, with the row's own
settings (its strength, server rule, similarity) and the number the paper
reports for it. `binaries/compare.py --preset=NAME` runs every row;
`binaries/train.py --preset=NAME --method=ROW` runs one (the paper's own
method by default); `binaries/presets.py` lists them all with the papers'
numbers. Flags given on the command line override a preset's settings, so
`--rounds=2` makes a short trial of a preset.

Where a paper leaves a setting out, or this project can't follow it, the
preset says so in its `notes` (printed by the listing): such settings are
choices, not the paper's.

Each paper's presets live in its own module (`fedcka`, `fedmax`, `fedcos`,
`fed2`, and `fedopt`: Reddi et al.'s on TFF's baseline tasks); `base` has
the types.

Sources: each paper's text (cited in its module) and, where the text lost a
value, the authors' reference code (named in the note).
"""

from tff_methods_tooling import commands
from tff_methods_tooling.presets import base
from tff_methods_tooling.presets import fed2
from tff_methods_tooling.presets import fedcka
from tff_methods_tooling.presets import fedcos
from tff_methods_tooling.presets import fedmax
from tff_methods_tooling.presets import fedopt

Preset = base.Preset
Row = base.Row
describe = base.describe
# By name, in the papers' order.
PRESETS: dict[str, Preset] = {
  preset.name: preset
  for paper in (fedcka, fedmax, fedcos, fed2, fedopt)
  for preset in paper.PRESETS
}
assert len(PRESETS) == sum(
  len(paper.PRESETS) for paper in (fedcka, fedmax, fedcos, fed2, fedopt)
)


def get(name: str) -> Preset:
  """The preset `name`; raises naming the presets there are."""
  if name not in PRESETS:
    raise ValueError(
      f'--preset={name!r} is unknown; choose one of '
      f'{", ".join(PRESETS)} (list them with '
      f"{commands.command('presets')})."
    )
  return PRESETS[name]
