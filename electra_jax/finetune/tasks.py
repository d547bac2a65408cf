"""Fine-tuning tasks as declarations: what to read, what kind of head, which metrics, how long to train.

A task is a `Task` instance. GLUE and SQuAD come from the files users have (`--config.glue_dir`: GLUE's
distribution as unzipped; `--config.squad_dir`: SQuAD's JSON files), or else from tensorflow-datasets (array_record
data sources, prepared and read without TensorFlow). A directory of local files is a task too:

  DIR/{train,dev[,test]}.tsv[.gz]    `label<TAB>sentence[<TAB>sentence2]`, optional header line starting `label`;
                                     classification, or regression when every label is a number and one is not
                                     an integer.
  DIR/{train,dev[,test]}.conll[.gz]  `token<TAB>tag` (or space separated; the tag is the last column), a blank
                                     line between sentences; span F1 when the tags are BIO/BIOES, else accuracy.

`get_task(name_or_directory, ...)` returns the declaration; `read(task, split)` its examples (files.py reads and
checks the files).
"""

import dataclasses
import os
import socket
import urllib.parse
import urllib.request
from typing import Sequence

from electra_jax import fileio
from electra_jax.config import ConfigError
from electra_jax.data import corpus
from electra_jax.errors import DataError
from electra_jax.finetune import files, metrics
from electra_jax.finetune.files import SquadExample, TaggingExample, TextExample  # noqa: F401

CLASSIFICATION, REGRESSION, TAGGING, SQUAD = 'classification', 'regression', 'tagging', 'squad'
KINDS = (CLASSIFICATION, REGRESSION, TAGGING, SQUAD)


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
  source: str  # 'tfds', 'files' (a task directory), 'glue_dir' or 'squad_dir'
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

  @property
  def glue_submission(self) -> bool:
    """Whether predictions go to GLUE's leaderboard files (`index<TAB>prediction`)."""
    return self.name in GLUE and self.source in ('tfds', 'glue_dir')

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


def get_task(name: str, kind: str = '', glue_dir: str = '', squad_dir: str = '') -> Task:
  """The declaration for a name in TASKS (GLUE, squad_v1/squad_v2, ...) or a directory of local files.

  `glue_dir`/`squad_dir` read GLUE/SQuAD from their distributed files instead of tfds. `kind` forces
  'classification' or 'regression' for a TSV directory (default: guessed from the labels).
  """
  if kind not in ('', CLASSIFICATION, REGRESSION):  # a typo ('regresion') trained as classification, in silence
    raise ConfigError(f'--config.task_kind={kind!r}: give classification or regression (a TSV directory\'s labels '
                      'decide when it is empty)')
  key = ALIASES.get(name.lower(), name.lower())
  if glue_dir and key not in GLUE:
    raise ConfigError(f'--config.glue_dir is for the GLUE tasks ({", ".join(GLUE)}), not {name!r}')
  if squad_dir and key not in SQUAD_TASKS:
    raise ConfigError(f'--config.squad_dir is for squad_v1 and squad_v2, not {name!r}')
  if key in GLUE and glue_dir:
    task_dir = files.glue_task_dir(glue_dir, files.GLUE_FORMATS[key])
    # Test files are optional, as in a task directory: GLUE's are unlabelled, only for leaderboard predictions.
    tests = tuple(s for s in GLUE[key].test_splits if (fileio.path(task_dir) / files.GLUE_FILES[s.source]).is_file())
    if key == 'mnli' and files.glue_diagnostic_file(task_dir):
      tests += (Split('diagnostic', 'diagnostic', 'AX.tsv'),)  # the leaderboard's AX: MNLI's model on it
    return dataclasses.replace(GLUE[key], source='glue_dir', location=task_dir, test_splits=tests)
  if key in SQUAD_TASKS and squad_dir:
    return dataclasses.replace(SQUAD_TASKS[key], source='squad_dir', location=os.fspath(fileio.path(squad_dir)))
  if key in TASKS:
    return TASKS[key]
  if name and fileio.path(name).is_dir():
    return _file_task(os.fspath(fileio.path(name)), kind)
  raise ConfigError(f'unknown task {name!r}: give one of {", ".join(TASKS)}, or a directory holding '
                    'train/dev(/test) .tsv or .conll files (optionally .gz)')


# Local files.

def _find(directory: str, split: str) -> str | None:
  for ext in ('.tsv', '.tsv.gz', '.conll', '.conll.gz'):
    path = fileio.path(directory) / (split + ext)
    if path.is_file():
      return os.fspath(path)
  return None


def _is_number(text: str) -> bool:
  try:
    float(text)
    return True
  except ValueError:
    return False


def check_classes(labels: list, where: str):
  """A classifier needs two classes in its training examples."""
  if len(set(labels)) < 2:
    found = f'the label {labels[0]!r}' if labels else 'no label'
    raise DataError(f'{where}: every training example has {found}; a classifier needs at least two classes (a '
                    'single-class training set scores 100% on a single-class dev set without learning anything). '
                    'Give training examples of every class')


def _file_task(directory: str, kind: str) -> Task:
  train, dev, test = (_find(directory, s) for s in ('train', 'dev', 'test'))
  if not train or not dev:
    raise ConfigError(f'task directory {directory} needs train and dev files: train.tsv/dev.tsv or '
                      'train.conll/dev.conll (optionally .gz)')
  name = fileio.path(directory).name
  tests = (Split('test', 'test', 'test_predictions.tsv'),) if test else ()
  if '.conll' in train:
    tags = sorted({t for e in files.conll_examples(train) for t in e.tags})
    chosen = ('span_f1', 'token_accuracy') if metrics.is_bio(tags) else ('token_accuracy',)
    return Task(name=name, kind=TAGGING, source='files', location=directory, labels=tuple(tags), metrics=chosen,
                test_splits=tests)
  labels = [e.label for e in files.local_text_examples(train, False, None, test=False)]
  if not kind:
    numbers = bool(labels) and all(_is_number(x) for x in labels)
    # nan and inf are not integers: regression targets, which reading refuses in one line (not finite).
    kind = REGRESSION if numbers and any(not float(x).is_integer() for x in labels) else CLASSIFICATION
  if kind == REGRESSION:
    return Task(name=name, kind=REGRESSION, source='files', location=directory, metrics=('spearman', 'pearson'),
                test_splits=tests)
  check_classes(labels, train)
  names = sorted(set(labels))
  chosen = ('accuracy', 'f1', 'mcc') if len(names) == 2 else ('accuracy', 'macro_f1')
  return Task(name=name, kind=CLASSIFICATION, source='files', location=directory, labels=tuple(names),
              metrics=chosen, test_splits=tests)


# Reading examples.

def _text(value) -> str:
  return value.decode('utf-8') if isinstance(value, bytes) else str(value)


def _tfds_source(task: Task, split: str, data_dir: str):
  import tensorflow_datasets as tfds  # noqa: PLC0415
  if task.location.startswith('glue/'):
    import tensorflow_datasets.text.glue  # noqa: PLC0415  (registers glue)
  files_key = '--config.squad_dir' if task.kind == SQUAD else '--config.glue_dir'
  try:
    if fileio.is_remote(data_dir):  # array_record opens local files only: read a verified copy
      data_dir = corpus.local_tfds_copy(tfds, task.location, split, data_dir, corpus.default_cache_dir())
    # array_record: the format data sources read, and the one tfds can prepare without TensorFlow.
    builder = tfds.builder(task.location, data_dir=data_dir or None, file_format='array_record')
    if not builder.is_prepared():
      _check_download_host(task, getattr(builder.builder_config, 'data_url', ''), builder.data_dir, files_key)
      builder.download_and_prepare()
    return builder.as_data_source(split=split)
  except DataError:
    raise
  except Exception as e:  # tfds raises many types for missing or unpreparable data
    raise DataError(f'cannot load tfds dataset {task.location!r} split {split!r} ({type(e).__name__}: '
                    f'{str(e)[:300]}). tfds downloads and prepares it on first use; without internet, give the '
                    f'downloaded files with {files_key}=DIR, or prepare it elsewhere and set --config.tfds_data_dir'
                    ) from None


# Where tfds downloads a task family from, when its builder does not say (GLUE's configs carry a data_url).
DOWNLOAD_HOSTS = {'glue': 'dl.fbaipublicfiles.com', 'squad': 'rajpurkar.github.io'}


def _check_download_host(task: Task, url: str, data_dir: str, files_key: str, timeout: float = 5.0):
  """Fails at once when the host tfds would download `task` from cannot be reached: tfds itself retries for minutes
  before it gives up (its downloader's backoff: 208 s measured offline for RTE)."""
  host = urllib.parse.urlparse(url).hostname or DOWNLOAD_HOSTS.get(task.location.split('/')[0])
  if not host or 'https' in urllib.request.getproxies():  # through a proxy: only the download itself can tell
    return
  try:
    socket.create_connection((host, 443), timeout=timeout).close()
  except OSError as e:
    raise DataError(f'{task.name} is not prepared in {data_dir} and cannot be downloaded: {host} is unreachable '
                    f'({e.strerror or type(e).__name__}). tfds downloads it once, on first use; without a network, '
                    f'give the downloaded files with {files_key}=DIR, or prepare it elsewhere and set '
                    '--config.tfds_data_dir') from None


def read(task: Task, split: str, *, data_dir: str = '') -> list:
  """The examples of source split `split` (e.g. 'train', 'validation', 'test') of `task`.

  Dev and test labels must be the task's (its training file's) labels; a file error is one DataError.
  """
  if task.source == 'files':
    path = _find(task.location, {'validation': 'dev'}.get(split, split))
    if path is None:
      raise DataError(f'task directory {task.location} has no {split} file')
    if task.kind == TAGGING:
      examples = files.conll_examples(path)
    else:
      examples = files.local_text_examples(path, task.kind == REGRESSION, None if split == 'train' else task.labels,
                                           test=split.startswith('test'))
    if not examples:  # an empty dev file would be scored 0 on nothing
      raise DataError(f'{path} holds no examples (it is empty or only a header); give it at least one')
    return examples
  if task.source == 'glue_dir':
    return files.glue_examples(task.location, files.GLUE_FORMATS[task.name], split, task.labels, task.target_range)
  if task.source == 'squad_dir':
    return files.squad_examples(task.location, task.squad_v2, split)
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
