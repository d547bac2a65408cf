"""Fine-tuning tasks as declarations: what to read, what kind of head, which metrics, how long to train.

A task is a `Task` instance. GLUE and SQuAD come from tensorflow-datasets data sources (array_record files
read without TensorFlow); a directory of local files is a task too:

  DIR/{train,dev[,test]}.tsv[.gz]    `label<TAB>sentence[<TAB>sentence2]`, optional header line starting `label`;
                                     classification, or regression when every label is a number and one is not
                                     an integer.
  DIR/{train,dev[,test]}.conll[.gz]  `token<TAB>tag` (or space separated; the tag is the last column), a blank
                                     line between sentences; span F1 when the tags are BIO/BIOES, else accuracy.

`get_task(name_or_directory)` returns the declaration; `read(task, split)` its examples.
"""

import csv
import dataclasses
import gzip
import os
from typing import Any, Sequence

from electra_jax.config import ConfigError
from electra_jax.data.corpus import DataError
from electra_jax.finetune import metrics

CLASSIFICATION, REGRESSION, TAGGING, SQUAD = 'classification', 'regression', 'tagging', 'squad'
KINDS = (CLASSIFICATION, REGRESSION, TAGGING, SQUAD)


@dataclasses.dataclass(frozen=True)
class TextExample:
  """One or two texts with a class name (classification), a number (regression) or None (unlabelled)."""
  guid: str
  texts: tuple[str, ...]
  label: Any = None


@dataclasses.dataclass(frozen=True)
class TaggingExample:
  """A sentence as words, with one tag per word (None when unlabelled)."""
  guid: str
  words: tuple[str, ...]
  tags: tuple[str, ...] | None = None


@dataclasses.dataclass(frozen=True)
class SquadExample:
  """A question about a context; `answers`/`answer_starts` (character offsets) are empty when unanswerable."""
  guid: str
  question: str
  context: str
  answers: tuple[str, ...] = ()
  answer_starts: tuple[int, ...] = ()
  is_impossible: bool = False


@dataclasses.dataclass(frozen=True)
class Split:
  """An evaluation split: the name results use, the source's split name, the submission file (GLUE/SQuAD)."""
  name: str
  source: str
  submission: str = ''


@dataclasses.dataclass(frozen=True)
class Task:
  """Everything task-specific; the rest of the fine-tuning code is shared.

  `features` are the tfds feature names of the texts (GLUE), `labels` the class or tag names in id order
  (empty for regression and SQuAD), `metrics` the reported metrics, the first one the task's main score.
  """
  name: str
  kind: str
  source: str  # 'tfds' or 'files'
  location: str  # tfds dataset name ('glue/cola', 'squad/v2.0') or a directory
  labels: tuple[str, ...] = ()
  metrics: tuple[str, ...] = ('accuracy',)
  features: tuple[str, ...] = ()
  train_split: str = 'train'
  dev_splits: tuple[Split, ...] = (Split('dev', 'validation'),)
  test_splits: tuple[Split, ...] = ()
  epochs: float = 3.0
  both_orders: bool = False  # also train on (sentence2, sentence1): MRPC, STS-B
  max_seq_length: int = 128
  label_names_in_submission: bool = False  # GLUE MNLI/QNLI/RTE submissions use names, the others ids
  squad_v2: bool = False
  # Regression: the targets' (min, max); the model learns (target - min) / max and predictions are mapped back
  # (official RegressionTask: STS-B is (0, 5), so the model learns label / 5). Empty: raw targets.
  target_range: tuple[float, ...] = ()

  def scale(self, target: float) -> float:
    """A regression target as the model learns it."""
    return (target - self.target_range[0]) / self.target_range[1] if self.target_range else target

  def unscale(self, output: float) -> float:
    """The inverse of `scale`: a model output as a target."""
    return output * self.target_range[1] + self.target_range[0] if self.target_range else output

  def __post_init__(self):
    if self.kind not in KINDS:
      raise ConfigError(f'task {self.name}: kind must be one of {KINDS}, got {self.kind!r}')

  @classmethod
  def from_dict(cls, values: dict) -> 'Task':
    """The inverse of dataclasses.asdict (e.g. after a JSON round trip)."""
    values = dict(values)
    for key in ('dev_splits', 'test_splits'):
      values[key] = tuple(Split(**s) for s in values[key])
    for key in ('labels', 'metrics', 'features', 'target_range'):
      values[key] = tuple(values[key])
    return cls(**values)


def glue(name: str, features: Sequence[str], labels: Sequence[str], metrics: Sequence[str], submission: str,
         **kwargs) -> Task:
  """A GLUE task from tfds `glue/<name>` (dev = validation split, test = unlabelled test split)."""
  kwargs.setdefault('dev_splits', (Split('dev', 'validation'),))
  kwargs.setdefault('test_splits', (Split('test', 'test', submission),))
  kind = REGRESSION if not labels else CLASSIFICATION
  return Task(name=name, kind=kind, source='tfds', location=f'glue/{name}', features=tuple(features),
              labels=tuple(labels), metrics=tuple(metrics), **kwargs)


_ENTAIL = ('entailment', 'not_entailment')
GLUE = {
    'cola': glue('cola', ['sentence'], ('unacceptable', 'acceptable'), ['mcc', 'accuracy'], 'CoLA.tsv'),
    'sst2': glue('sst2', ['sentence'], ('negative', 'positive'), ['accuracy'], 'SST-2.tsv'),
    'mrpc': glue('mrpc', ['sentence1', 'sentence2'], ('not_equivalent', 'equivalent'), ['f1', 'accuracy'],
                 'MRPC.tsv', both_orders=True),
    'stsb': glue('stsb', ['sentence1', 'sentence2'], (), ['spearman', 'pearson'], 'STS-B.tsv', epochs=10.0,
                 both_orders=True, target_range=(0.0, 5.0)),
    'qqp': glue('qqp', ['question1', 'question2'], ('not_duplicate', 'duplicate'), ['accuracy', 'f1'], 'QQP.tsv'),
    'mnli': glue('mnli', ['premise', 'hypothesis'], ('entailment', 'neutral', 'contradiction'), ['accuracy'], '',
                 dev_splits=(Split('dev_matched', 'validation_matched'),
                             Split('dev_mismatched', 'validation_mismatched')),
                 test_splits=(Split('test_matched', 'test_matched', 'MNLI-m.tsv'),
                              Split('test_mismatched', 'test_mismatched', 'MNLI-mm.tsv')),
                 label_names_in_submission=True),
    'qnli': glue('qnli', ['question', 'sentence'], _ENTAIL, ['accuracy'], 'QNLI.tsv', label_names_in_submission=True),
    'rte': glue('rte', ['sentence1', 'sentence2'], _ENTAIL, ['accuracy'], 'RTE.tsv', epochs=10.0,
                label_names_in_submission=True),
    'wnli': glue('wnli', ['sentence1', 'sentence2'], ('not_entailment', 'entailment'), ['accuracy'], 'WNLI.tsv'),
}
ALIASES = {'sst-2': 'sst2', 'sts-b': 'stsb', 'mnli-m': 'mnli'}
SQUAD_TASKS = {
    'squad_v1': Task(name='squad_v1', kind=SQUAD, source='tfds', location='squad/v1.1', metrics=('f1', 'exact_match'),
                     dev_splits=(Split('dev', 'validation', 'predictions.json'),), epochs=2.0, max_seq_length=512),
    'squad_v2': Task(name='squad_v2', kind=SQUAD, source='tfds', location='squad/v2.0', metrics=('f1', 'exact_match'),
                     dev_splits=(Split('dev', 'validation', 'predictions.json'),), epochs=2.0, max_seq_length=512,
                     squad_v2=True),
}


# Every named task; a new one is one entry, e.g.
#   TASKS['imdb'] = Task(name='imdb', kind=CLASSIFICATION, source='tfds', location='imdb_reviews',
#                        features=('text',), labels=('neg', 'pos'), dev_splits=(Split('dev', 'test'),))
TASKS = {**GLUE, **SQUAD_TASKS}


def get_task(name: str, kind: str = '') -> Task:
  """The declaration for a name in TASKS (GLUE, squad_v1/squad_v2, ...) or a directory of local files.

  `kind` forces 'classification' or 'regression' for a TSV directory (default: guessed from the labels).
  """
  key = ALIASES.get(name.lower(), name.lower())
  if key in TASKS:
    return TASKS[key]
  if name and os.path.isdir(os.path.expanduser(name)):
    return _file_task(os.path.expanduser(name), kind)
  raise ConfigError(f'unknown task {name!r}: give one of {", ".join(TASKS)}, or a directory holding '
                    'train/dev(/test) .tsv or .conll files (optionally .gz)')


# Local files.

def _find(directory: str, split: str) -> str | None:
  for ext in ('.tsv', '.tsv.gz', '.conll', '.conll.gz'):
    path = os.path.join(directory, split + ext)
    if os.path.isfile(path):
      return path
  return None


def _read_text(path: str) -> list[str]:
  with open(path, 'rb') as f:
    gzipped = f.read(2) == b'\x1f\x8b'
  opener = gzip.open if gzipped else open
  try:
    with opener(path, 'rt', encoding='utf-8', newline='') as f:
      return f.read().splitlines()
  except UnicodeDecodeError as e:
    raise DataError(f'{path} is not valid UTF-8 ({e.reason}); convert it to UTF-8') from None


def _read_tsv_rows(path: str) -> list[list[str]]:
  lines = _read_text(path)
  rows = list(csv.reader(lines, delimiter='\t', quoting=csv.QUOTE_NONE))
  if rows and rows[0] and rows[0][0].strip().lower() == 'label':
    rows = rows[1:]
  rows = [r for r in rows if any(cell.strip() for cell in r)]
  for number, row in enumerate(rows, 1):
    if len(row) < 2:
      raise DataError(f'{path}: row {number} has {len(row)} column(s); expected label<TAB>sentence'
                      '[<TAB>sentence2]')
  return rows


def _read_conll(path: str) -> list[TaggingExample]:
  examples, words, tags = [], [], []
  for number, line in enumerate(_read_text(path) + [''], 1):
    if not line.strip() or line.startswith('-DOCSTART-'):
      if words:
        examples.append(TaggingExample(f'{os.path.basename(path)}-{len(examples)}', tuple(words), tuple(tags)))
        words, tags = [], []
      continue
    parts = line.split('\t') if '\t' in line else line.split()
    if len(parts) < 2:
      raise DataError(f'{path} line {number}: expected token<TAB>tag, got {line!r}')
    words.append(parts[0])
    tags.append(parts[-1].strip())
  return examples


def _is_number(text: str) -> bool:
  try:
    float(text)
    return True
  except ValueError:
    return False


def _file_task(directory: str, kind: str) -> Task:
  train, dev, test = (_find(directory, s) for s in ('train', 'dev', 'test'))
  if not train or not dev:
    raise ConfigError(f'task directory {directory} needs train and dev files: train.tsv/dev.tsv or '
                      'train.conll/dev.conll (optionally .gz)')
  name = os.path.basename(os.path.normpath(directory))
  tests = (Split('test', 'test', 'test_predictions.tsv'),) if test else ()
  if '.conll' in train:
    tags = sorted({t for e in _read_conll(train) for t in e.tags})
    chosen = ('span_f1', 'token_accuracy') if metrics.is_bio(tags) else ('token_accuracy',)
    return Task(name=name, kind=TAGGING, source='files', location=directory, labels=tuple(tags), metrics=chosen,
                test_splits=tests)
  labels = [row[0].strip() for row in _read_tsv_rows(train)]
  if not kind:
    numbers = all(_is_number(x) for x in labels)
    kind = REGRESSION if numbers and any(float(x) != int(float(x)) for x in labels) else CLASSIFICATION
  if kind == REGRESSION:
    return Task(name=name, kind=REGRESSION, source='files', location=directory, metrics=('spearman', 'pearson'),
                test_splits=tests)
  names = sorted(set(labels))
  chosen = ('accuracy', 'f1', 'mcc') if len(names) == 2 else ('accuracy', 'macro_f1')
  return Task(name=name, kind=CLASSIFICATION, source='files', location=directory, labels=tuple(names),
              metrics=chosen, test_splits=tests)


# Reading examples.

def _text(value) -> str:
  return value.decode('utf-8') if isinstance(value, bytes) else str(value)


def _tfds_source(task: Task, split: str, data_dir: str):
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  if task.location.startswith('glue/'):
    import tensorflow_datasets.text.glue  # pylint: disable=g-import-not-at-top,unused-import  (registers glue)
  try:
    return tfds.data_source(task.location, split=split, data_dir=data_dir or None)
  except Exception as e:  # tfds raises many types for missing or unpreparable data
    raise DataError(f'cannot load tfds dataset {task.location!r} split {split!r} ({type(e).__name__}: '
                    f'{str(e)[:300]}). tfds downloads and prepares it on first use (array_record, no TensorFlow '
                    'needed); on a machine without internet, prepare it elsewhere and set --config.tfds_data_dir'
                    ) from None


def read(task: Task, split: str, *, data_dir: str = '') -> list:
  """The examples of source split `split` (e.g. 'train', 'validation', 'test') of `task`."""
  if task.source == 'files':
    path = _find(task.location, {'validation': 'dev'}.get(split, split))
    if path is None:
      raise DataError(f'task directory {task.location} has no {split} file')
    if task.kind == TAGGING:
      return _read_conll(path)
    rows = _read_tsv_rows(path)
    guid = os.path.basename(path)
    if task.kind == REGRESSION:
      return [TextExample(f'{guid}-{i}', tuple(r[1:3]), float(r[0]) if _is_number(r[0]) else None)
              for i, r in enumerate(rows)]
    return [TextExample(f'{guid}-{i}', tuple(r[1:3]), r[0].strip() if r[0].strip() in task.labels else None)
            for i, r in enumerate(rows)]
  source = _tfds_source(task, split, data_dir)
  records = [source[i] for i in range(len(source))]
  if task.kind == SQUAD:
    return [_squad_example(r) for r in records]
  examples = []
  for i, r in enumerate(records):
    label = r['label'].item() if hasattr(r['label'], 'item') else r['label']
    if task.kind == CLASSIFICATION:
      label = task.labels[int(label)] if 0 <= int(label) < len(task.labels) else None
    else:
      label = float(label) if split != 'test' else None
    idx = r['idx'].item() if hasattr(r.get('idx'), 'item') else r.get('idx', i)
    examples.append(TextExample(str(idx), tuple(_text(r[f]) for f in task.features), label))
  return examples


def _squad_example(record) -> SquadExample:
  answers = record['answers']
  texts = tuple(_text(t) for t in answers['text'])
  starts = tuple(int(s) for s in answers['answer_start'])
  impossible = bool(record['is_impossible']) if 'is_impossible' in record else False
  if impossible:
    texts, starts = (), ()
  return SquadExample(_text(record['id']), _text(record['question']), _text(record['context']), texts, starts,
                      impossible)
