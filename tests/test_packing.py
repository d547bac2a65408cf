"""Packing: the official builder's examples, layout, token accounting and the 10% / 5% draws."""

import random

import numpy as np
import pytest

from electra_jax.data import packing
from electra_jax.masking import SpecialIds

SPECIAL = SpecialIds(pad=0, cls=2, sep=3, mask=4, unk=1)


class OfficialExampleBuilder:
  """google-research/electra build_pretraining_dataset.ExampleBuilder, transcribed; `random` is an argument.

  `add_line` takes an already tokenized line; [] is a blank line (a document end).
  """

  def __init__(self, max_length, rng):
    self._current_sentences = []
    self._current_length = 0
    self._max_length = max_length
    self._target_length = max_length
    self.random = rng

  def add_line(self, bert_tokids):
    if (not bert_tokids) and self._current_length != 0:  # empty lines separate docs
      return self._create_example()
    self._current_sentences.append(bert_tokids)
    self._current_length += len(bert_tokids)
    if self._current_length >= self._target_length:
      return self._create_example()
    return None

  def _create_example(self):
    if self.random.random() < 0.1:
      first_segment_target_length = 100000
    else:
      first_segment_target_length = (self._target_length - 3) // 2
    first_segment = []
    second_segment = []
    for sentence in self._current_sentences:
      if (len(first_segment) == 0 or
          len(first_segment) + len(sentence) < first_segment_target_length or
          (len(second_segment) == 0 and
           len(first_segment) < first_segment_target_length and
           self.random.random() < 0.5)):
        first_segment += sentence
      else:
        second_segment += sentence
    first_segment = first_segment[:self._max_length - 2]
    second_segment = second_segment[:max(0, self._max_length - len(first_segment) - 3)]
    self._current_sentences = []
    self._current_length = 0
    if self.random.random() < 0.05:
      self._target_length = self.random.randint(5, self._max_length)
    else:
      self._target_length = self._max_length
    return self._make_example(first_segment, second_segment)

  def _make_example(self, first_segment, second_segment):
    input_ids = [SPECIAL.cls] + first_segment + [SPECIAL.sep]
    segment_ids = [0] * len(input_ids)
    if second_segment:
      input_ids += second_segment + [SPECIAL.sep]
      segment_ids += [1] * (len(second_segment) + 1)
    input_ids += [0] * (self._max_length - len(input_ids))
    segment_ids += [0] * (self._max_length - len(segment_ids))
    return input_ids, segment_ids


def _documents(seed, count, max_sentence, first_id=10):
  """Tokenized documents whose tokens are all distinct and increasing (so each one can be traced)."""
  rng = random.Random(seed)
  documents, next_id = [], first_id
  for _ in range(count):
    document = []
    for _ in range(rng.randint(1, 15)):
      length = rng.randint(1, max_sentence)
      document.append(list(range(next_id, next_id + length)))
      next_id += length
    documents.append(document)
  return documents


def test_matches_the_official_builder():
  max_length = 64
  documents = _documents(0, 300, max_sentence=max_length - 3)
  input_ids, segment_ids = packing.pack_documents(documents, SPECIAL, max_length, seed=7)
  official = OfficialExampleBuilder(max_length, random.Random(7))
  expected = []
  for document in documents:
    for line in document + [[]]:
      example = official.add_line(line)
      if example:
        expected.append(example)
  assert len(input_ids) == len(expected)
  np.testing.assert_array_equal(input_ids, [e[0] for e in expected])
  np.testing.assert_array_equal(segment_ids, [e[1] for e in expected])


@pytest.mark.parametrize('max_length', [16, 128])
def test_layout_and_segment_ids(max_length):
  documents = _documents(1, 200, max_sentence=2 * max_length)  # some sentences longer than an example
  input_ids, segment_ids = packing.pack_documents(documents, SPECIAL, max_length, seed=0)
  assert input_ids.shape == segment_ids.shape == (len(input_ids), max_length)
  assert input_ids.dtype == segment_ids.dtype == np.int32
  for ids, segments in zip(input_ids, segment_ids):
    length = int((ids != SPECIAL.pad).sum())
    assert (ids[length:] == SPECIAL.pad).all() and (segments[length:] == 0).all()
    seps = np.flatnonzero(ids == SPECIAL.sep)
    assert ids[0] == SPECIAL.cls and seps[-1] == length - 1 and len(seps) in (1, 2)
    assert not (ids[1:length] == SPECIAL.cls).any()
    first_end = seps[0] + 1  # [CLS] A [SEP]
    assert (segments[:first_end] == 0).all() and (segments[first_end:length] == 1).all()
    assert first_end > 2  # segment A is never empty
    if len(seps) == 2:
      assert length - first_end > 1  # segment B, when present, is not empty either


def test_no_token_lost_or_duplicated_except_the_official_cut():
  """Rebuilds each document's token stream from its examples: every token is in one example, exactly once,
  except the tokens the official builder cuts when an example overflows (only from full examples)."""
  max_length = 32
  documents = _documents(2, 150, max_sentence=40)
  seen_documents = 0
  builder = packing.ExampleBuilder(SPECIAL, max_length, random.Random(3))
  for document in documents:
    examples = [e for sentence in document for e in builder.add_sentence(sentence)] + list(builder.end_document())
    tokens = [ids[(ids != SPECIAL.pad) & (ids != SPECIAL.cls) & (ids != SPECIAL.sep)] for ids, _ in examples]
    stream = [t for sentence in document for t in sentence]
    flat = np.concatenate(tokens)
    assert len(set(flat.tolist())) == len(flat), 'a token is duplicated'
    assert set(flat.tolist()) <= set(stream), 'a token from another document'
    full = [len(t) >= max_length - 3 for t in tokens]
    # Examples take consecutive stretches of the document, in order.
    spans = [(t.min(), t.max()) for t in tokens]
    assert all(a[1] < b[0] for a, b in zip(spans, spans[1:]))
    kept = set(flat.tolist())
    for token in stream:
      if token not in kept:
        # A lost token lies inside or right after the span of a full example.
        owner = max(i for i, (low, _) in enumerate(spans) if low <= token)
        assert full[owner], f'token {token} lost from an example that was not full'
    seen_documents += 1
  assert seen_documents == len(documents)


def test_nothing_is_lost_when_sentences_fit():
  """With one-token sentences the builder stops exactly at its target: only the 3 tokens over max_length - 3
  of a full example are cut, as in the official code."""
  documents = [[[t] for t in range(10, 10 + 40)]]
  input_ids, _ = packing.pack_documents(documents, SPECIAL, 16, seed=0)
  kept = input_ids[(input_ids != SPECIAL.pad) & (input_ids != SPECIAL.cls) & (input_ids != SPECIAL.sep)]
  assert sorted(kept.tolist()) == kept.tolist()  # order kept
  assert 40 - len(kept) <= 3 * len(input_ids)


def test_single_segment_and_random_length_rates():
  max_length = 128
  # One long document of one-token sentences: an example's content is exactly its target (or max - 3).
  documents = [[[10 + (i % 1000)] for i in range(600_000)]]
  input_ids, segment_ids = packing.pack_documents(documents, SPECIAL, max_length, seed=0)
  input_ids, segment_ids = input_ids[:-1], segment_ids[:-1]  # the document's last example is short anyway
  single = (segment_ids.max(axis=1) == 0).mean()
  assert abs(single - 0.1) < 0.02
  # A random target in [5, max] shortens an example below max - 3 unless it is >= max - 3 (4 of 124 values).
  short = ((input_ids != SPECIAL.pad).sum(axis=1) < max_length).mean()
  assert abs(short - 0.05 * 120 / 124) < 0.015
