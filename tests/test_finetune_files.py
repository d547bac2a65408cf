"""Readers of the files users have (GLUE's distribution, SQuAD's JSON, task directories) on hand-made fixtures in
the exact formats (tests/data/), and every bad-input check: one DataError naming the file, the line and the fix."""

import json
import os
import shutil

import pytest

from electra_jax.config import ConfigError
from electra_jax.errors import DataError
from electra_jax.finetune import files, tasks

DATA = os.path.join(os.path.dirname(__file__), 'data')
GLUE_DIR = os.path.join(DATA, 'glue')
SQUAD_DIR = os.path.join(DATA, 'squad')


def _glue(name):
  return tasks.get_task(name, glue_dir=GLUE_DIR)


# Expected (split, number of examples, first example's texts and label) per task, read off the fixture files.
GLUE_EXPECTED = {
    'cola': ('validation', 2, ('The sailors rode the breeze clear of the rocks.',), 'acceptable'),
    'sst2': ('train', 8, ('hide new secretions from the parental units ',), 'negative'),
    'mrpc': ('train', 4, ('Amrozi accused his brother , whom he called " the witness " , of deliberately distorting '
                          'his evidence .', 'Referring to him as only " the witness " , Amrozi accused his brother of '
                          'deliberately distorting his evidence .'), 'equivalent'),
    'stsb': ('validation', 4, ('A man with a hard hat is dancing.', 'A man wearing a hard hat is dancing.'), 5.0),
    'qqp': ('train', 4, ('How is the life of a math student? Could you describe your own experiences?',
                         'Which level of prepration is enough for the exam jlpt5?'), 'not_duplicate'),
    'mnli': ('validation_mismatched', 2, ('Your contribution helped make it possible for us to provide our students '
                                          'with a quality education.',
                                          'Your contributions were of no help with our students\' education.'),
             'contradiction'),
    'qnli': ('validation', 2, ('What came into force after the new constitution was herald?',
                               'As of that day, the new constitution heralding the Second Republic came into force.'),
             'entailment'),
    'rte': ('train', 8, ('No Weapons of Mass Destruction Found in Iraq Yet.',
                         'Weapons of Mass Destruction Found in Iraq.'), 'not_entailment'),
    'wnli': ('validation', 2, ('The drain is clogged with hair. It has to be cleaned.', 'The hair has to be cleaned.'),
             'not_entailment'),
}


@pytest.mark.parametrize('name', sorted(GLUE_EXPECTED))
def test_every_glue_task_reads_its_own_format(name):
  task = _glue(name)
  assert task.source == 'glue_dir' and task.location == os.path.join(GLUE_DIR, files.GLUE_FORMATS[name].folder)
  split, count, texts, label = GLUE_EXPECTED[name]
  examples = tasks.read(task, split)
  assert len(examples) == count
  assert examples[0].texts == texts and examples[0].label == label
  # The file's id column (`index`; QQP `id`), else the 0-based row (CoLA/SST-2/MRPC train and dev), as tfds' idx.
  assert examples[0].guid == ('133273' if name == 'qqp' else '0')
  # Every labelled split reads, and every test split is unlabelled with the leaderboard's ids.
  for s in task.dev_splits:
    assert all(e.label is not None for e in tasks.read(task, s.source))
  for s in task.test_splits:
    test = tasks.read(task, s.source)
    assert test and all(e.label is None for e in test) and len(test[0].texts) == len(texts)


def test_glue_ids_labels_and_mnli_extras():
  qqp_test = tasks.read(_glue('qqp'), 'test')
  assert qqp_test[0].guid == '0'  # QQP's test id column is `id`, the others' `index`
  mnli = _glue('MNLI')
  assert [s.submission for s in mnli.test_splits] == ['MNLI-m.tsv', 'MNLI-mm.tsv', 'AX.tsv']
  assert [e.label for e in tasks.read(mnli, 'train')][:3] == ['neutral', 'entailment', 'entailment']
  assert len(tasks.read(mnli, 'diagnostic')) == 2
  cola_train = tasks.read(_glue('cola'), 'train')  # no header: all 6 rows are examples, label in column 2
  assert len(cola_train) == 6 and [e.label for e in cola_train][2:4] == ['unacceptable', 'unacceptable']
  # GLUE_DIR may also be the task's own directory.
  assert tasks.get_task('rte', glue_dir=os.path.join(GLUE_DIR, 'RTE')).location == os.path.join(GLUE_DIR, 'RTE')


def test_glue_dir_errors(tmp_path):
  with pytest.raises(DataError, match='holds no RTE/ directory'):
    tasks.get_task('rte', glue_dir=str(tmp_path))
  with pytest.raises(ConfigError, match='glue_dir is for the GLUE tasks'):
    tasks.get_task('squad_v1', glue_dir=GLUE_DIR)


def _copy_glue(tmp_path, folder):
  shutil.copytree(os.path.join(GLUE_DIR, folder), tmp_path / folder)
  return tmp_path / folder


def _replace_line(path, number, text):
  lines = path.read_text(encoding='utf-8').split('\n')
  lines[number - 1] = text
  path.write_text('\n'.join(lines), encoding='utf-8')


def test_glue_unknown_dev_label_names_file_line_and_labels(tmp_path):
  rte = _copy_glue(tmp_path, 'RTE')
  _replace_line(rte / 'dev.tsv', 3, '1\tYet, we now are discovering that.\tBacteria is winning.\tneutral')
  task = tasks.get_task('rte', glue_dir=str(tmp_path))
  with pytest.raises(DataError, match=r"RTE/dev.tsv line 3: the label 'neutral' is not one of GLUE RTE's labels "
                                      r'\(entailment, not_entailment\)'):
    tasks.read(task, 'validation')


def test_glue_wrong_column_count_and_missing_header(tmp_path):
  sst = _copy_glue(tmp_path, 'SST-2')
  _replace_line(sst / 'train.tsv', 4, 'a sentence\twith a tab inside\t1')
  task = tasks.get_task('sst2', glue_dir=str(tmp_path))
  with pytest.raises(DataError, match=r'SST-2/train.tsv line 4: 3 columns where GLUE.s SST-2 train.tsv has 2'):
    tasks.read(task, 'train')
  _replace_line(sst / 'dev.tsv', 1, 'text\tlabel')
  with pytest.raises(DataError, match=r"SST-2/dev.tsv line 1: GLUE's SST-2 header has the columns sentence, label; "
                                      'this one lacks sentence'):
    tasks.read(task, 'validation')


def test_glue_skips_a_few_stray_tab_lines_as_the_official_reader_does(tmp_path, capsys):
  # GLUE's real QQP train.tsv has lines like this one (line 97,931 of the file: a question split by a stray tab).
  qqp = _copy_glue(tmp_path, 'QQP')
  header = (qqp / 'train.tsv').read_text(encoding='utf-8').split('\n')[0]
  rows = [f'{i}\t{2 * i}\t{2 * i + 1}\tWhat is {i}?\tWhat is {i} + 0?\t1' for i in range(200)]
  rows.insert(100, '"\tWas Muhammad a real historical figure? What is the evidence for his existence?\t0')
  (qqp / 'train.tsv').write_text('\n'.join([header] + rows) + '\n', encoding='utf-8')
  examples = tasks.read(tasks.get_task('qqp', glue_dir=str(tmp_path)), 'train')
  assert len(examples) == 200 and examples[100].guid == '100'  # the bad line (file line 102) is the only one left out
  assert 'QQP/train.tsv: skipped 1 line(s) with a number of columns other than 6, as the official ELECTRA reader ' \
         'does (line 102)' in capsys.readouterr().err
  # Three bad lines in 203 is more than 1%: not GLUE's file, refused.
  rows[5:5] = ['only\tthree\tcolumns', 'two\tcolumns']
  (qqp / 'train.tsv').write_text('\n'.join([header] + rows) + '\n', encoding='utf-8')
  with pytest.raises(DataError, match=r'QQP/train.tsv line 7: 3 columns where .* and 2 more of its 203 lines'):
    tasks.read(tasks.get_task('qqp', glue_dir=str(tmp_path)), 'train')


@pytest.mark.parametrize('score, message', [('high', 'is not a number'),
                                            ('5.5', r'is out of range \(the task takes \[0, 5\]\)'),
                                            ('-0.1', 'is out of range')])
def test_stsb_score_must_be_a_number_in_0_5(tmp_path, score, message):
  sts = _copy_glue(tmp_path, 'STS-B')
  _replace_line(sts / 'train.tsv', 3, '1\tmain-captions\tMSRvid\t2012test\t0004\tnone\tnone\tA man.\tA flute.\t'
                + score)
  with pytest.raises(DataError, match=f'STS-B/train.tsv line 3: the regression target {score!r} {message}'):
    tasks.read(tasks.get_task('stsb', glue_dir=str(tmp_path)), 'train')


def test_squad_json_v1_and_v2():
  v1 = tasks.get_task('squad_v1', squad_dir=SQUAD_DIR)
  train = tasks.read(v1, 'train')
  assert len(train) == 5 and train[3].question == 'When was John Smith born?'
  assert train[3].answers == ('1895',) and train[3].context[train[3].answer_starts[0]:].startswith('1895')
  dev = tasks.read(v1, 'validation')
  assert dev[0].guid == '56be4db0acb8001400a502ec' and dev[0].answers == ('John Smith', 'John Smith (1895-1943)')
  v2 = tasks.get_task('squad_v2', squad_dir=SQUAD_DIR)
  train2 = tasks.read(v2, 'train')
  impossible = [e for e in train2 if e.is_impossible]
  assert len(train2) == 7 and len(impossible) == 2 and all(e.answers == () for e in impossible)
  assert not any(e.is_impossible for e in train)


def test_squad_json_errors(tmp_path):
  with pytest.raises(DataError, match='train-v1.1.json is missing'):
    tasks.read(tasks.get_task('squad_v1', squad_dir=str(tmp_path)), 'train')
  (tmp_path / 'train-v1.1.json').write_text('{"data": [{"paragraphs": [{"context": "x", "qas": [{"id": "q1", '
                                            '"question": "y"}]}]}]}', encoding='utf-8')
  with pytest.raises(DataError, match="question 'q1' lacks 'answers'"):
    tasks.read(tasks.get_task('squad_v1', squad_dir=str(tmp_path)), 'train')


# Characters str.splitlines takes for line ends; in these files they are text.
SEPARATORS = '\x85\u2028\u2029\x0b\x0c\x1c\x1d\x1e'


def test_lines_end_only_at_newlines(tmp_path):
  assert files.split_lines(f'a{SEPARATORS}b\r\nc\rd\n\ne') == [f'a{SEPARATORS}b', 'c', 'd', '', 'e']
  assert files.split_lines('a\n') == ['a'] and files.split_lines('') == []
  path = tmp_path / 'train.tsv'
  path.write_bytes(f'label\tsentence\r\n1\tgood{SEPARATORS}film\r\n0\tbad film'.encode())
  assert files.local_tsv_rows(str(path)) == [(2, ['1', f'good{SEPARATORS}film']), (3, ['0', 'bad film'])]


def test_a_glue_sentence_with_a_line_separator_is_one_sentence(tmp_path):
  sst2 = tmp_path / 'SST-2'
  sst2.mkdir()
  (sst2 / 'dev.tsv').write_text('sentence\tlabel\na moving\u2028and funny film \t1\nflat \t0\n', encoding='utf-8')
  examples = files.glue_examples(str(sst2), files.GLUE_FORMATS['sst2'], 'validation', ('negative', 'positive'), ())
  assert [(e.texts, e.label) for e in examples] == [(('a moving\u2028and funny film ',), 'positive'),
                                                    (('flat ',), 'negative')]


def test_squad_json_with_a_raw_line_separator_reads(tmp_path):
  context = 'Tesla\u2028was born in 1856.'
  data = {'data': [{'paragraphs': [{'context': context, 'qas': [{'id': 'q1', 'question': 'when?', 'answers': [
      {'text': '1856', 'answer_start': context.index('1856')}]}]}]}]}
  (tmp_path / 'dev-v1.1.json').write_text(json.dumps(data, ensure_ascii=False), encoding='utf-8')
  [example] = files.squad_examples(str(tmp_path), False, 'validation')
  assert example.context == context and example.answer_starts == (18,)


# A task directory.

def test_local_tsv_with_a_glue_header_is_refused(tmp_path):
  shutil.copy(os.path.join(GLUE_DIR, 'RTE', 'train.tsv'), tmp_path / 'train.tsv')
  shutil.copy(os.path.join(GLUE_DIR, 'RTE', 'dev.tsv'), tmp_path / 'dev.tsv')
  with pytest.raises(DataError, match=r"train.tsv line 1: 'index<TAB>sentence1<TAB>sentence2<TAB>label' is a header "
                                      r"of GLUE's distribution.*--config.glue_dir"):
    tasks.get_task(str(tmp_path))
  (tmp_path / 'train.tsv').write_text('sentence\tlabel\ngood film\t1\n', encoding='utf-8')  # SST-2's header
  with pytest.raises(DataError, match='is a header of GLUE'):
    tasks.get_task(str(tmp_path))


def test_local_tsv_errors(tmp_path):
  (tmp_path / 'train.tsv').write_text('label\tsentence\npos\tgood\nneg\tbad\n', encoding='utf-8')
  (tmp_path / 'dev.tsv').write_text('pos\tfine\nNegative\tawful\n', encoding='utf-8')
  task = tasks.get_task(str(tmp_path))
  with pytest.raises(ConfigError, match=r"^--config.task_kind='regresion': give classification or regression"):
    tasks.get_task(str(tmp_path), 'regresion')  # it trained as classification, status 0
  with pytest.raises(DataError, match=r"dev.tsv line 2: the label 'Negative' does not occur in the training file "
                                      r'\(its labels: neg, pos\)'):
    tasks.read(task, 'validation')
  (tmp_path / 'test.tsv').write_text('\tunlabelled is fine\nneutral\tnot fine\n', encoding='utf-8')
  task = tasks.get_task(str(tmp_path))
  with pytest.raises(DataError, match="test.tsv line 2: the label 'neutral'"):
    tasks.read(task, 'test')
  (tmp_path / 'dev.tsv').write_text('pos\tfine\nneg\ttoo\tmany\n', encoding='utf-8')
  with pytest.raises(DataError, match=r'dev.tsv line 2: 3 column\(s\) where the file.s first row has 2'):
    tasks.read(task, 'validation')
  (tmp_path / 'train.tsv').write_text('pos\tgood\npos\tfine\n', encoding='utf-8')
  with pytest.raises(DataError, match="train.tsv: every training example has the label 'pos'; a classifier needs "
                                      'at least two classes'):
    tasks.get_task(str(tmp_path))


def test_local_tsv_empty_files_empty_labels_and_tabs_ending_rows(tmp_path):
  (tmp_path / 'train.tsv').write_text('1\tgood film\t\n0\tbad film\t \t\n', encoding='utf-8')
  (tmp_path / 'dev.tsv').write_text('label\tsentence\n', encoding='utf-8')
  task = tasks.get_task(str(tmp_path))
  # A tab ending a row is no empty second sentence: still a single-sentence task.
  assert [(e.texts, e.label) for e in tasks.read(task, 'train')] == [(('good film',), '1'), (('bad film',), '0')]
  # A header-only (or empty) dev file is refused, not scored 0.
  with pytest.raises(DataError, match=r'dev.tsv holds no examples \(it is empty or only a header\)'):
    tasks.read(task, 'validation')
  (tmp_path / 'dev.tsv').write_text('', encoding='utf-8')
  with pytest.raises(DataError, match='dev.tsv holds no examples'):
    tasks.read(task, 'validation')
  # An empty label is a class '' nowhere but in a test file (unlabelled there).
  (tmp_path / 'dev.tsv').write_text('1\tnice\n\tbad\n', encoding='utf-8')
  with pytest.raises(DataError, match='dev.tsv line 2: the label is empty; only a test file may leave labels empty'):
    tasks.read(task, 'validation')
  (tmp_path / 'train.tsv').write_text('1\tgood film\n\tbad film\n0\tawful film\n', encoding='utf-8')
  with pytest.raises(DataError, match='train.tsv line 2: the label is empty'):
    tasks.get_task(str(tmp_path))
  conll = tmp_path / 'conll'
  conll.mkdir()
  (conll / 'train.conll').write_text('EU\tB-ORG\n', encoding='utf-8')
  (conll / 'dev.conll').write_text('\n', encoding='utf-8')
  with pytest.raises(DataError, match='dev.conll holds no examples'):
    tasks.read(tasks.get_task(str(conll)), 'validation')


def test_local_regression_targets_must_be_finite_numbers(tmp_path):
  (tmp_path / 'train.tsv').write_text('0.5\ta\n1.5\tb\n', encoding='utf-8')
  (tmp_path / 'dev.tsv').write_text('0.25\tc\nabc\td\n', encoding='utf-8')
  task = tasks.get_task(str(tmp_path))
  assert task.kind == tasks.REGRESSION
  with pytest.raises(DataError, match="dev.tsv line 2: the regression target 'abc' is not a number"):
    tasks.read(task, 'validation')
  (tmp_path / 'dev.tsv').write_text('0.25\tc\ninf\td\n', encoding='utf-8')
  with pytest.raises(DataError, match="dev.tsv line 2: the regression target 'inf' is out of range"):
    tasks.read(task, 'validation')


@pytest.mark.parametrize('label', ['nan', 'inf', '-Infinity'])
def test_a_non_finite_training_label_is_a_regression_target_refused_in_one_line(tmp_path, label):
  # Every label a number, one not an integer (nan and inf are not): regression, whose reader refuses it.
  (tmp_path / 'train.tsv').write_text(f'1\ta\n{label}\tb\n0\tc\n', encoding='utf-8')
  (tmp_path / 'dev.tsv').write_text('1\tc\n', encoding='utf-8')
  task = tasks.get_task(str(tmp_path))
  assert task.kind == tasks.REGRESSION
  with pytest.raises(DataError, match=f"train.tsv line 2: the regression target '{label}' is out of range"):
    tasks.read(task, 'train')


def test_conll_lines_and_sentence_positions(tmp_path):
  path = tmp_path / 'dev.conll'
  path.write_text('-DOCSTART- O\n\nThe\tDT\ncat\tNN\n\nA\tDT\n', encoding='utf-8')
  examples = files.conll_examples(str(path))
  assert [e.guid for e in examples] == ['dev.conll:3', 'dev.conll:6']  # the line of each sentence's first word
  path.write_text('The\tDT\ncat\n', encoding='utf-8')
  with pytest.raises(DataError, match=r"dev.conll line 2: expected token<TAB>tag, got 'cat'"):
    files.conll_examples(str(path))


def test_conll_tab_after_the_tag_is_not_an_empty_tag(tmp_path):
  path = tmp_path / 'dev.conll'
  path.write_text('EU\tB-ORG\t\nrejects\tO\t\n\nPeter Pan\tB-PER \t\n', encoding='utf-8')
  assert [(e.words, e.tags) for e in files.conll_examples(str(path))] == [
      (('EU', 'rejects'), ('B-ORG', 'O')), (('Peter Pan',), ('B-PER',))]
  # A word whose tag column is empty is refused, not read as the tag ''.
  path.write_text('EU\tB-ORG\nrejects\t\t\n', encoding='utf-8')
  with pytest.raises(DataError, match=r"dev.conll line 2: expected token<TAB>tag, got 'rejects\\t\\t' \(no tag\)"):
    files.conll_examples(str(path))


def test_glue_test_files_are_optional(tmp_path):
  """A GLUE directory without test.tsv trains and evaluates (as a task directory does); it only predicts none."""
  rte = _copy_glue(tmp_path, 'RTE')
  assert [s.name for s in tasks.get_task('rte', glue_dir=str(tmp_path)).test_splits] == ['test']
  os.remove(rte / 'test.tsv')
  task = tasks.get_task('rte', glue_dir=str(tmp_path))
  assert task.test_splits == ()
  assert len(tasks.read(task, 'validation')) == 3
