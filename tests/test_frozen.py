"""objective 'electra_frozen' (Fast-ELECTRA): replacements from another run's MLM, frozen. It loads the generator
from a checkpoint and never moves it, samples at the temperature schedule, counts its FLOPs (forward pass per step;
its training cost apart), and resumes exactly."""

import dataclasses
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from electra_jax import (checkpoint, config as config_lib, config_files, data, flops, frozen, objective, pretrained,
                         sharding, train_step, trainer)
from electra_jax.config import ConfigError, ModelConfig
from electra_jax.model import Electra
from helpers import read_metrics, tiny_pretraining_config  # pylint: disable=g-bad-import-order

pytestmark = [pytest.mark.usefixtures('compile_once'), pytest.mark.slow]


@pytest.fixture(scope='module')
def mlm_run(tmp_path_factory, corpus_file, cache_dir):
  """A 4-step mlm run with checkpoints at steps 2 and 4: the generator."""
  workdir = tmp_path_factory.mktemp('mlm')
  trainer.train(tiny_pretraining_config(corpus_file, cache_dir, **{
      'objective.name': 'mlm', 'train_steps': 4, 'checkpoint_every': 2}), workdir)
  return str(workdir)


def frozen_config(corpus_file, cache_dir, mlm_run):
  return tiny_pretraining_config(corpus_file, cache_dir, **{
      'objective.name': 'electra_frozen', 'objective.generator_checkpoint': mlm_run, 'objective.generator_step': 2,
      'objective.initial_temperature': 3.0, 'objective.temperature_decay_fraction': 0.5,
      'data.tokenizer': mlm_run})


def all_params(workdir, step=None):
  """Every parameter of a run's checkpoint, the frozen generator's included (load_params reads the rest)."""
  c = config_files.load_config(workdir)
  run = train_step.cached(c, data.tokenizer.load(workdir).special, sharding.make_mesh(c.mesh))
  ckpt = checkpoint.Checkpointer(workdir)
  try:
    return jax.device_get(ckpt.restore_params(step or ckpt.latest_step(), run.abstract_state().params))
  finally:
    ckpt.close()


@pytest.fixture(scope='module')
def one_go(tmp_path_factory, corpus_file, cache_dir, mlm_run):
  workdir = tmp_path_factory.mktemp('frozen_one_go')
  trainer.train(frozen_config(corpus_file, cache_dir, mlm_run), workdir)
  return str(workdir)


def test_generator_is_loaded_and_never_trained(one_go, mlm_run):
  params, generator = all_params(one_go), all_params(mlm_run, step=2)
  # The mlm run's discriminator-sized MLM at step 2 (not the latest, 4), unchanged after 8 steps.
  assert set(params[frozen.PARAMS]) == {'embeddings', 'discriminator'}
  jax.tree.map(np.testing.assert_array_equal, params[frozen.PARAMS], generator)
  assert not np.array_equal(params[frozen.PARAMS]['embeddings']['word_embeddings']['embedding'],
                            all_params(mlm_run, step=4)['embeddings']['word_embeddings']['embedding'])
  # The discriminator trains: its embeddings moved from their initial values (both runs start from seed 0).
  first = all_params(one_go, step=4)
  assert not np.array_equal(first['embeddings']['word_embeddings']['embedding'],
                            params['embeddings']['word_embeddings']['embedding'])
  # Fine-tuning reads the discriminator alone.
  config, loaded = pretrained.load_params(one_go)
  assert config.objective.name == 'electra_frozen' and set(loaded) == {'embeddings', 'discriminator'}


def test_temperature_schedule_and_flops(one_go, mlm_run, corpus_file, cache_dir):
  metrics = read_metrics(one_go)
  # Step s samples at progress (s - 1) / 8: 3 falling linearly to 1 at progress 0.5 (step 5), then 1.
  np.testing.assert_allclose([m['temperature'] for m in metrics], [3.0, 2.5, 2.0, 1.5, 1.0, 1.0, 1.0, 1.0])
  assert all(m['loss'] == pytest.approx(50.0 * m['disc_loss'], rel=1e-6) for m in metrics)  # no generator loss
  # Reported, not trained: the frozen MLM's cross-entropy on each batch (2 steps of training: near log(64)).
  assert all(2.0 < m['gen_loss'] < 6.0 for m in metrics)
  # FLOPs by hand: 3 x (discriminator encoder at every token + RTD head) + 1 x (the generator's encoder at every
  # token + its MLM head at the P selected positions), for B sequences of L tokens.
  c = config_files.load_config(one_go)
  source = config_files.load_config(mlm_run)
  batch, length, predictions = c.batch_size, c.data.max_seq_length, c.objective.num_predictions(32)
  disc = c.model.tower(generator=False)
  disc_forward = length * (flops.tower_forward_flops_per_token(disc, c.model.embedding_size, length)
                           + flops.rtd_head_flops_per_token(disc.hidden_size))
  gen = source.model.tower(generator=False)  # an mlm run: its discriminator-sized model
  gen_forward = (length * flops.tower_forward_flops_per_token(gen, source.model.embedding_size, length)
                 + predictions * flops.mlm_head_flops_per_prediction(gen.hidden_size, source.model))
  per_step = batch * (3 * disc_forward + gen_forward)
  assert [m['train_flops'] for m in metrics] == [pytest.approx(s * per_step, rel=1e-12) for s in range(1, 9)]
  assert objective.train_flops_per_step(c) == pytest.approx(per_step, rel=1e-12)
  # What the generator cost to train is apart: its 2 steps of mlm.
  generator = objective.generator_source(c)
  assert generator.config == source and generator.kind == 'mlm'
  assert frozen.generator_train_flops(generator, 2) == 2 * objective.train_flops_per_step(source)
  assert 'the mlm of' in frozen.describe(c, generator, 2) and 'training it cost' in frozen.describe(c, generator, 2)


def test_resume_equals_uninterrupted(tmp_path, one_go, mlm_run, corpus_file, cache_dir):
  config = frozen_config(corpus_file, cache_dir, mlm_run)
  trainer.train(config, tmp_path, stop_after=5)
  trainer.train(config, tmp_path)
  a, b = read_metrics(one_go), read_metrics(tmp_path)
  assert [m['step'] for m in b] == list(range(1, 9))
  np.testing.assert_allclose([m['loss'] for m in a], [m['loss'] for m in b], rtol=1e-6)
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7), all_params(one_go),
               all_params(str(tmp_path)))


def test_config_errors(corpus_file, cache_dir, mlm_run, tmp_path):
  with pytest.raises(ConfigError, match='generator_checkpoint'):
    trainer.train(tiny_pretraining_config(corpus_file, cache_dir, **{'objective.name': 'electra_frozen'}), tmp_path)
  with pytest.raises(ConfigError, match='generator_checkpoint'):
    trainer.train(tiny_pretraining_config(corpus_file, cache_dir, **{'objective.generator_checkpoint': mlm_run}),
                  tmp_path)
  with pytest.raises(ConfigError, match='leave init_checkpoint empty'):
    config = frozen_config(corpus_file, cache_dir, mlm_run)
    config.init_checkpoint = mlm_run
    trainer.train(config, tmp_path)
  # Another tokenizer than the generator's (one trained on the corpus with another vocabulary size).
  config = frozen_config(corpus_file, cache_dir, mlm_run)
  config.data.tokenizer = ''
  config.data.vocab_size = 60
  with pytest.raises(ConfigError, match='tokens'):
    trainer.train(config, tmp_path)
  # Sequences longer than the generator has positions (it died in the initialiser on a broadcast).
  config = frozen_config(corpus_file, cache_dir, mlm_run)
  config.data.max_seq_length, config.model.max_position_embeddings = 128, 128
  with pytest.raises(ConfigError, match=r"^data.max_seq_length=128 exceeds objective.generator_checkpoint \S+'s "
                     r'model.max_position_embeddings=64; lower data.max_seq_length$'):
    trainer.train(config, tmp_path)
  assert not os.path.exists(tmp_path / 'config.json')


def test_the_generator_computes_as_this_run_does(corpus_file, cache_dir, mlm_run):
  """A generator trained on a GPU saved attention=cudnn (resolved there): sampling from it on a CPU takes this
  run's attention and dtype (it stopped on 'cuDNN is not detected'), its sizes its own."""
  c = config_lib.load(frozen_config(corpus_file, cache_dir, mlm_run), vocab_size=64)
  source = frozen.Source(dataclasses.replace(
      c, model=dataclasses.replace(c.model, attention='cudnn', dtype='bfloat16', num_layers=3)), None)
  generator = frozen.model(c, source._replace(objective=objective.get('mlm'))).generator_config
  assert (generator.attention, generator.dtype, generator.num_layers) == (c.model.attention, c.model.dtype, 3)
  # A generator trained with attention dropout (einsum) under a run without it (xla): ModelConfig refused the mix.
  source = frozen.Source(dataclasses.replace(
      c, model=dataclasses.replace(c.model, attention='einsum', attention_dropout_rate=0.1)), objective.get('mlm'))
  run = dataclasses.replace(c, model=dataclasses.replace(c.model, attention='xla', attention_dropout_rate=0.0))
  assert frozen.model(run, source).generator_config.attention == 'xla'


def test_an_electra_runs_generator_samples_as_it_did():
  """kind 'generator': the frozen generator of an electra run is its generator tower, as that run computes it."""
  disc = ModelConfig(vocab_size=40, embedding_size=16, hidden_size=32, num_layers=1, num_heads=2,
                     intermediate_size=64, max_position_embeddings=16)
  gen = ModelConfig(vocab_size=40, embedding_size=16, hidden_size=64, num_layers=2, num_heads=2,
                    intermediate_size=128, generator_hidden_fraction=0.5, max_position_embeddings=16)
  ids = jnp.tile(jnp.arange(5, 17, dtype=jnp.int32)[None], (2, 1))
  positions = jnp.array([[1, 3], [2, 5]], jnp.int32)
  model = frozen.FrozenGeneratorElectra(disc, with_generator=False, generator_config=gen)
  params = nn.meta.unbox(model.init(jax.random.PRNGKey(0), ids, ids * 0, ids * 0 + 1, positions)['params'])
  assert set(params) == {'embeddings', 'discriminator', frozen.PARAMS}
  assert set(params[frozen.PARAMS]) == {'embeddings', 'generator'}  # what generator_logits reads, no more
  ours = model.apply({'params': params}, ids, ids * 0, ids * 0 + 1, positions, method='generator_logits')
  theirs = Electra(gen).apply({'params': params[frozen.PARAMS]}, ids, ids * 0, ids * 0 + 1, positions,
                              method='generator_logits')
  np.testing.assert_array_equal(ours, theirs)
  # Its forward FLOPs are the generator's share of an electra step's forward pass.
  electra = flops.pretraining_forward_flops_per_sequence(gen, 16, 2, objective.get('electra'))
  detector = flops.pretraining_forward_flops_per_sequence(gen, 16, 2, objective.get('electra_frozen'))
  assert flops.mlm_forward_flops_per_sequence(gen, False, 16, 2) == electra - detector > 0

