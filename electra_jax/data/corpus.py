"""Pre-training text sources, read as documents (each a list of non-empty lines).

Two kinds, chosen by `data.source` (see `open_source`):
  * text: a file, a directory or a glob, local or gs://, of plain or gzipped UTF-8 text with one sentence or
    paragraph per line and a blank line between documents, as the official ELECTRA builder expects ('' = the
    quickstart corpus);
  * `tfds:NAME[/CONFIG][:VERSION]`: a tensorflow-datasets dataset read through `tfds.data_source` (ArrayRecord
    files, no TensorFlow needed); each record is a document whose text field is split into paragraphs on newlines.
    A gs:// data_dir is copied to the local cache first (array_record reads local files only).
Problems with the input are `DataError`s whose message says what to do; records that cannot be used (empty,
undecodable) are skipped and counted in `skipped`.
"""

import collections
import contextlib
import functools
import glob
import gzip
import hashlib
import os
import random
from typing import Iterator
import zlib

from electra_jax import fileio
from electra_jax.errors import DataError

QUICKSTART = os.path.join(os.path.dirname(__file__), 'quickstart', 'kjv.txt.gz')
TFDS_PREFIX = 'tfds:'


class EmptyTextError(DataError):
  """A source with no text to pack: callers that know why (an empty held-out side) say so instead."""


def no_text(source) -> EmptyTextError:
  return EmptyTextError(f'{source} holds no text (every line is empty); give a corpus with one sentence or '
                        'paragraph per line')


def default_cache_dir() -> str:
  """$ELECTRA_JAX_CACHE, else ~/.cache/electra_jax: where a machine keeps tokenizers trained here, packed text and
  local copies of gs:// ArrayRecord files."""
  return os.path.expanduser(os.environ.get('ELECTRA_JAX_CACHE', '~/.cache/electra_jax'))


def resolve_files(source: str) -> list[str]:
  """Expands `source` (a file, a directory, or a glob; '' = the quickstart corpus) to a sorted file list."""
  if not source:
    return [QUICKSTART]
  if fileio.is_remote(source):
    try:
      files = fileio.list_files(source)
    except (OSError, ValueError) as e:  # no bucket or no access; a malformed glob
      raise DataError(f'data.source={source!r}: {fileio.describe(e)}') from None
    if not files:
      raise DataError(f'no objects found at data.source={source!r}; give an object, a directory or a glob such as '
                      "'gs://BUCKET/corpus/*.txt.gz' (`gcloud storage ls` shows what is there)")
    return files
  source = os.path.expanduser(source)
  if os.path.isfile(source):  # a file's own name, though it may hold glob characters ([ ] * ?)
    return [source]
  if os.path.isdir(source):
    files = []
    for root, directories, names in os.walk(source):
      directories[:] = [d for d in directories if not d.startswith('.')]  # .git, .ipynb_checkpoints: not the corpus
      files += [os.path.join(root, f) for f in names if not f.startswith('.')]
  else:
    files = glob.glob(source)
  files = sorted(f for f in files if os.path.isfile(f))
  if not files:
    raise DataError(f'no text files found at data.source={source!r}; give a file, a directory or a glob '
                    "such as 'corpus/*.txt.gz', or 'tfds:NAME' for a tensorflow-datasets dataset (leave it empty "
                    'for the built-in quickstart corpus)')
  return files


@contextlib.contextmanager
def _open(path: str):
  """The bytes of a local or remote file, decompressed if it is gzipped (whatever its name)."""
  with fileio.path(path).open('rb') as f:
    gzipped = f.read(2) == b'\x1f\x8b'
    f.seek(0)
    if gzipped:
      with gzip.GzipFile(fileobj=f) as unzipped:
        yield unzipped
    else:
      yield f


def read_lines(path: str) -> Iterator[str]:
  """Yields the lines of one text file (blank lines kept: they separate documents)."""
  try:
    with _open(path) as f:
      for number, raw in enumerate(f, 1):
        if b'\x00' in raw:
          raise DataError(f'{path} line {number} contains NUL bytes: it looks like a binary file, not text; '
                          'remove it from data.source')
        try:
          yield raw.decode('utf-8').rstrip('\r\n')
        except UnicodeDecodeError as e:
          raise DataError(f'{path} line {number} is not valid UTF-8 ({e.reason}); convert the file to UTF-8 '
                          '(e.g. iconv -f latin1 -t utf-8) or remove it from data.source') from None
  except (OSError, EOFError, zlib.error) as e:  # unreadable, gone; a truncated (EOFError) or corrupt .gz
    if fileio.is_remote(path) and isinstance(e, OSError):  # a missing object, no access: the client's error says
      raise DataError(fileio.describe(e)) from None
    raise DataError(f'cannot read {path}: {e}; fix or remove the file') from None


def read_documents(files: list[str]) -> Iterator[list[str]]:
  """Yields documents, each a list of non-empty lines; a file end also ends a document."""
  for path in files:
    document = []
    for line in read_lines(path):
      line = line.strip()
      if line:
        document.append(line)
      elif document:
        yield document
        document = []
    if document:
      yield document


class TextFiles:
  """Local text files (see the module docstring), in sorted path order."""

  def __init__(self, source: str):
    self.source = source
    self.files = resolve_files(source)
    self.skipped = collections.Counter()

  def __str__(self) -> str:
    return f'{len(self.files)} text file(s) at {self.source or QUICKSTART!r}'

  def documents(self) -> Iterator[list[str]]:
    return read_documents(self.files)

  def lines(self, max_lines: int) -> Iterator[str]:
    """Lines to train a tokenizer on: all of them, in order. The trainers keep a uniform sample of at most
    `max_lines` of the whole stream (reservoir sampling: SentencePiece's own, tokenizer._sample for WordPiece), so
    a corpus sorted by domain is sampled from every part, in one pass that reads but does not tokenize."""
    del max_lines
    return (line for document in self.documents() for line in document)

  def fingerprint(self) -> list:
    """What identifies the text for caches: each local file's name, size and sha256 (not its path or mtime: a
    copied, restored or re-mounted corpus keeps its tokenizer and packed data), a gs:// object's path, size and
    upload time."""
    return [_file_fingerprint(f) for f in self.files]


def _file_fingerprint(path: str) -> tuple:
  if fileio.is_remote(path):
    stat = fileio.path(path).stat()
    return path, stat.length, stat.mtime
  stat = os.stat(path)
  # A write changes st_ctime (utime cannot set it back): the digest is read once per process per version of a file,
  # not once by the tokenizer's cache key and again by the packed examples'.
  return os.path.basename(path), stat.st_size, _sha256(os.path.abspath(path), stat.st_ino, stat.st_ctime_ns)


@functools.lru_cache(maxsize=1024)
def _sha256(path: str, inode: int, ctime_ns: int) -> str:
  del inode, ctime_ns  # the cache key: another file or another version of it
  with open(path, 'rb') as f:
    return hashlib.file_digest(f, 'sha256').hexdigest()


class TfdsText:
  """A tensorflow-datasets split read through `tfds.data_source`: one document per record."""

  def __init__(self, name: str, *, split: str = 'train', data_dir: str = '', text_field: str = 'text',
               cache_dir: str = ''):
    try:
      import tensorflow_datasets as tfds  # noqa: PLC0415
      # Without TensorFlow tfds does not register all text builders (wikipedia, c4, ...) until this import.
      import tensorflow_datasets.text  # noqa: PLC0415
    except ImportError as e:
      raise DataError(f'data.source=tfds:{name} needs tensorflow-datasets ({e}); pip install '
                      'tensorflow-datasets array_record') from None
    self.name, self.split, self.data_dir, self.text_field = name, split, data_dir, text_field
    self.skipped = collections.Counter()
    self._batched_reads = True
    try:
      local_dir = local_tfds_copy(tfds, name, split, data_dir, cache_dir) if fileio.is_remote(data_dir) else data_dir
      self.records = tfds.data_source(name, split=split, data_dir=local_dir or None, download=False)
    except OSError as e:  # copying a remote data_dir: no room, an object gone, no access
      raise DataError(f'cannot copy tensorflow-datasets {name!r} split {split!r} from {data_dir}: '
                      f'{fileio.describe(e)}') from None
    except Exception as e:  # tfds raises many types for unknown, unprepared or non-ArrayRecord datasets
      first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
      raise DataError(
          f'cannot open tensorflow-datasets {name!r} split {split!r} ({first_line}). Prepare it first in '
          f'ArrayRecord format: `tfds build {name} --file_format=array_record` (on a machine with TensorFlow), and '
          'point data.tfds_data_dir at its data_dir if it is not ~/tensorflow_datasets') from None
    if not len(self.records):
      raise DataError(f'tensorflow-datasets {name!r} split {split!r} holds no records')
    fields = set(self.records.dataset_info.features.keys())
    if text_field not in fields:
      raise DataError(f'tensorflow-datasets {name!r} has no field {text_field!r}; set data.text_field to one of '
                      f'{sorted(fields)}')

  def __str__(self) -> str:
    return f'tensorflow-datasets {self.name} split {self.split} ({len(self.records)} records)'

  def _document(self, record) -> list[str]:
    return paragraphs(record[self.text_field], self.skipped, self.text_field)

  def _read(self, indices: list[int]) -> list:
    if self._batched_reads:
      try:
        return self.records.__getitems__(indices)
      except TypeError:  # tfds.testing.mock_data's stand-in source has no working batched read
        self._batched_reads = False
    return [self.records[i] for i in indices]

  def documents(self, block: int = 1024) -> Iterator[list[str]]:
    for start in range(0, len(self.records), block):
      for record in self._read(list(range(start, min(start + block, len(self.records))))):
        document = self._document(record)
        if document:
          yield document

  def lines(self, max_lines: int) -> Iterator[str]:
    """Lines of randomly chosen records (seeded), about `max_lines` of them, to train a tokenizer on."""
    order = list(range(len(self.records)))
    random.Random(0).shuffle(order)
    count = 0
    for start in range(0, len(order), 256):
      for record in self._read(sorted(order[start:start + 256])):
        for line in self._document(record):
          yield line
          count += 1
      if count >= max_lines:
        return

  def fingerprint(self) -> list:
    info = self.records.dataset_info
    data_dir = self.data_dir if fileio.is_remote(self.data_dir) or not self.data_dir else os.path.abspath(self.data_dir)
    # Another field is other text; the default one is left out, so caches made before the field was keyed stay valid.
    field = [self.text_field] if self.text_field != 'text' else []
    return [self.name, self.split, data_dir, info.full_name, len(self.records), *field]


def local_tfds_copy(tfds, name: str, split: str, data_dir: str, cache_dir: str) -> str:
  """A local data_dir holding what split `split` of dataset `name` in remote `data_dir` needs: its shards and the
  dataset's metadata files (array_record, under tfds.data_source, opens local files only)."""
  if not cache_dir:
    raise ValueError('a remote tfds data_dir needs a cache_dir for its local copy')
  builder = tfds.builder(name, data_dir=data_dir)  # reads the dataset's metadata from data_dir
  version_dir = os.fspath(builder.data_dir)  # data_dir/NAME[/CONFIG]/VERSION
  shards = {file for part in split.split('+') for file in builder.info.splits[part.split('[')[0].strip()].filenames}
  names = [file[len(version_dir) + 1:] for file in fileio.list_files(version_dir)]
  fileio.local_copy(version_dir, [n for n in names if n in shards or not _is_shard(n)], cache_dir)
  return fileio.cache_path(cache_dir, data_dir)


def _is_shard(name: str) -> bool:
  return '.array_record-' in name or '.tfrecord-' in name


def paragraphs(text, skipped: collections.Counter, field: str = 'text') -> list[str]:
  """A tfds record's text (str or UTF-8 bytes) as a document: its non-empty lines; unusable text is counted."""
  if isinstance(text, bytes):
    try:
      text = text.decode('utf-8')
    except UnicodeDecodeError:
      skipped['records not valid UTF-8'] += 1
      return []
  if not isinstance(text, str):
    skipped[f'records whose {field!r} is not text'] += 1
    return []
  document = [line.strip() for line in text.split('\n') if line.strip()]
  if not document:
    skipped['empty records'] += 1
  return document


def open_source(source: str, *, text_field: str = 'text', tfds_split: str = 'train', tfds_data_dir: str = '',
                cache_dir: str = '') -> TextFiles | TfdsText:
  """The text source `source` names: 'tfds:NAME[/CONFIG][:VERSION]', or text files (see `resolve_files`).

  `cache_dir` receives the local copy of a gs:// `tfds_data_dir`.
  """
  if source.startswith(TFDS_PREFIX):
    return TfdsText(source[len(TFDS_PREFIX):], split=tfds_split, data_dir=tfds_data_dir, text_field=text_field,
                    cache_dir=cache_dir)
  return TextFiles(source)
