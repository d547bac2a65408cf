"""What a fine-tuning run reports: majority baselines and most-frequent-prediction shares worked out by hand, the
one-class warning, results.md/json, the closing summary, dev prediction files and --mode=predict's formats."""

import csv
import io
import json

import numpy as np
import pytest

from electra_jax.errors import DataError
from electra_jax.finetune import predict, report, tasks, train
from electra_jax.finetune.config import FinetuneConfig

ABC = tasks.Task(name='abc', kind=tasks.CLASSIFICATION, source='files', location='abc', labels=('a', 'b', 'c'),
                 metrics=('accuracy', 'macro_f1'))
TAGS = tasks.Task(name='tags', kind=tasks.TAGGING, source='files', location='tags', labels=('B-X', 'I-X', 'O'),
                  metrics=('span_f1', 'token_accuracy'))


def text(label, *texts):
  return tasks.TextExample(f'g{len(texts)}', texts or ('some words',), label)


def test_majority_baseline_and_most_frequent_share_by_hand():
  dev = [text(x) for x in 'abacab'] + [text(None)]  # a: 3 of the 6 labelled rows
  assert report.majority_label(ABC, dev) == 'a'
  baseline = train.majority_baseline(ABC, dev, dev)
  # Always 'a': accuracy 3/6; macro F1 over the classes present: F1(a) = 2*3/(6+3) = 2/3, F1(b) = F1(c) = 0.
  assert baseline['accuracy'] == 0.5
  np.testing.assert_allclose(baseline['macro_f1'], (2 / 3) / 3)
  assert report.majority_label(ABC, [text(x) for x in 'cbbc']) == 'b'  # a tie goes to the label first in order

  assert report.top_prediction(ABC, list('bbabcbb')) == {'label': 'b', 'count': 5, 'total': 7, 'share': 5 / 7}
  tagged = [tasks.TaggingExample('s1', ('x', 'y', 'z'), ('O', 'B-X', 'O')), tasks.TaggingExample('s2', ('u', 'v'),
                                                                                                  ('O', 'O'))]
  assert report.majority_label(TAGS, tagged) == 'O'
  assert train.majority_baseline(TAGS, tagged, tagged) == {'span_f1': 0.0, 'token_accuracy': 0.8}  # 4 of 5 words
  assert report.top_prediction(TAGS, [['B-X', 'I-X', 'O'], ['O', 'O']])['share'] == 0.6
  regression = tasks.Task(name='r', kind=tasks.REGRESSION, source='files', location='r')
  assert report.top_prediction(regression, [0.5, 0.5]) is None and report.majority_label(regression, dev) is None


def seed_row(seed, accuracy, label, count, total=100):
  return {'seed': seed, 'dev/accuracy': accuracy, 'dev/macro_f1': accuracy / 2,
          'top_prediction': {'dev': report.top_prediction(ABC, [label] * count + ['c'] * (total - count))}}


def test_a_one_class_seed_is_flagged_in_results_and_on_screen(tmp_path, capsys):
  per_seed = [seed_row(0, 0.55, 'a', 96), seed_row(1, 0.80, 'b', 94), seed_row(2, 0.70, 'a', 60)]
  c = FinetuneConfig(task='abc')
  results = train.write_results(str(tmp_path), ABC, c, per_seed, {'dev/accuracy': 0.55, 'dev/macro_f1': 0.2},
                                {'dev': 'a'})
  out = capsys.readouterr().out
  table = (tmp_path / 'results.md').read_text()
  assert table in out
  rows = table.splitlines()
  assert rows[4] == '| 0 | 55.00 | 27.50 | dev: a 96.0% **one class** |'
  assert rows[5] == '| 1 | 80.00 | 40.00 | dev: b 94.0% |'  # under 95%: not flagged
  assert rows[7] == '| **median** | **70.00** | **35.00** | |'
  assert rows[8] == '| majority baseline | 55.00 | 20.00 | dev: always a |'
  assert rows[10].startswith('**Warning**: seed 0 answers one class for at least 95% of the dev rows')
  saved = json.loads((tmp_path / 'results.json').read_text())
  assert saved == json.loads(json.dumps(results))
  assert saved['majority_baseline'] == {'dev/accuracy': 0.55, 'dev/macro_f1': 0.2}
  assert saved['majority_label'] == {'dev': 'a'} and saved['one_class_seeds'] == [0]
  assert saved['seeds'][0]['top_prediction']['dev'] == {'label': 'a', 'count': 96, 'total': 100, 'share': 0.96}
  assert saved['best_seed'] == 1 and saved['median']['dev/accuracy'] == 0.7

  summary = out[len(table) + 1:].splitlines()  # print(table) adds a newline
  assert summary[0] == ('abc: dev/accuracy x100 55.00 (seed 0), 80.00 (seed 1), 70.00 (seed 2); median 70.00; '
                        "majority baseline 55.00 (always 'a')")
  assert summary[1] == 'warning: seed 0 answers one class for >= 95% of the dev rows (see results.md)'
  assert summary[-1] == (f'predict with the best seed (1): python -m electra_jax.main --config=configs/finetune.py '
                         f'--workdir={tmp_path} --config.predict_input=FILE')
  line = report.one_class_warning('[abc seed 0]', 'dev', per_seed[0]['top_prediction']['dev'])
  assert line.startswith("warning: [abc seed 0] predicts 'a' for 96.0% of dev rows (96 of 100)")
  assert '\n' not in line


def test_results_of_regression_have_no_baseline_or_share_column(tmp_path, capsys):
  stsb = tasks.get_task('stsb')
  per_seed = [{'seed': 0, 'dev/spearman': 0.5, 'dev/pearson': 0.4}]
  train.write_results(str(tmp_path), stsb, FinetuneConfig(task='stsb'), per_seed, {}, {})
  table = (tmp_path / 'results.md').read_text().splitlines()
  assert table[2] == '| seed | dev/spearman | dev/pearson |' and table[-1] == '| **median** | **50.00** | **40.00** |'
  assert 'majority baseline' not in capsys.readouterr().out


def read_tsv(text_):
  return list(csv.reader(io.StringIO(text_), delimiter='\t', quoting=csv.QUOTE_NONE, escapechar='\\'))


def test_dev_predictions_put_gold_and_predicted_label_names_side_by_side(tmp_path):
  sst2 = tasks.get_task('sst2')
  examples = [tasks.TextExample('0', ('a fine film',), 'positive'), tasks.TextExample('1', ('dull',), 'negative')]
  probs = np.array([[0.25, 0.75], [0.4, 0.6]])
  predict.write_predictions(str(tmp_path), sst2, sst2.dev_splits[0], examples, ['positive', 'positive'], probs)
  assert read_tsv((tmp_path / 'dev.tsv').read_text()) == [
      ['id', 'gold', 'prediction', 'p_negative', 'p_positive', 'sentence'],
      ['0', 'positive', 'positive', '0.2500', '0.7500', 'a fine film'],
      ['1', 'negative', 'positive', '0.4000', '0.6000', 'dull']]
  predict.write_predictions(str(tmp_path), sst2, sst2.test_splits[0], examples, ['positive', 'negative'], probs)
  assert (tmp_path / 'SST-2.tsv').read_text() == 'index\tprediction\n0\t1\n1\t0\n'  # the leaderboard's format

  tagged = [tasks.TaggingExample('s1', ('the', 'cat'), ('O', 'B-X'))]
  predict.write_predictions(str(tmp_path), TAGS, TAGS.dev_splits[0], tagged, [['O', 'O']])
  assert (tmp_path / 'dev.conll').read_text() == 'the\tO\tO\ncat\tB-X\tO\n\n'


def test_predict_formats_parse_back():
  inputs = [('a fine film',), ('tab-free text', 'second sentence')]
  predicted, probs = ['b', 'a'], np.array([[0.1, 0.7, 0.2], [0.5, 0.3, 0.2]])
  rows = read_tsv(predict.format_predictions(ABC, inputs, predicted, probs, 'tsv'))
  assert rows == [['prediction', 'p_a', 'p_b', 'p_c', 'sentence', 'sentence2'],
                  ['b', '0.1000', '0.7000', '0.2000', 'a fine film'],
                  ['a', '0.5000', '0.3000', '0.2000', 'tab-free text', 'second sentence']]
  records = [json.loads(line) for line in predict.format_predictions(ABC, inputs, predicted, probs,
                                                                     'jsonl').splitlines()]
  assert records[1] == {'input': ['tab-free text', 'second sentence'], 'prediction': 'a',
                        'probabilities': {'a': 0.5, 'b': 0.3, 'c': 0.2}}
  assert predict.format_predictions(ABC, inputs, predicted, probs, 'labels') == 'b\na\n'
  tagging = predict.format_predictions(TAGS, ['the cat'], [['O', 'B-X']], None, 'tsv')
  assert read_tsv(tagging) == [['prediction', 'words'], ['O B-X', 'the cat']]
  assert json.loads(predict.format_predictions(TAGS, ['the cat'], [['O', 'B-X']], None, 'jsonl')) == {
      'input': ['the', 'cat'], 'prediction': ['O', 'B-X']}


def test_predict_input_is_one_example_a_line_and_a_blank_line_is_refused():
  """The output has one line per input line, in order: a blank line skipped would shift every later prediction
  (the labels format shows no input to notice it by). Blank lines at the end are only a file's end."""
  assert predict.parse_inputs('a fine film\r\nfirst\tsecond\n\n \n', ABC.kind, 'in.txt') == [
      ('a fine film',), ('first', 'second')]
  assert predict.parse_inputs('the cat\n', TAGS.kind, 'in.txt') == ['the cat']
  with pytest.raises(DataError, match=r'^--config.predict_input=-: line 2 is blank \(2 blank line\(s\)\); give one '
                     'example per line, without blank lines, so that output line N is the prediction for input line '
                     'N$'):
    predict.parse_inputs('one\n\ntwo\n \nthree\n', ABC.kind, '-')


def test_the_log_interval_suits_the_run_length():
  assert train.log_interval(100, 96) == 4  # a 96-step run logs 24 times, not once at its end
  assert train.log_interval(100, 10) == 1
  assert train.log_interval(5, 1000) == 5  # a smaller configured interval is kept
  assert train.log_interval(100, 100_000) == 100
