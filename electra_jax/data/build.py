"""Text source -> tokenized, packed examples: in memory (small corpora), or built once into ArrayRecord shards.

Documents are grouped, in order, into chunks of about `chunk_chars` characters (at document boundaries; a file's end
also ends a chunk, so that each file's chunks can be counted and packed apart, see beam.py); chunk i is tokenized
and packed on its own with `random.Random(f'{seed}:{i}')`. The examples therefore depend only on the
text, the tokenizer and the `Packing` (max_length, seed, long_lines, chunk size), never on how many processes pack
them: `pack_source` (the in-memory path) and `build` (the on-disk path) produce the same examples in the same order.
"""

import collections
import dataclasses
import datetime
import itertools
import multiprocessing
import os
import shutil
import sys
import time
from typing import Iterable, Iterator

import numpy as np
import tqdm

from electra_jax import fileio
from electra_jax.data import corpus
from electra_jax.data import examples as examples_lib
from electra_jax.data import packing
from electra_jax.errors import DataError
from electra_jax.data.tokenizer import Tokenizer

CHUNK_CHARS = 1 << 20
SHARD_BYTES = 64 << 20
PARTIAL = '.electra_data.partial'  # in a gs:// output while it is built: --overwrite may remove what a failed job left


@dataclasses.dataclass(frozen=True)
class Packing:
  """How text becomes examples, besides the tokenizer: what a build's manifest records and a cache's key holds."""
  max_length: int
  seed: int = 0
  long_lines: str = 'split'  # a line longer than an example: packing.LONG_LINES
  chunk_chars: int = CHUNK_CHARS


@dataclasses.dataclass
class PackedChunk:
  """The examples of one chunk of documents, with counts for the corpus statistics."""
  input_ids: np.ndarray  # [examples, max_length] int32
  segment_ids: np.ndarray  # [examples, max_length] int32
  documents: int
  source_tokens: int  # tokens the tokenizer produced, before packing drops any


def chunk_documents(documents: Iterable[list[str]], chunk_chars: int = CHUNK_CHARS) -> Iterator[list[list[str]]]:
  """Groups consecutive documents into chunks of at least `chunk_chars` characters (the last may be smaller)."""
  chunk, size = [], 0
  for document in documents:
    chunk.append(document)
    size += sum(len(line) for line in document)
    if size >= chunk_chars:
      yield chunk
      chunk, size = [], 0
  if chunk:
    yield chunk


def source_chunks(source, chunk_chars: int = CHUNK_CHARS) -> Iterator[list[list[str]]]:
  """The chunks of `source` in order: those of each of its text files in turn, else of its documents."""
  files = getattr(source, 'files', None)
  if files is None:
    return chunk_documents(source.documents(), chunk_chars)
  return (chunk for path in files for chunk in chunk_documents(corpus.read_documents([path]), chunk_chars))


def pack_chunk(tokenizer: Tokenizer, documents: list[list[str]], index: int, how: Packing) -> PackedChunk:
  """Tokenizes (one batched call) and packs chunk number `index`."""
  ids = tokenizer.encode([line for document in documents for line in document])
  tokenized, start = [], 0
  for document in documents:
    tokenized.append(ids[start:start + len(document)])
    start += len(document)
  input_ids, segment_ids = packing.pack_documents(tokenized, tokenizer.special, how.max_length,
                                                  seed=f'{how.seed}:{index}', long_lines=how.long_lines)
  return PackedChunk(input_ids, segment_ids, len(documents), sum(len(sentence) for sentence in ids))


_worker_tokenizer = None


def _init_worker(tokenizer: Tokenizer):
  global _worker_tokenizer
  os.environ['TOKENIZERS_PARALLELISM'] = 'false'  # read at each batch encode: one thread per worker
  _worker_tokenizer = tokenizer


def _pack_in_worker(args) -> PackedChunk:
  return pack_chunk(_worker_tokenizer, *args)


def pack_source(source, tokenizer: Tokenizer, how: Packing, processes: int = 1) -> Iterator[PackedChunk]:
  """Packed chunks of `source` (a corpus.TextFiles or TfdsText) in order, packed by `processes` processes.

  This process reads the text; with processes > 1, worker processes tokenize and pack, a bounded number of chunks
  ahead so memory stays flat on any corpus size.
  """
  tasks = ((chunk, i, how) for i, chunk in enumerate(source_chunks(source, how.chunk_chars)))
  first = list(itertools.islice(tasks, 2))
  tasks = itertools.chain(first, tasks)
  if processes <= 1 or len(first) < 2:  # one chunk: not worth starting processes
    for task in tasks:
      yield pack_chunk(tokenizer, *task)
    return
  # Each worker tokenizes single-threaded: the processes are the parallelism.
  worker_tokenizer = type(tokenizer)(tokenizer.model_file, tokenizer.lowercase, 1)
  # spawn, not fork: the parent may run JAX or tokenizer threads, which fork would copy mid-operation.
  context = multiprocessing.get_context('spawn')
  with context.Pool(processes, initializer=_init_worker, initargs=(worker_tokenizer,)) as pool:
    pending = collections.deque()
    for task in tasks:
      pending.append(pool.apply_async(_pack_in_worker, (task,)))
      if len(pending) >= 2 * processes:
        yield pending.popleft().get()
    while pending:
      yield pending.popleft().get()


def pack_in_memory(source, tokenizer: Tokenizer, how: Packing, processes: int = 1,
                   progress: bool = False) -> examples_lib.InMemoryExamples:
  """All examples of `source` in memory (the streaming path for small corpora); `progress` shows a bar of the
  chunks, documents and examples packed so far on stderr."""
  chunks, documents, examples = [], 0, 0
  with tqdm.tqdm(desc='packing', bar_format='{desc}: {n} chunks of text [{elapsed}{postfix}]', disable=not progress,
                 mininterval=0.5 if sys.stderr.isatty() else 30.0) as bar:
    for chunk in pack_source(source, tokenizer, how, processes):
      documents, examples = documents + chunk.documents, examples + len(chunk.input_ids)
      bar.set_postfix(documents=documents, examples=examples, refresh=False)
      bar.update(1)
      if len(chunk.input_ids):
        chunks.append(chunk)
  if not chunks:
    raise corpus.no_text(source)
  return examples_lib.InMemoryExamples(np.concatenate([c.input_ids for c in chunks]),
                                       np.concatenate([c.segment_ids for c in chunks]))


def chunk_counts(chunk: PackedChunk, tokenizer: Tokenizer, max_length: int) -> collections.Counter:
  """What one chunk adds to the corpus statistics: integer counts, summed over chunks in any order."""
  stats = examples_lib.Statistics(tokenizer.special, max_length)
  stats.add(chunk.input_ids, chunk.segment_ids)
  return collections.Counter(documents=chunk.documents, source_tokens=chunk.source_tokens, examples=stats.examples,
                             tokens=stats.tokens, content=stats.content, unknown=stats.unknown, single=stats.single)


def manifest(source, tokenizer: Tokenizer, how: Packing, *, shards: list[dict], counts: collections.Counter,
             started: float, **builder) -> dict:
  """The metadata of a built directory (electra_data.json) from its shards and the summed `chunk_counts`; `builder`
  records what built it (processes, runner)."""
  stats = examples_lib.Statistics(tokenizer.special, how.max_length)
  for name in ('examples', 'tokens', 'content', 'unknown', 'single'):
    setattr(stats, name, counts[name])
  statistics = stats.result()
  statistics.update(documents=counts['documents'], source_tokens=counts['source_tokens'],
                    kept_token_fraction=statistics['content_tokens'] / max(1, counts['source_tokens']),
                    skipped=dict(source.skipped))
  return {
      'format': examples_lib.FORMAT, 'version': examples_lib.VERSION,
      'max_seq_length': how.max_length, 'num_examples': counts['examples'],
      'ids_dtype': examples_lib.ids_dtype(tokenizer.vocab_size).name,
      'shards': shards, 'seed': how.seed, 'chunk_chars': how.chunk_chars, 'long_lines': how.long_lines,
      'source': str(source),
      'source_fingerprint': source.fingerprint(),
      'tokenizer': {'type': tokenizer.kind, 'file': tokenizer.file_name, 'fingerprint': tokenizer.fingerprint,
                    'vocab_size': tokenizer.vocab_size, 'lowercase': tokenizer.lowercase},
      'created': datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'),
      'build_seconds': round(time.time() - started, 1), **builder, 'statistics': statistics,
  }


def check_output(output: str, overwrite: bool, remote: bool = False, sources=()):
  """Raises DataError unless `build` may write `output`: new, empty, or an earlier build and `overwrite`, and not
  holding any of the `sources` files (a build replaces the whole directory); gs:// only where `remote` (the Beam
  build)."""
  _check_sources_outside(output, sources)
  if fileio.is_remote(output):
    if not remote:
      raise DataError(f'--output={output}: this build writes local files (array_record writes local files only); '
                      'add --runner=DirectRunner, whose workers upload their shards, or build to a local directory '
                      'and copy it up (`gcloud storage cp -r DIR gs://...`)')
    if fileio.path(output).exists() and not fileio.path(output).is_dir():
      raise DataError(f'{output} exists and is not a directory; choose another --output')
    if fileio.path(output).is_dir() and any(fileio.path(output).iterdir()):
      if not overwrite:
        raise DataError(f'{output} already exists; pass --overwrite to replace it, or choose another --output')
      if not examples_lib.is_built(output) and not (fileio.path(output) / PARTIAL).exists():
        raise DataError(f'{output} is not a dataset built by electra_jax (no {examples_lib.METADATA}); refusing to '
                        'delete it, even with --overwrite: remove it yourself or choose another --output')
    return
  output = os.path.abspath(os.path.expanduser(output))
  if os.path.isdir(output) and not os.listdir(output):
    return
  if os.path.exists(output):
    if not overwrite:
      raise DataError(f'{output} already exists; pass --overwrite to replace it, or choose another --output')
    if os.path.isdir(output) and os.listdir(output) and not examples_lib.is_built(output):
      raise DataError(f'{output} is not a dataset built by electra_jax (no {examples_lib.METADATA}); refusing to '
                      'delete it, even with --overwrite: remove it yourself or choose another --output')
    if not os.path.isdir(output):
      raise DataError(f'{output} exists and is not a directory; choose another --output')


def _check_sources_outside(output: str, sources):
  """Raises DataError if a file of `sources` is `output` or lies under it."""
  root = fileio.resolved(output).rstrip('/')
  for file in sources:
    if fileio.resolved(file) == root or fileio.resolved(file).startswith(root + '/'):
      raise DataError(f'--source file {file} lies in --output={output}, which the build replaces: move the corpus '
                      'out of it, or choose another --output')


def build(source, tokenizer: Tokenizer, output: str, how: Packing, *, processes: int = 0, overwrite: bool = False,
          shard_bytes: int = SHARD_BYTES, progress=None) -> dict:
  """Packs `source` into ArrayRecord shards under `output` (see examples.py); returns the metadata written.

  The shards are written to a temporary directory beside `output`, renamed into place only when complete.
  `processes` 0 uses every CPU core; `progress(metadata_so_far)` is called after each chunk.
  """
  output = os.path.abspath(os.path.expanduser(output))
  check_output(output, overwrite, sources=getattr(source, 'files', None) or ())
  processes = processes or os.cpu_count() or 1
  parent = os.path.dirname(output)
  os.makedirs(parent, exist_ok=True)
  tmp = os.path.join(parent, f'.{os.path.basename(output)}.tmp{os.getpid()}')
  shutil.rmtree(tmp, ignore_errors=True)
  os.makedirs(tmp)
  started = time.time()
  try:
    tokenizer.save(tmp)
    ids_dtype = examples_lib.ids_dtype(tokenizer.vocab_size)
    record_bytes = how.max_length * (ids_dtype.itemsize + 1)
    writer = examples_lib.ShardWriter(tmp, max_length=how.max_length, vocab_size=tokenizer.vocab_size,
                                      shard_examples=max(1, shard_bytes // record_bytes))
    counts = collections.Counter()
    for chunk in pack_source(source, tokenizer, how, processes):
      writer.write(chunk.input_ids, chunk.segment_ids)
      counts.update(chunk_counts(chunk, tokenizer, how.max_length))
      if progress:
        progress(dict(counts))
    shards = writer.close()
    if not counts['examples']:
      raise corpus.no_text(source)
    metadata = manifest(source, tokenizer, how, shards=shards, counts=counts, started=started, processes=processes)
    examples_lib.write_metadata(tmp, metadata)
    examples_lib.ArrayRecordExamples(tmp)  # checks that every shard reads back with its count
    if os.path.exists(output):
      shutil.rmtree(output)
    os.replace(tmp, output)
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  return metadata
