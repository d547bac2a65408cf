"""Examples -> fixed-shape model inputs, and batches over them.

Every task becomes `input_ids`, `segment_ids`, `input_mask` [n, length] int32 plus its targets:
  classification  `labels` [n] int32 class ids (-1: unlabelled)
  regression      `labels` [n] float32, the target scaled as the task says (STS-B: / 5; NaN: unlabelled)
  tagging         `labels` [n, length] int32 tag id at the first sub-token of each word, -1 elsewhere
  squad           `start_positions`, `end_positions` [n] int32, `is_impossible` [n] float32 (see squad.py)
Sequences are `[CLS] a [SEP] (b [SEP])`, segment 0 then 1 (tagging: all 1, as the official code), padded to the
split's longest sequence rounded up to a multiple of 16 (at most max_seq_length): short-sentence tasks run much
faster than at a fixed 128.
"""

import dataclasses
from typing import Any, Iterator

import numpy as np

from electra_jax.data.tokenizer import Tokenizer
from electra_jax.finetune import tasks as tasks_lib


@dataclasses.dataclass
class Features:
  """The model inputs of one split (`arrays`, all with leading dimension n) and how they map to examples.

  `example_index` [n] is the example each row came from (SQuAD windows and swapped pairs repeat examples);
  `word_positions` (tagging) holds, per row, the token position of each word kept after truncation;
  `windows` (SQuAD) the per-row token -> word maps that decode answer spans.
  """
  arrays: dict[str, np.ndarray]
  examples: list
  example_index: np.ndarray
  word_positions: list[np.ndarray] | None = None
  windows: list[Any] | None = None

  def __len__(self) -> int:
    return len(self.example_index)


def pad_length(longest: int, max_seq_length: int) -> int:
  return min(max_seq_length, -(-longest // 16) * 16)


def pack(sequences: list[list[int]], segments: list[list[int]], length: int) -> dict[str, np.ndarray]:
  """Lists of token ids and segment ids -> padded input_ids, segment_ids, input_mask [n, length] (pad id 0)."""
  n = len(sequences)
  input_ids = np.zeros((n, length), np.int32)
  segment_ids = np.zeros((n, length), np.int32)
  input_mask = np.zeros((n, length), np.int32)
  for i, (ids, segs) in enumerate(zip(sequences, segments)):
    input_ids[i, :len(ids)], segment_ids[i, :len(ids)], input_mask[i, :len(ids)] = ids, segs, 1
  return {'input_ids': input_ids, 'segment_ids': segment_ids, 'input_mask': input_mask}


def truncate_pair(a: list[int], b: list[int], max_tokens: int) -> tuple[list[int], list[int]]:
  """Drops tokens from the end of the longer sequence until len(a) + len(b) <= max_tokens (as BERT does)."""
  a, b = list(a), list(b)
  while len(a) + len(b) > max_tokens:
    (a if len(a) > len(b) else b).pop()
  return a, b


def encode_texts(task: tasks_lib.Task, examples: list[tasks_lib.TextExample], tokenizer: Tokenizer,
                 max_seq_length: int, *, training: bool) -> Features:
  """Single sentences or pairs; with `task.both_orders`, training also sees every pair swapped."""
  special = tokenizer.special
  first = tokenizer.encode([e.texts[0] for e in examples])
  second = tokenizer.encode([e.texts[1] if len(e.texts) > 1 else '' for e in examples])
  pairs = [(i, a, b) for i, (a, b) in enumerate(zip(first, second))]
  if training and task.both_orders:
    pairs += [(i, b, a) for i, a, b in pairs if len(examples[i].texts) > 1]
  sequences, segments = [], []
  for i, a, b in pairs:
    if len(examples[i].texts) > 1:
      a, b = truncate_pair(a, b, max_seq_length - 3)
      sequences.append([special.cls] + a + [special.sep] + b + [special.sep])
      segments.append([0] * (len(a) + 2) + [1] * (len(b) + 1))
    else:
      a = a[:max_seq_length - 2]
      sequences.append([special.cls] + a + [special.sep])
      segments.append([0] * (len(a) + 2))
  arrays = pack(sequences, segments, pad_length(max(map(len, sequences), default=1), max_seq_length))
  index = np.array([i for i, _, _ in pairs], np.int64)
  if task.kind == tasks_lib.REGRESSION:
    values = [np.nan if examples[i].label is None else task.scale(examples[i].label) for i in index]
    arrays['labels'] = np.array(values, np.float32).reshape(-1)
  else:
    ids = {name: k for k, name in enumerate(task.labels)}
    arrays['labels'] = np.array([ids.get(examples[i].label, -1) for i in index], np.int32).reshape(-1)
  return Features(arrays, examples, index)


def encode_words(task: tasks_lib.Task, examples: list[tasks_lib.TaggingExample], tokenizer: Tokenizer,
                 max_seq_length: int) -> Features:
  """Words -> sub-tokens; each word's tag sits on its first sub-token. Words past max_seq_length are cut."""
  special = tokenizer.special
  pieces = tokenizer.encode([w for e in examples for w in e.words]) if examples else []
  ids = {name: k for k, name in enumerate(task.labels)}
  sequences, segments, positions, tag_rows = [], [], [], []
  offset = 0
  for e in examples:
    tokens, kept, tags = [special.cls], [], []
    for j, word in enumerate(pieces[offset:offset + len(e.words)]):
      word = word or [special.unk]
      if len(tokens) + len(word) > max_seq_length - 1:
        break
      kept.append(len(tokens))
      tags.append(ids.get(e.tags[j], -1) if e.tags else -1)
      tokens += word
    offset += len(e.words)
    tokens.append(special.sep)
    sequences.append(tokens)
    segments.append([1] * len(tokens))  # segment 1 throughout, as the official tagging featurizer
    positions.append(np.array(kept, np.int32))
    tag_rows.append(tags)
  arrays = pack(sequences, segments, pad_length(max(map(len, sequences), default=1), max_seq_length))
  labels = np.full(arrays['input_ids'].shape, -1, np.int32)
  for i, (kept, tags) in enumerate(zip(positions, tag_rows)):
    labels[i, kept] = tags
  arrays['labels'] = labels
  return Features(arrays, examples, np.arange(len(examples)), word_positions=positions)


def num_train_steps(num_rows: int, batch_size: int, epochs: float) -> int:
  """int(ceil(rows / batch) * epochs), as the official code counts (it pads the rows to whole batches)."""
  return max(1, int(-(-num_rows // batch_size) * epochs))


def train_batches(arrays: dict[str, np.ndarray], batch_size: int, num_steps: int, seed: int,
                  rows: np.ndarray | None = None, start: int = 0) -> Iterator[dict[str, np.ndarray]]:
  """Batches `start` .. `num_steps` - 1 of rows from consecutive seeded permutations (one per epoch, crossing epoch
  ends): a run resumed at step `start` sees the batches an uninterrupted one would.

  A process gets `rows` of each global batch (`sharding.local_rows`; None: all).
  """
  n = len(next(iter(arrays.values())))
  rows = slice(None) if rows is None else rows
  rng = np.random.default_rng(seed)
  order = np.zeros((0,), np.int64)
  for step in range(num_steps):
    while len(order) < batch_size:
      order = np.concatenate([order, rng.permutation(n)])
    index, order = order[:batch_size][rows], order[batch_size:]
    if step >= start:
      yield {k: v[index] for k, v in arrays.items()}


def eval_batches(arrays: dict[str, np.ndarray], batch_size: int,
                 rows: np.ndarray | None = None) -> Iterator[dict[str, np.ndarray]]:
  """Batches in order, `rows` of each for this process (None: all); the last one is padded with copies of row 0
  (drop them: the first n outputs count)."""
  n = len(next(iter(arrays.values())))
  rows = slice(None) if rows is None else rows
  for start in range(0, n, batch_size):
    index = np.arange(start, start + batch_size)
    index = np.where(index < n, index, 0)[rows]
    yield {k: v[index] for k, v in arrays.items()}
