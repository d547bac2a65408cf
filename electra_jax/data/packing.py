"""Packing tokenized documents into ELECTRA pre-training examples, as the official builder does.

Official `build_pretraining_dataset.ExampleBuilder`: sentences accumulate until their length reaches a target; a
document end flushes a shorter example. With p=0.1 everything is segment A; otherwise A takes about
(target - 3) // 2 tokens and the rest is B. A is cut to max_length - 2 tokens and B to what is left after
[CLS] A [SEP] ... [SEP], so the tokens of the sentence that takes an example past max_length - 3 are dropped, as
there (the official rule: only a full example loses tokens, and only from the end of a sentence). Layout
[CLS] A [SEP] B [SEP] with segment ids 0/1, padded with [PAD]. With p=0.05 the next example's target is uniform in
[5, max_length]. The random draws happen in the official order, from `rng`.

Over-long lines (`long_lines`): the official builder expects one sentence a line. A line longer than
max_length - 3 tokens (a paragraph on one line) becomes, there, one example cut to max_length - 2 tokens; the rest of
the line is dropped ('truncate'). By default ('split') it loses none of its tokens instead: its first piece fills the
current example to exactly max_length - 3 tokens and closes it, further pieces fill whole examples, and the rest
joins the next example as a sentence. Lines that fit an example are packed the same way under both.
"""

import random
from typing import Iterable, Iterator

import numpy as np

from electra_jax.config import LONG_LINES
from electra_jax.masking import SpecialIds


class ExampleBuilder:
  """Turns sentences (lists of token ids) into fixed-length examples; `rng` makes it deterministic."""

  def __init__(self, special: SpecialIds, max_length: int, rng: random.Random, long_lines: str = 'split'):
    if max_length < 8:
      raise ValueError(f'max_length must be at least 8, got {max_length}')
    if long_lines not in LONG_LINES:
      raise ValueError(f'long_lines must be one of {", ".join(LONG_LINES)}, got {long_lines!r}')
    self.long_lines = long_lines
    self.special = special
    self.max_length = max_length
    self.rng = rng
    self.sentences: list[list[int]] = []
    self.length = 0
    self.target = max_length

  def add_sentence(self, ids: list[int]) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Adds one sentence; yields the examples that became full."""
    room = self.max_length - 3  # what an example holds without cutting anything (one B segment: L - 3)
    start = 0
    while self.long_lines == 'split' and len(ids) - start > room - self.length and len(ids) > room:
      # An over-long sentence: fill the current example exactly, close it, go on with the rest.
      take = room - self.length
      if take > 0:
        self.sentences.append(ids[start:start + take])
        self.length += take
        start += take
      yield self._flush()
    if start < len(ids):
      self.sentences.append(ids[start:])
      self.length += len(ids) - start
      if self.length >= self.target:
        yield self._flush()

  def end_document(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    if self.sentences:
      yield self._flush()

  def _flush(self) -> tuple[np.ndarray, np.ndarray]:
    first_target = 10**9 if self.rng.random() < 0.1 else (self.target - 3) // 2
    first, second = [], []
    for sentence in self.sentences:
      # A sentence joins segment A while A is empty or stays under its target; the sentence that would cross
      # the target still joins A half of the time if B has not started.
      if (not first or len(first) + len(sentence) < first_target
          or (not second and len(first) < first_target and self.rng.random() < 0.5)):
        first += sentence
      else:
        second += sentence
    first = first[:self.max_length - 2]
    second = second[:max(0, self.max_length - len(first) - 3)]
    self.sentences, self.length = [], 0
    self.target = self.rng.randint(5, self.max_length) if self.rng.random() < 0.05 else self.max_length
    return self._layout(first, second)

  def _layout(self, first, second) -> tuple[np.ndarray, np.ndarray]:
    s = self.special
    ids = [s.cls] + first + [s.sep] + (second + [s.sep] if second else [])
    segments = [0] * (len(first) + 2) + [1] * (len(second) + 1 if second else 0)
    input_ids = np.full(self.max_length, s.pad, np.int32)
    segment_ids = np.zeros(self.max_length, np.int32)
    input_ids[:len(ids)] = ids
    segment_ids[:len(segments)] = segments
    return input_ids, segment_ids


def pack_documents(documents: Iterable[list[list[int]]], special: SpecialIds, max_length: int,
                   seed: int | str = 0, long_lines: str = 'split') -> tuple[np.ndarray, np.ndarray]:
  """Packs tokenized documents into (input_ids, segment_ids), each [num_examples, max_length] int32."""
  builder = ExampleBuilder(special, max_length, random.Random(seed), long_lines)
  examples = []
  for document in documents:
    for sentence in document:
      examples.extend(builder.add_sentence(sentence))
    examples.extend(builder.end_document())
  if not examples:
    return np.zeros((0, max_length), np.int32), np.zeros((0, max_length), np.int32)
  input_ids, segment_ids = zip(*examples)
  return np.stack(input_ids), np.stack(segment_ids)
