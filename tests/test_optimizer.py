"""The ELECTRA optimiser: schedule, weight-decay mask, Adam without bias correction, clipping."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from electra_jax import optimizer
from electra_jax.config import ModelConfig, OptimizerConfig
from electra_jax.model import Electra


@pytest.mark.parametrize('step, expected', [
    # lr = 1e-3, warmup w = 10, T = 100: lr * min(1, t / w) * (1 - t / T)
    (0, 0.0),
    (1, 1e-3 * 0.1 * 0.99),  # 9.9e-5
    (5, 1e-3 * 0.5 * 0.95),  # 4.75e-4
    (10, 1e-3 * 1.0 * 0.90),  # 9e-4
    (40, 1e-3 * 1.0 * 0.60),  # 6e-4
    (99, 1e-3 * 1.0 * 0.01),  # 1e-5
    (100, 0.0),
    (150, 0.0),  # stays at 0 past the end (no negative learning rate)
])
def test_schedule(step, expected):
  schedule = optimizer.learning_rate_schedule(OptimizerConfig(learning_rate=1e-3, warmup_steps=10), 100)
  np.testing.assert_allclose(float(schedule(step)), expected, rtol=1e-6, atol=1e-12)


def _model_params(boxed):
  config = ModelConfig(vocab_size=40, embedding_size=16, hidden_size=32, num_layers=2, num_heads=2,
                       intermediate_size=64, generator_hidden_fraction=0.25)
  ids = jnp.zeros((1, 8), jnp.int32)
  params = jax.eval_shape(Electra(config).init, jax.random.PRNGKey(0), ids, ids, ids, ids[:, :2])['params']
  return params if boxed else nn.meta.unbox(params)


@pytest.mark.parametrize('boxed', [False, True])
def test_decay_mask(boxed):
  params = _model_params(boxed)
  mask = optimizer.decay_mask(params)
  names = {}
  for path, decays in jax.tree_util.tree_leaves_with_path(mask):
    keys = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
    names['/'.join(keys)] = decays
  assert len(names) == len(jax.tree.leaves(nn.meta.unbox(params)))
  for name, decays in names.items():
    leaf = name.split('/')[-1]
    assert leaf in ('kernel', 'embedding', 'bias', 'scale'), name
    # Decay exactly the weight matrices and embedding tables; never a bias or a LayerNorm parameter.
    assert decays == (leaf in ('kernel', 'embedding') and 'LayerNorm' not in name), name
  # Spot checks of the three kinds.
  assert names['embeddings/word_embeddings/embedding']
  assert names['discriminator/encoder/layer_1/attention/self/query/kernel']
  assert not names['embeddings/LayerNorm/scale']
  assert not names['generator/encoder/layer_0/output/LayerNorm/bias']
  assert not names['generator/generator_lm_head/bias']
  assert not names['discriminator/discriminator_predictions/dense_prediction/bias']


def _tiny_tree(r):
  return {'dense': {'kernel': r.normal(size=(2, 3)), 'bias': r.normal(size=(3,))},
          'LayerNorm': {'scale': 1 + r.normal(size=(3,)), 'bias': r.normal(size=(3,))},
          'word_embeddings': {'embedding': r.normal(size=(4, 2))}}


def _np_reference(params, grads_per_step, config, train_steps):
  """Plain numpy ELECTRA AdamWeightDecay: clip, m/v without bias correction, + wd * param, * -lr_t."""
  leaves, treedef = jax.tree.flatten(params)
  names = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(params)]
  decays = ['LayerNorm' not in n and 'bias' not in n for n in names]
  p = [np.array(x, np.float64) for x in leaves]
  m = [np.zeros_like(x) for x in p]
  v = [np.zeros_like(x) for x in p]
  for t, grads in enumerate(grads_per_step):
    g = [np.array(x, np.float64) for x in jax.tree.leaves(grads)]
    norm = np.sqrt(sum(np.sum(x ** 2) for x in g))
    g = [x * min(1.0, config.clip_norm / norm) for x in g]
    lr = config.learning_rate * min(1.0, t / config.warmup_steps) * (1 - t / train_steps)
    for i in range(len(p)):
      m[i] = config.b1 * m[i] + (1 - config.b1) * g[i]
      v[i] = config.b2 * v[i] + (1 - config.b2) * g[i] ** 2
      update = m[i] / (np.sqrt(v[i]) + config.eps) + (config.weight_decay * p[i] if decays[i] else 0)
      p[i] = p[i] - lr * update
  return jax.tree.unflatten(treedef, p), jax.tree.unflatten(treedef, m)


def _adam_state(opt_state):
  found = [s for s in jax.tree.leaves(opt_state, is_leaf=lambda s: isinstance(s, optimizer.ScaleByAdamState))
           if isinstance(s, optimizer.ScaleByAdamState)]
  assert len(found) == 1
  return found[0]


def test_flat_params_lay_out_the_model_in_a_few_vectors():
  """FlatParams: the weight matrices and tables (decay_mask's True) in one vector, biases and LayerNorm parameters
  in vectors of at most `chunk` elements (a larger leaf alone), each in tree order; unravel gives back every leaf
  exactly, and ravel_state ravels the optimiser's moments (subtrees shaped like the parameters) and nothing else."""
  abstract = _model_params(boxed=False)
  r = np.random.RandomState(0)
  params = jax.tree.map(lambda x: r.normal(size=x.shape).astype(np.float32), abstract)
  decays = jax.tree.leaves(optimizer.decay_mask(params))
  expected = {group: [x.ravel() for x, d in zip(jax.tree.leaves(params), decays) if d == decayed]
              for group, decayed in ((optimizer.DECAY, True), (optimizer.NO_DECAY, False))}
  # Biases and LayerNorm: per layer 4 attention biases, 2 FFN biases and 2 LayerNorms, 9H + F: the discriminator's
  # 2 x (9 x 32 + 64), the generator's 2 x (9 x 8 + 32); embeddings' LayerNorm 2 x 16; the generator's projection
  # 8, its head's dense and LayerNorm 3 x 16 and output bias 40 (vocab); the discriminator's projection 32, its
  # head's dense 32 and prediction 1. 50 leaves: the discriminator's 3 + 2 x 10, the embeddings' 2, the
  # generator's 1 + 2 x 10 + 4.
  no_decay = 2 * (9 * 32 + 64) + 2 * (9 * 8 + 32) + 32 + 8 + 48 + 40 + 32 + 33  # 1,105
  assert len(expected[optimizer.NO_DECAY]) == 50
  # A chunk of exactly them all holds them all; the tree's last leaf is the generator head's dense bias (16): one
  # element less and it starts a second vector; with 1 every leaf is a vector of its own.
  for chunk, sizes in ((optimizer.NO_DECAY_CHUNK, [no_decay]), (no_decay, [no_decay]),
                       (no_decay - 1, [no_decay - 16, 16]),
                       (1, [x.size for x in expected[optimizer.NO_DECAY]])):
    flat = optimizer.FlatParams(abstract, chunk=chunk)
    vectors = flat.ravel(params)
    assert [v.size for v in vectors[optimizer.NO_DECAY]] == sizes and len(vectors[optimizer.DECAY]) == 1
    for group, leaves in expected.items():
      np.testing.assert_array_equal(np.concatenate(vectors[group]), np.concatenate(leaves))
    jax.tree.map(np.testing.assert_array_equal, flat.unravel(vectors), params)
    state = optimizer.ScaleByAdamState(mu=params, nu=params), jnp.int32(3)
    raveled = flat.ravel_state(state)
    assert set(raveled[0].mu) == {optimizer.DECAY, optimizer.NO_DECAY} and int(raveled[1]) == 3
    jax.tree.map(np.testing.assert_array_equal, flat.unravel_state(raveled), state)


@pytest.mark.parametrize('flat', [False, True])  # the parameters as FlatParams' vectors: the same update
@pytest.mark.parametrize('grad_scale', [3.0, 0.05])  # global norm well above / below the clip norm 1
def test_update_matches_numpy_reference(grad_scale, flat):
  # Three steps: at t = 0 the warm-up makes the learning rate 0 (params unchanged, moments updated), then
  # t = 1, 2 with lr_t = 0.1 * min(1, t / 2) * (1 - t / 10) = 0.045, 0.08. Gradients mix large and small
  # entries so that eps = 1e-6 is not negligible against sqrt(v) after clipping (the update depends on the
  # clipping only through eps: m / sqrt(v) is scale-free).
  config = OptimizerConfig(learning_rate=0.1, warmup_steps=2, weight_decay=0.1, eps=1e-6, clip_norm=1.0)
  r = np.random.RandomState(0)
  params = jax.tree.map(lambda x: x.astype(np.float32), _tiny_tree(r))
  grads = []
  for _ in range(3):
    g = _tiny_tree(r)
    g['dense']['kernel'][0, 0] = 30.0  # dominates the norm
    g['dense']['bias'][:] = [1e-4, -2e-4, 3e-5]  # tiny entries: eps matters once clipped
    grads.append(jax.tree.map(lambda x: (grad_scale * x).astype(np.float32), g))
  expected_params, expected_mu = _np_reference(params, grads, config, train_steps=10)

  tx, _ = optimizer.make_optimizer(config, train_steps=10)
  # Chunks of 6: the LayerNorm's bias and scale (3 + 3) in one vector, the dense bias in another.
  layout = optimizer.FlatParams(params, chunk=6) if flat else None
  ravel = layout.ravel if flat else lambda tree: tree
  p = ravel(params)
  state = tx.init(p)
  update = jax.jit(tx.update)
  for step, g in enumerate(grads):
    updates, state = update(ravel(g), state, p)
    if step == 0:
      assert all(np.all(np.asarray(u) == 0) for u in jax.tree.leaves(updates))  # lr(0) = 0
    p = optax.apply_updates(p, updates)
  if flat:
    p, state = layout.unravel(p), layout.unravel_state(state)
  for got, want in zip(jax.tree.leaves(p), jax.tree.leaves(expected_params)):
    np.testing.assert_allclose(np.asarray(got), want, rtol=2e-5, atol=1e-6)
  for got, want in zip(jax.tree.leaves(_adam_state(state).mu), jax.tree.leaves(expected_mu)):
    np.testing.assert_allclose(np.asarray(got), want, rtol=2e-5, atol=1e-9)


def test_first_moment_after_one_step():
  # No bias correction: after one step m = 0.1 g and v = 0.001 g^2 exactly (with Adam's correction the
  # update would be m / (1 - 0.9) = g; ELECTRA's optimiser has none).
  config = OptimizerConfig(clip_norm=1e9)
  tx, _ = optimizer.make_optimizer(config, train_steps=10)
  params = {'w': {'kernel': jnp.ones((2, 2))}}
  g = {'w': {'kernel': jnp.array([[1.0, -2.0], [0.5, 4.0]])}}
  _, state = tx.update(g, tx.init(params), params)
  adam = _adam_state(state)
  np.testing.assert_allclose(adam.mu['w']['kernel'], 0.1 * g['w']['kernel'], rtol=1e-6)
  np.testing.assert_allclose(adam.nu['w']['kernel'], 0.001 * g['w']['kernel'] ** 2, rtol=1e-6)


@pytest.mark.parametrize('g, expected_mu', [
    # Global norm of (3, 4) and (12,) = sqrt(9 + 16 + 144) = 13 > 1: clipped to g / 13, m = 0.1 g / 13.
    (([3.0, 4.0], [12.0]), ([0.3 / 13, 0.4 / 13], [1.2 / 13])),
    # Global norm sqrt(0.09 + 0.16) = 0.5 < 1: left as is (never scaled up), m = 0.1 g.
    (([0.3, 0.4], [0.0]), ([0.03, 0.04], [0.0])),
])
@pytest.mark.parametrize('flat_norm', [False, True])
def test_global_norm_clipping(g, expected_mu, flat_norm):
  tx, _ = optimizer.make_optimizer(OptimizerConfig(clip_norm=1.0), train_steps=10, flat_norm=flat_norm)
  params = {'a': {'kernel': jnp.zeros(2)}, 'b': {'kernel': jnp.zeros(1)}}
  grads = {'a': {'kernel': jnp.array(g[0])}, 'b': {'kernel': jnp.array(g[1])}}
  state = tx.init(params)
  _, state = jax.jit(tx.update)(grads, state, params)
  mu = _adam_state(state).mu
  np.testing.assert_allclose(mu['a']['kernel'], expected_mu[0], rtol=1e-6)
  np.testing.assert_allclose(mu['b']['kernel'], expected_mu[1], rtol=1e-6)
  assert optimizer.global_norm(grads, flat_norm) == pytest.approx(np.linalg.norm(np.concatenate(g)), rel=1e-6)


def test_flat_norm_keeps_the_optimizer_state_and_takes_a_few_reductions():
  """The flat global norm: the same state (checkpoints do not change), one reduction over all leaves where the
  per-leaf norm reduces each leaf apart (a kernel each on a GPU), and the same norm of bf16 and f32 leaves."""
  params = {f'layer_{i}': {'kernel': jnp.full((3, 4), 0.5, jnp.bfloat16), 'bias': jnp.ones(4)} for i in range(5)}
  per_leaf, _ = optimizer.make_optimizer(OptimizerConfig(), train_steps=10)
  flat, _ = optimizer.make_optimizer(OptimizerConfig(), train_steps=10, flat_norm=True)
  assert jax.tree.structure(per_leaf.init(params)) == jax.tree.structure(flat.init(params))
  reductions = lambda flat_norm: str(jax.make_jaxpr(lambda t: optimizer.global_norm(t, flat_norm))(params)).count(
      'reduce_sum')
  assert reductions(False) == 10 and reductions(True) == 1
  # 5 x (12 x 0.25 + 4 x 1) = 35
  assert optimizer.global_norm(params, True) == pytest.approx(35 ** 0.5) == optimizer.global_norm(params, False)
