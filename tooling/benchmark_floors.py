"""The floors of the methods that compute more than FedAvg: what each
computes beyond it, timed alone per client (`floors_on_outputs`: MOON,
FedCKA, FedMAX; `floors_on_weights`: SCAFFOLD, FedProx, FedCos), the least
ratio to FedAvg that this work allows (`floor_ratio`), the targets, and the
report's sentence on it (`floor_note`)."""

from typing import Optional

from tff_methods_tooling import floors_on_outputs
from tff_methods_tooling import floors_on_weights

# Each method's floor, by name (`benchmark_run` measures those it runs).
EXTRA_SECONDS = {
  'fedcka': floors_on_outputs.fedcka_extra_seconds,
  'moon': floors_on_outputs.moon_extra_seconds,
  'scaffold': floors_on_weights.scaffold_extra_seconds,
  'fedprox': floors_on_weights.fedprox_extra_seconds,
  'fedcos': floors_on_weights.fedcos_extra_seconds,
  'fedmax': floors_on_outputs.fedmax_extra_seconds,
}


# A method judged on its floor: its ratio to FedAvg at most this far above.
TARGET_ABOVE_FLOOR = 0.07

# On the worker, the methods whose target is their floor +
# TARGET_ABOVE_FLOOR when it is measured; the others keep their own targets,
# their floors printed beside them. (In-process, every method with a floor
# is judged on it: `benchmark_in_process.target`.)
JUDGED_ON_FLOOR = ('fedcka', 'moon')


def floor_ratio(
  extra_seconds: float, fedavg_round_seconds: float, num_clients: int
) -> float:
  """A method's lowest possible ratio to FedAvg: 1 + extra / FedAvg's share.

  A round of `num_clients` clients is FedAvg's training of each; the
  method's round adds at least `extra_seconds` per client (`*_extra_seconds`).
  """
  return 1.0 + extra_seconds * num_clients / fedavg_round_seconds


def floor_target(
  extra: dict, fedavg_round_seconds: float, num_clients: int
) -> float:
  """A `JUDGED_ON_FLOOR` method's target: its floor + `TARGET_ABOVE_FLOOR`."""
  return (
    floor_ratio(extra['extra_seconds'], fedavg_round_seconds, num_clients)
    + TARGET_ABOVE_FLOOR
  )


# Each floor's parts, as the report names them: (what, its figure's key).
_PASSES = "the global and previous models' reference passes"
_ROWS = "on each batch's rows of the reference tables"
FLOOR_PARTS = {
  'fedcka': (
    'FedCKA',
    [
      (_PASSES, 'reference_passes_seconds'),
      (f'the Gram products {_ROWS}', 'grams_seconds'),
    ],
  ),
  'moon': (
    'MOON',
    [
      (_PASSES, 'reference_passes_seconds'),
      (f'the contrastive terms {_ROWS}', 'contrastive_seconds'),
    ],
  ),
  'scaffold': (
    'SCAFFOLD',
    [
      ("the weights' corrections over the round's steps", 'correction_seconds'),
      ("the control variate's update and its sum", 'control_update_seconds'),
    ],
  ),
  'fedprox': (
    'FedProx',
    [("the proximal term's pull over the round's steps", 'proximal_seconds')],
  ),
  'fedcos': (
    'FedCos',
    [
      ("the cosine term's gradient over the round's steps", 'direction_seconds')
    ],
  ),
  'fedmax': (
    'FedMAX',
    [
      (
        "the entropy term and its gradient on each batch's activations",
        'entropy_seconds',
      )
    ],
  ),
}


def _ms(seconds: float) -> str:
  milliseconds = 1000 * seconds
  return f'{milliseconds:.0f}' if milliseconds >= 10 else f'{milliseconds:.2g}'


def floor_note(
  method: str,
  extra: dict,
  fedavg_round_seconds: float,
  num_clients: int,
  ratio: Optional[float] = None,
  fedavg_name: str = 'FedAvg',
) -> str:
  """The report's sentence on a method's floor (`extra`: its
  `*_extra_seconds` figures) against FedAvg's round, and where `ratio` (the
  method's measured ratio to that FedAvg) is; for `JUDGED_ON_FLOOR`'s
  methods, against the target of `TARGET_ABOVE_FLOOR` above it."""
  label, parts = FLOOR_PARTS[method]
  lowest = floor_ratio(
    extra['extra_seconds'], fedavg_round_seconds, num_clients
  )
  measured = ''
  if ratio is not None:
    gap = ratio - lowest
    # Below the floor only by the rounds' noise (the floor is a least
    # time, the ratio a median).
    where = (
      f'{gap:.2f} above its floor'
      if gap >= 0
      else f'{-gap:.2f} below its floor, within the noise'
    )
    target = ''
    if method in JUDGED_ON_FLOOR:
      met = 'yes' if gap <= TARGET_ABOVE_FLOOR else '**no**'
      target = f' (target <= {TARGET_ABOVE_FLOOR} above: {met})'
    measured = f' It ran at {ratio:.2f}: {where}{target}.'
  work = ' and '.join(f'{what} {_ms(extra[key])} ms' for what, key in parts)
  return (
    f"{label}'s floor: what it computes beyond FedAvg, timed alone, per "
    f"client: {work}, against {fedavg_name}'s "
    f'{_ms(fedavg_round_seconds / num_clients)} ms per client: {label} '
    f'cannot go below {lowest:.2f} of {fedavg_name} here.{measured}'
  )
