"""Dev-set metrics of the fine-tuning tasks, computed on the host from whole-split predictions.

Classification: accuracy, F1 (binary, of label 1; or macro), Matthews correlation. Regression: Pearson and
Spearman correlation (average ranks for ties). SQuAD: exact match and F1 after the official answer
normalisation. Tagging: span F1 over BIO(ES) chunks (conlleval rules) and token accuracy. Every function returns
a fraction in [0, 1] (correlations in [-1, 1]).
"""

import collections
import re
import string
from typing import Iterable, Sequence

import numpy as np


def accuracy(labels: np.ndarray, predictions: np.ndarray) -> float:
  """labels, predictions [n] class ids."""
  return float(np.mean(np.asarray(labels) == np.asarray(predictions))) if len(labels) else 0.0


def f1(labels: np.ndarray, predictions: np.ndarray, positive: int = 1) -> float:
  """F1 of class `positive` (binary F1, as GLUE reports for MRPC and QQP)."""
  labels, predictions = np.asarray(labels), np.asarray(predictions)
  tp = np.sum((predictions == positive) & (labels == positive))
  predicted, actual = np.sum(predictions == positive), np.sum(labels == positive)
  return float(2 * tp / (predicted + actual)) if predicted + actual else 0.0


def macro_f1(labels: np.ndarray, predictions: np.ndarray) -> float:
  """Unweighted mean over the classes present in labels or predictions of each class's F1."""
  classes = np.union1d(np.asarray(labels), np.asarray(predictions))
  return float(np.mean([f1(labels, predictions, c) for c in classes])) if len(classes) else 0.0


def matthews_corrcoef(labels: np.ndarray, predictions: np.ndarray) -> float:
  """Binary MCC = (tp tn - fp fn) / sqrt((tp+fp)(tp+fn)(tn+fp)(tn+fn)); 0 when a margin is empty (CoLA)."""
  labels, predictions = np.asarray(labels) == 1, np.asarray(predictions) == 1
  tp = float(np.sum(labels & predictions))
  tn = float(np.sum(~labels & ~predictions))
  fp = float(np.sum(~labels & predictions))
  fn = float(np.sum(labels & ~predictions))
  denominator = np.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
  return float((tp * tn - fp * fn) / denominator) if denominator else 0.0


def pearson(x: np.ndarray, y: np.ndarray) -> float:
  """Pearson correlation of two [n] arrays; 0 if either is constant."""
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  x, y = x - x.mean(), y - y.mean()
  denominator = np.sqrt(np.sum(x * x) * np.sum(y * y))
  return float(np.sum(x * y) / denominator) if denominator else 0.0


def average_ranks(x: np.ndarray) -> np.ndarray:
  """1-based ranks of [n] values; tied values share the mean of their ranks ([10, 20, 20] -> [1, 2.5, 2.5])."""
  x = np.asarray(x)
  order = np.argsort(x, kind='stable')
  sorted_x = x[order]
  # Runs of equal values: each run gets the mean of the ranks it spans.
  starts = np.concatenate([[True], sorted_x[1:] != sorted_x[:-1]])
  run = np.cumsum(starts) - 1
  first = np.flatnonzero(starts)
  last = np.concatenate([first[1:], [len(x)]]) - 1
  ranks = np.empty(len(x), np.float64)
  ranks[order] = (first[run] + last[run]) / 2 + 1
  return ranks


def spearman(x: np.ndarray, y: np.ndarray) -> float:
  """Spearman correlation: Pearson of the average ranks (handles ties as scipy.stats.spearmanr does)."""
  return pearson(average_ranks(x), average_ranks(y))


# SQuAD, as the official evaluate-v1.1.py / evaluate-v2.0.py scripts define it.

def normalize_answer(text: str) -> str:
  """Lower-cases, removes punctuation and the articles a/an/the, and collapses whitespace."""
  text = text.lower()
  text = ''.join(ch for ch in text if ch not in set(string.punctuation))
  text = re.sub(r'\b(a|an|the)\b', ' ', text)
  return ' '.join(text.split())


def squad_exact(prediction: str, gold: str) -> float:
  return float(normalize_answer(prediction) == normalize_answer(gold))


def squad_f1(prediction: str, gold: str) -> float:
  """Token-overlap F1 of the normalised answers (both empty: 1; one empty: 0, as in the v2.0 script)."""
  predicted, actual = normalize_answer(prediction).split(), normalize_answer(gold).split()
  if not predicted or not actual:
    return float(predicted == actual)
  common = collections.Counter(predicted) & collections.Counter(actual)
  overlap = sum(common.values())
  if not overlap:
    return 0.0
  precision, recall = overlap / len(predicted), overlap / len(actual)
  return 2 * precision * recall / (precision + recall)


def squad(predictions: dict[str, str], golds: dict[str, Sequence[str]]) -> dict[str, float]:
  """Mean over questions of the max EM/F1 over each question's gold answers ([''] when it has none)."""
  exact, overlap = [], []
  for qid, answers in golds.items():
    answers = [a for a in answers if normalize_answer(a)] or ['']
    prediction = predictions.get(qid, '')
    exact.append(max(squad_exact(prediction, a) for a in answers))
    overlap.append(max(squad_f1(prediction, a) for a in answers))
  return {'exact_match': float(np.mean(exact)) if exact else 0.0, 'f1': float(np.mean(overlap)) if overlap else 0.0}


# Tagging.

def bio_spans(tags: Sequence[str]) -> set[tuple[str, int, int]]:
  """Chunks (type, first, last) of one tag sequence, by conlleval's rules for BIO/IOB1/BIOES tags.

  A chunk starts at B-/S-, at I-/E- after O or after a chunk of another type, and ends before O, B-, S- or a
  change of type. E.g. [B-PER, I-PER, O, I-LOC] -> {(PER, 0, 1), (LOC, 3, 3)}.
  """
  spans, start, kind = set(), None, None
  for i, tag in enumerate(list(tags) + ['O']):
    prefix, _, label = tag.partition('-') if tag != 'O' else ('O', '', '')
    begins = prefix in ('B', 'S') or (prefix in ('I', 'E') and label != kind)
    if start is not None and (prefix == 'O' or begins):
      spans.add((kind, start, i - 1))
      start, kind = None, None
    if begins:
      start, kind = i, label
    if start is not None and prefix in ('E', 'S'):
      spans.add((kind, start, i))
      start, kind = None, None
  return spans


def span_f1(gold: Iterable[Sequence[str]], predicted: Iterable[Sequence[str]]) -> dict[str, float]:
  """Micro precision/recall/F1 of exact chunk matches over sentences (lists of tags per word)."""
  tp = n_gold = n_predicted = 0
  for g, p in zip(gold, predicted):
    g_spans, p_spans = bio_spans(g), bio_spans(p)
    tp += len(g_spans & p_spans)
    n_gold += len(g_spans)
    n_predicted += len(p_spans)
  precision = tp / n_predicted if n_predicted else 0.0
  recall = tp / n_gold if n_gold else 0.0
  f = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
  return {'span_f1': f, 'span_precision': precision, 'span_recall': recall}


def token_accuracy(gold: Iterable[Sequence[str]], predicted: Iterable[Sequence[str]]) -> float:
  """Fraction of words whose predicted tag equals the gold tag (POS tagging)."""
  correct = total = 0
  for g, p in zip(gold, predicted):
    correct += sum(a == b for a, b in zip(g, p))
    total += len(g)
  return correct / total if total else 0.0


def is_bio(tags: Iterable[str]) -> bool:
  """Whether a tag set is a chunking scheme (every tag O or B-/I-/E-/S-X), so span F1 applies."""
  tags = set(tags)
  return bool(tags) and all(t == 'O' or re.fullmatch(r'[BIES]-.+', t) for t in tags) and any(
      t.startswith('B-') or t.startswith('S-') for t in tags)
