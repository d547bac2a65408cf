"""model.tying='gdes' (DeBERTa-v3's gradient-disentangled embedding sharing): the discriminator reads
stop_gradient(shared embeddings) + a zero-initialised delta. Its loss never reaches the shared tables, it starts as
tying='embeddings', and the HF export and fine-tuning fold the delta into the discriminator's embeddings."""

import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

from electra_jax import masking, objective
from electra_jax.config import ConfigError, ModelConfig, ObjectiveConfig
from electra_jax.finetune import train as finetune_train
from electra_jax.model import Electra, fold_embeddings_delta

SMALL = dict(vocab_size=40, embedding_size=16, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
             generator_hidden_fraction=0.5, max_position_embeddings=16)
SPECIAL = masking.SpecialIds(pad=0, cls=2, sep=3, mask=4)


def batch(seed=0, size=3, length=12):
  rng = np.random.default_rng(seed)
  ids = rng.integers(5, SMALL['vocab_size'], (size, length)).astype(np.int32)
  ids[:, 0], ids[:, -1] = SPECIAL.cls, SPECIAL.sep
  mask = np.ones_like(ids)
  mask[0, 8:] = 0
  ids[0, 8:] = 0
  return {'input_ids': jnp.asarray(ids), 'segment_ids': jnp.zeros_like(ids), 'input_mask': jnp.asarray(mask)}


def init(tying, seed=0):
  config = ModelConfig(**SMALL, tying=tying)
  b = batch()
  positions = jnp.tile(jnp.arange(3)[None], (3, 1))
  params = Electra(config).init(jax.random.PRNGKey(seed), b['input_ids'], b['segment_ids'], b['input_mask'],
                                positions)['params']
  return config, jax.tree.map(np.asarray, nn.meta.unbox(params))


@pytest.mark.slow
def test_delta_starts_at_zero_and_step_0_is_tying_embeddings():
  gdes_config, gdes = init('gdes')
  config, tied = init('embeddings')
  delta = gdes['discriminator']['embeddings_delta']
  # The delta mirrors the shared embeddings (word, position, token type, LayerNorm) and is all zeros.
  assert jax.tree.structure(delta) == jax.tree.structure(tied['embeddings'])
  assert all(not np.any(x) for x in jax.tree.leaves(delta))
  # Every other parameter is drawn exactly as with tying='embeddings'.
  rest = {k: v for k, v in gdes.items() if k != 'discriminator'}
  rest['discriminator'] = {k: v for k, v in gdes['discriminator'].items() if k != 'embeddings_delta'}
  jax.tree.map(np.testing.assert_array_equal, rest, tied)
  b = batch(1)
  for method in ('discriminator_logits',):
    ours = Electra(gdes_config).apply({'params': gdes}, b['input_ids'], b['segment_ids'], b['input_mask'],
                                      method=method)
    theirs = Electra(config).apply({'params': tied}, b['input_ids'], b['segment_ids'], b['input_mask'],
                                   method=method)
    np.testing.assert_array_equal(ours, theirs)


def loss_grads(config, params):
  """Gradients of the generator's MLM loss and of the discriminator's loss (ELECTRA's two terms)."""
  def losses(p):
    _, metrics = objective.electra_loss(
        lambda q, *a, **k: Electra(config).apply({'params': q}, *a, **k), p, batch(2), jax.random.PRNGKey(3),
        config=ObjectiveConfig(), special=SPECIAL, vocab_size=SMALL['vocab_size'], deterministic=True)
    return metrics['gen_loss'][0], metrics['disc_loss'][0]
  return jax.jit(jax.jacrev(losses))(params)  # jitted: op by op, the backward pass takes a minute


@pytest.mark.slow
def test_discriminator_gradient_does_not_reach_the_shared_tables():
  config, params = init('gdes')
  params['discriminator']['embeddings_delta'] = jax.tree.map(lambda x: x + 0.01, params['discriminator'][
      'embeddings_delta'])  # not at zero: the test must not depend on the starting point
  gen, disc = loss_grads(config, params)
  # The shared embeddings get the generator's MLM gradient and nothing from the discriminator's loss.
  assert all(not np.any(x) for x in jax.tree.leaves(disc['embeddings']))
  assert all(np.any(x) for x in jax.tree.leaves(gen['embeddings']))
  # The discriminator's loss trains its delta (every table and the LayerNorm), which the generator never reads.
  assert all(np.any(x) for x in jax.tree.leaves(disc['discriminator']['embeddings_delta']))
  assert all(not np.any(x) for x in jax.tree.leaves(gen['discriminator']['embeddings_delta']))
  # The control: with tying='embeddings' the discriminator's loss does reach the shared tables.
  config, tied = init('embeddings')
  _, disc = loss_grads(config, tied)
  assert all(np.any(x) for x in jax.tree.leaves(disc['embeddings']))


def test_folded_delta_is_what_the_discriminator_reads():
  gdes_config, params = init('gdes')
  rng = np.random.default_rng(0)
  params['discriminator']['embeddings_delta'] = jax.tree.map(
      lambda x: rng.normal(0, 0.1, x.shape).astype(np.float32), params['discriminator']['embeddings_delta'])
  folded = fold_embeddings_delta(params)
  assert 'embeddings_delta' not in folded['discriminator']
  np.testing.assert_allclose(folded['embeddings']['LayerNorm']['scale'],
                             params['embeddings']['LayerNorm']['scale']
                             + params['discriminator']['embeddings_delta']['LayerNorm']['scale'])
  b = batch(4)
  ours = Electra(gdes_config).apply({'params': params}, b['input_ids'], b['segment_ids'], b['input_mask'],
                                    method='discriminator_logits')
  tied = Electra(ModelConfig(**SMALL)).apply({'params': folded}, b['input_ids'], b['segment_ids'],
                                             b['input_mask'], method='discriminator_logits')
  np.testing.assert_allclose(ours, tied, atol=1e-6, rtol=0)
  assert fold_embeddings_delta(folded) is folded  # nothing to fold


def test_gdes_needs_a_generator_and_a_detector():
  with pytest.raises(ConfigError, match='tying=gdes'):
    objective.get('mlm').model(ModelConfig(**SMALL, tying='gdes'))
  with pytest.raises(ConfigError, match='tying=gdes'):
    objective.get('replace_mlm').model(ModelConfig(**SMALL, tying='gdes'))
  objective.get('electra_15').model(ModelConfig(**SMALL, tying='gdes'))


@pytest.mark.slow
def test_export_folds_the_delta_and_fine_tuning_reads_it(tmp_path):
  transformers = pytest.importorskip('transformers')
  pytest.importorskip('torch')
  from test_convert import (MODEL_SECTION, example_batch, hf_logits, our_logits,  # noqa: PLC0415
                            random_workdir)
  model, params = random_workdir(tmp_path / 'ours', {**MODEL_SECTION, 'tying': 'gdes'})
  assert np.any(params['discriminator']['embeddings_delta']['word_embeddings']['embedding'])  # random, not zero
  from electra_jax import convert  # noqa: PLC0415
  convert.main(['--checkpoint', str(tmp_path / 'ours'), '--to-hf', str(tmp_path / 'hf')])
  disc_dir, gen_dir = str(tmp_path / 'hf' / 'discriminator'), str(tmp_path / 'hf' / 'generator')
  disc, info = transformers.ElectraForPreTraining.from_pretrained(disc_dir, output_loading_info=True)
  assert not info['missing_keys'] and not info['unexpected_keys'] and not info['mismatched_keys']
  gen = transformers.ElectraForMaskedLM.from_pretrained(gen_dir)
  ids, segments, mask = example_batch()
  ours, theirs = our_logits(model, params, ids, segments, mask), hf_logits(disc.eval(), gen.eval(), ids, segments,
                                                                            mask)
  real = mask > 0
  np.testing.assert_allclose(ours[0][real], theirs[0][real], atol=1e-4, rtol=0)  # the discriminator: with the delta
  np.testing.assert_allclose(ours[1][real], theirs[1][real], atol=1e-4, rtol=0)  # the generator: without it
  word = params['embeddings']['word_embeddings']['embedding']
  delta = params['discriminator']['embeddings_delta']['word_embeddings']['embedding']
  np.testing.assert_allclose(disc.electra.embeddings.word_embeddings.weight.detach().numpy(), word + delta,
                             rtol=1e-6)
  np.testing.assert_array_equal(gen.electra.embeddings.word_embeddings.weight.detach().numpy(), word)

  # Fine-tuning starts from the folded embeddings, as a tying='embeddings' model.
  load = finetune_train._load_pretrained  # pylint: disable=protected-access
  model_config, pretrained, _ = load(os.fspath(tmp_path / 'ours'))
  assert model_config.tying == 'embeddings' and set(pretrained) == {'embeddings', 'discriminator'}
  assert 'embeddings_delta' not in pretrained['discriminator']
  flat = traverse_util.flatten_dict(fold_embeddings_delta(params))
  for path, value in traverse_util.flatten_dict(pretrained).items():
    np.testing.assert_allclose(np.asarray(value), flat[path], rtol=1e-6, err_msg='/'.join(path))
