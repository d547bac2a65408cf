"""A deterministic, shuffling, resumable batch iterator over packed examples held in memory.

Batch b of epoch e takes rows perm_e[b*B:(b+1)*B] of a permutation seeded by (seed, e); process p of P keeps
its contiguous share of those rows. The iterator's state is two integers (epoch, batch), saved with every
checkpoint, so a resumed run sees exactly the batches an uninterrupted run would.
"""

import numpy as np

from electra_jax.masking import SpecialIds


class BatchIterator:
  """Yields {input_ids, segment_ids, input_mask} [local_batch, length] int32 batches forever."""

  def __init__(self, input_ids: np.ndarray, segment_ids: np.ndarray, special: SpecialIds, *, batch_size: int,
               seed: int, process_index: int = 0, process_count: int = 1):
    if batch_size % process_count:
      raise ValueError(f'batch_size {batch_size} is not divisible by the {process_count} processes')
    if len(input_ids) < batch_size:
      raise ValueError(f'the corpus packs into {len(input_ids)} examples, fewer than one batch of {batch_size}; '
                       'give more text or lower batch_size')
    self.input_ids, self.segment_ids, self.special = input_ids, segment_ids, special
    self.batch_size, self.seed = batch_size, seed
    local = batch_size // process_count
    self.rows = slice(process_index * local, (process_index + 1) * local)
    self.batches_per_epoch = len(input_ids) // batch_size
    self.epoch, self.batch = 0, 0
    self._perm_epoch, self._perm = -1, None

  def _permutation(self) -> np.ndarray:
    if self._perm_epoch != self.epoch:
      self._perm = np.random.default_rng([self.seed, self.epoch]).permutation(len(self.input_ids))
      self._perm_epoch = self.epoch
    return self._perm

  def __iter__(self):
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    start = self.batch * self.batch_size
    index = self._permutation()[start:start + self.batch_size][self.rows]
    self.batch += 1
    if self.batch == self.batches_per_epoch:
      self.epoch, self.batch = self.epoch + 1, 0
    input_ids = self.input_ids[index]
    return {'input_ids': input_ids, 'segment_ids': self.segment_ids[index],
            'input_mask': (input_ids != self.special.pad).astype(np.int32)}

  def get_state(self) -> dict[str, int]:
    return {'epoch': self.epoch, 'batch': self.batch}

  def set_state(self, state: dict[str, int]):
    self.epoch, self.batch = int(state['epoch']), int(state['batch'])
