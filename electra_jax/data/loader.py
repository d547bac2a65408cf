"""A deterministic, shuffling, resumable batch iterator over packed examples, built on grain.

The example order is grain's `MapDataset.range(N).shuffle(seed).repeat()`: a new permutation each epoch (grain
seeds it with seed + epoch), the stream running on across epoch ends so no example is dropped. Global batch b is
elements [b*B, (b+1)*B) of that stream; each process takes the rows of it that its devices hold (`rows`:
`sharding.local_rows`, process p's p-th block of B/P rows unless jax laid the devices out otherwise), so the local
batches of the processes partition each global batch, each process reads only its own rows, and row r of a global
batch is at position r on the devices whatever the number of processes. The iterator state
saved with every checkpoint is grain's ({'next_index': batches consumed}) plus the number and a fingerprint of the
examples as a check, so a resumed run sees exactly the batches an uninterrupted one would, or is refused. In-memory
and on-disk examples (examples.py) go through the same pipeline: the same examples and seed give the same batches.

A store that holds one host's share of a built dataset's shards (`host_part` = (p, P): a gs:// dataset read by P
processes, each copying only its own shards) is read by that process alone: its own permutation of its own
examples (seeded by seed and p), B/P of them per batch. The order then depends on P, so the state records P and a
checkpoint resumes only on as many processes.
"""

import hashlib

import numpy as np

from electra_jax.errors import DataError
from electra_jax.masking import SpecialIds


def shuffle_seed(seed: int, host: int | None = None) -> int:
  """A 32-bit grain shuffle seed; hashed because grain uses seed + epoch, which would make run s+1 replay run s."""
  name = f'electra_jax.loader:{seed}' + ('' if host is None else f':host{host}')
  return int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], 'little')


class BatchIterator:
  """Yields {input_ids, segment_ids, input_mask} [batch_size // process_count, length] int32 batches forever.

  `examples` is any store with `len()` and `read(indices)` (examples.InMemoryExamples, ArrayRecordExamples).
  `rows`: the rows of each global batch this process reads (`sharding.local_rows`; default its process_index-th
  block). `threads` read upcoming batches in the background, at most `prefetch` batches ahead.
  """

  def __init__(self, examples, special: SpecialIds, *, batch_size: int, seed: int, process_index: int = 0,
               process_count: int = 1, rows: np.ndarray | None = None, threads: int = 2, prefetch: int = 8):
    # grain imports jax and orbax (seconds): only the trainer's process needs it, not the CLI or packing workers.
    import grain  # noqa: PLC0415
    if batch_size % process_count:
      raise DataError(f'batch_size {batch_size} is not divisible by the {process_count} processes')
    self.host_part = getattr(examples, 'host_part', None)
    if len(examples) < (batch_size // process_count if self.host_part else batch_size):
      raise DataError(f'the corpus packs into {len(examples)} examples, fewer than one batch of {batch_size}; '
                       'give more text or lower batch_size')
    self.examples, self.special = examples, special
    self.batch_size, self.seed = batch_size, seed
    if self.host_part is None:
      local = batch_size // process_count
      rows = np.arange(process_index * local, (process_index + 1) * local) if rows is None else np.asarray(rows)
      if len(rows) != local:
        raise ValueError(f'{len(rows)} rows of each batch of {batch_size} given to one of {process_count} processes')
      # Global batch k is examples [k * batch_size, (k + 1) * batch_size) of the stream, and this process holds its
      # `rows`, those its devices take (sharding.global_batch places them there): every process count trains on
      # the same global batches, row for row, and a checkpoint's position (batches taken) means the same under any
      # process count.
      dataset = (grain.MapDataset.range(len(examples)).shuffle(seed=shuffle_seed(seed)).repeat()
                 .batch(batch_size, batch_fn=np.asarray))
      if local < batch_size:
        dataset = dataset.map(lambda indices: indices[rows])
    else:  # this process's own shards, in an order of its own (another process count is refused on resume)
      if self.host_part != (process_index, process_count):
        raise ValueError(f'the examples of process {self.host_part} given to process {process_index, process_count}')
      dataset = (grain.MapDataset.range(len(examples)).shuffle(seed=shuffle_seed(seed, process_index)).repeat()
                 .batch(batch_size // process_count, batch_fn=np.asarray))
    dataset = dataset.map(self._read)
    options = grain.ReadOptions(num_threads=threads, prefetch_buffer_size=prefetch)
    self._iterator = iter(dataset.to_iter_dataset(options))

  def _read(self, indices: np.ndarray) -> dict[str, np.ndarray]:
    return read_batch(self.examples, indices, self.special)

  def __iter__(self):
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    return next(self._iterator)

  def _dataset_size(self) -> int:
    """Examples in the whole dataset (a store of one host's shards holds fewer)."""
    return getattr(self.examples, 'dataset_size', len(self.examples))

  def get_state(self) -> dict:
    """JSON-serialisable position: grain's iterator state, and the number and fingerprint of the examples."""
    state = {'grain': self._iterator.get_state(), 'num_examples': self._dataset_size(),
             'examples': self.examples.fingerprint}
    if self.host_part is not None:
      state['host_shards_of'] = self.host_part[1]
    return state

  def set_state(self, state: dict):
    if not state:  # an import's step 0 (electra_jax.convert): no data read yet, start at the beginning
      return
    if 'grain' not in state:
      raise DataError(f'the checkpoint holds a data position {state} from an older loader; resume it with the '
                      'electra_jax version that wrote it, or start a new --workdir')
    saved, now = state.get('host_shards_of'), None if self.host_part is None else self.host_part[1]
    if saved != now:
      raise DataError(f'the checkpoint was written with {_reading(saved)}, but this run has {_reading(now)}: the '
                      'examples would come in another order. Resume it on the number of processes (and with the '
                      'data.source) it was written with, or start a new --workdir')
    if state['num_examples'] != self._dataset_size():
      raise DataError(f'the checkpoint was written while data.source packed into {state["num_examples"]} examples, '
                      f'but it now packs into {self._dataset_size()}: the corpus changed. Restore it, or start a '
                      'new --workdir')
    # Kept: version 0.1.0 wrote checkpoints without the fingerprint for a day; they resume unchecked.
    if state.get('examples', self.examples.fingerprint) != self.examples.fingerprint:
      raise DataError('the checkpoint was written on other examples than data.source now gives (its text or the '
                      'built dataset changed, though not its size). Restore it, or start a new --workdir')
    self._iterator.set_state(state['grain'])


def read_batch(examples, indices: np.ndarray, special) -> dict[str, np.ndarray]:
  """The examples at `indices` as a batch {input_ids, segment_ids, input_mask}, each [len(indices), length]."""
  input_ids, segment_ids = examples.read(indices)
  return {'input_ids': input_ids, 'segment_ids': segment_ids, 'input_mask': (input_ids != special.pad).astype(np.int32)}


def _reading(processes: int | None) -> str:
  if processes:
    return f'each of {processes} processes reading its own shards of the built data.source'
  return 'every process reading from the whole of data.source'
