"""Training curves of one or more runs, overlaid, from their metrics.jsonl (no TensorBoard needed).

  python -m electra_jax.plot WORKDIR [WORKDIR ...] --output=curves.png [--metrics=loss,disc_recall] [--x=train_flops]

One panel per metric, one line per run; a run's held-out curve (`eval_METRIC`, logged every `eval_every` steps) is
drawn dashed in the panel of METRIC, in the run's colour. A WORKDIR is a run's directory (its metrics.jsonl), a
metrics.jsonl file, or a directory whose subdirectories hold one each (e.g. one per fine-tuning seed): each becomes
a line.
Errors print one line `error: ...` and exit with status 1.
"""

import argparse
import collections
import math
import os
import sys

from matplotlib.figure import Figure

from electra_jax import fileio, metrics as metrics_lib

# What a pre-training run's panels show, in this order, when the runs logged them (see the README's Outputs).
DEFAULT_METRICS = ('loss', 'gen_loss', 'disc_loss', 'gen_accuracy', 'mlm_accuracy', 'disc_accuracy', 'disc_recall',
                   'disc_precision', 'disc_prob_replaced', 'disc_prob_original', 'eval_disc_auc', 'learning_rate')
HELD_OUT = 'eval_'  # the held-out counterpart of metric M is eval_M: drawn in M's panel
# Not curves: the x axes, and counters.
NOT_METRICS = ('step', 'train_flops', 'tokens_per_second', 'seed', 'eval_seconds')


class PlotError(ValueError):
  """A run cannot be read; the message says which and why."""


def find_runs(paths: list[str]) -> dict[str, str]:
  """{label: metrics.jsonl path} for the command line's paths (see the module docstring)."""
  found = {}
  for path in paths:
    location = fileio.path(path)
    if location.is_file():
      files = [location]
    elif (location / metrics_lib.FILE).is_file():
      files = [location / metrics_lib.FILE]
    elif location.is_dir():
      files = sorted(child / metrics_lib.FILE for child in location.iterdir() if (child / metrics_lib.FILE).is_file())
    else:
      raise PlotError(f'{path} does not exist; give a run\'s WORKDIR or its {metrics_lib.FILE}')
    if not files:
      raise PlotError(f'{path} holds no {metrics_lib.FILE} (nor do its subdirectories): has the run logged a step yet?')
    for file in files:
      found[os.fspath(file)] = os.fspath(file)
  # Label each run by the shortest tail of its directory that tells it from the others; runs whose files share a
  # directory (a.jsonl and b.jsonl side by side) by their files' paths, or one label would stand for both.
  directory = {key: os.path.normpath(os.path.dirname(key)) for key in found}
  shared = {d for d, count in collections.Counter(directory.values()).items() if count > 1}
  places = {key: (os.path.normpath(key) if d in shared else d).split(os.sep) for key, d in directory.items()}
  for depth in range(1, max(len(parts) for parts in places.values()) + 1):
    labels = {key: '/'.join(parts[-depth:]) for key, parts in places.items()}
    if len(set(labels.values())) == len(labels):
      break
  return {labels[key]: path for key, path in found.items()}


def read_metrics(path: str) -> list[dict]:
  """The records of a metrics.jsonl (a line cut short by a crash is skipped)."""
  records = metrics_lib.read(path)
  if not records:
    raise PlotError(f'{path} holds no metrics yet (no complete line with a step)')
  return records


def choose_metrics(runs: dict[str, list[dict]], wanted: list[str] | None = None) -> list[str]:
  """The metrics to plot: `wanted` (each must be logged by some run), else DEFAULT_METRICS that some run logged
  (itself, or its held-out eval_M alone: M's panel draws it dashed) and the scores of a split (fine-tuning's
  'dev/accuracy'), else every numeric key but the held-out eval_M of a logged M (drawn dashed in M's panel)."""
  numeric = {k for records in runs.values() for r in records for k, v in r.items() if isinstance(v, (int, float))}
  if wanted:
    missing = [m for m in wanted if m not in numeric]
    if missing:
      raise PlotError(f'no run logged {", ".join(missing)}; they logged {", ".join(sorted(numeric))}')
    return list(wanted)
  logged = numeric - set(NOT_METRICS)
  usual = [m for m in DEFAULT_METRICS if m in logged or HELD_OUT + m in logged]
  if usual:
    return usual + sorted(m for m in logged if '/' in m)
  return sorted(m for m in logged if not (m.startswith(HELD_OUT) and m[len(HELD_OUT):] in logged))


def plot(runs: dict[str, list[dict]], metrics: list[str], x: str = 'step', columns: int = 3) -> Figure:
  """A figure with one panel per metric and, in each, one line per run of `runs` ({label: records})."""
  without = [label for label, records in runs.items() if not any(x in r for r in records)]
  if without:
    raise PlotError(f'{", ".join(without)} logged no {x} (fine-tuning logs steps only): use --x=step')
  rows = math.ceil(len(metrics) / columns)
  figure = Figure(figsize=(4.5 * min(columns, len(metrics)), 3.2 * rows + 0.6), layout='constrained')
  axes = figure.subplots(rows, min(columns, len(metrics)), squeeze=False).ravel()
  for ax, metric in zip(axes, metrics):
    for label, records in runs.items():
      points = _points(records, x, metric)
      own_panel = metric.startswith(HELD_OUT) or HELD_OUT + metric in metrics  # eval_M drawn once only
      held_out = [] if own_panel else _points(records, x, HELD_OUT + metric)
      color = None
      if points:
        color = ax.plot(*zip(*points), label=label, linewidth=1.2, marker=_marker(points))[0].get_color()
      if held_out:
        ax.plot(*zip(*held_out), '--', color=color, label=f'{label} (held-out)', linewidth=1.2,
                marker=_marker(held_out))
    ax.set_title(metric)
    ax.set_xlabel(x)
    ax.grid(alpha=0.3)
  for ax in axes[len(metrics):]:
    ax.set_visible(False)
  handles = {}  # every line's label once, from whichever panel has it
  for ax in axes[:len(metrics)]:
    handles.update(zip(*reversed(ax.get_legend_handles_labels())))
  if len(handles) > 1:
    figure.legend(list(handles.values()), list(handles), loc='outside upper center', ncols=min(len(handles), 4),
                  fontsize='small')
  return figure


def _marker(points: list[tuple[float, float]]) -> str | None:
  """A dot for a curve with one point to draw (one evaluation, one logged step, the others NaN), which as a line
  alone would not show."""
  return 'o' if sum(math.isfinite(x) and math.isfinite(y) for x, y in points) == 1 else None


def _points(records: list[dict], x: str, metric: str) -> list[tuple[float, float]]:
  return [(r[x], r[metric]) for r in records if x in r and isinstance(r.get(metric), (int, float))]


def main(argv=None):
  parser = argparse.ArgumentParser(prog='python -m electra_jax.plot', description=__doc__.split('\n')[0],
                                   formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  parser.add_argument('workdirs', nargs='+', metavar='WORKDIR', help='runs to overlay')
  parser.add_argument('--output', default='curves.png', help='the image to write (.png, .pdf, .svg)')
  parser.add_argument('--metrics', default='', help="comma-separated metrics; '': the usual pre-training ones")
  parser.add_argument('--x', default='step', choices=('step', 'train_flops'), help='the x axis')
  args = parser.parse_args(sys.argv[1:] if argv is None else argv)
  try:
    runs = {label: read_metrics(path) for label, path in find_runs(args.workdirs).items()}
    metrics = choose_metrics(runs, [m for m in args.metrics.split(',') if m])
    figure = plot(runs, metrics, x=args.x)
    with fileio.atomic_writer(args.output) as f:
      figure.savefig(f, format=os.path.splitext(args.output)[1][1:] or 'png', dpi=110)
  except ValueError as e:  # PlotError too
    print(f'error: {e}', file=sys.stderr)
    sys.exit(1)
  except fileio.storage_errors() as e:
    print(f'error: {fileio.describe(e)}', file=sys.stderr)
    sys.exit(1)
  print(f'wrote {args.output}: {len(metrics)} metrics of {len(runs)} run(s)')


if __name__ == '__main__':
  main()
