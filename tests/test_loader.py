"""The batch loader: determinism, epochs, resuming mid-epoch, per-process shares of each global batch."""

import json

import numpy as np
import pytest

from electra_jax.data import BatchIterator, DataError
from electra_jax.data.examples import InMemoryExamples
from helpers import SPECIAL  # pylint: disable=g-bad-import-order

NUM_EXAMPLES, LENGTH = 103, 8


@pytest.fixture(scope='module')
def examples():
  """Example i holds token 10 + i (then padding), so a batch's rows name the examples in it."""
  input_ids = np.zeros((NUM_EXAMPLES, LENGTH), np.int32)
  input_ids[:, 0] = SPECIAL.cls
  input_ids[:, 1] = 10 + np.arange(NUM_EXAMPLES)
  input_ids[:, 2] = SPECIAL.sep
  segment_ids = np.zeros_like(input_ids)
  return InMemoryExamples(input_ids, segment_ids)


def _rows(batch):
  return (batch['input_ids'][:, 1] - 10).tolist()


def _take(iterator, count):
  return [_rows(next(iterator)) for _ in range(count)]


def test_batches(examples):
  batch = next(BatchIterator(examples, SPECIAL, batch_size=4, seed=0))
  assert set(batch) == {'input_ids', 'segment_ids', 'input_mask'}
  assert all(v.shape == (4, LENGTH) and v.dtype == np.int32 for v in batch.values())
  np.testing.assert_array_equal(batch['input_mask'], batch['input_ids'] != SPECIAL.pad)


def test_same_seed_same_stream(examples):
  first = _take(BatchIterator(examples, SPECIAL, batch_size=8, seed=3), 30)
  assert first == _take(BatchIterator(examples, SPECIAL, batch_size=8, seed=3, threads=0), 30)
  assert first != _take(BatchIterator(examples, SPECIAL, batch_size=8, seed=4), 30)


def test_every_epoch_is_a_new_permutation(examples):
  stream = sum(_take(BatchIterator(examples, SPECIAL, batch_size=8, seed=0), 3 * NUM_EXAMPLES // 8 + 1), [])
  epochs = [stream[i * NUM_EXAMPLES:(i + 1) * NUM_EXAMPLES] for i in range(3)]
  for epoch in epochs:
    assert sorted(epoch) == list(range(NUM_EXAMPLES))  # every example once per epoch
  assert len({tuple(epoch) for epoch in epochs}) == 3  # three different orders


@pytest.mark.parametrize('stop', [5, 12, 13, 40])  # mid-epoch, at an epoch end (103 // 8), later epochs
def test_resume_continues_the_stream(examples, stop):
  uninterrupted = _take(BatchIterator(examples, SPECIAL, batch_size=8, seed=1), stop + 10)
  interrupted = BatchIterator(examples, SPECIAL, batch_size=8, seed=1)
  _take(interrupted, stop)
  state = json.loads(json.dumps(interrupted.get_state()))  # as the checkpoint stores it
  resumed = BatchIterator(examples, SPECIAL, batch_size=8, seed=1)
  resumed.set_state(state)
  assert _take(resumed, 10) == uninterrupted[stop:]


@pytest.mark.parametrize('process_count', [2, 4])
def test_processes_partition_each_global_batch(examples, process_count):
  batch_size = 8
  global_batches = _take(BatchIterator(examples, SPECIAL, batch_size=batch_size, seed=2), 30)
  local = [_take(BatchIterator(examples, SPECIAL, batch_size=batch_size, seed=2, process_index=p,
                               process_count=process_count), 30) for p in range(process_count)]
  for step, expected in enumerate(global_batches):
    shares = [local[p][step] for p in range(process_count)]
    assert all(len(share) == batch_size // process_count for share in shares)
    assert sum(shares, []) == expected  # process p holds the p-th block of rows: the 1-process batch, row for row


def test_a_process_reads_the_rows_its_devices_hold(examples):
  """Devices interleaved over 2 processes (as on a TPU slice): process p holds rows p, p+2, ... of each global
  batch (sharding.local_rows), and reads exactly those."""
  global_batches = _take(BatchIterator(examples, SPECIAL, batch_size=8, seed=2), 30)
  for p in range(2):
    rows = np.arange(p, 8, 2)
    local = _take(BatchIterator(examples, SPECIAL, batch_size=8, seed=2, process_index=p, process_count=2, rows=rows),
                  30)
    assert local == [[batch[r] for r in rows] for batch in global_batches]


@pytest.mark.parametrize('before, after', [(2, 1), (4, 2), (1, 4)])
def test_resume_on_another_process_count_continues_the_global_stream(examples, before, after):
  """A checkpoint stores process 0's position (batches taken): under another process count it resumes the same
  global batches."""
  expected = _take(BatchIterator(examples, SPECIAL, batch_size=8, seed=5), 25)
  first = BatchIterator(examples, SPECIAL, batch_size=8, seed=5, process_index=0, process_count=before)
  _take(first, 15)
  state = json.loads(json.dumps(first.get_state()))
  resumed = []
  for p in range(after):
    iterator = BatchIterator(examples, SPECIAL, batch_size=8, seed=5, process_index=p, process_count=after)
    iterator.set_state(state)
    resumed.append(_take(iterator, 10))
  assert [sum((resumed[p][step] for p in range(after)), []) for step in range(10)] == expected[15:]


def test_resuming_on_other_examples_of_the_same_number_is_refused(examples):
  """A checkpoint records the examples' fingerprint: a corpus edited (or a dataset rebuilt) since, even into as
  many examples, is refused rather than resumed at a position that now means other batches."""
  state = json.loads(json.dumps(BatchIterator(examples, SPECIAL, batch_size=8, seed=0).get_state()))
  edited = InMemoryExamples(examples.input_ids.copy(), examples.segment_ids)
  edited.input_ids[5, 1] += 1000
  BatchIterator(InMemoryExamples(examples.input_ids.copy(), examples.segment_ids), SPECIAL, batch_size=8,
                seed=0).set_state(state)  # the same examples: accepted
  with pytest.raises(DataError, match='other examples than data.source now gives'):
    BatchIterator(edited, SPECIAL, batch_size=8, seed=0).set_state(state)


def test_bad_states_and_sizes(examples):
  iterator = BatchIterator(examples, SPECIAL, batch_size=8, seed=0)
  with pytest.raises(DataError, match='older loader'):
    iterator.set_state({'epoch': 0, 'batch': 3})
  with pytest.raises(DataError, match='the corpus changed'):
    iterator.set_state({'grain': {'next_index': 3}, 'num_examples': NUM_EXAMPLES + 1})
  with pytest.raises(ValueError, match='fewer than one batch'):
    BatchIterator(examples, SPECIAL, batch_size=NUM_EXAMPLES + 1, seed=0)
  with pytest.raises(ValueError, match='not divisible'):
    BatchIterator(examples, SPECIAL, batch_size=9, seed=0, process_count=2)
