"""Data pipeline throughput: tokenize+pack tokens/s on one core and with N processes, and loader tokens/s.

  python bench/data_throughput.py [--source='../shared/data/corpus/*.txt.gz'] [--mb_per_file=2] [--processes=2]

Reads the first --mb_per_file MB of text of each file of --source into memory, trains (or loads, --tokenizer) the
tokenizers, then measures: tokenizing and packing in this process with one tokenizer thread (tokens per second
and per CPU-second: the second is what one core gives, whatever else runs on the machine); the same with
--processes worker processes (wall clock, process start-up included); `build` into ArrayRecord shards; and the
grain loader over the built shards and over the same examples in memory (batch 128 x max_seq_length positions).
Prints one markdown table row per measurement.
"""

import argparse
import collections
import os
import resource
import sys
import tempfile
import time

os.environ.setdefault('TOKENIZERS_PARALLELISM', 'false')  # one thread per process: we measure per core
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np

from electra_jax.data import BatchIterator, corpus
from electra_jax.data import build as build_lib
from electra_jax.data import examples as examples_lib
from electra_jax.data import tokenizer as tokenizer_lib


class InMemoryText:
  """Documents already read, behaving as a corpus source (so reading the disk is not measured)."""

  def __init__(self, documents, name):
    self._documents, self.name, self.skipped = documents, name, collections.Counter()

  def __str__(self):
    return self.name

  def documents(self):
    return iter(self._documents)

  def fingerprint(self):
    return [self.name, len(self._documents)]


def read_subset(source: str, mb_per_file: float) -> list[list[str]]:
  documents = []
  for path in corpus.resolve_files(source):
    size = 0
    for document in corpus.read_documents([path]):
      documents.append(document)
      size += sum(len(line) + 1 for line in document)
      if size >= mb_per_file * 1e6:
        break
  return documents


def row(what: str, tokens: float, seconds: float, cpu_seconds: float | None = None, note: str = ''):
  per_cpu = f'{tokens / cpu_seconds / 1e3:,.0f}k' if cpu_seconds else ''
  print(f'| {what} | {tokens / seconds / 1e3:,.0f}k | {per_cpu} | {note} |', flush=True)


def _cpu_with_children() -> float:
  """CPU seconds of this process and of its finished children (the packing workers)."""
  children = resource.getrusage(resource.RUSAGE_CHILDREN)
  return time.process_time() + children.ru_utime + children.ru_stime


def bench_packing(documents, tokenizer, max_length, processes):
  chunks = list(build_lib.chunk_documents(documents))
  lines = [[line for document in chunk for line in document] for chunk in chunks]
  wall, cpu = time.perf_counter(), time.process_time()
  tokens = sum(sum(len(ids) for ids in tokenizer.encode(chunk)) for chunk in lines)
  row(f'{tokenizer.kind}: tokenize, 1 process', tokens, time.perf_counter() - wall, time.process_time() - cpu)
  wall, cpu = time.perf_counter(), time.process_time()
  examples = 0
  for i, chunk in enumerate(chunks):
    packed = build_lib.pack_chunk(tokenizer, chunk, i, build_lib.Packing(max_length))
    examples += len(packed.input_ids)
  row(f'{tokenizer.kind}: tokenize+pack, 1 process', tokens, time.perf_counter() - wall, time.process_time() - cpu,
      f'{examples} examples of {max_length}')
  source = InMemoryText(documents, 'subset')
  wall, cpu = time.perf_counter(), _cpu_with_children()
  first = None  # (time, tokens) when the first chunk came back: the workers have started
  done = 0
  for chunk in build_lib.pack_source(source, tokenizer, build_lib.Packing(max_length), processes):
    done += chunk.source_tokens
    first = first or (time.perf_counter(), done)
  end = time.perf_counter()
  steady = (done - first[1]) / (end - first[0])
  row(f'{tokenizer.kind}: tokenize+pack, {processes} processes', tokens, end - wall, _cpu_with_children() - cpu,
      f'process start-up included; {steady / 1e3:,.0f}k tokens/s after the first chunk')
  return tokens


def bench_loader(examples, special, max_length, seconds, what):
  batches = BatchIterator(examples, special, batch_size=128, seed=0)
  for _ in range(20):
    next(batches)
  count, real = 0, 0
  wall, cpu = time.perf_counter(), time.process_time()
  while time.perf_counter() - wall < seconds:
    batch = next(batches)
    count += 1
    real += int(batch['input_mask'].sum())
  elapsed, cpu = time.perf_counter() - wall, time.process_time() - cpu
  row(f'loader, {what}', count * 128 * max_length, elapsed, cpu,
      f'batch 128 x {max_length}; {real / elapsed / 1e3:,.0f}k non-padding tokens/s')


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--source', default=os.path.join(os.path.dirname(__file__), '../../shared/data/corpus/*.txt.gz'))
  parser.add_argument('--mb_per_file', type=float, default=2.0)
  parser.add_argument('--processes', type=int, default=os.cpu_count())
  parser.add_argument('--max_seq_length', type=int, default=128)
  parser.add_argument('--types', default='wordpiece,unigram', help='tokenizers to train and measure')
  parser.add_argument('--tokenizer', default='', help='measure this tokenizer instead of training')
  parser.add_argument('--vocab_size', type=int, default=30522)
  parser.add_argument('--loader_seconds', type=float, default=10)
  args = parser.parse_args()

  started = time.perf_counter()
  documents = read_subset(args.source, args.mb_per_file)
  size = sum(len(line) + 1 for document in documents for line in document)
  print(f'subset: {len(documents)} documents, {size / 1e6:.1f} MB of text from {args.source}; '
        f'{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}\n')
  print('| measurement | tokens/s | tokens/CPU-s | note |\n|---|---|---|---|')
  with tempfile.TemporaryDirectory() as tmp:
    if args.tokenizer:
      tokenizers = [tokenizer_lib.load(args.tokenizer, num_threads=1)]
    else:
      tokenizers = []
      for kind in args.types.split(','):
        wall = time.perf_counter()
        lines = (line for document in documents for line in document)
        trained = tokenizer_lib.train(lines, os.path.join(tmp, kind), vocab_size=args.vocab_size, kind=kind,
                                      max_sentences=200_000)
        tokenizers.append(tokenizer_lib.load(os.path.join(tmp, kind), num_threads=1))
        print(f'| ({kind} tokenizer of {trained.vocab_size} trained in {time.perf_counter() - wall:.0f} s) | | | |')
    for tokenizer in tokenizers:
      bench_packing(documents, tokenizer, args.max_seq_length, args.processes)
    tokenizer = tokenizers[0]
    wall, cpu = time.perf_counter(), _cpu_with_children()
    metadata = build_lib.build(InMemoryText(documents, 'subset'), tokenizer, os.path.join(tmp, 'built'),
                               build_lib.Packing(args.max_seq_length), processes=args.processes)
    stats = metadata['statistics']
    row(f'{tokenizer.kind}: build (pack + write ArrayRecord), {args.processes} processes', stats['source_tokens'],
        time.perf_counter() - wall, _cpu_with_children() - cpu,
        f'{stats["examples"]} examples, fill {stats["fill_ratio"]:.3f}, kept {stats["kept_token_fraction"]:.3f}')
    built = examples_lib.ArrayRecordExamples(os.path.join(tmp, 'built'))
    bench_loader(built, tokenizer.special, args.max_seq_length, args.loader_seconds, 'ArrayRecord shards')
    in_memory = examples_lib.InMemoryExamples(*built.read(np.arange(len(built))))
    bench_loader(in_memory, tokenizer.special, args.max_seq_length, args.loader_seconds, 'in memory')
  print(f'\ntotal {time.perf_counter() - started:.0f} s; load average now {os.getloadavg()[0]:.1f}')


if __name__ == '__main__':
  main()
