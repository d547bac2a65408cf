"""Held-out evaluation: the split keeps held-out documents out of training, the eval metrics are logged every
eval_every steps on the same batches, the AUC estimate; and the profiler hook writes a trace."""

import dataclasses
import glob
import json
import math
import os
import random
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from electra_jax import config as config_lib, data, evaluation, objective, sharding, train_step, trainer
from electra_jax.checkpoint import Checkpointer
from electra_jax.config import ModelConfig, ObjectiveConfig, TrainConfig
from electra_jax.data import split as split_lib
from configs import default
from helpers import SPECIAL, STUB_VOCAB, WORDS, read_metrics, tiny_pretraining_config  # pylint: disable=g-bad-import-order
from helpers import stub_generator_logits, token_batch

pytestmark = pytest.mark.usefixtures('compile_once')


def tiny_config(source, cache_dir, **overrides):
  return tiny_pretraining_config(source, cache_dir, **{
      'train_steps': 6, 'log_every': 2, 'checkpoint_every': 6, 'eval_every': 3, 'eval_batches': 2,
      'data.eval_fraction': 0.2, **overrides})


def marker(document: int) -> str:
  """A word naming `document`: 'mark' and its number as three letters (a-j), so a cut-off marker matches none."""
  return 'mark' + ''.join('abcdefghij'[int(d)] for d in f'{document:03d}')


MARKER = re.compile(r'mark([a-j]{3})\b')


def test_held_out_documents_are_never_trained_on(tmp_path, cache_dir):
  """Every sentence of document d starts with its marker word: the decoded training examples must hold markers of
  kept documents only, the held-out examples markers of held-out documents only."""
  rng = random.Random(0)
  documents = [[f'{marker(d)} ' + ' '.join(rng.choice(WORDS) for _ in range(rng.randint(4, 10))) + '.'
                for _ in range(rng.randint(2, 6))] for d in range(150)]
  corpus = tmp_path / 'marked.txt'
  corpus.write_text('\n\n'.join('\n'.join(document) for document in documents) + '\n')
  config = data.DataConfig(source=str(corpus), vocab_size=80, max_seq_length=32, cache_dir=cache_dir,
                           eval_fraction=0.2)
  held_out = {marker(d) for d, document in enumerate(documents) if split_lib.held_out(document, 0.2)}
  assert 15 < len(held_out) < 45  # about 30 of 150

  tokenizer = data.load_tokenizer(config)

  def markers(examples) -> set[str]:
    input_ids, _ = examples.read(np.arange(len(examples)))
    found = set()
    for ids in input_ids:
      found.update('mark' + m for m in MARKER.findall(tokenizer.decode([i for i in ids if i > 4])))
    return found

  trained = markers(data.load_examples(config, tokenizer))
  evaluated = markers(data.load_eval_examples(config, tokenizer))
  assert not trained & held_out
  assert evaluated <= held_out and len(evaluated) > 0.9 * len(held_out)
  assert len(trained) > 0.9 * (150 - len(held_out))
  # Without a held-out fraction every document is trained on; the two sides are cached apart from the whole.
  whole = data.DataConfig(source=str(corpus), vocab_size=80, max_seq_length=32, cache_dir=cache_dir)
  assert markers(data.load_examples(whole, tokenizer)) >= held_out
  assert data.load_eval_examples(whole, tokenizer) is None


def test_held_out_choice_depends_on_the_text_alone():
  rng = random.Random(1)
  documents = [[' '.join(rng.choice(WORDS) for _ in range(8))] for _ in range(4000)]
  chosen = [split_lib.held_out(d, 0.1) for d in documents]
  assert 0.08 < np.mean(chosen) < 0.12
  assert chosen == [split_lib.held_out(list(d), 0.1) for d in documents]  # a copy, elsewhere: the same side
  assert all(split_lib.held_out(d, 0.2) for d, c in zip(documents, chosen) if c)  # a larger fraction adds to it


def test_eval_source_and_bad_settings(tmp_path, corpus_file, cache_dir):
  other = tmp_path / 'other.txt'
  other.write_text('\n\n'.join(f'{marker(d)} the cat sat on the mat.' for d in range(40)) + '\n')
  config = data.DataConfig(source=corpus_file, vocab_size=64, max_seq_length=32, cache_dir=cache_dir,
                           eval_source=str(other))
  tokenizer = data.load_tokenizer(config)
  held = data.load_eval_examples(config, tokenizer)
  assert len(held) == len(data.load_examples(data.DataConfig(source=str(other), vocab_size=64, max_seq_length=32,
                                                             cache_dir=cache_dir), tokenizer))
  missing = dataclasses.replace(config, eval_source=str(tmp_path / 'nowhere'))  # it named data.source
  with pytest.raises(data.DataError, match=r"^no text files found at data.eval_source='.*nowhere'"):
    data.load_eval_examples(missing, tokenizer)
  with pytest.raises(data.DataError, match='set one of them'):
    data.DataConfig(eval_fraction=0.1, eval_source=str(other))
  with pytest.raises(data.DataError, match=r'eval_fraction must be in \[0, 1\)'):
    data.DataConfig(eval_fraction=1.0)
  values = tiny_config(corpus_file, cache_dir, **{'data.eval_fraction': 0.0}).to_dict()
  with pytest.raises(config_lib.ConfigError, match='evaluates on held-out text, and there is none'):
    config_lib.load(values, vocab_size=64)
  for bad in ('10', '0,5', '5,x'):
    with pytest.raises(config_lib.ConfigError, match="profile_steps must be 'START,COUNT'"):
      config_lib.load(tiny_config(corpus_file, cache_dir, profile_steps=bad).to_dict(), vocab_size=64)


def test_an_empty_side_of_the_split_is_named_and_other_data_errors_keep_their_words(tmp_path, corpus_file, cache_dir):
  config = data.DataConfig(source=corpus_file, vocab_size=64, max_seq_length=32, cache_dir=cache_dir)
  tokenizer = data.load_tokenizer(config)
  documents = [[f'{marker(d)} the cat sat on the mat.'] for d in range(2)]
  assert not any(split_lib.held_out(d, 0.01) for d in documents)
  two = tmp_path / 'two.txt'
  two.write_text('\n\n'.join(d[0] for d in documents) + '\n')
  with pytest.raises(data.DataError, match='eval_fraction=0.01 holds out no document'):
    data.load_eval_examples(data.DataConfig(source=str(two), vocab_size=64, max_seq_length=32, cache_dir=cache_dir,
                                            eval_fraction=0.01), tokenizer)
  # The training side says when every document is held out (it used to read "holds no text").
  lines = (f'{marker(d)} the cat sat on the mat.' for d in range(100))
  (tmp_path / 'one.txt').write_text(next(line for line in lines if split_lib.held_out([line], 0.5)) + '\n')
  with pytest.raises(data.DataError, match=f'eval_fraction=0.5 holds out every document of 1 text file.s. at '
                     f"'{tmp_path}/one.txt', leaving none to train on; lower it, or add text$"):
    data.load_examples(data.DataConfig(source=str(tmp_path / 'one.txt'), vocab_size=64, max_seq_length=32,
                                       cache_dir=cache_dir, eval_fraction=0.5), tokenizer)
  (tmp_path / 'blank.txt').write_text('\n \n')  # no text at all: not a held-out problem
  with pytest.raises(data.DataError, match='holds no text'):
    data.load_examples(data.DataConfig(source=str(tmp_path / 'blank.txt'), vocab_size=64, max_seq_length=32,
                                       cache_dir=cache_dir, eval_fraction=0.5), tokenizer)
  # Any other data error on the held-out side keeps its own words (it used to read "holds out no document").
  binary = tmp_path / 'binary.txt'
  binary.write_text('the cat sat.\n\nthe dog \x00 ran.\n')
  with pytest.raises(data.DataError, match='NUL bytes'):
    data.load_eval_examples(data.DataConfig(source=str(binary), vocab_size=64, max_seq_length=32,
                                            cache_dir=cache_dir, eval_fraction=0.5), tokenizer)


def test_binned_auc_by_hand():
  # Replaced tokens in bins 2 and 3, originals in bins 0 and 2: of the 4 pairs, 3 are ordered right and the tie
  # in bin 2 counts one half: 3.5 / 4.
  assert evaluation.binned_auc([0, 0, 1, 1], [1, 0, 1, 0]) == 0.875
  assert evaluation.binned_auc([0, 0, 1], [0, 0, 0]) is None
  # From logits: replaced {2.0, 0.5} against originals {-1.0, 3.0} (the 5.0 has weight 0, a pad): 2 of 4 pairs.
  logits = np.array([[2.0, -1.0, 0.5, 3.0, 5.0]], np.float32)
  counts = evaluation.logit_histograms(logits, np.array([[1, 0, 1, 0, 0]]), np.array([[1, 1, 1, 1, 0]]))
  assert evaluation.binned_auc(*counts) == 0.5


def test_binned_auc_is_the_exact_auc_up_to_ties_within_a_bin():
  rng = np.random.default_rng(0)
  labels = (rng.random((8, 64)) < 0.15).astype(np.int32)
  logits = (rng.normal(size=(8, 64)) + 0.8 * labels - 2.0).astype(np.float32)
  positive, negative = logits[labels == 1], logits[labels == 0]
  exact = np.mean((positive[:, None] > negative[None]) + 0.5 * (positive[:, None] == negative[None]))
  binned = evaluation.binned_auc(*evaluation.logit_histograms(logits, labels, np.ones_like(labels)))
  assert abs(binned - exact) < 2e-3 and 0.6 < exact < 0.9


class _StubModel:
  """An Electra-like `model.apply`: the stub generator (helpers.stub_generator_logits, of the original tokens at the
  positions), a baseline logit 0 at each position, and discriminator logits 0 (P(replaced) = 1/2 everywhere)."""

  def __init__(self, original):
    self.original = original

  def apply(self, variables, input_ids, segment_ids, input_mask, positions=None, *, deterministic, method, rngs):
    del segment_ids, input_mask, deterministic, rngs
    if method == 'discriminator_logits':  # 0, or the discriminator's one weight where params hold one
      weight = variables['params'].get('discriminator', {}).get('encoder', {}).get('w', 0.0)
      return jnp.full(input_ids.shape, weight, jnp.float32)
    logits = stub_generator_logits(jnp.take_along_axis(self.original, positions, axis=1))
    return (logits, jnp.zeros(positions.shape)) if method == 'generator_logits_and_baseline' else logits


@pytest.mark.parametrize('name, two_stage, step, expected', [
    # Every word of the batch below is selected, so with the stub gen_loss = 8/5 log 2 and disc_loss = log 2.
    ('electra', 0, 0, 1.6 + 50),
    ('electra_frozen', 0, 0, 50),  # the frozen generator's loss is reported, not trained: weight 0, not 1
    ('electra', 5, 2, 1.6),  # two stages: the generator's loss alone before step 5 ...
    ('electra', 5, 7, 50),  # ... the discriminator's alone from step 5 on
    # At step 5 the train step first copies the generator into the discriminator (train_step.two_stage_params): the
    # discriminator's weight 3 (logits 3) becomes the generator's 0, so P(replaced) = 1/2 again.
    ('electra', 5, 5, 50),
    ('electra_adversarial', 0, 0, None),  # + the policy and baseline losses, not gen_loss: the training loss below
])
def test_eval_loss_is_the_training_loss(name, two_stage, step, expected):
  """eval_loss is what the train step minimises on that batch with its masks and samples (without dropout): the
  objective's own metrics, not ELECTRA's loss for every replaced-token detection objective."""
  ids = np.array([[2, 5, 6, 7, 3, 0, 0, 0], [2, 7, 5, 3, 0, 0, 0, 0]], np.int32)
  batch = {k: jnp.asarray(v) for k, v in token_batch(ids).items()}
  # (A generator of the discriminator's size, as two-stage training needs; the stub runs neither.)
  model_config = ModelConfig(vocab_size=STUB_VOCAB, hidden_size=64, num_heads=1, intermediate_size=256,
                             generator_hidden_fraction=1.0)
  c = TrainConfig(train_steps=10, model=model_config, objective=ObjectiveConfig(
      name=name, mask_prob=0.6, mask_with_replacement=False, temperature=1e-3, two_stage_generator_steps=two_stage,
      generator_checkpoint='unread' if name == 'electra_frozen' else ''))
  model, rng = _StubModel(jnp.asarray(ids)), jax.random.PRNGKey(0)
  params = {'generator': {'encoder': {'w': jnp.float32(0)}}, 'discriminator': {'encoder': {'w': jnp.float32(3)}}}
  params = params if (two_stage, step) == (5, 5) else {}
  state = train_step.TrainState(jnp.int32(step), params, None)
  metrics, histograms = evaluation.eval_step(state, batch, rng, model=model, config=c, special=SPECIAL)
  loss = objective.two_stage_loss if two_stage else objective.get(name).loss
  kwargs = {'step': state.step} if two_stage else {}
  if two_stage:  # the parameters of the stage, as the train step takes them
    params = train_step.two_stage_params(params, state.step, two_stage, model_config)
  trained, _ = loss(lambda p, *args, **kw: model.apply({'params': p}, *args, **kw), params, batch, rng,
                    config=c.objective, special=SPECIAL, vocab_size=STUB_VOCAB, progress=step / 10,
                    deterministic=True, **kwargs)
  np.testing.assert_allclose(metrics['loss'][0], trained, rtol=1e-6)
  if expected is not None:
    np.testing.assert_allclose(metrics['loss'][0], expected * math.log(2), rtol=1e-6)
  assert ('policy_loss' in metrics) == (name == 'electra_adversarial')
  assert int(np.sum(histograms[0]) + np.sum(histograms[1])) == 9  # the AUC's histograms of the 9 real tokens


EVAL_KEYS = {'eval_loss', 'eval_gen_loss', 'eval_gen_accuracy', 'eval_disc_loss', 'eval_disc_accuracy',
             'eval_disc_recall', 'eval_disc_auc'}


@pytest.mark.slow
def test_eval_metrics_every_eval_every_on_the_same_batches(tmp_path, corpus_file, cache_dir):
  config = tiny_config(corpus_file, cache_dir, profile_steps='2,2')
  trainer.train(config, tmp_path)
  logs = read_metrics(tmp_path)
  # Step 3 is an evaluation but no log step: a line of its own; step 6 (eval and log) is one line.
  assert [m['step'] for m in logs] == [2, 3, 4, 6]
  assert [m['step'] for m in logs if EVAL_KEYS <= set(m)] == [3, 6]
  assert 'loss' not in logs[1] and 'loss' in logs[3]
  # 6 steps, dropout off: no skill to ask for yet, but every held-out number is a number (a binned AUC with an empty
  # class, or a 0/0 accuracy, would be NaN).
  assert all(np.isfinite(logs[3][key]) for key in EVAL_KEYS), logs[3]

  # The final state, evaluated twice more from its checkpoint: the same numbers as the run logged at step 6.
  c = config_lib.load(config, vocab_size=64)
  tokenizer = data.load_tokenizer(c.data)
  run = train_step.cached(c, tokenizer.special, sharding.make_mesh(c.mesh))
  checkpointer = Checkpointer(tmp_path)
  _, state, _ = checkpointer.restore_latest(run.abstract_state())
  checkpointer.close()
  evaluator = evaluation.Evaluator(run, data.load_eval_examples(c.data, tokenizer), every=3, num_batches=2,
                                   last_step=6)
  first, second = evaluator.evaluate(state), evaluator.evaluate(state)
  assert first == second
  for key in EVAL_KEYS:
    np.testing.assert_allclose(first[key], logs[3][key], rtol=1e-6, err_msg=key)

  # profile_steps='2,2' traced steps 2 and 3 into the TensorBoard directory, where the profile plugin looks.
  traces = glob.glob(str(tmp_path / 'tensorboard' / 'plugins' / 'profile' / '*' / '*.xplane.pb'))
  assert len(traces) == 1 and os.path.getsize(traces[0]) > 1000


def test_a_run_from_before_the_held_out_keys_resumes(tmp_path, corpus_file, cache_dir):
  """A workdir whose config.json predates data.eval_fraction/eval_source resumes when they keep their defaults,
  and is refused when they would change the training examples."""
  values = tiny_config(corpus_file, cache_dir, eval_every=0, **{'data.eval_fraction': 0.0}).to_dict()
  saved = json.loads(json.dumps(values))
  del saved['data']['eval_fraction'], saved['data']['eval_source']
  (tmp_path / 'config.json').write_text(json.dumps(saved))
  trainer._check_resume_config(tmp_path, values)  # pylint: disable=protected-access
  values['data']['eval_fraction'] = 0.1
  with pytest.raises(config_lib.ConfigError, match=r'different data settings \(data.eval_fraction\)'):
    trainer._check_resume_config(tmp_path, values)  # pylint: disable=protected-access


@pytest.mark.parametrize('key, saved, resumes', [
    ('fused_qkv', False, True), ('fused_qkv', True, False), ('fused_qkv', 'false', False), ('fused_qkv', 'auto', True),
    ('remat', False, True), ('remat', True, False),
])
def test_a_run_that_saved_a_key_s_old_boolean_resumes(tmp_path, key, saved, resumes):
  """model.fused_qkv was a boolean, false by default, before 'auto', and model.remat one before its policies: a run
  that saved false resumes under today's defaults ('auto', 'none'); one that saved true or asked for 'false' does
  not."""
  values = default.get_config().to_dict()
  old = json.loads(json.dumps(values))
  old['model'][key] = saved
  (tmp_path / 'config.json').write_text(json.dumps(old))
  if resumes:
    trainer._check_resume_config(tmp_path, values)  # pylint: disable=protected-access
  else:
    with pytest.raises(config_lib.ConfigError, match=rf'different model settings \(model.{key}\)'):
      trainer._check_resume_config(tmp_path, values)  # pylint: disable=protected-access
