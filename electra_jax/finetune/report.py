"""What a fine-tuning run tells its user: the results table (results.md), the dev set's majority-class baseline, how
often each seed gives its most frequent answer, and the closing summary.

A seed that answers one class (one tag) for at least `ONE_CLASS_SHARE` of the dev rows has learned nothing a
constant could not do: its accuracy is about the share of that class, which looks plausible without the baseline
beside it. Such seeds are flagged in the table and on screen.
"""

import collections
import os
import shlex

import numpy as np

from electra_jax.finetune import tasks

ONE_CLASS_SHARE = 0.95
NOT_METRICS = ('seed', 'top_prediction')  # the keys of a seed's row that are not dev metrics
PREDICT_COMMAND = ('python -m electra_jax.main --config=configs/finetune.py --workdir={workdir} '
                   '--config.predict_input=FILE')


def metric_names(row: dict) -> list[str]:
  return [k for k in row if k not in NOT_METRICS]


def majority_label(task: tasks.Task, examples: list):
  """The most frequent label of labelled `examples` (the most frequent tag over all words, for tagging); None for
  regression and SQuAD, or without labels. Ties go to the label first in the task's order."""
  if task.kind == tasks.CLASSIFICATION:
    values = [e.label for e in examples if e.label is not None]
  elif task.kind == tasks.TAGGING:
    values = [t for e in examples for t in (e.tags or ())]
  else:
    return None
  counts = collections.Counter(values)
  order = {label: i for i, label in enumerate(task.labels)}
  return min(counts, key=lambda label: (-counts[label], order.get(label, len(order)))) if counts else None


def top_prediction(task: tasks.Task, predicted: list) -> dict | None:
  """{'label', 'count', 'total', 'share'} of the most frequent of `predicted` labels (tags, over all words, for
  tagging); None for regression and SQuAD."""
  if task.kind == tasks.CLASSIFICATION:
    values = list(predicted)
  elif task.kind == tasks.TAGGING:
    values = [t for tags in predicted for t in tags]
  else:
    return None
  if not values:
    return None
  label, count = collections.Counter(values).most_common(1)[0]
  return {'label': label, 'count': count, 'total': len(values), 'share': count / len(values)}


def one_class_splits(row: dict) -> list[tuple[str, dict]]:
  """(dev split, top prediction) of a seed's row where it answers one class for >= ONE_CLASS_SHARE of the rows."""
  return [(split, top) for split, top in (row.get('top_prediction') or {}).items()
          if top and top['share'] >= ONE_CLASS_SHARE]


def one_class_warning(tag: str, split: str, top: dict) -> str:
  """One line for the screen."""
  return (f'warning: {tag} predicts {top["label"]!r} for {100 * top["share"]:.1f}% of {split} rows ({top["count"]} of '
          f'{top["total"]}): it answers one class, so its score is a constant\'s; compare it with the majority '
          'baseline in results.md')


def results_table(title: str, per_seed: list[dict], median: dict, baseline: dict | None = None,
                  baseline_labels: dict | None = None) -> str:
  """A Markdown table, one row per seed (with its most frequent prediction) plus the median and the majority
  baseline; metrics x 100. Seeds that answer one class are flagged."""
  names = metric_names(per_seed[0])
  tops = any(row.get('top_prediction') for row in per_seed)
  header = ['seed'] + names + (['most frequent prediction'] if tops else [])
  lines = [f'### {title} (dev, x100)', '', '| ' + ' | '.join(header) + ' |',
           '|---|' + '---:|' * len(names) + ('---|' if tops else '')]
  flagged = []
  for row in per_seed:
    cells = [str(row['seed'])] + [f'{100 * row[k]:.2f}' for k in names]
    if tops:
      one_class = one_class_splits(row)
      if one_class:
        flagged.append(row['seed'])
      cells.append('; '.join(f'{split}: {top["label"]} {100 * top["share"]:.1f}%'
                             for split, top in (row.get('top_prediction') or {}).items() if top)
                   + (' **one class**' if one_class else ''))
    lines.append('| ' + ' | '.join(cells) + ' |')
  lines.append('| **median** | ' + ' | '.join(f'**{100 * median[k]:.2f}**' for k in names) + ' |'
               + (' |' if tops else ''))
  if baseline:
    always = '; '.join(f'{split}: always {label}' for split, label in (baseline_labels or {}).items())
    lines.append('| majority baseline | ' + ' | '.join(f'{100 * baseline[k]:.2f}' if k in baseline else '-'
                                                       for k in names) + ' |' + (f' {always} |' if tops else ''))
  if flagged:
    lines += ['', f'**Warning**: {_seeds(flagged)} one class for at least {100 * ONE_CLASS_SHARE:.0f}% of the dev '
              'rows: a constant answer, whose score is about the majority baseline\'s. Try another learning rate, '
              'more epochs or more seeds.']
  return '\n'.join(lines) + '\n'


def _seeds(seeds: list[int]) -> str:
  """'seed 3 answers' or 'seeds 1, 3 answer'."""
  return f'seeds {", ".join(map(str, seeds))} answer' if len(seeds) > 1 else f'seed {seeds[0]} answers'


def summary(results: dict, workdir: str) -> str:
  """The lines a finished run ends with: the main dev metric per seed and its median, the majority baseline,
  where results, predictions and models are, and the command that predicts with the best seed."""
  main, seeds = results['main_metric'], results['seeds']
  per_seed = ', '.join(f'{100 * row[main]:.2f} (seed {row["seed"]})' for row in seeds)
  lines = [f'{results["task"]}: {main} x100 {per_seed}; median {100 * results["median"][main]:.2f}']
  baseline = results.get('majority_baseline') or {}
  if main in baseline:
    labels = ', '.join(f'{label!r}' for label in (results.get('majority_label') or {}).values())
    lines[0] += f'; majority baseline {100 * baseline[main]:.2f} (always {labels})'
  flagged = [row['seed'] for row in seeds if one_class_splits(row)]
  if flagged:
    lines.append(f'warning: {_seeds(flagged)} one class for >= {100 * ONE_CLASS_SHARE:.0f}% of the dev rows (see '
                 'results.md)')
  lines.append(f'results: {workdir}/results.md and results.json; per seed: {workdir}/seeds/<seed>/ (result.json, '
               'metrics.jsonl, tensorboard/, predictions/, params/)')
  if results.get('save_model', True):
    command = PREDICT_COMMAND.format(workdir=shlex.quote(os.fspath(workdir)))  # runs as printed, spaces and all
    lines.append(f'predict with the best seed ({results["best_seed"]}): {command}')
  return '\n'.join(lines) + '\n'


def median(per_seed: list[dict]) -> dict[str, float]:
  return {k: float(np.median([row[k] for row in per_seed])) for k in metric_names(per_seed[0])}
