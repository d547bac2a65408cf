"""The files users have, read into examples, with every input checked before training starts.

  a task directory     {train,dev[,test]}.tsv[.gz]: `label<TAB>sentence[<TAB>sentence2]`, an optional header line
                       starting `label`;  {train,dev[,test]}.conll[.gz]: `token<TAB>tag` (or space separated, the
                       tag last), a blank line between sentences.
  GLUE                 the directories of GLUE's distribution as unzipped (CoLA/, SST-2/, MRPC/, STS-B/, QQP/,
                       MNLI/, QNLI/, RTE/, WNLI/, diagnostic/), each task with its own columns, header and labels,
                       as the official ELECTRA reader (finetune/classification/classification_tasks.py) takes them.
  SQuAD                train-v1.1.json / dev-v1.1.json, train-v2.0.json / dev-v2.0.json as downloaded.

Bad input is a DataError naming the file, the line and the fix (`cli` prints it as one line): a wrong number of
columns, a header of GLUE's format in a task directory, a dev/test label the training file does not have, an empty
label outside a test file, a regression target that is not a number or is out of range. Nothing is skipped
silently. One exception, said in a warning line: GLUE's own files have a few rows with a stray tab (QQP's
train.tsv), which the official reader logs and skips, and so does `glue_examples`, unless more than 1% of a file's
rows are malformed.
"""

import csv
import dataclasses
import gzip
import json
import math
import os
import sys
from typing import Any

from electra_jax import fileio
from electra_jax.errors import DataError


@dataclasses.dataclass(frozen=True)
class TextExample:
  """One or two texts with a class name (classification), a number (regression) or None (unlabelled)."""
  guid: str
  texts: tuple[str, ...]
  label: Any = None


@dataclasses.dataclass(frozen=True)
class TaggingExample:
  """A sentence as words, with one tag per word (None when unlabelled); guid is FILE:LINE of its first word."""
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


def split_lines(text: str) -> list[str]:
  r"""The lines of `text`, ended by '\n', '\r\n' or '\r' (Python's universal newlines), none after the last end.

  Not str.splitlines: it also ends lines at U+0085, U+2028, U+2029, \x0b, \x0c and \x1c-\x1e, which are text
  inside a TSV cell or a sentence (it would cut a row in two, or a GLUE sentence short)."""
  lines = text.replace('\r\n', '\n').replace('\r', '\n').split('\n')
  return lines[:-1] if lines[-1] == '' else lines


def read_text(path: str) -> str:
  """The text of a UTF-8 file (local or gs://), plain or gzip (recognised by its magic bytes, whatever its name),
  without a byte-order mark."""
  location = fileio.path(path)
  if not location.is_file():
    raise DataError(f'{path} does not exist')
  content = location.read_bytes()
  try:
    text = (gzip.decompress(content) if content[:2] == b'\x1f\x8b' else content).decode('utf-8')
  except (OSError, EOFError) as e:  # a damaged .gz
    raise DataError(f'{path} cannot be read ({e}); fix or replace it') from None
  except UnicodeDecodeError as e:
    raise DataError(f'{path} is not valid UTF-8 ({e.reason}); convert it to UTF-8') from None
  return text.removeprefix('\ufeff')  # GLUE's MRPC header keeps its source's byte-order mark


def read_lines(path: str) -> list[str]:
  """The lines of `read_text(path)` (see `split_lines`)."""
  return split_lines(read_text(path))


def read_tsv(path: str) -> list[tuple[int, list[str]]]:
  """(line number, cells) of every non-blank line; no quoting (a `"` is text, as in GLUE's files)."""
  lines = read_lines(path)
  rows = csv.reader(lines, delimiter='\t', quoting=csv.QUOTE_NONE)
  return [(n, row) for n, row in enumerate(rows, 1) if any(cell.strip() for cell in row)]


def parse_number(text: str, where: str, target_range: tuple[float, ...] = ()) -> float:
  """A regression target; not a number, not finite or outside `target_range` (min, max) is a DataError."""
  try:
    value = float(text)
  except ValueError:
    raise DataError(f'{where}: the regression target {text!r} is not a number; fix the line (a classification '
                    'task takes --config.task_kind=classification)') from None
  low, high = target_range or (-math.inf, math.inf)
  if not math.isfinite(value) or not low <= value <= high:
    span = f'[{low:g}, {high:g}]' if target_range else 'finite numbers'
    raise DataError(f'{where}: the regression target {text!r} is out of range (the task takes {span}); fix the '
                    'line')
  return value


# A task directory.

# First-row cells that only GLUE's distribution has (a task directory's header is `label<TAB>sentence...`).
GLUE_FIRST_CELLS = frozenset({'index', 'id', 'sentence', 'quality', 'pairid'})
GLUE_HEADER_CELLS = frozenset({'sentence1', 'sentence2', 'question', 'question1', 'question2', '#1 string',
                               '#2 string', 'gold_label', 'is_duplicate', 'premise', 'hypothesis', 'score'})


def _looks_like_glue_header(cells: list[str]) -> bool:
  names = [c.strip().lower() for c in cells]
  return names[0] in GLUE_FIRST_CELLS or any(name in GLUE_HEADER_CELLS for name in names)


def local_tsv_rows(path: str) -> list[tuple[int, list[str]]]:
  """(line number, [label, sentence(, sentence2)]) of a task directory's TSV, its `label...` header dropped, and
  empty cells at a row's end too (a tab ending the row would make a sentence a pair with an empty second one)."""
  rows = read_tsv(path)
  for _, row in rows:
    while not row[-1].strip():  # read_tsv keeps only rows with a non-blank cell
      row.pop()
  if rows and rows[0][1][0].strip().lower() == 'label':
    rows = rows[1:]
  elif rows and _looks_like_glue_header(rows[0][1]):
    raise DataError(f'{path} line {rows[0][0]}: {"<TAB>".join(rows[0][1])!r} is a header of GLUE\'s '
                    'distribution, not of a task directory (label<TAB>sentence[<TAB>sentence2]); read GLUE tasks '
                    'with --config.task=NAME --config.glue_dir=DIR (the directory holding CoLA/, RTE/, ...)')
  width = len(rows[0][1]) if rows else 2
  for number, row in rows:
    if len(row) != width or len(row) not in (2, 3):
      raise DataError(f'{path} line {number}: {len(row)} column(s) where the file\'s first row has {width}; every '
                      'row is label<TAB>sentence or label<TAB>sentence<TAB>sentence2 (a tab inside a sentence '
                      'splits it): fix the line')
  return rows


def local_text_examples(path: str, regression: bool, labels: tuple[str, ...] | None, test: bool) -> list[TextExample]:
  """A task directory's TSV. `labels` (dev/test): the training file's classes, any other label is a DataError;
  only test files may leave the label empty (unlabelled)."""
  examples = []
  guid = os.path.basename(path)
  for number, row in local_tsv_rows(path):
    label = row[0].strip()
    where = f'{path} line {number}'
    if test and not label:
      label = None
    elif not label:
      raise DataError(f'{where}: the label is empty; only a test file may leave labels empty (unlabelled): fix '
                      'the line')
    elif regression:
      label = parse_number(label, where)
    elif labels is not None and label not in labels:
      raise DataError(f'{where}: the label {label!r} does not occur in the training file (its labels: '
                      f'{", ".join(labels)}); the model cannot predict it. Fix the label, or add training '
                      'examples with it')
    examples.append(TextExample(f'{guid}-{len(examples)}', tuple(row[1:]), label))
  return examples


def conll_examples(path: str) -> list[TaggingExample]:
  """Sentences of a CoNLL file (the official tagging reader: first column the word, last the tag)."""
  examples, words, tags, first = [], [], [], 0
  name = os.path.basename(path)
  for number, line in enumerate(read_lines(path) + [''], 1):
    if not line.strip() or line.startswith('-DOCSTART-'):
      if words:
        examples.append(TaggingExample(f'{name}:{first}', tuple(words), tuple(tags)))
        words, tags = [], []
      continue
    cells = line.strip()  # a tab after the tag (some exporters write one) is not an empty tag column
    parts = cells.split('\t') if '\t' in cells else cells.split()
    if len(parts) < 2:
      raise DataError(f'{path} line {number}: expected token<TAB>tag, got {line!r} (no tag); fix the line (a blank '
                      'line ends a sentence)')
    first = first if words else number
    words.append(parts[0])
    tags.append(parts[-1].strip())
  return examples


# GLUE's distribution.

# More malformed rows than this share of a GLUE file means it is not GLUE's file (the real ones have a handful).
MAX_MALFORMED_GLUE_ROWS = 0.01

@dataclasses.dataclass(frozen=True)
class GlueFormat:
  """How one GLUE task's files look: header names of the text and label columns, the label strings in the files
  (in the task's label order; empty: the task's label names), the id column of test files."""
  folder: str
  texts: tuple[str, ...]
  label: str
  file_labels: tuple[str, ...] = ()
  id_column: str = 'index'
  headerless_columns: int = 0  # CoLA's train/dev: no header, 4 columns: source, label, original mark, sentence


GLUE_FORMATS = {
    'cola': GlueFormat('CoLA', ('sentence',), 'label', ('0', '1'), headerless_columns=4),
    'sst2': GlueFormat('SST-2', ('sentence',), 'label', ('0', '1')),
    'mrpc': GlueFormat('MRPC', ('#1 String', '#2 String'), 'Quality', ('0', '1')),
    'stsb': GlueFormat('STS-B', ('sentence1', 'sentence2'), 'score'),
    'qqp': GlueFormat('QQP', ('question1', 'question2'), 'is_duplicate', ('0', '1'), id_column='id'),
    'mnli': GlueFormat('MNLI', ('sentence1', 'sentence2'), 'gold_label'),
    'qnli': GlueFormat('QNLI', ('question', 'sentence'), 'label'),
    'rte': GlueFormat('RTE', ('sentence1', 'sentence2'), 'label'),
    'wnli': GlueFormat('WNLI', ('sentence1', 'sentence2'), 'label', ('0', '1')),
}
# Source split -> file, as GLUE names them (MNLI's dev and test come matched and mismatched).
GLUE_FILES = {'train': 'train.tsv', 'validation': 'dev.tsv', 'validation_matched': 'dev_matched.tsv',
              'validation_mismatched': 'dev_mismatched.tsv', 'test': 'test.tsv', 'test_matched': 'test_matched.tsv',
              'test_mismatched': 'test_mismatched.tsv', 'diagnostic': 'diagnostic.tsv'}


def glue_task_dir(glue_dir: str, fmt: GlueFormat) -> str:
  """The task's directory: GLUE_DIR/<folder> (e.g. glue_data/RTE), or GLUE_DIR itself if it is that folder."""
  for candidate in (fileio.path(glue_dir) / fmt.folder, fileio.path(glue_dir)):
    if any((candidate / f).is_file() for f in ('dev.tsv', 'dev_matched.tsv')):
      return os.fspath(candidate)
  raise DataError(f'--config.glue_dir={glue_dir} holds no {fmt.folder}/ directory with dev.tsv: give the directory '
                  f'GLUE\'s download unzips into (CoLA/, SST-2/, ..., {fmt.folder}/)')


def glue_diagnostic_file(task_dir: str) -> str | None:
  """GLUE's diagnostic set (AX), beside the task directories or inside MNLI's; None if absent."""
  task_dir = fileio.path(task_dir)
  for path in (task_dir.parent / 'diagnostic' / 'diagnostic.tsv', task_dir / 'diagnostic.tsv'):
    if path.is_file():
      return os.fspath(path)
  return None


def glue_examples(task_dir: str, fmt: GlueFormat, split: str, labels: tuple[str, ...],
                  target_range: tuple[float, ...]) -> list[TextExample]:
  """The examples of GLUE file `split` (a GLUE_FILES key). Test files (and AX) are unlabelled. The guid is the
  file's id column (`index`, QQP's `id`: for test files the id the leaderboard expects), else the 0-based row."""
  if split == 'diagnostic':
    path = glue_diagnostic_file(task_dir)
  else:
    path = os.fspath(fileio.path(task_dir) / GLUE_FILES[split])
  if not path or not fileio.path(path).is_file():
    raise DataError(f'{path or task_dir + "/diagnostic.tsv"} is missing: GLUE\'s {fmt.folder}/ directory holds '
                    f'{", ".join(sorted({GLUE_FILES[s] for s in ("train", "validation", "test")}))} as unzipped')
  rows = read_tsv(path)
  test = split.startswith('test') or split == 'diagnostic'
  if fmt.headerless_columns and not test:
    width, text_columns, label_column, id_column = fmt.headerless_columns, (3,), 1, None
  else:
    if not rows:
      raise DataError(f'{path} is empty; give GLUE\'s {fmt.folder} files as distributed')
    header = [cell.strip() for cell in rows[0][1]]
    needed = fmt.texts + (() if test else (fmt.label,))
    missing = [name for name in needed if name not in header]
    if missing:
      raise DataError(f'{path} line {rows[0][0]}: GLUE\'s {fmt.folder} header has the columns '
                      f'{", ".join(needed)}; this one lacks {", ".join(missing)} (it reads '
                      f'{"<TAB>".join(header)[:120]!r}). Give the files as GLUE distributes them')
    width, rows = len(header), rows[1:]
    text_columns = tuple(header.index(name) for name in fmt.texts)
    label_column = None if test else header.index(fmt.label)
    id_column = header.index(fmt.id_column) if fmt.id_column in header else None
  names = fmt.file_labels or labels
  malformed = [(number, len(row)) for number, row in rows if len(row) != width]
  if len(malformed) > MAX_MALFORMED_GLUE_ROWS * len(rows):
    (number, columns), more = malformed[0], len(malformed) - 1
    raise DataError(f'{path} line {number}: {columns} columns where GLUE\'s {fmt.folder} {os.path.basename(path)} '
                    f'has {width}, and {more} more of its {len(rows)} lines are malformed too: this is not the file '
                    f'GLUE distributes (a tab inside a sentence splits it); fix the lines or give GLUE\'s file')
  if malformed:
    # GLUE's own QQP train.tsv has a few such lines (a stray tab); the official reader logs and skips them: so do we.
    print(f'warning: {path}: skipped {len(malformed)} line(s) with a number of columns other than {width}, as the '
          f'official ELECTRA reader does (line {", ".join(str(n) for n, _ in malformed[:5])}'
          f'{", ..." if len(malformed) > 5 else ""})', file=sys.stderr)
  examples = []
  for index, (number, row) in enumerate(rows):
    where = f'{path} line {number}'
    if len(row) != width:
      continue
    label = None
    if label_column is not None:
      raw = row[label_column].strip()
      if not labels:  # regression (STS-B)
        label = parse_number(raw, where, target_range)
      elif raw in names:
        label = labels[names.index(raw)]
      else:
        raise DataError(f'{where}: the label {raw!r} is not one of GLUE {fmt.folder}\'s labels '
                        f'({", ".join(names)}); fix the line')
    guid = row[id_column].strip() if id_column is not None else str(index)
    examples.append(TextExample(guid, tuple(row[c] for c in text_columns), label))
  return examples


# SQuAD.

SQUAD_FILES = {False: {'train': 'train-v1.1.json', 'validation': 'dev-v1.1.json'},
               True: {'train': 'train-v2.0.json', 'validation': 'dev-v2.0.json'}}


def squad_examples(squad_dir: str, v2: bool, split: str) -> list[SquadExample]:
  """The questions of SQuAD's official JSON (data / paragraphs / qas); all gold answers are kept (scoring takes
  the best), training uses the first. 2.0's unanswerable questions have none (`plausible_answers` are not
  answers)."""
  path = os.fspath(fileio.path(squad_dir) / SQUAD_FILES[v2][split])
  if not fileio.path(path).is_file():
    raise DataError(f'{path} is missing: --config.squad_dir holds SQuAD\'s {" and ".join(SQUAD_FILES[v2].values())} '
                    'as downloaded')
  try:
    data = json.loads(read_text(path))['data']
  except (json.JSONDecodeError, KeyError, TypeError) as e:
    raise DataError(f'{path} is not SQuAD\'s JSON ({type(e).__name__}: {e}); give the file as downloaded') from None
  examples = []
  for article in data:
    for paragraph in article.get('paragraphs', ()):
      for qa in paragraph.get('qas', ()):
        try:
          impossible = bool(qa.get('is_impossible', False))
          answers = () if impossible else tuple((a['text'], int(a['answer_start'])) for a in qa['answers'])
          examples.append(SquadExample(qa['id'], qa['question'], paragraph['context'],
                                       tuple(a for a, _ in answers), tuple(s for _, s in answers), impossible))
        except (KeyError, TypeError, ValueError) as e:
          raise DataError(f'{path}: question {qa.get("id", "?")!r} lacks {e} or has a malformed field; SQuAD\'s '
                          'format is data / paragraphs / {context, qas / {id, question, answers / {text, '
                          'answer_start}}}') from None
  return examples
