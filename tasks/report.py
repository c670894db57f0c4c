"""Partition reports: class counts per client, as text and as a heatmap.

The heatmap is FedCKA's Fig. 4: clients on one axis, classes on the other,
the number of examples in each cell.
"""

import os

import numpy as np


def partition_table(counts: np.ndarray) -> str:
  """A plain-text table of examples per client (rows) and class (columns)."""
  counts = np.asarray(counts)
  num_classes = counts.shape[1]
  width = max(5, len(str(counts.max())) + 1)
  header = (
    'client'.ljust(8)
    + ''.join(f'c{c}'.rjust(width) for c in range(num_classes))
    + 'total'.rjust(8)
  )
  lines = [header]
  for i, row in enumerate(counts):
    lines.append(
      f'{i:<8d}' + ''.join(f'{v:>{width}d}' for v in row) + f'{row.sum():>8d}'
    )
  lines.append(
    'total'.ljust(8)
    + ''.join(f'{v:>{width}d}' for v in counts.sum(0))
    + f'{counts.sum():>8d}'
  )
  return '\n'.join(lines)


def partition_heatmap(counts: np.ndarray, path: str, title: str = '') -> str:
  """Writes a clients x classes heatmap of example counts as a PNG."""
  import matplotlib

  matplotlib.use('Agg')
  import matplotlib.pyplot as plt

  counts = np.asarray(counts)
  num_clients, num_classes = counts.shape
  fig, ax = plt.subplots(
    figsize=(max(4, num_classes * 0.5 + 2), max(3, num_clients * 0.3 + 1.5))
  )
  image = ax.imshow(counts, aspect='auto', cmap='Blues')
  ax.set_xlabel('class')
  ax.set_ylabel('client')
  if num_classes <= 20:
    ax.set_xticks(range(num_classes))
  if num_clients <= 30:
    ax.set_yticks(range(num_clients))
    if num_classes <= 20:
      for i in range(num_clients):
        for c in range(num_classes):
          if counts[i, c]:
            ax.text(
              c,
              i,
              str(counts[i, c]),
              ha='center',
              va='center',
              fontsize=6,
              color='white' if counts[i, c] > counts.max() / 2 else 'black',
            )
  fig.colorbar(image, ax=ax, label='examples')
  ax.set_title(title or 'examples per client and class')
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path


def write_partition_report(
  counts: np.ndarray, output_dir: str, title: str = ''
) -> tuple[str, str]:
  """Writes `partition.txt` and `partition.png` to `output_dir`."""
  os.makedirs(output_dir, exist_ok=True)
  text_path = os.path.join(output_dir, 'partition.txt')
  with open(text_path, 'w') as f:
    f.write(partition_table(counts) + '\n')
  png_path = partition_heatmap(
    counts, os.path.join(output_dir, 'partition.png'), title
  )
  return text_path, png_path
