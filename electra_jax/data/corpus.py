"""Reading pre-training text: files, directories or globs of plain or gzipped UTF-8 text.

Format (as the official ELECTRA builder expects): one sentence or paragraph per line, a blank line between
documents. Problems with the input are `DataError`s whose message says what to do.
"""

import glob
import gzip
import os
from typing import Iterator

QUICKSTART = os.path.join(os.path.dirname(__file__), 'quickstart', 'kjv.txt.gz')


class DataError(ValueError):
  """Input data the user must fix; the message says how."""


def resolve_files(source: str) -> list[str]:
  """Expands `source` (a file, a directory, or a glob; '' = the quickstart corpus) to a sorted file list."""
  if not source:
    return [QUICKSTART]
  if os.path.isdir(source):
    files = [os.path.join(root, f) for root, _, names in os.walk(source) for f in names if not f.startswith('.')]
  else:
    files = glob.glob(os.path.expanduser(source))
  files = sorted(f for f in files if os.path.isfile(f))
  if not files:
    raise DataError(f'no text files found at data.source={source!r}; give a file, a directory or a glob '
                    "such as 'corpus/*.txt.gz' (leave it empty for the built-in quickstart corpus)")
  return files


def _open(path: str):
  with open(path, 'rb') as f:
    gzipped = f.read(2) == b'\x1f\x8b'
  return gzip.open(path, 'rb') if gzipped else open(path, 'rb')


def read_lines(path: str) -> Iterator[str]:
  """Yields the lines of one text file (blank lines kept: they separate documents)."""
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
