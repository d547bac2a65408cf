"""`data build --runner=...`: build.py's chunk -> pack -> write as an Apache Beam pipeline, for Beam's local runner or
a distributed one (Dataflow, Flink, Spark), with the same examples, order and shard bytes as the local build.

The pipeline (chunk i is still packed with seed f'{seed}:{i}', so nothing depends on which worker packs it):
  1. each text file -> how many chunks it holds (read, not tokenized) -> the index of each file's first chunk;
  2. each text file -> its chunks, tokenized and packed (build.pack_chunk), with their statistics counts;
  3. each chunk's example count -> its first example's index -> its rows cut into the pieces of each shard (shard k
     holds examples [k * shard_examples, (k + 1) * shard_examples), as build.ShardWriter cuts them);
  4. each shard written whole by one worker on its local disk (array_record writes local files only) and, where
     the output is gs://, uploaded; its size and sha256 recorded;
  5. once every shard is written (a side input waits for all of them): the manifest, electra_data.json, which is
     what makes a directory read as a dataset. A failed job leaves none. A local output is built in a hidden
     directory beside it and renamed into place after the job, as build.build does; so is a gs:// output that
     replaces an earlier build (--overwrite: moved into place once whole, so a failed job keeps the earlier one).
Steps 1-2 are parallel over files: give a corpus of at least as many files as workers.
"""

import collections
import contextlib
import os
import re
import shutil
import tempfile
import time

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
import numpy as np

from electra_jax import fileio
from electra_jax.data import build as build_lib
from electra_jax.data import corpus
from electra_jax.data import examples as examples_lib
from electra_jax.data import tokenizer as tokenizer_lib
from electra_jax.errors import DataError

LOCAL_RUNNERS = ('DirectRunner', 'PrismRunner')


def count_chunks(path: str, chunk_chars: int) -> int:
  return sum(1 for _ in build_lib.chunk_documents(corpus.read_documents([path]), chunk_chars))


def first_indices(counts: list[tuple[int, int]]) -> np.ndarray:
  """[n + 1] int64 prefix sums of (number, count) pairs for numbers 0..n-1: where each one's items start."""
  sizes = np.zeros(len(counts), np.int64)
  for number, count in counts:
    sizes[number] = count
  return np.concatenate([[0], np.cumsum(sizes)])


class PackFile(beam.DoFn):
  """(file number, path) -> (chunk index, build.PackedChunk, build.chunk_counts) for each chunk of the file."""

  def __init__(self, tokenizer_dir: str, how: build_lib.Packing):
    self.tokenizer_dir, self.how = tokenizer_dir, how

  def setup(self):
    os.environ['TOKENIZERS_PARALLELISM'] = 'false'  # one thread per worker, as the local build's processes
    self.tokenizer = tokenizer_lib.load(self.tokenizer_dir, num_threads=1)

  def process(self, file, first_chunks):
    number, path = file
    chunks = build_lib.chunk_documents(corpus.read_documents([path]), self.how.chunk_chars)
    for index, documents in enumerate(chunks, int(first_chunks[number])):
      chunk = build_lib.pack_chunk(self.tokenizer, documents, index, self.how)
      counts = build_lib.chunk_counts(chunk, self.tokenizer, self.how.max_length)
      # As the shards store them (uint16 ids for a vocabulary up to 65536, uint8 segments): a third of the int32
      # arrays, which a local runner holds in memory until every chunk is packed.
      chunk.input_ids = chunk.input_ids.astype(examples_lib.ids_dtype(self.tokenizer.vocab_size))
      chunk.segment_ids = chunk.segment_ids.astype(np.uint8)
      yield index, chunk, counts


def shard_pieces(packed, first_examples, shard_examples: int):
  """(chunk index, chunk, _) -> (shard number, (first row, input_ids, segment_ids)) for each shard it reaches."""
  index, chunk, _ = packed
  start, end = int(first_examples[index]), int(first_examples[index + 1])
  row = start
  while row < end:
    shard = row // shard_examples
    stop = min(end, (shard + 1) * shard_examples)
    yield shard, (row, chunk.input_ids[row - start:stop - start], chunk.segment_ids[row - start:stop - start])
    row = stop


class WriteShard(beam.DoFn):
  """(shard number, pieces) -> (shard number, its manifest entry), the shard written under `directory`."""

  def __init__(self, directory: str, *, max_length: int, vocab_size: int, shard_examples: int):
    self.directory, self.max_length, self.vocab_size = directory, max_length, vocab_size
    self.shard_examples = shard_examples

  def process(self, shard_pieces):
    shard, pieces = shard_pieces
    pieces = sorted(pieces, key=lambda piece: piece[0])
    remote = fileio.is_remote(self.directory)
    with tempfile.TemporaryDirectory(prefix='electra_jax_shard_') as local:
      writer = examples_lib.ShardWriter(local if remote else self.directory, max_length=self.max_length,
                                        vocab_size=self.vocab_size, shard_examples=self.shard_examples, first=shard)
      writer.write(np.concatenate([p[1] for p in pieces]), np.concatenate([p[2] for p in pieces]))
      (entry,) = writer.close()
      if remote:
        fileio.copy(os.path.join(local, entry['file']), fileio.path(self.directory) / entry['file'])
    yield shard, entry


def sum_counts(counts) -> collections.Counter:
  total = collections.Counter()
  for count in counts:
    total.update(count)
  return total


def write_manifest(_, shards, counts, *, source, directory: str, how: build_lib.Packing, started: float,
                   runner: str):
  """Writes electra_data.json into `directory` once every shard is there; nothing when no text was packed."""
  counts = collections.Counter(counts)  # Beam's coder may hand a Counter back as a dict
  if not counts['examples']:
    return
  tokenizer = tokenizer_lib.load(directory)
  metadata = build_lib.manifest(source, tokenizer, how, shards=[entry for _, entry in sorted(shards)], counts=counts,
                                started=started, runner=runner)
  examples_lib.write_metadata(directory, metadata)


def build(source, tokenizer: tokenizer_lib.Tokenizer, output: str, how: build_lib.Packing, *, runner: str,
          pipeline_args=(), processes: int = 0, overwrite: bool = False,
          shard_bytes: int = build_lib.SHARD_BYTES) -> dict:
  """build.build on Beam runner `runner` with its options `pipeline_args` (e.g. ['--project=P', '--region=R']):
  the same shards; returns the metadata written. `processes` is the local runner's worker count (0: one per core).
  """
  files = getattr(source, 'files', None)
  if files is None:
    raise DataError(f'--runner builds text files; {source} is not (tensorflow-datasets sources build without '
                    '--runner)')
  remote = fileio.is_remote(output)
  if runner not in LOCAL_RUNNERS and not (remote and all(fileio.is_remote(f) for f in files)):
    raise DataError(f'--runner={runner} runs on other machines: give the corpus and --output on gs:// (a local '
                    'path names a file on each worker, not this machine)')
  build_lib.check_output(output, overwrite, remote=True, sources=files)
  with _pipeline_errors(parsing=True):
    options = PipelineOptions(_runner_flags(runner, processes, pipeline_args))
    unknown = set(options.get_all_options(retain_unknown_options=True)) - set(options.get_all_options())
  if unknown:  # Beam would log them and go on without them
    raise DataError(f'--{", --".join(sorted(unknown))}: not an option of data build nor of Apache Beam\'s runners; '
                    'check the spelling')
  started = time.time()
  replacing = remote and fileio.path(output).exists()  # an earlier build (check_output)
  discard = replacing  # the build made beside it, unless it has replaced it (or could not: _swap)
  if remote:  # over an earlier build, built beside it and moved into place once complete: a failure keeps it
    parent, name = os.path.split(output.rstrip('/'))
    directory = f'{parent}/.{name}.tmp{os.getpid()}' if replacing else output
  else:
    output = os.path.abspath(os.path.expanduser(output))
    os.makedirs(os.path.dirname(output), exist_ok=True)
    directory = os.path.join(os.path.dirname(output), f'.{os.path.basename(output)}.tmp{os.getpid()}')
    shutil.rmtree(directory, ignore_errors=True)
  try:
    if remote:
      fileio.write_text(fileio.path(directory) / build_lib.PARTIAL, 'a data build is writing here\n')
    tokenizer.save(directory)
    record_bytes = how.max_length * (examples_lib.ids_dtype(tokenizer.vocab_size).itemsize + 1)
    shard_examples = max(1, shard_bytes // record_bytes)
    with _pipeline_errors(), beam.Pipeline(options=options) as pipeline:
      numbered = pipeline | 'files' >> beam.Create(list(enumerate(files))) | 'spread files' >> beam.Reshuffle()
      first_chunks = (numbered
                      | 'count chunks' >> beam.Map(lambda file: (file[0], count_chunks(file[1], how.chunk_chars)))
                      | 'all chunk counts' >> beam.combiners.ToList()
                      | 'first chunks' >> beam.Map(first_indices))
      packed = numbered | 'pack' >> beam.ParDo(
          PackFile(directory, how),
          first_chunks=beam.pvalue.AsSingleton(first_chunks))
      first_examples = (packed
                        | 'example counts' >> beam.Map(lambda p: (p[0], p[2]['examples']))
                        | 'all example counts' >> beam.combiners.ToList()
                        | 'first examples' >> beam.Map(first_indices))
      counts = packed | 'counts' >> beam.Map(lambda p: p[2]) | 'sum counts' >> beam.CombineGlobally(sum_counts)
      shards = (packed
                | 'cut into shards' >> beam.FlatMap(shard_pieces, beam.pvalue.AsSingleton(first_examples),
                                                    shard_examples)
                | 'group shards' >> beam.GroupByKey()
                | 'write shards' >> beam.ParDo(WriteShard(directory, max_length=how.max_length,
                                                          vocab_size=tokenizer.vocab_size,
                                                          shard_examples=shard_examples)))
      _ = (pipeline
           | 'once' >> beam.Create([None])
           | 'manifest' >> beam.Map(write_manifest, beam.pvalue.AsList(shards), beam.pvalue.AsSingleton(counts),
                                    source=source, directory=directory, how=how, started=started, runner=runner))
    if not examples_lib.is_built(directory):
      raise corpus.no_text(source)
    metadata = examples_lib.read_metadata(directory)
    if remote:
      (fileio.path(directory) / build_lib.PARTIAL).unlink()
      if replacing:
        discard = False  # from here on the new build is kept, whatever happens
        _swap(directory, output, metadata)
    else:
      examples_lib.ArrayRecordExamples(directory)  # checks that every shard reads back with its count
      if os.path.exists(output):
        shutil.rmtree(output)
      os.replace(directory, output)
  finally:
    if not remote:
      shutil.rmtree(directory, ignore_errors=True)
    elif discard:  # a failed job over an earlier build: the earlier one stays
      fileio.rmtree(directory)
  return metadata


def _swap(staged: str, output: str, metadata: dict):
  """Replaces the earlier build `output` with the whole new one `staged` (gs://), its manifest last, so that
  neither reads as a dataset half-written. If that fails, the new build stays whole where it was built and `output`
  is marked as a build in progress (which --overwrite replaces); the DataError says so."""
  try:
    (fileio.path(output) / examples_lib.METADATA).unlink(missing_ok=True)
    fileio.rmtree(output)
    (fileio.path(staged) / examples_lib.METADATA).unlink()
    fileio.move(staged, output)
    examples_lib.write_metadata(output, metadata)
  except BaseException as e:  # Ctrl-C too: say where the build is
    with contextlib.suppress(Exception):
      fileio.write_text(fileio.path(output) / build_lib.PARTIAL, 'a data build is writing here\n')
      (fileio.path(output) / examples_lib.METADATA).unlink(missing_ok=True)
    with contextlib.suppress(Exception):
      if not examples_lib.is_built(staged):
        examples_lib.write_metadata(staged, metadata)
    why = fileio.describe(e) if isinstance(e, OSError) else type(e).__name__
    raise DataError(f'the new build is whole in {staged}, but replacing {output} with it failed ({why}): move it '
                    f'there (gcloud storage mv {staged} {output}, after removing {output}), or run the same command '
                    'again') from None


@contextlib.contextmanager
def _pipeline_errors(parsing: bool = False):
  """A failed pipeline as one line: a worker's DataError (Beam wraps it in its own errors), or Beam's refusal of
  its options: argparse's exit after printing its usage, its validator's ValueError when the pipeline starts, any
  ValueError while `parsing` them."""
  try:
    yield
  except (DataError, KeyboardInterrupt):
    raise
  except (Exception, SystemExit) as e:  # pylint: disable=broad-except
    text = str(e)
    worker = re.search(r'DataError: ([^\n]+)', text)
    if worker:
      raise DataError(worker.group(1)) from None
    if isinstance(e, SystemExit) or isinstance(e, ValueError) and (
        parsing or text.startswith('Pipeline has validations errors')):
      raise DataError(f'Apache Beam refused the pipeline\'s options: {" ".join(text.split())[:400]}') from None
    raise


def _runner_flags(runner: str, processes: int, pipeline_args) -> list[str]:
  """Beam's flags: the runner, the user's own, and for DirectRunner its worker count (processes, unless given)."""
  flags = [f'--runner={runner}', *pipeline_args]
  if runner == 'DirectRunner' and not any(a.startswith('--direct_num_workers') for a in pipeline_args):
    workers = processes or os.cpu_count() or 1
    flags.append(f'--direct_num_workers={workers}')
    if workers > 1 and not any(a.startswith('--direct_running_mode') for a in pipeline_args):
      flags.append('--direct_running_mode=multi_processing')
  return flags
