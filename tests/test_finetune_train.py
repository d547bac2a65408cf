"""End-to-end fine-tuning on CPU with a tiny model: generated learnable tasks, loading a pre-training workdir,
SQuAD 2.0 on tfds mock data, GLUE's own files, prediction files, --mode=predict, bad input, workdirs and resuming."""

import dataclasses
import json
import os
import random

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
import tensorflow_datasets as tfds

from configs import finetune as finetune_config
from electra_jax import config as config_lib
from electra_jax import data, sharding
from electra_jax.finetune import predict, tasks, train
from helpers import KEYWORD, TINY_FINETUNE_MODEL as TINY_MODEL, WORDS  # pylint: disable=g-bad-import-order
from helpers import keyword_free_sentence, make_tsv_task, override, pretraining_workdir, traced_functions

# Many runs here share one tiny model: with a persistent compilation cache they compile it once. tfds's data here is
# mock data: no download (`online`).
pytestmark = pytest.mark.usefixtures('compile_once', 'online')

ANIMALS = ('cat', 'dog', 'bird')


def make_conll_task(directory, seed=0, sizes=(200, 60)):
  """Animals are B-ANI (I-ANI after 'big'/'small', which is then B-ANI); every other word is O."""
  os.makedirs(directory, exist_ok=True)
  rng = random.Random(seed)
  for split, count in zip(('train', 'dev'), sizes):
    with open(os.path.join(directory, f'{split}.conll'), 'w', encoding='utf-8') as f:
      for _ in range(count):
        words = [rng.choice(WORDS) for _ in range(rng.randint(4, 9))]
        tags = []
        for i, w in enumerate(words):
          previous_adjective = i > 0 and words[i - 1] in ('big', 'small') and tags[-1] == 'B-ANI'
          tags.append(('I-ANI' if previous_adjective else 'B-ANI') if w in ANIMALS else 'O')
          if w in ANIMALS and i > 0 and words[i - 1] in ('big', 'small') and not previous_adjective:
            tags[-2], tags[-1] = 'B-ANI', 'I-ANI'
        f.writelines(f'{w}\t{t}\n' for w, t in zip(words, tags))
        f.write('\n')
  return str(directory)


def tiny_config(cache_dir, corpus_file, task, **overrides):
  config = finetune_config.get_config()
  config.task = task
  config.model.update(TINY_MODEL)
  config.data.update(source=corpus_file, vocab_size=60, cache_dir=cache_dir)
  config.update(batch_size=16, eval_batch_size=32, log_every=1000, max_seq_length=32, epochs=6.0)
  config.optimizer.learning_rate = 2e-3
  config.mesh.shape = (1, 1, 1)
  return override(config, overrides)


@pytest.mark.slow
def test_tsv_task_learns_from_scratch_and_predicts(tmp_path, corpus_file, cache_dir):
  directory = make_tsv_task(tmp_path / 'keyword')
  workdir = str(tmp_path / 'run')
  results = train.run(tiny_config(cache_dir, corpus_file, directory), workdir)
  task = tasks.get_task(directory)
  baseline = train.majority_baseline(task, tasks.read(task, 'train'), tasks.read(task, 'validation'))
  accuracy = results['median']['dev/accuracy']
  assert accuracy > baseline['accuracy'] + 0.15, (accuracy, baseline)
  with open(os.path.join(workdir, 'results.json'), encoding='utf-8') as f:
    assert json.load(f)['seeds'][0]['dev/accuracy'] == accuracy
  assert '| **median** |' in open(os.path.join(workdir, 'results.md'), encoding='utf-8').read()
  dev = tasks.read(task, 'validation')
  assert results['majority_baseline'] == {f'dev/{k}': v for k, v in train.majority_baseline(task, dev, dev).items()}
  assert results['majority_label'] == {'dev': 'no'}
  rows = open(os.path.join(workdir, 'seeds', '0', 'predictions', 'dev.tsv'), encoding='utf-8').read().splitlines()
  assert rows[0] == 'id\tgold\tprediction\tp_no\tp_yes\tsentence' and len(rows) == len(dev) + 1
  assert [row.split('\t')[1] for row in rows[1:]] == [e.label for e in dev]
  top = results['seeds'][0]['top_prediction']['dev']
  assert top['count'] == max(sum(row.split('\t')[2] == x for row in rows[1:]) for x in ('no', 'yes'))

  predictor = predict.Predictor(workdir)
  sentences = ['the dog sat on a mat', f'the {KEYWORD} dog sat on a mat', 'a cat ate food', f'{KEYWORD} man']
  assert predictor.predict(sentences) == ['no', 'yes', 'no', 'yes']
  # --mode=predict never writes its predictions over its input, however the path is spelled.
  inputs = tmp_path / 'inputs.txt'
  inputs.write_text('\n'.join(sentences) + '\n', encoding='utf-8')
  config = tiny_config(cache_dir, corpus_file, directory)
  override(config, {'predict_input': str(inputs), 'predict_output': f'{tmp_path}/run/../inputs.txt'})
  with pytest.raises(config_lib.ConfigError, match='is the input file, which the predictions would replace'):
    predict.predict_main(config, workdir)
  assert inputs.read_text(encoding='utf-8').splitlines() == sentences


@pytest.mark.slow
def test_conll_task_learns_span_f1_from_scratch_on_a_sharded_mesh(tmp_path, corpus_file, cache_dir):
  directory = make_conll_task(tmp_path / 'animals')
  # Two of the conftest's 8 CPU devices: the batch is split over them.
  config = tiny_config(cache_dir, corpus_file, directory, **{'mesh.shape': (2, 1, 1)})
  results = train.run(config, str(tmp_path / 'run'))
  task = tasks.get_task(directory)
  baseline = train.majority_baseline(task, tasks.read(task, 'train'), tasks.read(task, 'validation'))
  assert baseline['span_f1'] == 0.0  # all 'O'
  assert results['median']['dev/span_f1'] > 0.6, results['median']
  first = open(os.path.join(tmp_path, 'run', 'seeds', '0', 'predictions', 'dev.conll'), encoding='utf-8').readline()
  assert len(first.rstrip('\n').split('\t')) == 3  # word, gold tag, predicted tag


@pytest.mark.slow
def test_loads_the_discriminator_of_apretraining_workdir(tmp_path, corpus_file, cache_dir):
  saved = pretraining_workdir(str(tmp_path / 'pre'), corpus_file, cache_dir)
  config = tiny_config(cache_dir, corpus_file, make_tsv_task(tmp_path / 'keyword'))
  c = train.load_config(config)
  model_config, pretrained, tokenizer = train._load_pretrained(str(tmp_path / 'pre'))  # pylint: disable=protected-access
  assert model_config.hidden_size == 32 and tokenizer.vocab_size == model_config.vocab_size
  assert set(pretrained) == {'embeddings', 'discriminator'}
  task = tasks.get_task(config.task)
  model = train.heads.make_model(task, model_config, 0.1, c.squad)
  run = train.Finetuning(model, c, 10, sharding.make_mesh(c.mesh))
  state = run.init_state(jax.random.PRNGKey(0), pretrained)
  assert set(state.params) == {'embeddings', 'discriminator', 'head'}
  np.testing.assert_array_equal(state.params['embeddings']['word_embeddings']['embedding'],
                                saved['embeddings']['word_embeddings']['embedding'])
  np.testing.assert_array_equal(state.params['discriminator']['encoder']['layer_0']['output']['dense']['kernel'],
                                saved['discriminator']['encoder']['layer_0']['output']['dense']['kernel'])
  assert 'discriminator_predictions' not in state.params['discriminator']
  # The state owns its buffers: donating it to the train step must leave the pre-trained params for the next seed.
  pointer = lambda x: x.addressable_shards[0].data.unsafe_buffer_pointer()
  assert pointer(state.params['embeddings']['word_embeddings']['embedding']) != pointer(
      pretrained['embeddings']['word_embeddings']['embedding'])


@pytest.mark.slow
def test_precompile_from_scratch_compiles_what_a_pretrained_run_then_runs(tmp_path, corpus_file, cache_dir):
  """finetune.precompile (experiments.compare's, from the from-scratch config, before anything is pre-trained)
  compiles the train and evaluation steps that the fine-tuning of a pre-trained model of the same sizes later in
  the process runs without tracing them, and writes nothing."""
  pretraining_workdir(str(tmp_path / 'pre'), corpus_file, cache_dir)
  scratch = tiny_config(cache_dir, corpus_file, make_tsv_task(tmp_path / 'keyword'), epochs=1.0, seeds=1)
  lines = train.precompile(scratch, str(tmp_path / 'scratch'))()
  assert [line.split(' in ')[0] for line in lines] == ['compiled the keyword fine-tuning step',
                                                      'compiled the keyword evaluation step']
  assert not (tmp_path / 'scratch').exists()
  with traced_functions() as traced:
    results = train.run(override(scratch, {'init_checkpoint': str(tmp_path / 'pre')}), str(tmp_path / 'pretrained'))
  assert 'train_step' not in traced and 'eval_step' not in traced, traced
  assert len(results['seeds']) == 1


@pytest.mark.slow
def test_init_step_picks_the_checkpoint(tmp_path, corpus_file, cache_dir):
  saved = pretraining_workdir(str(tmp_path / 'pre'), corpus_file, cache_dir, later_step=5)
  word = lambda params: np.asarray(params['embeddings']['word_embeddings']['embedding'])
  load = lambda step: train._load_pretrained(str(tmp_path / 'pre'), step)[1]  # pylint: disable=protected-access
  np.testing.assert_array_equal(word(load(3)), word(saved))
  np.testing.assert_array_equal(word(load(0)), word(saved) + 1)  # 0: the latest, step 5
  np.testing.assert_array_equal(word(load(5)), word(saved) + 1)


def test_max_train_examples_keeps_one_subset_in_file_order(tmp_path, corpus_file, cache_dir):
  directory = make_tsv_task(tmp_path / 'keyword')
  task = tasks.get_task(directory)
  everything = tasks.read(task, 'train')
  c = train.load_config(tiny_config(cache_dir, corpus_file, directory, max_train_examples=50,
                                    write_predictions=False))
  tokenizer = data.load_tokenizer(c.data)
  kept, feats, _ = train._load_splits(task, tokenizer, c)  # pylint: disable=protected-access
  assert len(kept) == len(feats) == 50 and len(everything) == 240
  positions = [everything.index(e) for e in kept]
  assert positions == sorted(positions)
  assert kept == train._load_splits(task, tokenizer, c)[0]  # pylint: disable=protected-access


def _squad_records(split, count, seed):
  """SQuAD 2.0-style tfds records: the answer is the word after 'near the'; a third are unanswerable."""
  rng = random.Random(seed)
  records = []
  for i in range(count):
    words = keyword_free_sentence(rng)
    answer = rng.choice(WORDS)
    words[rng.randrange(len(words)):0] = ['near', 'the', answer]
    context = ' '.join(words)
    impossible = i % 3 == 0
    start = context.index('near the ') + len('near the ')
    records.append({'id': f'{split}-{i}', 'title': 't', 'context': context, 'question': 'what is near',
                    'is_impossible': impossible,
                    'answers': {'text': [] if impossible else [answer], 'answer_start': [] if impossible else [start]},
                    'plausible_answers': {'text': [answer], 'answer_start': [start]}})
  return records


@pytest.mark.slow
def test_squad_v2_trains_and_writes_predictions_on_tfds_mock_data(tmp_path, corpus_file, cache_dir):
  records = {'train': _squad_records('train', 48, 0), 'validation': _squad_records('validation', 12, 1)}
  config = tiny_config(cache_dir, corpus_file, 'squad_v2', epochs=2.0, **{
      'squad.doc_stride': 8, 'squad.max_query_length': 8, 'squad.beam_size': 5})
  with tfds.testing.mock_data(as_data_source_fn=lambda self, split, **kwargs: records[split]):
    results = train.run(config, str(tmp_path / 'run'))
  assert results['median']['dev/exact_match'] <= results['median']['dev/f1']  # an exact answer has F1 1
  directory = os.path.join(tmp_path, 'run', 'seeds', '0', 'predictions')
  with open(os.path.join(directory, 'dev.json'), encoding='utf-8') as f:
    assert set(json.load(f)) == {r['id'] for r in records['validation']}
  with open(os.path.join(directory, 'dev_null_odds.json'), encoding='utf-8') as f:
    assert len(json.load(f)) == 12


def test_glue_submission_files(tmp_path):
  mnli = tasks.get_task('mnli')
  examples = [tasks.TextExample('0', ('a', 'b')), tasks.TextExample('1', ('c', 'd'))]
  predict.write_predictions(str(tmp_path), mnli, mnli.test_splits[1], examples, ['neutral', 'entailment'])
  assert open(tmp_path / 'MNLI-mm.tsv', encoding='utf-8').read() == 'index\tprediction\n0\tneutral\n1\tentailment\n'
  cola = tasks.get_task('cola')
  predict.write_predictions(str(tmp_path), cola, cola.test_splits[0], examples[:1], ['acceptable'])
  assert open(tmp_path / 'CoLA.tsv', encoding='utf-8').read() == 'index\tprediction\n0\t1\n'
  stsb = tasks.get_task('stsb')
  predict.write_predictions(str(tmp_path), stsb, stsb.test_splits[0], examples[:1], [3.14159])
  assert open(tmp_path / 'STS-B.tsv', encoding='utf-8').read() == 'index\tprediction\n0\t3.1416\n'


def test_main_dispatches_the_finetune_and_predict_modes():
  from absl import flags  # noqa: PLC0415
  from electra_jax import main  # noqa: F401, PLC0415  (defines the flags)
  assert {'pretrain', 'finetune', 'predict'} <= set(flags.FLAGS['mode'].parser.enum_values)


GLUE_DIR = os.path.join(os.path.dirname(__file__), 'data', 'glue')


@pytest.mark.slow
def test_glue_sst2_and_rte_directories_fine_tune_end_to_end(tmp_path, corpus_file, cache_dir):
  """GLUE's own files (tests/data/glue: rows in the distribution's exact formats) through training, dev scores and
  the leaderboard's submission files."""
  expected = {'sst2': ('SST-2.tsv', {'0', '1'}, 3, 4), 'rte': ('RTE.tsv', {'entailment', 'not_entailment'}, 2, 3)}
  for name, (submission, values, rows, dev_rows) in expected.items():
    config = tiny_config(cache_dir, corpus_file, name, glue_dir=GLUE_DIR, epochs=2.0, batch_size=4, eval_batch_size=4)
    results = train.run(config, str(tmp_path / name))
    # Each dev row scored once: RTE's 3 fill a batch of 4 with a padding row, which must not count.
    assert (dev_rows * results['median']['dev/accuracy']).is_integer()
    lines = open(tmp_path / name / 'seeds' / '0' / 'predictions' / submission, encoding='utf-8').read().splitlines()
    assert lines[0] == 'index\tprediction' and len(lines) == rows + 1
    assert [line.split('\t')[0] for line in lines[1:]] == [str(i) for i in range(rows)]
    assert {line.split('\t')[1] for line in lines[1:]} <= values


def test_an_unknown_dev_label_is_one_clear_line_before_training(tmp_path, corpus_file, cache_dir, capsys):
  from electra_jax import cli  # noqa: PLC0415
  directory = make_tsv_task(tmp_path / 'keyword', sizes=(40, 10))
  with open(os.path.join(directory, 'dev.tsv'), 'a', encoding='utf-8') as f:
    f.write('neutral\tthe cat sat\n')  # line 12: the header, 10 rows, then this one
  capsys.readouterr()
  with pytest.raises(SystemExit) as stop:
    cli.run(train.run, tiny_config(cache_dir, corpus_file, directory), str(tmp_path / 'run'))
  assert stop.value.code == 1
  err = capsys.readouterr().err
  assert err.splitlines() == [f"error: {directory}/dev.tsv line 12: the label 'neutral' does not occur in the "
                              'training file (its labels: no, yes); the model cannot predict it. Fix the label, or '
                              'add training examples with it']
  assert not os.path.exists(tmp_path / 'run' / 'seeds')  # nothing trained


def test_workdirs_of_other_runs_are_refused(tmp_path, corpus_file, cache_dir):
  directory = make_tsv_task(tmp_path / 'keyword', sizes=(40, 10))
  pretraining_workdir(str(tmp_path / 'pre'), corpus_file, cache_dir)
  with pytest.raises(config_lib.ConfigError, match='holds a pre-training run'):
    train.run(tiny_config(cache_dir, corpus_file, directory), str(tmp_path / 'pre'))
  task = tasks.get_task(directory)
  config = tiny_config(cache_dir, corpus_file, directory).to_dict()
  workdir = tmp_path / 'ft'
  workdir.mkdir()
  saved = {'config': config, 'task': dataclasses.asdict(tasks.get_task('rte'))}
  (workdir / 'finetune.json').write_text(json.dumps(saved), encoding='utf-8')
  with pytest.raises(config_lib.ConfigError, match="holds a fine-tuning run of task 'rte'"):
    train.check_workdir(str(workdir), config, task)
  saved['task'] = dataclasses.asdict(task)
  (workdir / 'finetune.json').write_text(json.dumps(saved), encoding='utf-8')
  train.check_workdir(str(workdir), dict(config, seeds=5, log_every=1), task)  # same run, more seeds: fine
  changed = json.loads(json.dumps(config))
  changed['optimizer']['learning_rate'] = 1e-4
  with pytest.raises(config_lib.ConfigError, match=r'other settings \(optimizer.learning_rate: 0.002 -> 0.0001\)'):
    train.check_workdir(str(workdir), changed, task)
  # A run saved before a key existed (squad.na_threshold) resumes while the key keeps its default, not with another.
  del saved['config']['squad']['na_threshold']
  (workdir / 'finetune.json').write_text(json.dumps(saved), encoding='utf-8')
  train.check_workdir(str(workdir), config, task)
  changed = json.loads(json.dumps(config))
  changed['squad']['na_threshold'] = 0.0
  with pytest.raises(config_lib.ConfigError, match=r'other settings \(squad.na_threshold: -2.75 -> 0.0\)'):
    train.check_workdir(str(workdir), changed, task)


def test_a_workdir_of_another_directory_of_the_same_name_is_refused(tmp_path, monkeypatch):
  for version in ('v1', 'v2'):
    directory = tmp_path / version / 'sentiment'
    directory.mkdir(parents=True)
    for split in ('train', 'dev'):
      (directory / f'{split}.tsv').write_text('neg\tbad film\npos\tgood film\n', encoding='utf-8')
  old = tasks.get_task(str(tmp_path / 'v1' / 'sentiment'))
  workdir = tmp_path / 'work'
  workdir.mkdir()
  config = {'task': str(tmp_path / 'v1' / 'sentiment'), 'seed': 0}
  (workdir / 'finetune.json').write_text(json.dumps({'config': config, 'task': dataclasses.asdict(old)}),
                                         encoding='utf-8')
  # Same name, same labels, other files: v1's finished seeds are not v2's.
  new = tasks.get_task(str(tmp_path / 'v2' / 'sentiment'))
  with pytest.raises(config_lib.ConfigError, match=r"run of task 'sentiment' \(location: .*v1/sentiment', now .*"
                                                   r"v2/sentiment'; finetune.json\).*give a new --workdir"):
    train.check_workdir(str(workdir), dict(config, task=str(tmp_path / 'v2' / 'sentiment')), new)
  # A directory holding a tokenizer or results of the user's own (no finetune.json): fine-tuning would replace them.
  (tmp_path / 'mine').mkdir()
  (tmp_path / 'mine' / 'results.md').write_text('my notes')
  with pytest.raises(config_lib.ConfigError, match=r'mine holds results.md, which a new fine-tuning run would write '
                     'over: give another --workdir'):
    train.check_workdir(str(tmp_path / 'mine'), config, old)
  # The task's own directory is no workdir: fine-tuning would write results.md and its tokenizer among the data.
  with pytest.raises(config_lib.ConfigError, match="is the task's own directory"):
    train.check_workdir(str(tmp_path / 'v2' / 'sentiment' / '.'), dict(config, task=str(tmp_path / 'v2' / 'sentiment')),
                        new)
  # The same directory by another relative path (or a symlink) is the same task.
  monkeypatch.chdir(tmp_path / 'v1')
  train.check_workdir(str(workdir), dict(config, task='sentiment'), tasks.get_task('sentiment'))
  os.symlink(tmp_path / 'v1', tmp_path / 'link')
  train.check_workdir(str(workdir), config, tasks.get_task(str(tmp_path / 'link' / 'sentiment')))


@pytest.mark.slow
def test_a_rerun_resumes_the_unfinished_seed_and_skips_finished_ones(tmp_path, corpus_file, cache_dir, capsys):
  directory = make_tsv_task(tmp_path / 'keyword', sizes=(64, 16))
  # 8 steps of 16: metrics every step (at most a 20th of the run), dev scores at steps 4 and 8.
  overrides = dict(epochs=2.0, checkpoint_every=1000, write_predictions=False, eval_every=4)
  reference = train.run(tiny_config(cache_dir, corpus_file, directory, seeds=1, **overrides), str(tmp_path / 'a'))
  config = tiny_config(cache_dir, corpus_file, directory, seeds=2, **overrides)
  workdir = str(tmp_path / 'b')
  assert train.run(config, workdir, stop_after=3) is None  # as a preemption after 3 steps of seed 0
  assert '[keyword seed 0] stopped: checkpoint saved at step 3/8 in ' in capsys.readouterr().err
  assert os.path.isdir(os.path.join(workdir, 'seeds', '0', 'checkpoints', '3'))
  resumed = train.run(config, workdir)
  assert 'resumed from' in capsys.readouterr().err
  assert resumed['seeds'][0] == reference['seeds'][0]  # exactly the uninterrupted run's scores
  restore = lambda run: ocp.StandardCheckpointer().restore(os.path.join(tmp_path, run, 'seeds', '0', 'params'))
  for a, b in zip(jax.tree.leaves(restore('a')), jax.tree.leaves(restore('b'))):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
  assert not os.path.exists(os.path.join(workdir, 'seeds', '0', 'checkpoints'))  # removed once the seed finished
  # metrics.jsonl reads as one uninterrupted run: the steps after the checkpoint were logged once, by the rerun.
  lines = {run: [json.loads(line) for line in open(os.path.join(tmp_path, run, 'seeds', '0', 'metrics.jsonl'),
                                                    encoding='utf-8')] for run in ('a', 'b')}
  assert [(m['step'], sorted(m)) for m in lines['b']] == [(m['step'], sorted(m)) for m in lines['a']]
  train_lines = [m for m in lines['a'] if 'loss' in m]
  assert [m['step'] for m in train_lines] == list(range(1, 9))
  assert [m['step'] for m in lines['a'] if 'dev/accuracy' in m] == [4, 8]
  assert lines['a'][-1] == {'step': 8, **{k: v for k, v in reference['seeds'][0].items() if k.startswith('dev/')}}
  np.testing.assert_allclose([m['loss'] for m in lines['b'] if 'loss' in m], [m['loss'] for m in train_lines],
                             rtol=1e-5)
  assert os.listdir(os.path.join(workdir, 'seeds', '0', 'tensorboard'))
  again = train.run(config, workdir)
  assert capsys.readouterr().err.count('finished by an earlier run: skipped') == 2
  assert again['seeds'] == resumed['seeds']


def test_a_stop_at_a_seeds_last_step_finishes_that_seed(tmp_path, corpus_file, cache_dir, capsys, monkeypatch):
  """A SIGTERM at a seed's last step: the seed is trained, so it is finished (scored, result.json) rather than left
  at an older checkpoint with a 'checkpoint saved' line for one never written; the command then stops before the
  next seed, and the same command trains only that one."""
  directory = make_tsv_task(tmp_path / 'keyword', sizes=(64, 16))
  config = tiny_config(cache_dir, corpus_file, directory, seeds=2, epochs=2.0, checkpoint_every=1000,
                       write_predictions=False)  # 8 steps of 16 per seed

  class AtTheLastStep(train.StopSignal):
    calls = 0
    def should_stop(self):
      self.calls += 1
      return self.calls == 8
    def reason(self):
      return 'SIGTERM received'

  monkeypatch.setattr(train, 'StopSignal', AtTheLastStep)
  assert train.run(config, str(tmp_path / 'run')) is None
  assert ('[keyword seed 0] SIGTERM received at its last step: the seed is finished; run the same command again for '
          'the others') in capsys.readouterr().err
  assert (tmp_path / 'run' / 'seeds' / '0' / 'result.json').exists() and not (tmp_path / 'run' / 'seeds' / '1').exists()
  monkeypatch.undo()
  results = train.run(config, str(tmp_path / 'run'))
  assert 'finished by an earlier run: skipped' in capsys.readouterr().err
  assert [row['seed'] for row in results['seeds']] == [0, 1]


def test_unseen_dev_tags_are_reported_and_a_one_class_subset_refused(tmp_path, corpus_file, cache_dir, capsys):
  directory = make_conll_task(tmp_path / 'animals', sizes=(20, 6))
  first = len(open(os.path.join(directory, 'dev.conll'), encoding='utf-8').read().splitlines()) + 1
  with open(os.path.join(directory, 'dev.conll'), 'a', encoding='utf-8') as f:
    f.write('the\tO\nhorse\tB-HORSE\nran\tO\n\n')  # a tag the training file lacks, in a sentence at line `first`
  c = train.load_config(tiny_config(cache_dir, corpus_file, directory, write_predictions=False))
  tokenizer = data.load_tokenizer(c.data)
  capsys.readouterr()
  train._load_splits(tasks.get_task(directory), tokenizer, c)  # pylint: disable=protected-access
  assert capsys.readouterr().err == (f'animals dev: 1 words have tags the training file lacks (B-HORSE; the first in '
                                     f'the sentence at dev.conll:{first}): the model cannot predict them, so '
                                     'they count as errors\n')
  # A training subset of one class is refused, though the file has two.
  keyword = make_tsv_task(tmp_path / 'keyword', sizes=(40, 10))
  c = train.load_config(tiny_config(cache_dir, corpus_file, keyword, max_train_examples=1))
  with pytest.raises(data.DataError, match=r'1 kept by max_train_examples: every training example has the label'):
    train._load_splits(tasks.get_task(keyword), tokenizer, c)  # pylint: disable=protected-access
