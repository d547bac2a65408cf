"""Stores of packed examples with random access: in memory, or a directory of ArrayRecord shards.

Both give `len()` and `read(indices) -> (input_ids, segment_ids)`, each [len(indices), max_length] int32, which is
all the loader needs, so a built directory and the in-memory path yield the same batches for the same examples.

A built directory holds examples-NNNNN.array_record shards (written with group_size:1 for fast random reads), the
tokenizer they were made with (see `Tokenizer.save`) and electra_data.json: the format, max_seq_length, each
shard's example count, size in bytes and sha256, the tokenizer's fingerprint and corpus statistics. A shard whose
size changed is refused when the directory is opened; `verify()` checks the checksums. One record is input_ids
(uint16, or int32 for a vocabulary over 65536) followed by segment_ids (uint8), max_seq_length of each.
"""

import functools
import hashlib
import json
import os
from typing import Iterable

import numpy as np

from electra_jax import fileio
from electra_jax.errors import DataError
from electra_jax.masking import SpecialIds

METADATA = 'electra_data.json'
FORMAT = 'electra_jax.packed_examples'
VERSION = 2  # 2: over-long lines lose no token (packing.py)
SHARD_PATTERN = 'examples-{:05d}.array_record'


def is_built(path: str) -> bool:
  """Whether `path` (local or gs://) is a directory `build` wrote (recognised by its metadata file). False when it
  cannot be read: reading it as text then says why."""
  try:
    return bool(path) and (fileio.path(path) / METADATA).is_file()
  except fileio.storage_errors():  # no access to the bucket
    return False


def read_metadata(directory: str) -> dict:
  metadata = fileio.read_json(fileio.path(directory) / METADATA, 'rebuild the dataset with `python -m electra_jax.data '
                              'build --overwrite`', DataError)
  if metadata.get('format') != FORMAT or metadata.get('version') != VERSION:
    raise DataError(f'{directory} holds {metadata.get("format")} version {metadata.get("version")}, not '
                    f'{FORMAT} version {VERSION}; rebuild it with `python -m electra_jax.data build`')
  return metadata


def write_metadata(directory: str, metadata: dict):
  fileio.write_json(os.path.join(directory, METADATA), metadata)


class InMemoryExamples:
  """Packed examples held as two [num_examples, max_length] int32 arrays."""

  def __init__(self, input_ids: np.ndarray, segment_ids: np.ndarray):
    self.input_ids, self.segment_ids = input_ids, segment_ids
    self.max_length = input_ids.shape[1]

  @functools.cached_property
  def fingerprint(self) -> str:
    """sha256 of the examples: a checkpoint records it, so resuming on other examples is refused."""
    digest = hashlib.sha256()
    for array in (self.input_ids, self.segment_ids):
      digest.update(np.ascontiguousarray(array, np.int32).tobytes())
    return digest.hexdigest()

  def __len__(self) -> int:
    return len(self.input_ids)

  def read(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return self.input_ids[indices], self.segment_ids[indices]


class ArrayRecordExamples:
  """The examples of a built directory, read on demand from its ArrayRecord shards: all of them, or those of the
  shards numbered `shards` (one host's share, see `host_shards`), in that order."""
  host_part = None  # (process index, process count) when the store is one host's share of the shards

  def __init__(self, directory: str, shards: list[int] | None = None):
    from array_record.python import array_record_module  # noqa: PLC0415
    self.directory = os.path.expanduser(directory)
    self.metadata = read_metadata(self.directory)
    self.max_length = self.metadata['max_seq_length']
    self.ids_dtype = np.dtype(self.metadata['ids_dtype'])
    self.shards = list(range(len(self.metadata['shards']))) if shards is None else list(shards)
    self.readers, sizes = [], []
    for shard in [self.metadata['shards'][i] for i in self.shards]:
      path = os.path.join(self.directory, shard['file'])
      if not os.path.exists(path):
        raise DataError(f'{path} is missing: the built dataset {self.directory} is incomplete; rebuild it')
      if 'bytes' in shard and os.path.getsize(path) != shard['bytes']:
        raise DataError(f'{path} has {os.path.getsize(path)} bytes, {shard["bytes"]} when it was built: the built '
                        f'dataset {self.directory} changed or is damaged; rebuild it')
      reader = array_record_module.ArrayRecordReader(path, 'readahead_buffer_size:0')
      if reader.num_records() != shard['examples']:
        raise DataError(f'{path} holds {reader.num_records()} examples, {shard["examples"]} expected: the built '
                        f'dataset {self.directory} is damaged; rebuild it')
      self.readers.append(reader)
      sizes.append(shard['examples'])
    self.starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    self.record_bytes = self.max_length * (self.ids_dtype.itemsize + 1)
    # What the examples are: the shards' checksums (counts and names for older builds) and how they were made, for
    # the whole dataset (not only the shards this store reads).
    self.fingerprint = hashlib.sha256(json.dumps(
        [self.metadata['shards'], self.metadata['tokenizer']['fingerprint'], self.max_length]).encode()).hexdigest()
    # Of the whole dataset, whatever share this store reads: what a checkpoint's data position is checked against
    # (every process restores the one process 0 saved).
    self.dataset_size = sum(shard['examples'] for shard in self.metadata['shards'])

  def __len__(self) -> int:
    return int(self.starts[-1])

  def verify(self):
    """Raises DataError unless every shard's sha256 is the one recorded when it was built (reads them all)."""
    for shard in [self.metadata['shards'][i] for i in self.shards]:
      path = os.path.join(self.directory, shard['file'])
      if 'sha256' in shard and fileio.sha256(path) != shard['sha256']:
        raise DataError(f'{path} is not the file that was built (its sha256 differs): the built dataset '
                        f'{self.directory} changed or is damaged; rebuild it')

  def read(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    indices = np.asarray(indices, np.int64)
    shards = np.searchsorted(self.starts, indices, side='right') - 1
    records = [b''] * len(indices)
    for shard in np.unique(shards):
      rows = np.flatnonzero(shards == shard)
      positions = (indices[rows] - self.starts[shard]).tolist()
      name = self.metadata['shards'][self.shards[shard]]['file']
      try:
        read = self.readers[shard].read(positions)
      except Exception as e:  # array_record raises RuntimeError and others for a damaged file
        raise DataError(f'reading {name} in {self.directory} failed ({e}): the '
                        'built dataset changed or was damaged while in use; restore or rebuild it') from None
      for row, record in zip(rows, read):
        if len(record) != self.record_bytes:  # a shard truncated or rewritten while we read it
          raise DataError(f'{name} in {self.directory} returned a record of '
                          f'{len(record)} bytes, not {self.record_bytes}: the built dataset changed or was damaged '
                          'while in use. Restore it (or rebuild it and start a new --workdir)')
        records[row] = record
    return decode_records(records, self.max_length, self.ids_dtype)


# How many times the smallest host's share of the shards the largest may hold for the hosts to read their own.
HOST_SHARE_SPREAD = 1.1


def host_shards(shard_examples: list[int], process_index: int, process_count: int) -> list[int] | None:
  """The shards process `process_index` of `process_count` reads, given each shard's example count: every
  process_count-th from its own index. None (all, in the global order) for one process, for fewer shards than
  processes, or when one process's share would hold over HOST_SHARE_SPREAD times another's examples: each process
  draws batch_size / process_count rows of every batch from its own share, so the examples of a share n times smaller
  would be seen n times as often."""
  if process_count == 1 or len(shard_examples) < process_count:
    return None
  shares = [sum(shard_examples[p::process_count]) for p in range(process_count)]
  if max(shares) > HOST_SHARE_SPREAD * min(shares):
    return None
  return list(range(process_index, len(shard_examples), process_count))


def encode_records(input_ids: np.ndarray, segment_ids: np.ndarray, ids_dtype: np.dtype) -> list[bytes]:
  """One record per row of input_ids, segment_ids [n, max_length]."""
  ids = input_ids.astype(ids_dtype).view(np.uint8)
  return [row.tobytes() for row in np.concatenate([ids, segment_ids.astype(np.uint8)], axis=1)]


def decode_records(records: list[bytes], max_length: int, ids_dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
  """(input_ids, segment_ids) [len(records), max_length] int32 from records `encode_records` wrote."""
  width = max_length * ids_dtype.itemsize
  rows = np.frombuffer(b''.join(records), np.uint8).reshape(len(records), width + max_length)
  input_ids = np.ascontiguousarray(rows[:, :width]).view(ids_dtype).astype(np.int32)
  return input_ids, rows[:, width:].astype(np.int32)


def ids_dtype(vocab_size: int) -> np.dtype:
  return np.dtype(np.uint16 if vocab_size <= 2**16 else np.int32)


class ShardWriter:
  """Appends examples to examples-NNNNN.array_record shards of `shard_examples` examples each, numbered from
  `first`."""

  def __init__(self, directory: str, *, max_length: int, vocab_size: int, shard_examples: int, first: int = 0):
    from array_record.python import array_record_module  # noqa: PLC0415
    self._module = array_record_module
    self.directory, self.max_length, self.shard_examples = directory, max_length, shard_examples
    self.ids_dtype = ids_dtype(vocab_size)
    self.shards: list[dict] = []
    self._writer, self._first = None, first

  def write(self, input_ids: np.ndarray, segment_ids: np.ndarray):
    for record in encode_records(input_ids, segment_ids, self.ids_dtype):
      if self._writer is None or self.shards[-1]['examples'] == self.shard_examples:
        self._close_shard()
        name = SHARD_PATTERN.format(self._first + len(self.shards))
        # group_size:1 makes every record directly addressable: random reads touch one record, not a chunk.
        self._writer = self._module.ArrayRecordWriter(os.path.join(self.directory, name),
                                                      'group_size:1,uncompressed')
        self.shards.append({'file': name, 'examples': 0})
      self._writer.write(record)
      self.shards[-1]['examples'] += 1

  def _close_shard(self):
    if self._writer is not None:
      self._writer.close()
      self._writer = None
      path = os.path.join(self.directory, self.shards[-1]['file'])
      self.shards[-1].update(bytes=os.path.getsize(path), sha256=fileio.sha256(path))

  def close(self) -> list[dict]:
    self._close_shard()
    return self.shards


def iterate(examples, block: int = 4096) -> Iterable[tuple[np.ndarray, np.ndarray]]:
  """(input_ids, segment_ids) blocks of `examples` in stored order."""
  for start in range(0, len(examples), block):
    yield examples.read(np.arange(start, min(start + block, len(examples))))


class Statistics:
  """Counts over packed examples: tokens (not [PAD]), fill ratio, unknown-token rate, single-segment fraction."""

  def __init__(self, special: SpecialIds, max_length: int):
    self.special, self.max_length = special, max_length
    self.examples = self.tokens = self.content = self.unknown = self.single = 0

  def add(self, input_ids: np.ndarray, segment_ids: np.ndarray):
    """Counts a block of examples, input_ids and segment_ids [n, max_length]."""
    s = self.special
    real = input_ids != s.pad
    self.examples += len(input_ids)
    self.tokens += int(real.sum())
    self.content += int((real & (input_ids != s.cls) & (input_ids != s.sep)).sum())
    self.unknown += int((input_ids == s.unk).sum())
    self.single += int((segment_ids.max(axis=1, initial=0) == 0).sum())

  def result(self) -> dict:
    return {'examples': self.examples, 'tokens': self.tokens, 'content_tokens': self.content,
            'fill_ratio': self.tokens / max(1, self.examples * self.max_length),
            'unknown_rate': self.unknown / max(1, self.content),
            'single_segment_fraction': self.single / max(1, self.examples)}


def statistics(examples, special: SpecialIds) -> dict:
  """`Statistics` of all of `examples`."""
  stats = Statistics(special, examples.max_length)
  for input_ids, segment_ids in iterate(examples):
    stats.add(input_ids, segment_ids)
  return stats.result()
