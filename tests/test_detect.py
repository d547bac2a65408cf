"""The replaced-token detector on our own (SentencePiece) and imported (WordPiece) checkpoints."""

import functools
import json
import os
import re
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import default
from electra_jax import config as config_lib, data, detect, objective, optimizer, pretrained
from electra_jax.checkpoint import Checkpointer
from electra_jax.model import Electra
from electra_jax.train_step import TrainState

MODEL = dict(embedding_size=16, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
             generator_hidden_fraction=0.5, max_position_embeddings=24)


@pytest.fixture(scope='module')
def own_run(tmp_path_factory, corpus_file, cache_dir):
  """A workdir laid out as the trainer writes it (config.json with model.vocab_size 0, tokenizer.model,
  checkpoints/7/) holding a random tiny model; returns (workdir, tokenizer, params)."""
  return _write_run(str(tmp_path_factory.mktemp('run')), corpus_file, cache_dir)


def _write_run(workdir, corpus_file, cache_dir, objective_name='electra'):
  tokenizer = data.load_tokenizer(data.DataConfig(source=corpus_file, vocab_size=60, cache_dir=cache_dir))
  config = default.get_config()
  config.model.update(MODEL)
  config.data.update(source=corpus_file, vocab_size=60, cache_dir=cache_dir, max_seq_length=24)
  config.objective.name = objective_name
  with open(os.path.join(workdir, 'config.json'), 'w', encoding='utf-8') as f:
    json.dump(config.to_dict(), f)
  shutil.copyfile(tokenizer.model_file, os.path.join(workdir, 'tokenizer.model'))
  c = config_lib.load(config, vocab_size=tokenizer.vocab_size)
  rng = np.random.default_rng(0)
  params = jax.tree_util.tree_map_with_path(  # LayerNorm scales near 1, so the tokens stay distinguishable
      lambda path, s: jnp.asarray((path[-1].key == 'scale') + rng.normal(0, 0.3, s.shape), jnp.float32),
      pretrained.abstract_params(objective.get(objective_name).model(c.model)))
  tx, _ = optimizer.make_optimizer(c.optimizer, c.train_steps)
  checkpointer = Checkpointer(workdir)
  state = TrainState(jnp.asarray(7, jnp.int32), params, jax.jit(tx.init)(params))
  checkpointer.save(7, state, {'epoch': 0, 'batch': 7})
  checkpointer.close()
  return workdir, tokenizer, c.model, params


@pytest.mark.slow
def test_json_gives_each_token_its_discriminator_probability(own_run, capsys):
  workdir, tokenizer, model_config, params = own_run
  detect.main(['--checkpoint', workdir, '--json', 'The CAT sat', 'on the mat'])
  rows = json.loads(capsys.readouterr().out)

  ids = [tokenizer.special.cls] + tokenizer.encode(['the cat sat on the mat'])[0] + [tokenizer.special.sep]
  assert [r['token'] for r in rows] == tokenizer.pieces(ids)
  assert rows[0]['token'] == '[CLS]' and rows[-1]['token'] == '[SEP]' and len(rows) > 4
  ids = jnp.asarray([ids])  # unpadded, unlike the detector's input
  logits = jax.jit(functools.partial(Electra(model_config).apply, method='discriminator_logits'))(
      {'params': params}, ids, jnp.zeros_like(ids), jnp.ones_like(ids))[0]
  expected = 1 / (1 + np.exp(-np.asarray(logits, np.float64)))
  np.testing.assert_allclose([r['p_replaced'] for r in rows], expected, atol=1e-6)
  assert np.ptp(expected) > 0.01  # random weights give the tokens different probabilities


def test_table_lists_tokens_aligned_with_probabilities(own_run, capsys):
  workdir = own_run[0]
  detect.main(['--checkpoint', workdir, '--json', 'the dog ran'])
  rows = json.loads(capsys.readouterr().out)
  detect.main(['--checkpoint', workdir, 'the dog ran'])
  lines = capsys.readouterr().out.rstrip('\n').split('\n')
  assert lines[0].split() == ['token', 'p_replaced'] and len(lines) == len(rows) + 1
  column = lines[0].index('p_replaced')
  for line, row in zip(lines[1:], rows):
    assert line.split()[0] == row['token']
    assert line[column:column + 10].strip() == f'{row["p_replaced"]:.4f}'


def test_long_text_is_cut_to_the_position_table_and_says_so(own_run, capsys):
  rows = detect.Detector(own_run[0])(' '.join(['the cat sat on the mat'] * 20))
  assert len(rows) == MODEL['max_position_embeddings'] and rows[-1]['token'] == '[SEP]'
  assert re.fullmatch(r'note: the text is \d+ tokens with \[CLS\] and \[SEP\]; the model was trained on 24: only '
                      r'the first 23 and \[SEP\] are shown\n', capsys.readouterr().err)
  detect.Detector(own_run[0])('the cat sat')
  assert capsys.readouterr().err == ''


def test_text_is_cut_to_the_length_the_model_was_trained_on(own_run, tmp_path):
  """Positions beyond data.max_seq_length had no gradient: their probabilities would come from random weights."""
  workdir = str(tmp_path / 'copy')
  shutil.copytree(own_run[0], workdir)
  with open(os.path.join(workdir, 'config.json'), encoding='utf-8') as f:
    values = json.load(f)
  values['data']['max_seq_length'] = 16  # of the 24 positions
  with open(os.path.join(workdir, 'config.json'), 'w', encoding='utf-8') as f:
    json.dump(values, f)
  text = ' '.join(['the cat sat on the mat'] * 20)
  assert len(detect.Detector(workdir)(text)) == 24  # no metrics.jsonl: an import (Google trained Base at 512)
  with open(os.path.join(workdir, 'metrics.jsonl'), 'w', encoding='utf-8') as f:
    f.write('{"step": 7, "loss": 1.0}\n')  # a run trained here
  detector = detect.Detector(workdir)
  rows = detector(text)
  assert len(rows) == 16 and rows[-1]['token'] == '[SEP]'
  with pytest.raises(detect.DetectError, match='^the text is not UTF-8'):
    detector('caf\udce9')  # argv's b'caf\xe9' as Python decodes it: a TypeError from the tokenizer before


def test_a_run_without_a_replaced_token_head_is_one_line(tmp_path, corpus_file, cache_dir, capsys):
  """An MLM run (BERT) has no replaced-token head: a flax error about a missing parameter before."""
  workdir = str(tmp_path / 'mlm')
  os.mkdir(workdir)
  _write_run(workdir, corpus_file, cache_dir, 'mlm')
  with pytest.raises(SystemExit) as exit_info:
    detect.main(['--checkpoint', workdir, 'the cat'])
  assert exit_info.value.code == 1
  assert capsys.readouterr().err == (f'error: {workdir} was pre-trained with objective mlm, whose discriminator '
                                     'predicts masked words, not replaced ones: detect needs a replaced-token '
                                     'detection run (objective electra, its default)\n')


# Google's and older transformers' model directories hold vocab.txt; transformers 5 saves tokenizer.json only.
@pytest.mark.slow
@pytest.mark.parametrize('tokenizer_file', ['vocab.txt', 'tokenizer.json'])
def test_imported_wordpiece_checkpoint_matches_transformers(tmp_path, capsys, tokenizer_file):
  torch = pytest.importorskip('torch')
  transformers = pytest.importorskip('transformers')
  from electra_jax import convert  # noqa: PLC0415
  vocab = ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]', 'the', 'chef', 'ate', 'meal', 'a', '##s', '!']
  torch.manual_seed(0)
  common = dict(vocab_size=len(vocab), embedding_size=16, max_position_embeddings=24, initializer_range=0.5)
  disc = transformers.ElectraForPreTraining(transformers.ElectraConfig(
      hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, **common)).eval()
  gen = transformers.ElectraForMaskedLM(transformers.ElectraConfig(
      hidden_size=16, num_hidden_layers=1, num_attention_heads=1, intermediate_size=64, **common))
  gen.electra.embeddings.load_state_dict(disc.electra.embeddings.state_dict())
  disc.save_pretrained(tmp_path / 'disc')
  gen.save_pretrained(tmp_path / 'gen')
  if tokenizer_file == 'vocab.txt':
    (tmp_path / 'disc' / 'vocab.txt').write_text('\n'.join(vocab) + '\n')
    (tmp_path / 'disc' / 'tokenizer_config.json').write_text(json.dumps({'do_lower_case': True}))
  else:
    transformers.ElectraTokenizerFast(vocab={t: i for i, t in enumerate(vocab)}).save_pretrained(tmp_path / 'disc')
    assert {'tokenizer.json', 'vocab.txt'} & set(os.listdir(tmp_path / 'disc')) == {'tokenizer.json'}
  convert.import_hf(str(tmp_path / 'disc'), str(tmp_path / 'run'), generator_dir=str(tmp_path / 'gen'))

  detect.main(['--checkpoint', str(tmp_path / 'run'), '--json', 'The chef ate the meals!'])
  rows = json.loads(capsys.readouterr().out)
  hf_tokenizer = transformers.AutoTokenizer.from_pretrained(str(tmp_path / 'disc'))
  encoded = hf_tokenizer('The chef ate the meals!', return_tensors='pt')
  assert [r['token'] for r in rows] == hf_tokenizer.convert_ids_to_tokens(encoded['input_ids'][0])
  assert [r['token'] for r in rows] == ['[CLS]', 'the', 'chef', 'ate', 'the', 'meal', '##s', '!', '[SEP]']
  with torch.no_grad():
    expected = torch.sigmoid(disc(**encoded).logits[0]).numpy()
  np.testing.assert_allclose([r['p_replaced'] for r in rows], expected, atol=1e-5)
  # Fine-tuning reads the imported workdir's tokenizer the same way.
  assert data.tokenizer.load(str(tmp_path / 'run')).encode(['The chef ate the meals!'])[0] == (
      encoded['input_ids'][0, 1:-1].tolist())


def test_workdir_without_tokenizer_is_one_clear_error(own_run, tmp_path, capsys):
  workdir = str(tmp_path / 'copy')
  shutil.copytree(own_run[0], workdir)
  with open(os.path.join(workdir, 'config.json'), encoding='utf-8') as f:
    values = json.load(f)
  values['model']['vocab_size'] = 60
  with open(os.path.join(workdir, 'config.json'), 'w', encoding='utf-8') as f:
    json.dump(values, f)
  os.remove(os.path.join(workdir, 'tokenizer.model'))
  with pytest.raises(SystemExit) as exit_info:
    detect.main(['--checkpoint', workdir, 'the cat'])
  assert exit_info.value.code == 1
  assert 'holds no tokenizer (tokenizer.model, vocab.txt or tokenizer.json)' in capsys.readouterr().err
