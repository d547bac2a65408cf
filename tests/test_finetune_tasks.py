"""Task declarations, the tfds route (mock data, and real preparation from the downloaded files), featurisation and
SQuAD span decoding."""

import gzip
import json
import os
import types
from unittest import mock

import numpy as np
import pytest
import tensorflow_datasets as tfds

from electra_jax.config import ConfigError
from electra_jax.data import DataError
from electra_jax.data import tokenizer as tokenizer_lib
from electra_jax.finetune import features, metrics, predict, squad, tasks
from electra_jax.finetune.config import SquadConfig

DATA = os.path.join(os.path.dirname(__file__), 'data')
GLUE_DIR, SQUAD_DIR = os.path.join(DATA, 'glue'), os.path.join(DATA, 'squad')


@pytest.fixture(scope='module')
def tokenizer(corpus_file, tmp_path_factory):
  with open(corpus_file, encoding='utf-8') as f:
    lines = f.read().splitlines()
  return tokenizer_lib.train(lines, str(tmp_path_factory.mktemp('spm')), vocab_size=60)


def _write(path, text, gz=False):
  if gz:
    with gzip.open(path, 'wt', encoding='utf-8') as f:
      f.write(text)
  else:
    path.write_text(text, encoding='utf-8')


def test_tsv_directory_classification_with_and_without_header(tmp_path):
  _write(tmp_path / 'train.tsv.gz', 'label\tsentence\npos\tgood film\nneg\tbad film\npos\tfine\n', gz=True)
  _write(tmp_path / 'dev.tsv', 'neg\tawful\npos\tgreat\n')  # no header
  task = tasks.get_task(str(tmp_path))
  assert (task.kind, task.labels, task.metrics[0]) == (tasks.CLASSIFICATION, ('neg', 'pos'), 'accuracy')
  assert task.test_splits == ()
  train = tasks.read(task, 'train')
  assert [(e.texts, e.label) for e in train] == [(('good film',), 'pos'), (('bad film',), 'neg'), (('fine',), 'pos')]
  assert [e.label for e in tasks.read(task, 'validation')] == ['neg', 'pos']


def test_tsv_directory_regression_pairs(tmp_path):
  _write(tmp_path / 'train.tsv', 'label\tsentence\tsentence2\n3.5\ta b\tc d\n1\te\tf\n')
  _write(tmp_path / 'dev.tsv', 'label\tsentence\tsentence2\n2.25\tg\th\n')
  _write(tmp_path / 'test.tsv', 'label\tsentence\tsentence2\n\ti\tj\n')  # an empty label: unlabelled
  task = tasks.get_task(str(tmp_path))
  assert task.kind == tasks.REGRESSION and task.metrics == ('spearman', 'pearson')
  assert [(e.texts, e.label) for e in tasks.read(task, 'train')] == [(('a b', 'c d'), 3.5), (('e', 'f'), 1.0)]
  assert tasks.read(task, 'test')[0].label is None
  assert tasks.get_task(str(tmp_path), kind=tasks.CLASSIFICATION).labels == ('1', '3.5')


def test_conll_directory(tmp_path):
  _write(tmp_path / 'train.conll', 'John\tB-PER\nSmith\tI-PER\nran\tO\n\nParis\tB-LOC\n')
  _write(tmp_path / 'dev.conll', '-DOCSTART- O\n\nMary\tB-PER\n')
  task = tasks.get_task(str(tmp_path))
  assert (task.kind, task.labels, task.metrics) == (tasks.TAGGING, ('B-LOC', 'B-PER', 'I-PER', 'O'),
                                                    ('span_f1', 'token_accuracy'))
  train = tasks.read(task, 'train')
  assert [(e.words, e.tags) for e in train] == [(('John', 'Smith', 'ran'), ('B-PER', 'I-PER', 'O')),
                                                (('Paris',), ('B-LOC',))]
  pos = tmp_path / 'pos'
  pos.mkdir()
  _write(pos / 'train.conll', 'The\tDT\ncat\tNN\n')
  _write(pos / 'dev.conll', 'A\tDT\n')
  assert tasks.get_task(str(pos)).metrics == ('token_accuracy',)


def test_unknown_task_is_a_clear_error(tmp_path):
  with pytest.raises(ConfigError, match='unknown task'):
    tasks.get_task('nope')
  with pytest.raises(ConfigError, match='train and dev'):
    tasks.get_task(str(tmp_path))


def test_glue_from_tfds_mock_data(online):
  with tfds.testing.mock_data(num_examples=6, policy=tfds.testing.MockPolicy.USE_CODE):
    cola = tasks.read(tasks.get_task('CoLA'), 'validation')
    mnli = tasks.get_task('mnli')
    mismatched = tasks.read(mnli, mnli.dev_splits[1].source)
    stsb = tasks.read(tasks.get_task('sts-b'), 'train')
  assert len(cola) == 6 and len(cola[0].texts) == 1 and cola[0].label in ('unacceptable', 'acceptable')
  assert len(mismatched) == 6 and len(mismatched[0].texts) == 2 and mismatched[0].label in mnli.labels
  assert isinstance(stsb[0].label, float) and len(stsb[0].texts) == 2
  assert [s.submission for s in mnli.test_splits] == ['MNLI-m.tsv', 'MNLI-mm.tsv']


def test_squad_from_tfds_mock_data(online):
  with tfds.testing.mock_data(num_examples=4, policy=tfds.testing.MockPolicy.USE_CODE):
    v1 = tasks.read(tasks.get_task('squad_v1'), 'validation')
    v2 = tasks.read(tasks.get_task('squad_v2'), 'train')
  assert len(v1) == 4 and isinstance(v1[0].context, str) and v1[0].answers
  assert all(e.answers == () for e in v2 if e.is_impossible)


def _downloaded(self, url_or_urls):
  """DownloadManager.download_and_extract on the fixtures: GLUE's zips unpack to tests/data/glue/<TASK>/, SQuAD's
  JSON files are tests/data/squad/."""
  del self
  if isinstance(url_or_urls, dict):
    return {k: os.path.join(SQUAD_DIR, os.path.basename(v)) for k, v in url_or_urls.items()}
  return GLUE_DIR


def test_tfds_prepares_glue_and_squad_without_tensorflow(tmp_path, online):
  """The real tfds route (dataset preparation included: importlib_resources, array_record writing) on the
  downloaded files, network replaced by the fixtures; it reads what our own GLUE/SQuAD file readers read."""
  data_dir = str(tmp_path / 'tfds')
  with mock.patch.object(tfds.download.DownloadManager, 'download_and_extract', _downloaded):
    for name in ('rte', 'sst2'):
      from_tfds = tasks.read(tasks.get_task(name), 'validation', data_dir=data_dir)
      from_files = tasks.read(tasks.get_task(name, glue_dir=GLUE_DIR), 'validation')
      assert sorted(from_tfds, key=_guid) == sorted(from_files, key=_guid)  # tfds shuffles; guid = GLUE's index
    from_tfds = tasks.read(tasks.get_task('squad_v1'), 'train', data_dir=data_dir)
  from_files = tasks.read(tasks.get_task('squad_v1', squad_dir=SQUAD_DIR), 'train')
  assert sorted(from_tfds, key=_guid) == sorted(from_files, key=_guid)


@pytest.mark.parametrize('name, host', [('rte', 'dl.fbaipublicfiles.com'), ('squad_v1', 'rajpurkar.github.io')])
def test_an_unprepared_task_fails_at_once_when_offline(name, host, tmp_path, monkeypatch):
  """Offline, a task by name stops before tfds's downloader (which retries for minutes), naming the flag to give;
  a task tfds has prepared already needs no network."""
  tried = []

  def unreachable(address, timeout):
    tried.append((address, timeout))
    raise OSError(101, 'Network is unreachable')

  monkeypatch.setattr(tasks.socket, 'create_connection', unreachable)
  monkeypatch.delenv('https_proxy', raising=False)
  monkeypatch.delenv('HTTPS_PROXY', raising=False)
  with mock.patch.object(tfds.download.DownloadManager, 'download_and_extract', side_effect=AssertionError):
    with pytest.raises(DataError) as error:
      tasks.read(tasks.get_task(name), 'train', data_dir=str(tmp_path / 'tfds'))
  assert tried == [((host, 443), 5.0)]
  message = str(error.value)
  assert f'{host} is unreachable (Network is unreachable)' in message and 'downloads it once' in message
  assert ('--config.squad_dir=DIR' if name.startswith('squad') else '--config.glue_dir=DIR') in message
  # Prepared (here from the fixture files, as if online), it reads without the network.
  check = tasks._check_download_host  # pylint: disable=protected-access
  monkeypatch.setattr(tasks, '_check_download_host', lambda *args: None)
  with mock.patch.object(tfds.download.DownloadManager, 'download_and_extract', _downloaded):
    tasks.read(tasks.get_task(name), 'validation', data_dir=str(tmp_path / 'tfds'))
  monkeypatch.setattr(tasks, '_check_download_host', check)
  assert tasks.read(tasks.get_task(name), 'validation', data_dir=str(tmp_path / 'tfds'))
  assert len(tried) == 1  # not asked again


def _guid(example):
  return example.guid


def test_text_features_truncate_pairs_and_swap_orders(tokenizer):
  task = tasks.get_task('mrpc')
  examples = [tasks.TextExample('0', ('the cat sat', 'the dog ran on the mat and the rug'), 'equivalent')]
  feats = features.encode_texts(task, examples, tokenizer, 12, training=True)
  assert feats.arrays['input_ids'].shape == (2, 12)  # both orders; length 12 <= the rounded-up 16
  s = tokenizer.special
  row = feats.arrays['input_ids'][0]
  assert row[0] == s.cls and list(row).count(s.sep) == 2 and feats.arrays['input_mask'][0].sum() == 12
  assert feats.arrays['labels'].tolist() == [1, 1] and feats.example_index.tolist() == [0, 0]
  assert len(features.encode_texts(task, examples, tokenizer, 128, training=False)) == 1


def test_word_features_label_first_sub_tokens(tokenizer):
  task = tasks.Task('t', tasks.TAGGING, 'files', '', labels=('B-X', 'O'))
  examples = [tasks.TaggingExample('0', ('quickly', 'the', 'cat'), ('O', 'O', 'B-X'))]
  feats = features.encode_words(task, examples, tokenizer, 32)
  positions = feats.word_positions[0]
  assert positions[0] == 1 and len(positions) == 3
  labels = feats.arrays['labels'][0]
  assert labels[positions].tolist() == [1, 1, 0] and (labels >= 0).sum() == 3
  length = feats.arrays['input_mask'][0].sum()
  assert (feats.arrays['segment_ids'][0][:length] == 1).all()  # the official tagging featurizer's segment ids


def test_stsb_targets_are_scaled_to_0_1_and_predictions_back(tokenizer):
  # Official RegressionTask(0, 5): target (label - 0) / 5, so 3.8 -> 0.76; an output of 0.5 is a score of 2.5.
  task = tasks.get_task('stsb')
  examples = [tasks.TextExample('0', ('the cat', 'a dog'), 3.8), tasks.TextExample('1', ('a', 'b'), None)]
  feats = features.encode_texts(task, examples, tokenizer, 32, training=False)
  np.testing.assert_allclose(feats.arrays['labels'], [0.76, np.nan], rtol=1e-6)
  outputs = {'logits': np.array([[0.5], [1.0]], np.float32)}
  assert predict.decode(task, feats, outputs, SquadConfig(), tokenizer) == pytest.approx([2.5, 5.0])
  local = tasks.Task('r', tasks.REGRESSION, 'files', '')  # no declared range: raw targets
  assert features.encode_texts(local, examples[:1], tokenizer, 32, training=False).arrays['labels'][0] == \
      pytest.approx(3.8)


@pytest.mark.parametrize('rows, batch, epochs, expected', [
    (1000, 32, 3.0, 96),  # official: ceil(1000 / 32) = 32 batches per epoch (rows padded to whole batches) x 3
    (1000, 32, 2.5, 80),
    (64, 32, 3.0, 6),
    (10, 32, 0.5, 1),  # int(0.5) = 0, at least one step
])
def test_train_steps_count_whole_batches(rows, batch, epochs, expected):
  assert features.num_train_steps(rows, batch, epochs) == expected


def test_improve_span_narrows_to_the_answer_tokens():
  # Official _improve_answer_span: "(1895-1943)." -> ( 1895 - 1943 ) .; the answer "1895" is token 1 of the word.
  doc = [10, 11, 12, 13, 14, 15]  # ( 1895 - 1943 ) .
  assert squad.improve_span(doc, 0, 5, [11]) == (1, 1)
  assert squad.improve_span(doc, 0, 5, [13, 14]) == (3, 4)
  assert squad.improve_span(doc, 0, 5, [99]) == (0, 5)  # not found: the word span


def test_squad_windows_hold_the_answer_and_decode_back(tokenizer):
  context = 'the cat sat on the mat and the dog ran over the big red house near the field'
  start = context.index('big red house')
  example = tasks.SquadExample('q', 'where did the dog run', context, ('big red house',), (start,))
  config = SquadConfig(doc_stride=4, max_query_length=8)
  feats = squad.encode([example], tokenizer, 24, config, training=True)
  assert len(feats) > 2  # several overlapping windows
  arrays = feats.arrays
  holding = np.flatnonzero(arrays['start_positions'] > 0)
  assert 1 <= len(holding) < len(feats)
  # Windows without the answer point at [CLS], yet stay labelled answerable: the official label is the question's.
  assert (arrays['end_positions'][arrays['start_positions'] == 0] == 0).all()
  assert (arrays['is_impossible'] == 0).all()
  row = holding[0]
  words, _ = squad.split_words(context)
  token_to_word = feats.windows['token_to_word'][row]
  first, last = arrays['start_positions'][row], arrays['end_positions'][row]
  assert ' '.join(words[token_to_word[first]:token_to_word[last] + 1]) == 'big red house'

  # Decoding: a beam whose best entry is the gold span of that window gives the answer text back.
  n, k = len(feats), 2
  outputs = {'start_top_log_probs': np.full((n, k), -5.0), 'start_top_index': np.zeros((n, k), np.int64),
             'end_top_log_probs': np.full((n, k, k), -5.0), 'end_top_index': np.zeros((n, k, k), np.int64)}
  outputs['start_top_log_probs'][row, 0], outputs['start_top_index'][row, 0] = -0.1, first
  outputs['end_top_log_probs'][row, 0, 0], outputs['end_top_index'][row, 0, 0] = -0.1, last
  predictions, _ = squad.decode(feats, outputs, config, False, tokenizer)
  assert predictions == {'q': 'big red house'}
  outputs['impossible_logit'] = np.full((n,), 2.0)
  predictions, null_odds = squad.decode(feats, outputs, config, True, tokenizer)
  assert predictions == {'q': 'big red house'} and null_odds == {'q': 2.0}
  assert squad.answer('big red house', 2.0, config) == ''  # 2.0 > -2.75: unanswered


def _wordpiece(directory, words):
  """An uncased WordPiece tokenizer knowing only ELECTRA's special tokens and `words`."""
  vocab = directory / 'vocab.txt'
  vocab.write_text('\n'.join(['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]', *words]) + '\n', encoding='utf-8')
  return tokenizer_lib.load(str(vocab))


def test_squad_answer_is_cut_out_of_its_word_by_characters(tmp_path):
  # Official get_final_text: the span predicted is the sub-token "1856" of the word "(1856-1943).", so the answer is
  # "1856" (EM 1), not the whole word (EM 0).
  wordpiece = _wordpiece(tmp_path, ['when', 'was', 'tesla', 'born', 'lived', '(', ')', '-', '.', '1856', '1943'])
  context = 'Tesla lived (1856-1943).'
  example = tasks.SquadExample('q', 'when was tesla born', context, ('1856',), (context.index('1856'),))
  feats = squad.encode([example], wordpiece, 32, SquadConfig(), training=True)
  start, end = int(feats.arrays['start_positions'][0]), int(feats.arrays['end_positions'][0])
  assert wordpiece.pieces(feats.arrays['input_ids'][0][start:end + 1]) == ['1856']
  outputs = {'start_top_log_probs': np.array([[-0.1]]), 'start_top_index': np.array([[start]]),
             'end_top_log_probs': np.array([[[-0.1]]]), 'end_top_index': np.array([[[end]]])}
  predictions, _ = squad.decode(feats, outputs, SquadConfig(), False, wordpiece)
  assert predictions == {'q': '1856'}
  assert metrics.squad(predictions, {'q': ['1856']}) == {'exact_match': 1.0, 'f1': 1.0}
  # Several words: cut at both ends; the case and accents of the context are kept.
  assert squad.final_text(['lived', '(', '1856'], 'Tesla lived (1856-1943).', wordpiece) == 'lived (1856'
  assert squad.final_text(['tesla'], 'Téslà', wordpiece) == 'Téslà'
  # SentencePiece marks word starts with U+2581; uncased NFKC: the full-width "１８５６" is spelled 1856.
  sentencepiece = types.SimpleNamespace(kind='sentencepiece', lowercase=True)
  assert squad.final_text(['\u2581(', '18', '56'], '(1856-1943).', sentencepiece) == '(1856'
  assert squad.final_text(['56', '-'], '(\uff11\uff18\uff15\uff16-1943)', sentencepiece) == '\uff15\uff16-'


def test_squad_answer_falls_back_to_the_whole_words_when_it_cannot_be_aligned(tmp_path):
  wordpiece = _wordpiece(tmp_path, ['1856'])
  # "Smiljan" is [UNK]: its text is not in the words, so the answer is the words the span covers, as officially.
  assert squad.final_text(['[UNK]'], '(Smiljan).', wordpiece) == '(Smiljan).'
  assert squad.final_text(['1856', '[UNK]'], '1856 Smiljan', wordpiece) == '1856 Smiljan'


def test_squad_v2_is_unanswered_above_the_official_threshold_and_dev_files_are_the_official_ones(tmp_path):
  # Official: squad_official_eval scores dev with na_prob_thresh = qa_na_threshold = -2.75 (null odds > it: ''),
  # from a predictions file of best spans plus a null-odds file.
  config = SquadConfig()
  assert [squad.answer('x', odds, config) for odds in (-1.0, -2.75, -3.0, None)] == ['', 'x', 'x', 'x']
  wordpiece = _wordpiece(tmp_path, ['when', 'was', 'tesla', 'born', 'lived', '(', ')', '-', '.', '1856', '1943'])
  context = 'Tesla lived (1856-1943).'
  examples = [tasks.SquadExample('q1', 'when was tesla born', context, ('1856',), (context.index('1856'),)),
              tasks.SquadExample('q2', 'when was tesla born', context, is_impossible=True)]
  feats = squad.encode(examples, wordpiece, 32, config, training=False)
  position = wordpiece.pieces(feats.arrays['input_ids'][0]).index('1856')
  outputs = {'start_top_log_probs': np.full((2, 1), -0.1), 'start_top_index': np.full((2, 1), position),
             'end_top_log_probs': np.full((2, 1, 1), -0.1), 'end_top_index': np.full((2, 1, 1), position),
             'impossible_logit': np.array([-3.0, -1.0])}
  task = tasks.get_task('squad_v2')
  predicted = predict.decode(task, feats, outputs, config, wordpiece)
  assert predicted == [{'answer': '1856', 'span': '1856', 'null_odds': -3.0},
                       {'answer': '', 'span': '1856', 'null_odds': -1.0}]
  # q1 right, q2 rightly unanswered: EM 1 (the threshold 0 used before answered q2 "1856": EM 1/2).
  answers = {e.guid: p['answer'] for e, p in zip(examples, predicted)}
  assert metrics.squad(answers, {'q1': ['1856'], 'q2': []}) == {'exact_match': 1.0, 'f1': 1.0}
  predict.write_predictions(str(tmp_path / 'out'), task, task.dev_splits[0], examples, predicted)
  assert json.loads((tmp_path / 'out' / 'dev.json').read_text()) == {'q1': '1856', 'q2': '1856'}
  assert json.loads((tmp_path / 'out' / 'dev_null_odds.json').read_text()) == {'q1': -3.0, 'q2': -1.0}
