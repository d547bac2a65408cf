"""Fine-tuning metrics against values worked out by hand."""

import numpy as np
import pytest

from electra_jax.finetune import metrics


def test_accuracy_f1_macro_f1():
  labels = np.array([1, 1, 0, 0, 1])
  predictions = np.array([1, 0, 0, 1, 1])
  assert metrics.accuracy(labels, predictions) == pytest.approx(3 / 5)
  # class 1: tp 2, predicted 3, actual 3 -> 2*2/6; class 0: tp 1, predicted 2, actual 2 -> 2*1/4
  assert metrics.f1(labels, predictions) == pytest.approx(4 / 6)
  assert metrics.macro_f1(labels, predictions) == pytest.approx((4 / 6 + 2 / 4) / 2)


def test_matthews_corrcoef():
  # tp = 2, tn = 1, fp = 1, fn = 1: (2*1 - 1*1) / sqrt(3 * 3 * 2 * 2) = 1/6
  labels = np.array([1, 1, 0, 0, 1])
  predictions = np.array([1, 0, 0, 1, 1])
  assert metrics.matthews_corrcoef(labels, predictions) == pytest.approx(1 / 6)
  assert metrics.matthews_corrcoef(labels, labels) == pytest.approx(1.0)
  assert metrics.matthews_corrcoef(labels, 1 - labels) == pytest.approx(-1.0)
  assert metrics.matthews_corrcoef(labels, np.ones(5)) == 0.0  # an empty margin: CoLA reports 0


def test_pearson_and_spearman_with_ties():
  assert metrics.pearson([1, 2, 3], [2, 4, 7]) == pytest.approx(0.9933992677987828)
  # ranks of x: [1, 2.5, 2.5, 4]; of y: [1, 2, 3, 4]. Centred: [-1.5, 0, 0, 1.5] and [-1.5, -.5, .5, 1.5]:
  # cov = 2.25 + 2.25 = 4.5; |x| = sqrt(4.5), |y| = sqrt(5) -> 4.5 / sqrt(22.5) = 0.9486832980505138
  np.testing.assert_allclose(metrics.average_ranks([10, 20, 20, 30]), [1, 2.5, 2.5, 4])
  assert metrics.spearman([10, 20, 20, 30], [1, 2, 3, 4]) == pytest.approx(4.5 / np.sqrt(22.5))
  np.testing.assert_allclose(metrics.average_ranks([3, 1, 3, 3]), [3, 1, 3, 3])
  assert metrics.pearson([1, 1, 1], [1, 2, 3]) == 0.0


def test_squad_normalisation_and_scores():
  assert metrics.normalize_answer('The  Eiffel-Tower!') == 'eiffeltower'
  assert metrics.normalize_answer('an apple, a pear and the plum.') == 'apple pear and plum'
  assert metrics.normalize_answer('Theatre') == 'theatre'  # 'the' only as a whole word
  assert metrics.squad_exact('the Apple.', 'apple') == 1.0
  # prediction 'big red dog' vs gold 'the red dog barked': common {red, dog}: P = 2/3, R = 2/3 -> 2/3
  assert metrics.squad_f1('big red dog', 'the red dog barked') == pytest.approx(2 / 3)
  assert metrics.squad_f1('', '') == 1.0
  assert metrics.squad_f1('a', 'something') == 0.0  # 'a' normalises to nothing
  result = metrics.squad({'q1': 'Paris', 'q2': 'red dog', 'q3': ''},
                         {'q1': ['paris', 'in Paris'], 'q2': ['the red dog barked'], 'q3': []})
  assert result['exact_match'] == pytest.approx(2 / 3)  # q1 and q3 (unanswerable, predicted '')
  assert result['f1'] == pytest.approx((1 + 2 * (1 * 2 / 3) / (1 + 2 / 3) + 1) / 3)


def test_bio_spans_and_span_f1():
  assert metrics.bio_spans(['B-PER', 'I-PER', 'O', 'I-LOC']) == {('PER', 0, 1), ('LOC', 3, 3)}
  assert metrics.bio_spans(['B-PER', 'B-PER', 'I-LOC']) == {('PER', 0, 0), ('PER', 1, 1), ('LOC', 2, 2)}
  assert metrics.bio_spans(['S-X', 'B-Y', 'E-Y', 'I-Y']) == {('X', 0, 0), ('Y', 1, 2), ('Y', 3, 3)}
  gold = [['B-PER', 'I-PER', 'O', 'B-LOC'], ['O', 'B-ORG']]
  predicted = [['B-PER', 'I-PER', 'O', 'O'], ['B-ORG', 'I-ORG']]
  # gold spans: (PER 0-1), (LOC 3), (ORG 1); predicted: (PER 0-1), (ORG 0-1); 1 correct: P 1/2, R 1/3 -> F1 0.4
  result = metrics.span_f1(gold, predicted)
  assert result['span_precision'] == pytest.approx(1 / 2)
  assert result['span_recall'] == pytest.approx(1 / 3)
  assert result['span_f1'] == pytest.approx(0.4)
  assert metrics.token_accuracy(gold, predicted) == pytest.approx(3 / 6)  # 3 of 4, then 0 of 2


def test_is_bio():
  assert metrics.is_bio(['O', 'B-PER', 'I-PER'])
  assert not metrics.is_bio(['NN', 'VB', 'DT'])
  assert not metrics.is_bio(['O'])
