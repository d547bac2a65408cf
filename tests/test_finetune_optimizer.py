"""Layer-wise learning-rate decay, the warm-up/decay schedule and the paper defaults, checked by hand."""

import dataclasses

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

from electra_jax.config import ModelConfig
from electra_jax.finetune import heads, optimizer, tasks, train
from electra_jax.finetune.config import OptimizerConfig, SquadConfig

MODEL = ModelConfig(vocab_size=20, embedding_size=8, hidden_size=16, num_layers=2, num_heads=2,
                    intermediate_size=32, max_position_embeddings=32)
TASK = tasks.Task(name='t', kind=tasks.CLASSIFICATION, source='files', location='', labels=('a', 'b'))


def _abstract_params(model_config=MODEL):
  """The fine-tuning model's parameter shapes (nothing is computed)."""
  model = heads.make_model(TASK, model_config, 0.1, SquadConfig())
  ids = jnp.zeros((1, 8), jnp.int32)
  init = lambda rng: nn.meta.unbox(model.init(rng, {'input_ids': ids, 'segment_ids': ids, 'input_mask': ids}))
  return jax.eval_shape(init, jax.random.PRNGKey(0))['params']


def _small_params():
  """A few parameters named as the model names them, one per depth, plus a LayerNorm and a bias."""
  w = lambda *shape: jnp.full(shape, 0.5, jnp.float32)
  return {'embeddings': {'word_embeddings': {'embedding': w(4, 2)}, 'LayerNorm': {'scale': w(2)}},
          'discriminator': {'encoder': {'layer_0': {'output': {'dense': {'kernel': w(2, 2), 'bias': w(2)}}},
                                        'layer_1': {'output': {'dense': {'kernel': w(2, 2)}}}}},
          'head': {'dense': {'kernel': w(2, 3)}}}


def test_multipliers_follow_the_formula_on_a_two_layer_model():
  ones = jax.tree.map(lambda s: jnp.ones(s.shape, s.dtype), _abstract_params())
  tx = optimizer.layerwise_decay(num_layers=2, decay=0.8)
  scaled, _ = tx.update(ones, tx.init(ones))  # each update of ones scaled by its parameter's multiplier
  flat = flax.traverse_util.flatten_dict(jax.tree.map(lambda x: float(x.reshape(-1)[0]), scaled), sep='/')
  # L = 2: head depth 4 -> 0.8^0; layer 1 depth 2 -> 0.8^2; layer 0 depth 1 -> 0.8^3; embeddings depth 0 -> 0.8^4.
  expected = {
      'head/dense/kernel': 1.0,
      'discriminator/encoder/layer_1/attention/self/query/kernel': 0.64,
      'discriminator/encoder/layer_1/output/LayerNorm/scale': 0.64,
      'discriminator/encoder/layer_0/intermediate/dense/bias': 0.512,
      'discriminator/embeddings_project/kernel': 0.4096,  # E != H: the projection counts as embeddings
      'embeddings/word_embeddings/embedding': 0.4096,
      'embeddings/LayerNorm/bias': 0.4096,
  }
  for path, value in expected.items():
    assert flat[path] == pytest.approx(value), path
  assert sorted(set(flat.values())) == pytest.approx([0.4096, 0.512, 0.64, 1.0])
  assert not any(k.startswith('generator') for k in flat)  # the generator is dropped


@pytest.mark.parametrize('scan_layers, tying', [(True, 'embeddings'), (False, 'gdes'), (True, 'gdes')])
def test_from_scratch_every_layer_has_its_depth_whatever_the_pretraining_layout(scan_layers, tying):
  # Built as configured, scanned layers are stacked under encoder/layers (no layer_N: all depth L+2 = 4, the head's
  # rate) and GDES's embeddings_delta is outside `embeddings` (depth 4). As fine-tuning builds it, neither.
  config = dataclasses.replace(MODEL, scan_layers=scan_layers, tying=tying)
  depths = flax.traverse_util.flatten_dict(optimizer.depths(_abstract_params(config), 2), sep='/')
  assert any(('/layers/' if scan_layers else '/embeddings_delta/') in k and d == 4 for k, d in depths.items())
  depths = flax.traverse_util.flatten_dict(
      optimizer.depths(_abstract_params(train.scratch_model_config(config)), 2), sep='/')
  by_subtree = {}
  for path, d in depths.items():
    by_subtree.setdefault('/'.join(path.split('/')[:3]), set()).add(d)
  assert by_subtree == {'discriminator/embeddings_project/kernel': {0}, 'discriminator/embeddings_project/bias': {0},
                        'discriminator/encoder/layer_0': {1}, 'discriminator/encoder/layer_1': {2},
                        'embeddings/LayerNorm/bias': {0}, 'embeddings/LayerNorm/scale': {0},
                        'embeddings/word_embeddings/embedding': {0}, 'embeddings/position_embeddings/embedding': {0},
                        'embeddings/token_type_embeddings/embedding': {0}, 'head/dense/kernel': {4},
                        'head/dense/bias': {4}}


def test_updates_are_scaled_per_layer():
  params = _small_params()
  config = OptimizerConfig(learning_rate=1e-3, layerwise_lr_decay=0.8, weight_decay=0.01)
  grads = jax.tree.map(jnp.ones_like, params)
  updates = {}
  for decay in (0.8, 1.0):
    tx, _ = optimizer.make_optimizer(dataclasses.replace(config, layerwise_lr_decay=decay), 2, 100)
    state = tx.init(params)
    state = jax.tree.map(lambda x: x + 5 if x.dtype == jnp.int32 else x, state)  # step 5 (warm-up): lr > 0
    updates[decay], _ = jax.jit(tx.update)(grads, state, params)
  ratio = jax.tree.map(lambda a, b: float(jnp.mean(a / b)), updates[0.8], updates[1.0])
  # Leaves in tree order: layer_0's bias and kernel (depth 1), layer_1 (2), the embeddings' two (0), the head (4).
  expected = [0.8 ** 3, 0.8 ** 3, 0.8 ** 2, 0.8 ** 4, 0.8 ** 4, 1.0]
  for (path, r), e in zip(jax.tree_util.tree_leaves_with_path(ratio), expected, strict=True):
    assert r == pytest.approx(e, rel=1e-5), jax.tree_util.keystr(path)


@pytest.mark.parametrize('total_steps, step, expected', [
    # Official: lr * min(1, t / w) * (1 - t / T), w = 0.1 T; lr = 1. T = 100, w = 10:
    (100, 0, 0.0),
    (100, 5, 0.5 * 0.95),  # warming up AND decaying: 0.475 (the old warm-up-then-decay form gave 0.5)
    (100, 10, 1.0 * 0.90),  # the peak is 0.9 lr, not lr
    (100, 55, 0.45),
    (100, 99, 0.01),
    (100, 100, 0.0),
    # T = 25: w = 2.5 is not rounded (the official code divides by the float T * 0.1).
    (25, 1, 0.4 * 0.96),  # 0.384
    (25, 2, 0.8 * 0.92),  # 0.736
    (25, 3, 1.0 * 0.88),
])
def test_schedule_is_the_official_overlapping_warmup_and_decay(total_steps, step, expected):
  schedule = optimizer.learning_rate_schedule(1.0, total_steps=total_steps, warmup_fraction=0.1)
  assert float(schedule(step)) == pytest.approx(expected, abs=1e-6)


def test_schedule_mean_is_the_official_one():
  # The integral of min(1, 10x)(1 - x) over [0, 1] is 10 (1/200 - 1/3000) + 0.9^2 / 2 = 0.04667 + 0.405 = 0.45167;
  # warm-up-then-decay would average 0.5 (11% more).
  schedule = optimizer.learning_rate_schedule(1.0, total_steps=10000, warmup_fraction=0.1)
  mean = float(jnp.mean(jax.vmap(schedule)(jnp.arange(10000))))
  assert mean == pytest.approx(0.45167, abs=2e-4)


def test_paper_defaults_by_model_width():
  assert OptimizerConfig().for_model(256) == OptimizerConfig(learning_rate=3e-4, layerwise_lr_decay=0.8)
  assert OptimizerConfig().for_model(768).learning_rate == 1e-4
  assert OptimizerConfig().for_model(1024).layerwise_lr_decay == 0.9
  assert OptimizerConfig(learning_rate=1e-3, layerwise_lr_decay=1.0).for_model(1024).learning_rate == 1e-3
