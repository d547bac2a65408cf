"""Continued pre-training from an import (init_checkpoint), then fine-tuning; every layout official ELECTRA writes
imports with `convert --from-tf` (TensorFlow not needed: the variables are written as a dict of arrays)."""

import dataclasses
import json
import os

import jax
import numpy as np
import pytest
from flax import traverse_util

from configs import default
from configs import finetune as finetune_config
import helpers  # pylint: disable=g-bad-import-order
from helpers import SPECIAL, WORDS, make_corpus, override
from electra_jax import (checkpoint, config as config_lib, config_files, continued, convert, finetune, pretrained,
                         sharding, trainer)
from electra_jax.config import ModelConfig
from electra_jax.data import tokenizer as tokenizer_lib
from electra_jax.train_step import Pretraining

pytest.importorskip('torch')  # the tiny HF models of helpers.hf_models
pytest.importorskip('transformers')

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures('compile_once')]
VOCAB = helpers.WORDPIECE_VOCAB
# Official sizes for the TF layouts: E=32, discriminator H=64 (2 layers), generator H=32 (1 layer).
TF_MODEL = dict(vocab_size=len(VOCAB), embedding_size=32, hidden_size=64, num_layers=2, num_heads=1,
                intermediate_size=256, generator_hidden_fraction=0.5, generator_layers_fraction=0.5,
                max_position_embeddings=32)


def tf_variables(model: ModelConfig, seed=0) -> dict:
  """Random weights of `model` under the variable names of official ELECTRA's checkpoints."""
  params = helpers.random_params(model, seed)
  return {convert.tf_name(p): np.asarray(v) for p, v in traverse_util.flatten_dict(params).items()}


# Official names and shapes of the variables that differ between layouts (run_pretraining.py, modeling.py:
# `generator/embeddings/` holds untied tables as wide as the generator; `embeddings_project` exists where the
# table width differs from the tower's hidden size; generator_predictions/dense maps the generator to the width
# of the table its output is tied to).
LAYOUTS = {
    'tied': (dict(tying='embeddings'), {
        'electra/embeddings/word_embeddings': (len(VOCAB), 32), 'electra/embeddings_project/kernel': (32, 64),
        'generator_predictions/dense/kernel': (32, 32), 'generator_predictions/output_bias': (len(VOCAB),),
        'discriminator_predictions/dense_1/kernel': (64, 1)}, ('generator/embeddings_project/kernel',
                                                            'generator/embeddings/word_embeddings')),
    'tied, both projected': (dict(embedding_size=16, tying='embeddings'), {
        'electra/embeddings_project/kernel': (16, 64), 'generator/embeddings_project/kernel': (16, 32),
        'generator_predictions/dense/kernel': (32, 16)}, ('generator/embeddings/word_embeddings',)),
    'untied': (dict(tying='none'), {
        'electra/embeddings/word_embeddings': (len(VOCAB), 32), 'electra/embeddings_project/kernel': (32, 64),
        'generator/embeddings/word_embeddings': (len(VOCAB), 32),
        'generator/embeddings/position_embeddings': (32, 32),
        'generator/embeddings/token_type_embeddings': (2, 32), 'generator/embeddings/LayerNorm/beta': (32,),
        'generator_predictions/dense/kernel': (32, 32), 'generator_predictions/LayerNorm/beta': (32,)},
               ('generator/embeddings_project/kernel',)),
    'untied, E=H': (dict(embedding_size=64, tying='none'), {
        'electra/embeddings/word_embeddings': (len(VOCAB), 64),
        'generator/embeddings/word_embeddings': (len(VOCAB), 32), 'generator_predictions/dense/kernel': (32, 32)},
                    ('generator/embeddings_project/kernel', 'electra/embeddings_project/kernel')),
    # untied_generator=False: the generator's head on the discriminator's encoder, no generator/ scope.
    'shared encoder': (dict(embedding_size=64, tying='all', generator_hidden_fraction=1.0,
                            generator_layers_fraction=1.0), {
        'generator_predictions/dense/kernel': (64, 64), 'generator_predictions/output_bias': (len(VOCAB),)},
                       ('generator/encoder/layer_0/output/dense/kernel', 'electra/embeddings_project/kernel')),
}


@pytest.mark.parametrize('layout', LAYOUTS.keys())
def test_every_official_layout_imports(layout):
  fields, present, absent = LAYOUTS[layout]
  model = ModelConfig(**dict(TF_MODEL, **fields))
  weights = tf_variables(model)
  for name, shape in present.items():
    assert weights[name].shape == shape, name
  assert not set(absent) & set(weights)
  section = convert.model_section_from_tf({k: v.shape for k, v in weights.items()})
  assert ModelConfig(**section) == model
  back = convert.params_from_tf(model, weights)
  jax.tree.map(np.testing.assert_array_equal, back, helpers.random_params(model, 0))


def _stub_tf(monkeypatch, weights):
  monkeypatch.setattr(convert, 'read_tf_checkpoint', lambda path: weights)


def _official_run(root, weights, monkeypatch):
  """DATA_DIR/models/tiny/model.ckpt-10 (a stub: its variables are `weights`) and DATA_DIR/vocab.txt, as the
  official run_pretraining.py lays them out."""
  models = root / 'data_dir' / 'models' / 'tiny'
  models.mkdir(parents=True)
  (models / 'model.ckpt-10.index').write_bytes(b'')
  helpers.write_tokenizer_files(root / 'data_dir')
  _stub_tf(monkeypatch, weights)
  return str(models / 'model.ckpt-10')


def test_from_tf_finds_the_vocab_or_says_where_it_looked(tmp_path, monkeypatch, capsys):
  model = ModelConfig(**dict(TF_MODEL, tying='none'))
  prefix = _official_run(tmp_path, tf_variables(model), monkeypatch)
  convert.main(['--from-tf', prefix, '--out', str(tmp_path / 'found')])
  assert tokenizer_lib.load(str(tmp_path / 'found')).vocab_size == len(VOCAB)
  saved = json.loads((tmp_path / 'found' / 'config.json').read_text())
  assert saved['data']['vocab_size'] == len(VOCAB) and saved['data']['tokenizer'] == ''
  # --vocab wins; a checkpoint with no vocab.txt near it is refused in one line.
  os.remove(tmp_path / 'data_dir' / 'vocab.txt')
  with pytest.raises(SystemExit):
    convert.main(['--from-tf', prefix, '--out', str(tmp_path / 'none')])
  err = capsys.readouterr().err
  assert err.count('\n') == 1 and 'found no vocab.txt' in err and '--vocab' in err
  assert not (tmp_path / 'none').exists()
  (tmp_path / 'vocab.txt').write_text('\n'.join(VOCAB[:-1]) + '\n')
  with pytest.raises(SystemExit):
    convert.main(['--from-tf', prefix, '--vocab', str(tmp_path / 'vocab.txt'), '--out', str(tmp_path / 'short')])
  err = capsys.readouterr().err
  assert err.count('\n') == 1 and f'holds {len(VOCAB) - 1} tokens' in err and not (tmp_path / 'short').exists()
  helpers.write_tokenizer_files(tmp_path)
  convert.main(['--from-tf', prefix, '--vocab', str(tmp_path / 'vocab.txt'), '--out', str(tmp_path / 'given')])
  assert tokenizer_lib.load(str(tmp_path / 'given')).vocab_size == len(VOCAB)


def _continue_config(init, corpus, cache_dir, **overrides):
  config = default.get_config()
  config.update(train_steps=3, batch_size=8, log_every=1, checkpoint_every=3, init_checkpoint=init)
  config.data.update(source=corpus, max_seq_length=32, cache_dir=cache_dir)
  config.model.update(dropout_rate=0.0, attention_dropout_rate=0.0)
  config.optimizer.update(learning_rate=1e-3, warmup_steps=1)
  config.mesh.shape = (1, 1, 1)
  return override(config, overrides)


def _check_finetuned(results, init):
  """The fine-tuning started from `init` and scored each of its 16 dev rows once (an accuracy of k / 16)."""
  assert results['init_checkpoint'] == init
  assert (16 * results['median']['dev/accuracy']).is_integer()


def _finetune(init, tmp_path, cache_dir):
  """Two steps of fine-tuning a keyword task from `init`; returns its results."""
  task = tmp_path / 'task'
  task.mkdir()
  rng = np.random.RandomState(0)
  for split, count in (('train', 32), ('dev', 16)):
    lines = ['label\tsentence']
    for _ in range(count):
      positive = rng.rand() < 0.5
      words = [WORDS[i] for i in rng.randint(0, len(WORDS), 5)] + (['happy'] if positive else [])
      lines.append(f'{"yes" if positive else "no"}\t{" ".join(words)}')
    (task / f'{split}.tsv').write_text('\n'.join(lines) + '\n')
  config = finetune_config.get_config()
  override(config, {'task': str(task), 'init_checkpoint': init, 'seeds': 1, 'batch_size': 16,
                    'eval_batch_size': 16, 'epochs': 1.0, 'max_seq_length': 32, 'log_every': 1000,
                    'mesh.shape': (1, 1, 1), 'data.cache_dir': cache_dir})
  return finetune.run(config, str(tmp_path / 'finetuned'))


def _check_continued(source, workdir, corpus):
  """The continued run: 3 steps of its own from source's weights, source's model and tokenizer, the new corpus."""
  source_config, source_params = pretrained.load_params(source)
  config, params = pretrained.load_params(workdir)
  assert checkpoint.Checkpointer(workdir).all_steps() == [3]
  assert [json.loads(line)['step'] for line in open(os.path.join(workdir, 'metrics.jsonl'))] == [1, 2, 3]
  sizes = lambda m: {k: v for k, v in dataclasses.asdict(m).items() if k not in continued.FREE_MODEL_KEYS}
  assert sizes(config.model) == sizes(source_config.model)
  assert config.model.dropout_rate == 0.0  # the run's own (its config), not the source's
  assert config.data.source == corpus and config.init_checkpoint == source
  assert tokenizer_lib.load(workdir).fingerprint == tokenizer_lib.load(source).fingerprint
  # Trained from the source's weights: 3 Adam steps of lr <= 1e-3 move each weight by less than 0.02, while a
  # fresh initialisation differs from these N(0, 0.1) weights by ~0.1 on average.
  moved = jax.tree.map(lambda a, b: float(np.max(np.abs(np.asarray(a) - np.asarray(b)))), params, source_params)
  assert 0 < max(jax.tree.leaves(moved)) < 0.02


@pytest.mark.e2e  # a whole workflow: import, continue, fine-tune (README suite: 5-minute bound)
def test_continue_hf_import_on_a_new_corpus_then_finetune(tmp_path, cache_dir, capsys):
  disc, gen = helpers.hf_models(*helpers.HF_SIZES['E!=H'], layers=1)  # the layer mapping is test_convert's
  disc_dir, gen_dir = helpers.save_hf(tmp_path, disc, gen)
  imported = str(tmp_path / 'import')
  convert.main(['--from-hf', disc_dir, '--from-hf-generator', gen_dir, '--out', imported])
  saved = json.loads(open(os.path.join(imported, 'config.json')).read())
  assert saved['data']['tokenizer'] == ''  # nothing machine-absolute: the import can move
  os.rename(imported, tmp_path / 'moved')
  imported = str(tmp_path / 'moved')
  corpus = make_corpus(tmp_path / 'new.txt', documents=30, seed=5)
  workdir = str(tmp_path / 'continued')
  # The sizes come from the import whatever the config file says (default.py's are other ones).
  trainer.train(_continue_config(imported, corpus, cache_dir), workdir)
  _check_continued(imported, workdir, corpus)
  assert config_files.load_config(workdir).model.tying == 'embeddings'
  _check_finetuned(_finetune(workdir, tmp_path, cache_dir), workdir)


@pytest.mark.e2e  # a whole workflow: import, continue, fine-tune (README suite: 5-minute bound)
def test_continue_official_untied_tf_import_then_finetune(tmp_path, cache_dir, monkeypatch):
  # One layer: the layouts' layer mapping is test_every_official_layout_imports'; here each compile is the cost.
  model = ModelConfig(**dict(TF_MODEL, tying='none', num_layers=1))
  prefix = _official_run(tmp_path, tf_variables(model, seed=1), monkeypatch)
  imported = str(tmp_path / 'import')
  convert.main(['--from-tf', prefix, '--out', imported])
  corpus = make_corpus(tmp_path / 'new.txt', documents=30, seed=6)
  workdir = str(tmp_path / 'continued')
  trainer.train(_continue_config(imported, corpus, cache_dir, init_optimizer=True), workdir)
  _check_continued(imported, workdir, corpus)
  assert config_files.load_config(workdir).model.tying == 'none'
  _check_finetuned(_finetune(workdir, tmp_path, cache_dir), workdir)


def test_conflicting_model_override_and_own_workdir_are_refused(tmp_path):
  model = ModelConfig(**TF_MODEL)
  helpers.write_tokenizer_files(tmp_path)
  convert.write_workdir(str(tmp_path / 'import'), dict(TF_MODEL), helpers.random_params(model),
                        vocab_file=str(tmp_path / 'vocab.txt'))
  config = _continue_config(str(tmp_path / 'import'), '', '')
  continued.check_overrides(config, {'model.hidden_size': 64, 'model.dtype': 'bfloat16', 'train_steps': 9})
  with pytest.raises(config_lib.ConfigError, match=r'--config.model.hidden_size=128 conflicts with init_checkpoint '
                     r'.*model has model.hidden_size=64.*drop the override'):
    continued.check_overrides(config, {'model.hidden_size': 128})
  with pytest.raises(config_lib.ConfigError, match='data.tokenizer conflicts'):
    continued.check_overrides(config, {'data.tokenizer': 'other.model'})
  continued.check_overrides(config, {'data.vocab_size': len(VOCAB), 'data.lowercase': True})  # the tokenizer's own
  with pytest.raises(config_lib.ConfigError, match=r'--config.data.lowercase=False conflicts with init_checkpoint '
                     r'\S+, whose tokenizer has data.lowercase=True: a continued run uses its tokenizer'):
    continued.check_overrides(config, {'data.lowercase': False})
  with pytest.raises(config_lib.ConfigError, match='data.vocab_size=8000 conflicts'):
    continued.check_overrides(config, {'data.vocab_size': 8000})
  with pytest.raises(config_lib.ConfigError, match='give a new --workdir'):
    trainer.train(config, str(tmp_path / 'import'))
  with pytest.raises(config_lib.ConfigError, match='init_optimizer needs init_checkpoint'):
    continued.check_overrides(_continue_config('', '', '', init_optimizer=True), {})


def test_the_dropout_draw_is_the_continued_runs_own(tmp_path):
  """model.dropout_draw changes no parameter: a source whose config.json saved the value its GPU resolved
  ('rbg_tower') neither refuses the default 'auto' nor pins the new run, on another machine, to its draw."""
  helpers.write_tokenizer_files(tmp_path)
  model = dict(TF_MODEL, dropout_draw='rbg_tower')
  convert.write_workdir(str(tmp_path / 'import'), model, helpers.random_params(ModelConfig(**TF_MODEL)),
                        vocab_file=str(tmp_path / 'vocab.txt'))
  config = _continue_config(str(tmp_path / 'import'), '', '')
  continued.check_overrides(config, {'model.dropout_draw': 'auto'})
  assert continued.adopt(config).model.dropout_draw == 'auto'


def test_init_checkpoint_spelled_otherwise_resumes_as_the_same_source(tmp_path, monkeypatch):
  """A trailing slash or a relative path names the same init_checkpoint: the run stores it (and its tokenizer,
  data.tokenizer) absolute, and a workdir that saved it as typed resumes with another spelling."""
  helpers.write_tokenizer_files(tmp_path)
  convert.write_workdir(str(tmp_path / 'import'), dict(TF_MODEL), helpers.random_params(ModelConfig(**TF_MODEL)),
                        vocab_file=str(tmp_path / 'vocab.txt'))
  monkeypatch.chdir(tmp_path)
  source = str(tmp_path / 'import')
  for init in (source, source + '/', 'import', './import/'):
    config = continued.adopt(_continue_config(init, '', ''))
    assert config.init_checkpoint == config.data.tokenizer == source, init
  saved = config.to_dict()
  saved['data']['tokenizer'] = 'import/'  # as typed, before adopt made it absolute
  (tmp_path / 'config.json').write_text(json.dumps(saved))
  trainer._check_resume_config(tmp_path, config.to_dict())  # pylint: disable=protected-access


def test_init_optimizer_takes_the_moments_and_restarts_the_schedule(tmp_path):
  values = _continue_config('', '', '', **{'optimizer.bias_correction': True})
  values.model.update(TF_MODEL)
  config = config_lib.load(values)
  run = Pretraining(config, SPECIAL, sharding.make_mesh(config.mesh))
  source = run.init_state(jax.random.PRNGKey(1))
  # A source 7 steps in: moments and counts that are not a fresh optimiser's.
  opt_state = jax.tree.map(lambda x: x + 7 if x.dtype == np.int32 else x + 0.5, source.opt_state)
  source = source.replace(step=source.step + 7, opt_state=opt_state)
  saver = checkpoint.Checkpointer(str(tmp_path / 'source'))
  saver.save(7, source, {})
  saver.close()
  fresh = run.init_state(jax.random.PRNGKey(2))
  state = continued.initial_state(str(tmp_path / 'source'), True, run, fresh)
  assert int(state.step) == 0
  jax.tree.map(np.testing.assert_array_equal, state.params, source.params)
  adam, schedule = state.opt_state[1], state.opt_state[3]
  assert int(adam.count) == 7 and int(schedule.count) == 0  # Adam's bias correction goes on; the schedule restarts
  jax.tree.map(np.testing.assert_array_equal, adam.mu, source.opt_state[1].mu)
  without = continued.initial_state(str(tmp_path / 'source'), False, run, fresh)
  jax.tree.map(np.testing.assert_array_equal, without.params, source.params)
  jax.tree.map(np.testing.assert_array_equal, without.opt_state, fresh.opt_state)


def test_a_source_of_another_objective_gives_what_it_has(tmp_path, capsys):
  """An MLM run continued as ELECTRA: its encoder and embeddings come from the source, the generator and the
  replaced-token head (which it never had) from the fresh initialisation, with one line saying so (orbax's partial
  restore left them abstract, and the first step died on a ShapeDtypeStruct). With init_optimizer: refused, naming
  the objective as a cause (it named only optimizer.bias_correction)."""
  def made(name, seed):
    values = _continue_config('', '', '', **{'objective.name': name})
    values.model.update(TF_MODEL)
    config = config_lib.load(values)
    run = Pretraining(config, SPECIAL, sharding.make_mesh(config.mesh))
    return run, run.init_state(jax.random.PRNGKey(seed))
  mlm_run, source = made('mlm', 1)
  saver = checkpoint.Checkpointer(str(tmp_path / 'mlm'))
  saver.save(5, source, {})
  saver.close()
  run, fresh = made('electra', 2)
  state = continued.initial_state(str(tmp_path / 'mlm'), False, run, fresh)
  assert capsys.readouterr().err == ('init_checkpoint has no discriminator/discriminator_predictions, generator '
                                     '(trained with another objective): initialised afresh\n')
  ours, theirs, initial = (traverse_util.flatten_dict(p) for p in (state.params, source.params, fresh.params))
  assert all(isinstance(v, jax.Array) for v in ours.values())
  for path, value in ours.items():
    expected = theirs[path] if path in theirs else initial[path]
    np.testing.assert_array_equal(value, expected, err_msg=str(path))
  assert any(p[0] == 'generator' for p in ours) and not any(p[0] == 'generator' for p in theirs)
  del mlm_run
  with pytest.raises(checkpoint.CheckpointError, match=r'with init_optimizer it must hold every parameter this run '
                     r'trains \(a run of another objective may not: continue without init_optimizer\)'):
    continued.initial_state(str(tmp_path / 'mlm'), True, run, fresh)


def test_a_continued_run_resumes_after_its_source_moved(tmp_path, cache_dir):
  """Once the continued run has a checkpoint of its own, the same command resumes it from that, with the model and
  tokenizer its config.json recorded: its source may have been moved or removed (it stopped with 'IMPORT has no
  config.json'), as an import may be."""
  helpers.write_tokenizer_files(tmp_path)
  source = str(tmp_path / 'import')
  convert.write_workdir(source, dict(TF_MODEL), helpers.random_params(ModelConfig(**TF_MODEL)),
                        vocab_file=str(tmp_path / 'vocab.txt'))
  corpus = make_corpus(tmp_path / 'new.txt', documents=30, seed=7)
  config, workdir = _continue_config(source, corpus, cache_dir), str(tmp_path / 'continued')
  trainer.train(config, workdir, stop_after=2)
  os.rename(source, tmp_path / 'moved')
  continued.check_overrides(config, {'model.hidden_size': 64}, workdir)  # the recorded model's
  trainer.train(config, workdir)
  assert [json.loads(line)['step'] for line in open(os.path.join(workdir, 'metrics.jsonl'))] == [1, 2, 3]
  with pytest.raises(config_lib.ConfigError, match='model.hidden_size=64: a continued run'):
    continued.check_overrides(config, {'model.hidden_size': 128}, workdir)
