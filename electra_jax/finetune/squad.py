"""SQuAD: contexts cut into overlapping windows, and answer spans decoded back into context words.

As BERT/ELECTRA do it: the context is split on whitespace into words, each word is sub-tokenized, and the input
is `[CLS] question [SEP] window [SEP]`, windows `doc_stride` tokens apart. The answer's token span is narrowed to
the sub-tokens of the answer text where they occur inside its words (official `_improve_answer_span`: "1895"
in "(1895-1943)."). A training window whose span does not hold the answer (or whose question has none) points
at [CLS] (start = end = 0). Its answerability target is the question's `is_impossible`, not the window's: the
official code labels every window of an answerable question answerable (and every SQuAD 1.1 window). A
span is decoded from the beam of the head (see heads.SquadHead), keeping starts in the window where the token
has its most context, and cut out of its context words by characters (official `get_final_text`: a prediction of
the sub-token "1895" gives "1895", not the whole word "(1895-1943).").
"""

import unicodedata

import numpy as np

from electra_jax.data.tokenizer import Tokenizer
from electra_jax.finetune import features as features_lib
from electra_jax.finetune.config import SquadConfig
from electra_jax.finetune.tasks import SquadExample


def split_words(context: str) -> tuple[list[str], list[int]]:
  """Whitespace words of `context` and, for each character, the index of the word it is in (or before)."""
  words, char_to_word, previous_space = [], [], True
  for ch in context:
    if ch.isspace() or ord(ch) == 0x202F:
      previous_space = True
    else:
      if previous_space:
        words.append(ch)
      else:
        words[-1] += ch
      previous_space = False
    char_to_word.append(len(words) - 1)
  return words, char_to_word


def _answer_words(example: SquadExample, words: list[str], char_to_word: list[int]) -> tuple[int, int] | None:
  """First and last word of the first gold answer, or None when its offsets do not match the context: as the
  official reader, the answer text (whitespace-normalised, lower-cased) must occur in the words it spans."""
  if example.is_impossible or not example.answers:
    return None
  text, start = example.answers[0], example.answer_starts[0]
  end = start + len(text) - 1
  if not text or start < 0 or end >= len(char_to_word):
    return None
  first, last = max(char_to_word[start], 0), char_to_word[end]
  if ' '.join(text.split()).lower() not in ' '.join(words[first:last + 1]).lower():
    return None
  return first, last


def _windows(num_tokens: int, window: int, stride: int) -> list[tuple[int, int]]:
  """(start, length) of windows over `num_tokens` doc tokens, `stride` apart, the last ending at the end."""
  spans, start = [], 0
  while True:
    length = min(num_tokens - start, window)
    spans.append((start, length))
    if start + length >= num_tokens:
      return spans
    start += min(length, stride)


def _max_context(spans: list[tuple[int, int]], index: int, position: int) -> bool:
  """Whether window `index` gives doc token `position` its most context (min of left/right, BERT's rule)."""
  best, best_score = None, None
  for i, (start, length) in enumerate(spans):
    end = start + length - 1
    if position < start or position > end:
      continue
    score = min(position - start, end - position) + 0.01 * length
    if best_score is None or score > best_score:
      best, best_score = i, score
  return best == index


def improve_span(doc: list[int], start: int, end: int, answer: list[int]) -> tuple[int, int]:
  """The first (longest-first) sub-span of doc[start:end + 1] whose tokens are the answer's; (start, end) if none.

  The official code compares the sub-token strings joined by spaces; comparing the token ids is the same test.
  """
  for new_start in range(start, end + 1):
    for new_end in range(end, new_start - 1, -1):
      if doc[new_start:new_end + 1] == answer:
        return new_start, new_end
  return start, end


def encode(examples: list[SquadExample], tokenizer: Tokenizer, max_seq_length: int, config: SquadConfig, *,
           training: bool) -> features_lib.Features:
  """One row per window. Training drops examples whose answer offsets do not match the context.

  Returns arrays input_ids/segment_ids/input_mask [n, L], start_positions/end_positions [n] int32,
  is_impossible [n] float32; windows = {'token_to_word' [n, L] int32 (-1 outside the context),
  'max_context' [n, L] bool}.
  """
  special = tokenizer.special
  questions = tokenizer.encode([e.question for e in examples]) if examples else []
  split = [split_words(e.context) for e in examples]
  pieces = tokenizer.encode([w for words, _ in split for w in words]) if examples else []
  answer_ids = tokenizer.encode([e.answers[0] if e.answers else '' for e in examples]) if training else []
  sequences, segments, rows, token_maps, contexts, targets = [], [], [], [], [], []
  offset = 0
  for i, (example, (words, char_to_word)) in enumerate(zip(examples, split)):
    word_pieces, offset = pieces[offset:offset + len(words)], offset + len(words)
    answer = _answer_words(example, words, char_to_word)
    if training and answer is None and not example.is_impossible:
      continue
    doc, doc_to_word, word_start = [], [], []
    for w, p in enumerate(word_pieces):
      word_start.append(len(doc))
      p = p or [special.unk]
      doc += p
      doc_to_word += [w] * len(p)
    if answer is not None:
      answer_start = word_start[answer[0]]
      answer_end = (word_start[answer[1] + 1] if answer[1] + 1 < len(words) else len(doc)) - 1
      if training:
        answer_start, answer_end = improve_span(doc, answer_start, answer_end, answer_ids[i])
    query = questions[i][:config.max_query_length]
    spans = _windows(len(doc), max(1, max_seq_length - len(query) - 3), config.doc_stride)
    prefix = len(query) + 2
    for index, (start, length) in enumerate(spans):
      sequences.append([special.cls] + query + [special.sep] + doc[start:start + length] + [special.sep])
      segments.append([0] * prefix + [1] * (length + 1))
      rows.append(i)
      token_maps.append([doc_to_word[start + k] for k in range(length)])
      contexts.append([_max_context(spans, index, start + k) for k in range(length)])
      impossible = float(example.is_impossible)
      if answer is not None and start <= answer_start and answer_end < start + length:
        targets.append((answer_start - start + prefix, answer_end - start + prefix, impossible))
      else:
        targets.append((0, 0, impossible))
  length = features_lib.pad_length(max(map(len, sequences), default=1), max_seq_length)
  arrays = features_lib.pack(sequences, segments, length)
  targets = np.array(targets, np.float32).reshape(-1, 3)
  arrays['start_positions'] = targets[:, 0].astype(np.int32)
  arrays['end_positions'] = targets[:, 1].astype(np.int32)
  arrays['is_impossible'] = targets[:, 2]
  token_to_word = np.full((len(rows), length), -1, np.int32)
  max_context = np.zeros((len(rows), length), bool)
  for r, (words, flags) in enumerate(zip(token_maps, contexts)):
    prefix = len(sequences[r]) - len(words) - 1
    token_to_word[r, prefix:prefix + len(words)] = words
    max_context[r, prefix:prefix + len(words)] = flags
  return features_lib.Features(arrays, examples, np.array(rows, np.int64),
                               windows={'token_to_word': token_to_word, 'max_context': max_context})


def _spelled(ch: str, tokenizer: Tokenizer) -> str:
  """Context character `ch` as the tokenizer's pieces spell it ('' for one they drop): lower-cased when uncased,
  accents stripped (BERT's uncased normaliser) or NFKC (SentencePiece's), control characters removed."""
  if unicodedata.category(ch) in ('Cc', 'Cf'):
    return ''
  if tokenizer.lowercase:
    ch = ch.lower()
  if tokenizer.kind != 'wordpiece':
    return unicodedata.normalize('NFKC', ch)
  if not tokenizer.lowercase:
    return ch
  return ''.join(c for c in unicodedata.normalize('NFD', ch) if unicodedata.category(c) != 'Mn')


def final_text(pieces: list[str], words: str, tokenizer: Tokenizer) -> str:
  """The part of `words` (the context words a predicted span lies in, joined by spaces) that the span's sub-token
  `pieces` spell: "1856" of "(1856-1943).".

  As the official `get_final_text`: the pieces' text and the words, both without spaces and spelled as the
  tokenizer spells them, are aligned character by character, and the characters of the first occurrence of the
  pieces' text are cut out of `words`; when it does not occur (an [UNK] piece, another normalisation), `words`.
  (Each spelled character keeps the index of the one it comes from, so a spelling of another length, "ﬁ" -> "fi",
  still aligns where the official code gives up.)
  """
  if tokenizer.kind == 'wordpiece':
    text = ''.join(p.removeprefix('##') for p in pieces)  # '##' marks a continuation
  else:
    text = ''.join(pieces).replace('\u2581', '')  # SentencePiece's word-start mark
  predicted = ''.join(text.split())
  spelled, source = [], []  # the characters of `words` as spelled, and the index in `words` each comes from
  for i, ch in enumerate(words):
    if not ch.isspace():
      for c in _spelled(ch, tokenizer):
        spelled.append(c)
        source.append(i)
  start = ''.join(spelled).find(predicted) if predicted else -1
  if start < 0:
    return words
  return words[source[start]:source[start + len(predicted) - 1] + 1]


def decode(feats: features_lib.Features, outputs: dict[str, np.ndarray], config: SquadConfig, v2: bool,
           tokenizer: Tokenizer) -> tuple[dict[str, str], dict[str, float]]:
  """Best span's text per question ('' when no span is valid), and (v2) its null odds (min over windows of the
  impossible logit); `answer` decides between them.

  `outputs`: start_top_log_probs [n, k], start_top_index [n, k], end_top_log_probs [n, k, k],
  end_top_index [n, k, k], impossible_logit [n]. `tokenizer` spells the predicted sub-tokens (see `final_text`).
  """
  best = {}
  null = {}
  token_to_word, max_context = feats.windows['token_to_word'], feats.windows['max_context']
  for row, i in enumerate(feats.example_index):
    starts, ends = outputs['start_top_index'][row], outputs['end_top_index'][row]
    valid = ((token_to_word[row, starts] >= 0) & max_context[row, starts])[:, None]
    valid = valid & (token_to_word[row, ends] >= 0) & (ends >= starts[:, None])
    valid &= ends - starts[:, None] < config.max_answer_length
    scores = outputs['start_top_log_probs'][row][:, None] + outputs['end_top_log_probs'][row]
    scores = np.where(valid, scores, -np.inf)
    a, b = np.unravel_index(np.argmax(scores), scores.shape)
    if np.isfinite(scores[a, b]) and (i not in best or scores[a, b] > best[i][0]):
      best[i] = (scores[a, b], row, starts[a], ends[a, b])
    if v2:
      null[i] = min(null.get(i, np.inf), float(outputs['impossible_logit'][row]))
  predictions, null_odds = {}, {}
  for i, example in enumerate(feats.examples):
    text = ''
    if i in best:
      _, row, start, end = best[i]
      words, _ = split_words(example.context)
      pieces = tokenizer.pieces(feats.arrays['input_ids'][row, start:end + 1])
      text = final_text(pieces, ' '.join(words[token_to_word[row, start]:token_to_word[row, end] + 1]), tokenizer)
    if v2:
      null_odds[example.guid] = null.get(i, np.inf)
    predictions[example.guid] = text
  return predictions, null_odds


def answer(span: str, null_odds: float | None, config: SquadConfig) -> str:
  """The answer to a question whose best span is `span`: '' when its null odds (SQuAD 2.0) exceed
  `config.na_threshold`, as the official squad_official_eval scores dev (na_prob_thresh = qa_na_threshold) and
  run_finetuning.py writes test predictions."""
  return '' if null_odds is not None and null_odds > config.na_threshold else span
