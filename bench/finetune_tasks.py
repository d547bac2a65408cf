"""Fine-tunes a pre-trained workdir, and the same architecture and tokenizer from scratch, on local tasks over
several seeds; prints (and writes) a Markdown table of dev medians, and for classification tasks the share of the
dev set given the most frequent predicted label per seed (100%: the model collapsed to a constant answer).

  python bench/finetune_tasks.py --pretrained=WORKDIR --tasks_dir=../shared/data/tasks \
      --tasks=polarity,hedge,pos --seeds=3 --workdir=BENCH_WORKDIR [--max_train=2000 --epochs=2]

Each task directory holds train/dev(/test) .tsv(.gz) (`label<TAB>sentence`, header optional) or .conll(.gz) files.
`--max_train` keeps N random training examples (config key max_train_examples) for quick CPU runs.
For pre-training objectives compared at equal compute, see `python -m electra_jax.experiments.compare`.
"""

import json
import os
import sys
import time

from absl import app, flags, logging

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from configs import finetune as finetune_config
from electra_jax import finetune

_PRETRAINED = flags.DEFINE_string('pretrained', None, 'A pre-training WORKDIR (config.json, tokenizer.model, '
                                  'checkpoints/).')
_TASKS_DIR = flags.DEFINE_string('tasks_dir', '../shared/data/tasks', 'Directory holding one directory per task.')
_TASKS = flags.DEFINE_list('tasks', ['polarity', 'hedge', 'pos'], 'Task directories under --tasks_dir.')
_SEEDS = flags.DEFINE_integer('seeds', 3, 'Seeds per task and initialisation.')
_WORKDIR = flags.DEFINE_string('workdir', '/tmp/finetune_bench', 'Where runs, results and the table go.')
_MAX_TRAIN = flags.DEFINE_integer('max_train', 0, 'Keep N random training examples (0: all).')
_EPOCHS = flags.DEFINE_float('epochs', 0.0, 'Training epochs (0: the task default, 3).')
_LR = flags.DEFINE_float('learning_rate', 0.0, 'Peak learning rate (0: the paper value for the model width).')
_BATCH = flags.DEFINE_integer('batch_size', 32, 'Training batch.')
_MAX_LEN = flags.DEFINE_integer('max_seq_length', 128, 'Tokens per example.')
_INITS = flags.DEFINE_list('inits', ['pre-trained', 'from scratch'], 'Which initialisations to run (from scratch '
                           'needs only the pre-training\'s config.json and tokenizer: it can run while that trains; '
                           'a later run of both skips its finished seeds).')


def make_config(task_dir: str, pretrained: str, from_scratch: bool):
  config = finetune_config.get_config()
  config.task = task_dir
  config.seeds = _SEEDS.value
  config.max_train_examples = _MAX_TRAIN.value
  config.epochs = _EPOCHS.value
  config.batch_size = _BATCH.value
  config.max_seq_length = _MAX_LEN.value
  config.optimizer.learning_rate = _LR.value
  config.save_model = False
  config.write_predictions = True  # dev predictions (gold and predicted side by side)
  config.log_every = 1000
  if from_scratch:
    with open(os.path.join(pretrained, 'config.json'), encoding='utf-8') as f:
      saved = json.load(f)
    config.model.update(saved['model'])
    config.data.tokenizer = os.path.join(pretrained, 'tokenizer.model')
    config.data.lowercase = saved['data'].get('lowercase', True)
  else:
    config.init_checkpoint = pretrained
  return config


def constant_answer_shares(results: dict) -> list[float] | None:
  """Per seed, the fraction of dev examples given its most frequent predicted label (results.json's
  top_prediction); None for tagging tasks."""
  shares = []
  for row in results['seeds']:
    top = (row.get('top_prediction') or {}).get('dev')
    if not top or results['main_metric'] in ('dev/token_accuracy', 'dev/span_f1'):
      return None
    shares.append(top['share'])
  return shares


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  pretrained = os.path.abspath(_PRETRAINED.value)
  rows = []
  for name in _TASKS.value:
    task_dir = os.path.join(_TASKS_DIR.value, name)
    row = {'task': name}
    for label, scratch in (('pre-trained', False), ('from scratch', True)):
      if label not in _INITS.value:
        continue
      start = time.time()
      workdir = os.path.join(_WORKDIR.value, name, label.replace(' ', '_'))
      results = finetune.run(make_config(task_dir, pretrained, scratch), workdir)
      if results is None:  # stopped by a signal at a checkpoint (it says so): the same command resumes
        return
      main_metric = results['main_metric']
      row['metric'] = main_metric
      row[label] = (results['median'][main_metric], [s[main_metric] for s in results['seeds']])
      row[label + ' shares'] = constant_answer_shares(results)
      row[label + ' time'] = time.time() - start
    rows.append(row)
  if set(_INITS.value) != {'pre-trained', 'from scratch'}:
    return
  lines = [f'| task | dev metric | pre-trained (median of {_SEEDS.value}) | from scratch (median) '
           '| seeds (pre-trained) | seeds (from scratch) | top answer share (pre-trained) | (from scratch) |',
           '|---|---|---:|---:|---|---|---|---|']
  # pylint: disable=cell-var-from-loop
  for row in rows:
    seeds = lambda key: ', '.join(f'{100 * v:.1f}' for v in row[key][1])
    shares = lambda key: ', '.join(f'{100 * v:.0f}%' for v in row[key] or ()) or '-'
    lines.append(f'| {row["task"]} | {row["metric"]} | {100 * row["pre-trained"][0]:.2f} | '
                 f'{100 * row["from scratch"][0]:.2f} | {seeds("pre-trained")} | {seeds("from scratch")} | '
                 f'{shares("pre-trained shares")} | {shares("from scratch shares")} |')
  table = '\n'.join(lines) + '\n'
  print(table)
  with open(os.path.join(_WORKDIR.value, 'table.md'), 'w', encoding='utf-8') as f:
    f.write(table)


if __name__ == '__main__':
  flags.mark_flags_as_required(['pretrained'])
  app.run(main)
