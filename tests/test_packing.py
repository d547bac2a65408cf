"""Packing: the official builder's examples, layout, token accounting (property tests with hypothesis: no token
lost but by the official cut, over random lengths and unicode text) and the 10% / 5% draws."""

import collections
import random

import hypothesis
from hypothesis import strategies as st
import numpy as np
import pytest

from electra_jax.data import build, packing
from helpers import SPECIAL  # pylint: disable=g-bad-import-order



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


def test_an_over_long_line_loses_no_token():
  """The issue's case: 10 tokens, then one 300-token line at L=128. The official builder keeps tokens 10-135 of
  the 310; here every token of the long line is kept: the first example takes 115 of its tokens after the 10
  (125 = L - 3), the next one 125, and the last 60 join the next example."""
  documents = [[list(range(100, 110)), list(range(1000, 1300))]]
  input_ids, _ = packing.pack_documents(documents, SPECIAL, 128, seed=0)
  kept = input_ids[(input_ids != SPECIAL.pad) & (input_ids != SPECIAL.cls) & (input_ids != SPECIAL.sep)]
  assert sorted(kept.tolist()) == list(range(100, 110)) + list(range(1000, 1300))
  assert [int(((ids != SPECIAL.pad) & (ids > SPECIAL.mask)).sum()) for ids in input_ids] == [125, 125, 60]


@pytest.mark.parametrize('long_lines, kept', [
    # A 100-token line at L=64: one example of its first 62 tokens (L - 2), the rest dropped, as officially...
    ('truncate', [list(range(1000, 1062))]),
    # ... or every token: the first 61 (L - 3) close one example, the other 39 end the document in the next.
    ('split', [list(range(1000, 1061)), list(range(1061, 1100))]),
])
def test_long_lines(long_lines, kept):
  input_ids, _ = packing.pack_documents([[list(range(1000, 1100))]], SPECIAL, 64, seed=0, long_lines=long_lines)
  assert [[int(t) for t in ids if t > SPECIAL.mask] for ids in input_ids] == kept


def test_long_lines_truncate_matches_the_official_builder():
  """Paragraph-long lines (up to 3 examples long): 'truncate' packs exactly as the official builder."""
  max_length = 64
  documents = _documents(2, 200, max_sentence=3 * max_length)
  input_ids, segment_ids = packing.pack_documents(documents, SPECIAL, max_length, seed=7, long_lines='truncate')
  official = OfficialExampleBuilder(max_length, random.Random(7))
  expected = [e for document in documents for line in document + [[]] if (e := official.add_line(line))]
  np.testing.assert_array_equal(input_ids, [e[0] for e in expected])
  np.testing.assert_array_equal(segment_ids, [e[1] for e in expected])


def test_long_lines_must_be_known():
  with pytest.raises(ValueError, match='long_lines must be one of split, truncate'):
    packing.ExampleBuilder(SPECIAL, 64, random.Random(0), long_lines='cut')


def _check_nothing_lost_but_the_official_cut(documents, max_length, seed):
  """Packs `documents` (sentences of distinct token ids > the specials) and checks, for every document:
  every example respects the layout and length; no token is duplicated or comes from elsewhere; every token of
  a sentence longer than max_length - 3 is kept; a sentence that fits loses tokens only as the official builder
  cuts them: a suffix of the sentence, from the example it was packed into, which is then full
  (>= max_length - 3 tokens besides [CLS]/[SEP])."""
  builder = packing.ExampleBuilder(SPECIAL, max_length, random.Random(seed))
  for document in documents:
    examples, owner, waiting = [], {}, []
    for i, sentence in enumerate(document):
      waiting.append(i)
      for example in builder.add_sentence(sentence):
        examples.append(example)
        owner.update({j: len(examples) - 1 for j in waiting})
        waiting = []
    for example in builder.end_document():
      examples.append(example)
      owner.update({j: len(examples) - 1 for j in waiting})
      waiting = []
    kept = []
    for ids, segments in examples:
      assert ids.shape == segments.shape == (max_length,)
      length = int((ids != SPECIAL.pad).sum())
      assert ids[0] == SPECIAL.cls and ids[length - 1] == SPECIAL.sep and (ids[length:] == SPECIAL.pad).all()
      kept.append([int(t) for t in ids[:length] if t not in (SPECIAL.cls, SPECIAL.sep)])
    flat = [t for tokens in kept for t in tokens]
    assert len(set(flat)) == len(flat), 'a token is duplicated'
    everything = {t for sentence in document for t in sentence}
    assert set(flat) <= everything, 'a token from elsewhere'
    where = {t: e for e, tokens in enumerate(kept) for t in tokens}
    for i, sentence in enumerate(document):
      lost = [k for k, t in enumerate(sentence) if t not in where]
      if not lost:
        continue
      assert len(sentence) <= max_length - 3, f'a token of an over-long sentence was lost: {sentence[lost[0]]}'
      assert lost == list(range(lost[0], len(sentence))), 'tokens lost from inside a sentence'
      assert len(kept[owner[i]]) >= max_length - 3, 'tokens lost from an example that was not full'


@hypothesis.settings(max_examples=150, deadline=None)
@hypothesis.given(
    max_length=st.sampled_from([8, 9, 16, 33]),
    lengths=st.lists(st.lists(st.integers(0, 100), min_size=1, max_size=12), min_size=1, max_size=5),
    seed=st.integers(0, 2 ** 16))
def test_property_no_token_lost_but_the_official_cut(max_length, lengths, seed):
  """Random sentence lengths, from empty to 12 examples long, with synthetic distinct ids."""
  documents, next_id = [], 10
  for document in lengths:
    documents.append([])
    for n in document:
      documents[-1].append(list(range(next_id, next_id + n)))
      next_id += n
  _check_nothing_lost_but_the_official_cut(documents, max_length, seed)


@pytest.fixture(scope='module')
def real_tokenizer(tmp_path_factory):
  from helpers import make_corpus  # noqa: PLC0415
  from electra_jax.data import tokenizer as tokenizer_lib  # noqa: PLC0415
  corpus = make_corpus(tmp_path_factory.mktemp('corpus') / 'c.txt', documents=30)
  with open(corpus, encoding='utf-8') as f:
    return tokenizer_lib.train(f.read().splitlines(), str(tmp_path_factory.mktemp('spm')), vocab_size=60)


@pytest.mark.slow
@hypothesis.settings(max_examples=60, deadline=None,
                     suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture])
@hypothesis.given(lines=st.lists(st.text(min_size=0, max_size=120), min_size=1, max_size=12),
                  seed=st.integers(0, 2 ** 16))
def test_property_real_tokenizer_on_unicode_text(real_tokenizer, lines, seed):
  """Random unicode lines through a real tokenizer (SentencePiece) and the build path's packing. Its token ids
  repeat, so each token is relabelled with a distinct id (packing only sees lengths) for the exact checks; the
  real ids are checked as a multiset."""
  ids = real_tokenizer.encode(lines)
  documents, next_id = [[]], 10
  for sentence in ids:
    documents[0].append(list(range(next_id, next_id + len(sentence))))
    next_id += len(sentence)
  _check_nothing_lost_but_the_official_cut(documents, 16, seed)
  chunk = build.pack_chunk(real_tokenizer, [lines], 0, build.Packing(16, seed))
  special = {real_tokenizer.special.cls, real_tokenizer.special.sep, real_tokenizer.special.pad}
  packed = collections.Counter(int(t) for t in chunk.input_ids.ravel() if t not in special)
  given = collections.Counter(t for sentence in ids for t in sentence if t not in special)
  assert not packed - given  # nothing invented
  over_long = sum((collections.Counter(s) for s in ids if len(s) > 16 - 3), collections.Counter())
  assert not over_long - packed  # every token of every over-long line is in some example


def test_nothing_is_lost_when_sentences_fit():
  """With one-token sentences the builder stops exactly at its target: only the 3 tokens over max_length - 3
  of a full example are cut, as in the official code. By hand: a full example collects 16 sentences (its target,
  max_length) and keeps 13 (16 - [CLS] [SEP] [SEP]): 10..25 keeps 10..22, 26..41 keeps 26..38; the document's
  last 8 tokens fill no example and are all kept."""
  documents = [[[t] for t in range(10, 10 + 40)]]
  input_ids, _ = packing.pack_documents(documents, SPECIAL, 16, seed=0)
  kept = input_ids[(input_ids != SPECIAL.pad) & (input_ids != SPECIAL.cls) & (input_ids != SPECIAL.sep)]
  assert sorted(kept.tolist()) == kept.tolist()  # order kept
  assert sorted(set(range(10, 50)) - set(kept.tolist())) == [23, 24, 25, 39, 40, 41]


@pytest.mark.slow
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
