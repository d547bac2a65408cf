"""The ELECTRA model: tied embeddings, tower sizes, exact GELU, LayerNorm eps, init, padding and dropout."""

import dataclasses
import functools
import importlib
import math
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import erf

from electra_jax import config as config_lib
from electra_jax import model as model_lib
from electra_jax.config import ModelConfig

from helpers import B, E, H, L, P, V  # pylint: disable=g-bad-import-order
from helpers import MODEL_CONFIG as CONFIG, model_inputs as _inputs, random_model_params as _random_params


@functools.cache
def _model(config=CONFIG):
  return model_lib.Electra(config)


@functools.cache
def _forward(config=CONFIG):
  """jitted (params, ids, segments, mask, positions) -> (generator logits [B, P, V], disc logits [B, L])."""
  model = _model(config)
  return jax.jit(lambda p, *args: model.apply({'params': p}, *args, deterministic=True))


@pytest.fixture(scope='module')
def params():
  ids, segments, mask, positions = _inputs()
  boxed = jax.jit(_model().init)(jax.random.PRNGKey(0), ids, segments, mask, positions)['params']
  return nn.meta.unbox(boxed)


def _paths(tree):
  return {jax.tree_util.keystr(p, simple=True, separator='/'): v
          for p, v in jax.tree_util.tree_leaves_with_path(tree)}


# An independent float64 numpy ELECTRA, run one sequence at a time on its real tokens only (no padding).

def np_gelu(x):
  return 0.5 * x * (1 + erf(x / math.sqrt(2)))


def np_layer_norm(x, p, eps=1e-12):
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + eps) * p['scale'] + p['bias']


def np_dense(x, p):
  return x @ p['kernel'] + p['bias']


def np_softmax(x):
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def np_tower(params, tower, embedded, num_heads):
  """embedded [n, E] -> [n, H_tower]: optional projection, then post-LN Transformer layers."""
  p = params[tower]
  x = np_dense(embedded, p['embeddings_project']) if 'embeddings_project' in p else embedded
  n, hidden = x.shape
  d = hidden // num_heads
  for i in range(len(p['encoder'])):
    layer = p['encoder'][f'layer_{i}']
    att = layer['attention']
    q, k, v = (np_dense(x, att['self'][name]).reshape(n, num_heads, d).transpose(1, 0, 2)
               for name in ('query', 'key', 'value'))
    probs = np_softmax(q @ k.transpose(0, 2, 1) / math.sqrt(d))
    context = (probs @ v).transpose(1, 0, 2).reshape(n, hidden)
    h = np_layer_norm(np_dense(context, att['output']['dense']) + x, att['output']['LayerNorm'])
    inner = np_gelu(np_dense(h, layer['intermediate']['dense']))
    x = np_layer_norm(np_dense(inner, layer['output']['dense']) + h, layer['output']['LayerNorm'])
  return x


def np_electra(params, ids, segments, positions, config):
  """One unpadded sequence -> (generator logits at `positions` [P, V], discriminator logits [n]).

  config.tying: 'none' reads the generator's own embeddings (its head ties to its own table), 'all' runs the
  generator's head on the discriminator's encoder.
  """
  params = jax.tree.map(lambda a: np.asarray(a, np.float64), params)

  def embed(emb):
    x = (emb['word_embeddings']['embedding'][ids] + emb['position_embeddings']['embedding'][:len(ids)]
         + emb['token_type_embeddings']['embedding'][segments])
    return np_layer_norm(x, emb['LayerNorm'])
  gen_emb = params['generator']['embeddings'] if config.tying == 'none' else params['embeddings']
  gen_tower = 'discriminator' if config.tying == 'all' else 'generator'
  gen = np_tower(params, gen_tower, embed(gen_emb), config.tower(True).num_heads)[positions]
  head = params['generator']['generator_predictions']
  gen = np_layer_norm(np_gelu(np_dense(gen, head['dense'])), head['LayerNorm'])
  gen_logits = gen @ gen_emb['word_embeddings']['embedding'].T + params['generator']['generator_lm_head']['bias']
  disc = np_tower(params, 'discriminator', embed(params['embeddings']), config.tower(False).num_heads)
  head = params['discriminator']['discriminator_predictions']
  disc_logits = np_dense(np_gelu(np_dense(disc, head['dense'])), head['dense_prediction'])[:, 0]
  return gen_logits, disc_logits


@pytest.mark.slow
@pytest.mark.parametrize('embedding_size, fraction, tying', [
    (16, 0.5, 'embeddings'), (32, 0.5, 'embeddings'),
    (16, 0.25, 'none'),  # the generator's own tables are 8 wide (its hidden size), the shared ones 16
    (16, 1.0, 'all'),  # one encoder, with its 16 -> 32 projection, run by both heads
])
def test_matches_numpy_reference(embedding_size, fraction, tying):
  """Both towers equal the numpy ELECTRA; padded rows equal the reference run on their real tokens alone."""
  config = ModelConfig(vocab_size=V, embedding_size=embedding_size, hidden_size=H, num_layers=2, num_heads=2,
                       intermediate_size=64, generator_hidden_fraction=fraction, max_position_embeddings=32,
                       tying=tying)
  params = _random_params(config, seed=1)
  ids, segments, mask, positions = _inputs(lengths=(16, 11))
  gen_logits, disc_logits = map(np.asarray, _forward(config)(params, ids, segments, mask, positions))
  for row, n in enumerate((16, 11)):
    ref_gen, ref_disc = np_electra(params, ids[row, :n], segments[row, :n], positions[row], config)
    np.testing.assert_allclose(disc_logits[row, :n], ref_disc, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(gen_logits[row], ref_gen, rtol=1e-4, atol=1e-4)


def test_scanned_layers_are_the_unrolled_stack():
  """model.scan_layers: the layers' parameters stacked [num_layers, ...] under encoder/layers and run by one
  nn.scan give the numpy reference's logits; unstack_layers turns them into the unrolled tree, leaf for leaf."""
  config = dataclasses.replace(CONFIG, scan_layers=True)
  stacked = _random_params(config, seed=2)
  assert stacked['discriminator']['encoder']['layers']['attention']['self']['query']['kernel'].shape == (2, H, H)
  unrolled = model_lib.unstack_layers(stacked)
  shapes = lambda tree: {path: leaf.shape for path, leaf in _paths(tree).items()}
  assert shapes(unrolled) == shapes(_random_params(CONFIG))
  np.testing.assert_array_equal(unrolled['generator']['encoder']['layer_1']['output']['dense']['kernel'],
                                stacked['generator']['encoder']['layers']['output']['dense']['kernel'][1])
  ids, segments, mask, positions = _inputs(lengths=(16, 11))
  gen_logits, disc_logits = map(np.asarray, _forward(config)(stacked, ids, segments, mask, positions))
  for row, n in enumerate((16, 11)):
    ref_gen, ref_disc = np_electra(unrolled, ids[row, :n], segments[row, :n], positions[row], CONFIG)
    np.testing.assert_allclose(disc_logits[row, :n], ref_disc, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(gen_logits[row], ref_gen, rtol=1e-4, atol=1e-4)


def _shapes(config, **fields):
  ids, segments, mask, positions = _inputs()
  shapes = jax.eval_shape(model_lib.Electra(config, **fields).init, jax.random.PRNGKey(0), ids, segments, mask,
                          positions)['params']
  return {name: s.shape for name, s in _paths(nn.meta.unbox(shapes)).items()}


def test_tying_parameter_trees():
  """'embeddings' is the default tree; 'none' adds the generator's own embeddings; 'all' leaves one encoder."""
  same_size = dict(vocab_size=V, embedding_size=E, hidden_size=H, num_layers=2, num_heads=2, intermediate_size=128,
                   generator_hidden_fraction=1.0, max_position_embeddings=32)
  quarter = {**same_size, 'generator_hidden_fraction': 0.25}
  assert ModelConfig().tying == 'embeddings'  # the tree the other tests, checkpoints and convert.py know

  tied, untied = (_shapes(ModelConfig(**quarter, tying=t)) for t in ('embeddings', 'none'))
  own = {n: s for n, s in untied.items() if n.startswith('generator/embeddings/')}
  # Its own tables are as wide as the generator (H / 4 = 8, official `untied_generator_embeddings`), so it needs
  # no embeddings_project; the rest of the tree is the tied one.
  assert own == {'generator/embeddings/word_embeddings/embedding': (V, 8),
                 'generator/embeddings/position_embeddings/embedding': (32, 8),
                 'generator/embeddings/token_type_embeddings/embedding': (2, 8),
                 'generator/embeddings/LayerNorm/scale': (8,), 'generator/embeddings/LayerNorm/bias': (8,)}
  assert tied['generator/embeddings_project/kernel'] == (E, 8)
  assert untied['generator/generator_predictions/dense/kernel'] == (8, 8)  # its head maps to its own width
  assert ({n: s for n, s in untied.items() if n not in own and 'generator_predictions' not in n}
          == {n: s for n, s in tied.items() if 'generator/embeddings_project' not in n
              and 'generator_predictions' not in n})

  # 'all' against the same-size generator tied by its embeddings: the generator's encoder and projection go.
  embeddings_only, everything = (_shapes(ModelConfig(**same_size, tying=t)) for t in ('embeddings', 'all'))
  gone = {n: s for n, s in embeddings_only.items() if n not in everything}
  assert everything.keys() <= embeddings_only.keys()
  assert {n.split('/')[1] for n in gone} == {'encoder', 'embeddings_project'}
  assert all(n.startswith('generator/') for n in gone)
  assert sorted({n.split('/')[1] for n in everything if n.startswith('generator/')}) == [
      'generator_lm_head', 'generator_predictions']
  assert sorted({n.split('/')[0] for n in everything if '/encoder/' in n}) == ['discriminator']
  count = lambda shapes: sum(math.prod(s) for s in shapes.values())
  # A same-size generator (FFN 4 H = 128, as the discriminator here): exactly one encoder (and projection) less.
  disc_encoder = count({n: s for n, s in everything.items() if n.startswith('discriminator/encoder/')})
  disc_project = count({n: s for n, s in everything.items() if n.startswith('discriminator/embeddings_project/')})
  assert count(everything) == count(embeddings_only) - disc_encoder - disc_project


def test_tying_decides_what_each_tower_reads():
  """'none': the generator reads only its own embeddings and the discriminator only the top-level ones; 'all':
  the discriminator's encoder changes the generator's logits."""
  ids, segments, mask, positions = _inputs()
  changed = lambda a, b: np.max(np.abs(np.asarray(a) - np.asarray(b))) > 1e-4
  for tying, fraction in (('none', 0.5), ('all', 1.0)):
    config = ModelConfig(vocab_size=V, embedding_size=E, hidden_size=H, num_layers=1, num_heads=2,
                         intermediate_size=64, generator_hidden_fraction=fraction, max_position_embeddings=32,
                         tying=tying)
    params = _random_params(config, seed=4)
    forward = lambda p, config=config: _forward(config)(p, ids, segments, mask, positions)
    gen, disc = forward(params)
    if tying == 'none':
      gen_e, disc_e = forward(_perturb(params, ('embeddings',)))
      assert changed(disc, disc_e)
      np.testing.assert_array_equal(gen, gen_e)
      gen_g, disc_g = forward(_perturb(params, ('generator', 'embeddings')))
      assert changed(gen, gen_g)
      np.testing.assert_array_equal(disc, disc_g)
    else:
      gen_d, disc_d = forward(_perturb(params, ('discriminator', 'encoder')))
      assert changed(gen, gen_d) and changed(disc, disc_d)
      gen_h, disc_h = forward(_perturb(params, ('discriminator', 'discriminator_predictions')))
      np.testing.assert_array_equal(gen, gen_h)
      assert changed(disc, disc_h)


@pytest.mark.parametrize('fraction, layers', [(0.5, 1.0), (1.0, 0.5)])
def test_tying_all_needs_a_same_size_generator(fraction, layers):
  with pytest.raises(config_lib.ConfigError, match='generator_hidden_fraction=1'):
    ModelConfig(hidden_size=H, num_heads=2, generator_hidden_fraction=fraction, generator_layers_fraction=layers,
                tying='all')
  with pytest.raises(config_lib.ConfigError, match="'embeddings', 'none', 'all'"):
    ModelConfig(tying='generator')


@pytest.mark.slow
def test_one_shared_word_embedding_table(params):
  flat = _paths(params)
  tables = [name for name, value in flat.items() if value.ndim == 2 and V in value.shape]
  assert tables == ['embeddings/word_embeddings/embedding']
  assert flat['embeddings/word_embeddings/embedding'].shape == (V, E)
  # The only other vocab-sized parameter is the generator's output bias.
  assert [n for n, v in flat.items() if v.shape == (V,)] == ['generator/generator_lm_head/bias']
  # Position and token-type tables and the embedding LayerNorm exist once, shared too.
  assert sorted(params) == ['discriminator', 'embeddings', 'generator']
  assert not any('position_embeddings' in n or 'token_type' in n for n in flat if not n.startswith('embeddings/'))


def _perturb(params, path, seed=0):
  """A copy of params with the subtree at `path` (a tuple of keys) shifted by noise."""
  r = np.random.RandomState(seed)
  def shift(p, x):
    keys = tuple(k.key for k in p)
    if keys[:len(path)] == path:
      return x + 0.05 * r.normal(size=x.shape).astype(np.float32)
    return x
  return jax.tree_util.tree_map_with_path(shift, params)


def test_both_towers_read_the_tied_table(params):
  ids, segments, mask, positions = _inputs()
  forward = lambda p: tuple(map(np.asarray, _forward()(p, ids, segments, mask, positions)))
  gen, disc = forward(params)
  changed = lambda a, b: np.max(np.abs(a - b)) > 1e-4
  gen_t, disc_t = forward(_perturb(params, ('embeddings', 'word_embeddings')))
  assert changed(gen, gen_t) and changed(disc, disc_t)
  # The towers are otherwise independent: each tower's own parameters change only its output.
  gen_g, disc_g = forward(_perturb(params, ('generator',)))
  assert changed(gen, gen_g)
  np.testing.assert_array_equal(disc, disc_g)
  gen_d, disc_d = forward(_perturb(params, ('discriminator',)))
  assert changed(disc, disc_d)
  np.testing.assert_array_equal(gen, gen_d)


@pytest.mark.slow
def test_generator_logits_from_intermediate_values():
  """MLM logits = LayerNorm(gelu(dense(h))) @ word_embeddings.T + bias, at the selected positions only."""
  params = _random_params(CONFIG, seed=2)
  ids, segments, mask, positions = _inputs()
  model = _model()

  def hidden_fn(m, ids, segments, mask):
    return m.generator(m.embeddings(ids, segments, deterministic=True), mask, deterministic=True)
  hidden = np.asarray(model.apply({'params': params}, ids, segments, mask, method=hidden_fn), np.float64)
  logits, _ = _forward()(params, ids, segments, mask, positions)
  head = jax.tree.map(lambda a: np.asarray(a, np.float64), params['generator'])
  table = np.asarray(params['embeddings']['word_embeddings']['embedding'], np.float64)
  h = hidden[np.arange(B)[:, None], positions]  # [B, P, H_gen]
  x = np_dense(h, head['generator_predictions']['dense'])
  x = 0.5 * x * (1 + erf(x / math.sqrt(2)))  # exact GELU
  mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
  x = (x - mean) / np.sqrt(var + 1e-12) * head['generator_predictions']['LayerNorm']['scale'] + (
      head['generator_predictions']['LayerNorm']['bias'])
  expected = x @ table.T + head['generator_lm_head']['bias']
  assert logits.shape == (B, P, V) and logits.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(logits), expected, rtol=1e-5, atol=1e-5)


def test_discriminator_logits_from_intermediate_values():
  """Discriminator head: dense(H) -> exact GELU -> dense(1) on the encoder output."""
  params = _random_params(CONFIG, seed=3)
  ids, segments, mask, positions = _inputs()
  hidden = np.asarray(_model().apply({'params': params}, ids, segments, mask, method='encode'), np.float64)
  assert hidden.shape == (B, L, H)
  _, logits = _forward()(params, ids, segments, mask, positions)
  head = jax.tree.map(lambda a: np.asarray(a, np.float64), params['discriminator']['discriminator_predictions'])
  x = np_dense(hidden, head['dense'])
  expected = np_dense(0.5 * x * (1 + erf(x / math.sqrt(2))), head['dense_prediction'])[..., 0]
  np.testing.assert_allclose(np.asarray(logits), expected, rtol=1e-5, atol=1e-5)


def test_gelu_is_exact_erf():
  # The tanh approximation differs from the erf GELU by up to 4.7e-4 (at x = -2.7: -0.009386 vs -0.008912);
  # a 1e-6 tolerance separates them.
  x = np.linspace(-4, 4, 81, dtype=np.float32)
  exact = 0.5 * x.astype(np.float64) * (1 + erf(x / math.sqrt(2)))
  np.testing.assert_allclose(np.asarray(model_lib.gelu(x)), exact, atol=1e-6)
  assert np.max(np.abs(np.asarray(nn.gelu(x, approximate=True)) - exact)) > 1e-4


def test_every_layer_norm_has_eps_1e_12():
  """Records the epsilon of every LayerNorm the model calls, and counts them."""
  seen = []

  def record(next_fun, args, kwargs, context):
    if isinstance(context.module, nn.LayerNorm) and context.method_name == '__call__':
      seen.append(context.module.epsilon)
    return next_fun(*args, **kwargs)
  ids, segments, mask, positions = _inputs()
  with nn.intercept_methods(record):
    jax.eval_shape(_model().init, jax.random.PRNGKey(0), ids, segments, mask, positions)
  # embeddings: once per tower call (2) + 2 per layer x 2 layers x 2 towers (8) + generator head (1) = 11
  assert len(seen) == 11
  assert set(seen) == {1e-12}


def test_layer_norm_eps_behaviour():
  # Word embedding row = 1e-4 * (+1, -1, ...), position/type tables 0: the pre-LN vector has variance 1e-8.
  # With eps 1e-12 the LayerNorm output is ~(+1, -1, ...) (error ~ eps/var/2 = 5e-5); with BERT's 1e-5 it
  # would be 1e-4 / sqrt(1e-5) = 0.032.
  embeddings = model_lib.Embeddings(CONFIG)
  ids = jnp.array([[7]], jnp.int32)
  shapes = nn.meta.unbox(jax.eval_shape(functools.partial(embeddings.init, deterministic=True),
                                           jax.random.PRNGKey(0), ids, ids))
  p = jax.tree.map(lambda s: np.zeros(s.shape, np.float32), shapes)['params']
  pattern = np.tile([1.0, -1.0], E // 2).astype(np.float32)
  p['word_embeddings']['embedding'][7] = 1e-4 * pattern
  p['LayerNorm']['scale'][:] = 1.0
  out = embeddings.apply({'params': p}, ids, jnp.zeros_like(ids), deterministic=True)
  np.testing.assert_allclose(np.asarray(out)[0, 0], pattern, atol=1e-3)


# The layers official ELECTRA builds with tf.layers.dense's default kernel initialiser (glorot_uniform).
GLOROT = ('embeddings_project/kernel', 'discriminator_predictions/dense_prediction/kernel')


def test_initialisation(params):
  # Kernels and embedding tables but GLOROT's: truncated normal with stddev 0.02, cut at 2 stddev (as TF's
  # truncated_normal_initializer): every |w| <= 0.04 and the std is 0.02 * 0.8796 = 0.01759 (the std of a
  # standard normal truncated to [-2, 2] is sqrt(1 - 4 phi(2) / (2 Phi(2) - 1)) = 0.8796).
  # With n ~ 2e4 values the sample std's relative sd is 1/sqrt(2n) = 0.5%; tolerance 3% (6 sd).
  # Biases 0, LayerNorm scale 1.
  flat = _paths(params)
  weights = [v for n, v in flat.items() if n.endswith(('kernel', 'embedding')) and not n.endswith(GLOROT)]
  values = np.concatenate([np.ravel(v) for v in weights])
  assert values.size > 15000
  assert np.max(np.abs(values)) <= 0.04 + 1e-7
  np.testing.assert_allclose(np.std(values), 0.02 * 0.8796, rtol=0.03)
  assert abs(np.mean(values)) < 5 * 0.0176 / math.sqrt(values.size)
  for name, value in flat.items():
    if name.endswith('bias'):
      np.testing.assert_array_equal(value, 0, err_msg=name)
    elif name.endswith('scale'):
      np.testing.assert_array_equal(value, 1, err_msg=name)
    else:
      assert name.endswith(('kernel', 'embedding')), name


def test_official_glorot_layers(params):
  # glorot_uniform draws U(-a, a), a = sqrt(6 / (fan_in + fan_out)), std a / sqrt(3) = sqrt(2 / (fan_in + fan_out)).
  # CONFIG: the discriminator's embeddings_project is [E=16, H=32]: a = sqrt(6/48) = 0.35355, std 0.20412;
  # dense_prediction (official dense_1) is [H=32, 1]: a = sqrt(6/33) = 0.42640, std 0.24618 (the generator,
  # 16 = E wide, has no projection). Against truncated_normal(0.02), std 0.0176 and |w| <= 0.04.
  flat = _paths(params)
  glorot = {n: v for n, v in flat.items() if n.endswith(GLOROT)}
  assert sorted(glorot) == ['discriminator/discriminator_predictions/dense_prediction/kernel',
                            'discriminator/embeddings_project/kernel']
  limits = {'discriminator/embeddings_project/kernel': (0.35355, 0.20412),
            'discriminator/discriminator_predictions/dense_prediction/kernel': (0.42640, 0.24618)}
  scaled = []
  for name, (limit, std) in limits.items():
    value = np.ravel(glorot[name])
    np.testing.assert_allclose(limit / math.sqrt(3), std, rtol=1e-4)
    assert np.max(np.abs(value)) <= limit, name
    assert np.max(np.abs(value)) > limit / 2, name  # 32 draws all under a/2: probability 2^-32
    scaled.append(value / limit)
  # value / a is U(-1, 1), std 1/sqrt(3) = 0.57735. For n = 544 uniform draws the sample std's relative sd is
  # sqrt((kurtosis - 1) / (4n)) = sqrt(0.8 / 2176) = 1.9%; tolerance 8% (4 sd).
  np.testing.assert_allclose(np.std(np.concatenate(scaled)), 0.57735, rtol=0.08)
  np.testing.assert_allclose(np.std(np.ravel(glorot['discriminator/embeddings_project/kernel'])), 0.20412, rtol=0.08)


@pytest.mark.parametrize('embedding_size, fraction, gen_project, disc_project', [
    (16, 0.5, False, True),  # generator 16 = E, discriminator 32 != E
    (32, 0.5, True, False),  # generator 16 != E, discriminator 32 = E
    (32, 1.0, False, False),  # both 32 = E
    (8, 0.25, False, True),  # generator 8 = E
])
def test_embeddings_project_iff_sizes_differ(embedding_size, fraction, gen_project, disc_project):
  config = ModelConfig(vocab_size=V, embedding_size=embedding_size, hidden_size=H, num_layers=1, num_heads=2,
                       intermediate_size=64, generator_hidden_fraction=fraction)
  ids, segments, mask, positions = _inputs()
  shapes = nn.meta.unbox(jax.eval_shape(model_lib.Electra(config).init, jax.random.PRNGKey(0), ids, segments,
                                        mask, positions)['params'])
  assert ('embeddings_project' in shapes['generator']) == gen_project
  assert ('embeddings_project' in shapes['discriminator']) == disc_project
  for tower, on in (('generator', gen_project), ('discriminator', disc_project)):
    if on:
      hidden = int(H * fraction) if tower == 'generator' else H
      assert shapes[tower]['embeddings_project']['kernel'].shape == (embedding_size, hidden)
  assert shapes['embeddings']['word_embeddings']['embedding'].shape == (V, embedding_size)


@pytest.mark.parametrize('name, disc, gen', [
    # (hidden, layers, heads, FFN) from the paper's table; generator = hidden x fraction, heads = hidden // 64
    # (at least 1), FFN = 4 x hidden, the same depth.
    ('small', (256, 12, 4, 1024), (64, 12, 1, 256)),  # 256 / 4
    ('base', (768, 12, 12, 3072), (256, 12, 4, 1024)),  # 768 / 3
    ('large', (1024, 24, 16, 4096), (256, 24, 4, 1024)),  # 1024 / 4
])
def test_tower_sizes(name, disc, gen):
  model_config = config_lib.load(importlib.import_module(f'configs.{name}').get_config(), vocab_size=30522).model
  sizes = lambda t: (t.hidden_size, t.num_layers, t.num_heads, t.intermediate_size)
  assert sizes(model_config.tower(False)) == disc
  assert sizes(model_config.tower(True)) == gen


@pytest.mark.slow
def test_small_generator_parameter_shapes():
  """ELECTRA-Small's generator really is 64 wide with a 256 FFN (E = 128, so it projects 128 -> 64)."""
  config = ModelConfig(vocab_size=V, embedding_size=128, hidden_size=256, num_layers=12, num_heads=4,
                       intermediate_size=1024, generator_hidden_fraction=0.25)
  ids = jnp.zeros((1, 8), jnp.int32)
  shapes = _paths(nn.meta.unbox(jax.eval_shape(model_lib.Electra(config).init, jax.random.PRNGKey(0), ids, ids,
                                               ids, ids[:, :2])['params']))
  g = 'generator/encoder/layer_0/'
  assert shapes['generator/embeddings_project/kernel'].shape == (128, 64)
  assert shapes[g + 'attention/self/query/kernel'].shape == (64, 64)
  assert shapes[g + 'intermediate/dense/kernel'].shape == (64, 256)
  assert shapes['generator/generator_predictions/dense/kernel'].shape == (64, 128)
  assert shapes['discriminator/encoder/layer_0/intermediate/dense/kernel'].shape == (256, 1024)
  layers = {n.split('/')[2] for n in shapes if n.startswith(('generator/encoder', 'discriminator/encoder'))}
  assert layers == {f'layer_{i}' for i in range(12)}


def test_padding_does_not_change_real_positions(params):
  """Garbage token and segment ids under the padding mask change nothing at the real positions."""
  ids, segments, mask, positions = _inputs(lengths=(16, 9))
  r = np.random.RandomState(5)
  noisy_ids = np.where(mask > 0, ids, r.randint(0, V, ids.shape)).astype(np.int32)
  noisy_segments = np.where(mask > 0, segments, 1).astype(np.int32)
  positions[1] = [1, 3, 7]
  gen, disc = _forward()(params, ids, segments, mask, positions)
  gen_n, disc_n = _forward()(params, noisy_ids, noisy_segments, mask, positions)
  np.testing.assert_allclose(np.asarray(disc_n)[:, :9], np.asarray(disc)[:, :9], atol=1e-6)
  np.testing.assert_allclose(np.asarray(disc_n)[0], np.asarray(disc)[0], atol=1e-6)
  np.testing.assert_allclose(np.asarray(gen_n), np.asarray(gen), atol=1e-6)
  assert np.max(np.abs(np.asarray(disc_n)[1, 9:] - np.asarray(disc)[1, 9:])) > 1e-4  # padded slots did change


@pytest.mark.slow
def test_dropout_only_when_not_deterministic(params):
  ids, segments, mask, _ = _inputs()
  model = _model()

  @functools.partial(jax.jit, static_argnames='deterministic')
  def disc(rng, deterministic):
    return model.apply({'params': params}, ids, segments, mask, deterministic=deterministic,
                       method='discriminator_logits', rngs={'dropout': rng})
  off_a, off_b = disc(jax.random.PRNGKey(0), True), disc(jax.random.PRNGKey(1), True)
  np.testing.assert_array_equal(off_a, off_b)
  _, plain = _forward()(params, ids, segments, mask, np.zeros((B, P), np.int32))
  np.testing.assert_allclose(off_a, plain, atol=1e-6)
  on_a, on_b = disc(jax.random.PRNGKey(0), False), disc(jax.random.PRNGKey(1), False)
  assert np.max(np.abs(on_a - on_b)) > 1e-4
  assert np.max(np.abs(on_a - off_a)) > 1e-4
  np.testing.assert_array_equal(on_a, disc(jax.random.PRNGKey(0), False))


@pytest.mark.parametrize('draw, drop', [('uniform', 0.1), ('bits16', 6554 / 65536)])
def test_dropout_rate_rows_and_odd_lengths(draw, drop):
  """model.dropout_draw='uniform' drops with probability 0.1; 'bits16' keeps an element iff its 16 random bits are
  >= round(0.1 * 2^16) = 6554, a drop probability of 6554 / 65536 = 0.1000061. Either way a row's mask depends on
  its index alone (not on the rows beside it), and an odd length (bits16: one 32-bit draw serves two positions) is
  cut to size."""
  dropout = model_lib.Dropout(0.1, draw)
  keep = lambda shape, rows: dropout.apply({}, shape, jnp.asarray(rows), method='keep',
                                           rngs={'dropout': jax.random.PRNGKey(0)})
  mask = np.asarray(keep((64 * 127, 64), np.arange(64)))  # 64 rows of [127, 64]: 520,192 draws
  assert mask.shape == (64 * 127, 64) and mask.dtype == np.bool_
  # Binomial standard deviation sqrt(n p (1 - p)) / n = 4.2e-4: the mean is within 5 of them of the drop probability.
  assert abs((1 - mask.mean()) - drop) < 5 * 4.2e-4
  # Rows 5 and 9, asked for alone (a micro-batch), drop exactly what they drop in the whole batch.
  alone = np.asarray(keep((2 * 127, 64), [5, 9]))
  np.testing.assert_array_equal(alone[:127], mask[5 * 127:6 * 127])
  np.testing.assert_array_equal(alone[127:], mask[9 * 127:10 * 127])
  assert not np.array_equal(mask[:127], mask[127:254])  # and rows differ from one another


def test_rbg_dropout_draws_the_same_mask_on_any_mesh():
  """model.dropout_draw='rbg' (the GPU's): one RngBitGenerator draw per micro-batch, keyed by its first row. It drops
  with probability 0.1; the batch split over 8 devices draws the same mask as on one; a micro-batch from row 5 on
  draws another, and a second key other masks."""
  dropout = model_lib.Dropout(0.1, 'rbg')

  def keep(rows, key=0, sharding=None):
    fn = lambda r: dropout.apply({}, (r.shape[0] * 127, 64), r, method='keep',
                                 rngs={'dropout': jax.random.PRNGKey(key)})
    return np.asarray(jax.jit(fn, out_shardings=sharding)(jnp.asarray(rows)))

  mask = keep(np.arange(64))  # 64 rows of [127, 64]: 520,192 draws
  assert mask.shape == (64 * 127, 64) and mask.dtype == np.bool_
  assert abs((1 - mask.mean()) - 0.1) < 5 * 4.2e-4  # within 5 binomial standard deviations
  mesh = jax.make_mesh((8,), ('data',))
  sharded = keep(np.arange(64), sharding=jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec('data')))
  np.testing.assert_array_equal(sharded, mask)
  assert not np.array_equal(keep(np.arange(5, 69))[:127], mask[5 * 127:6 * 127])
  assert np.mean(keep(np.arange(64), key=1) != mask) > 0.1  # independent masks differ at 2 p (1 - p) = 18%


def test_rbg_tower_draws_an_encoders_output_masks_at_once():
  """model.dropout_draw='rbg_tower': an encoder draws the masks of all its layers' output dropouts in one
  RngBitGenerator draw (Encoder.tower_keep): [layers, 2, tokens, hidden], drops with probability 0.1, masks that
  differ from one another, the same on any mesh. The discriminator then draws as often whatever its depth, where
  'rbg' draws twice more for each layer."""
  c = ModelConfig(vocab_size=50, embedding_size=16, hidden_size=64, num_layers=3, num_heads=2, intermediate_size=32,
                  attention_dropout_rate=0.0, dropout_draw='rbg_tower')  # (attention dropout: a draw per layer)
  encoder = model_lib.Encoder(c, c.tower(False))

  def keep(rows, sharding=None):
    fn = lambda r: encoder.apply({}, (r.shape[0] * 127, 64), r, False, method='tower_keep',
                                 rngs=model_lib.dropout_rngs({'dropout': jax.random.PRNGKey(0)}, 'rbg_tower'))
    return np.asarray(jax.jit(fn, out_shardings=sharding)(jnp.asarray(rows)))

  masks = keep(np.arange(64))
  assert masks.shape == (3, 2, 64 * 127, 64) and masks.dtype == np.bool_
  # 6 masks of 520,192 draws: each within 5 binomial standard deviations (4.2e-4) of the drop probability.
  assert all(abs((1 - m.mean()) - 0.1) < 5 * 4.2e-4 for m in masks.reshape(6, -1))
  assert all(np.mean(masks.reshape(6, -1)[i] != masks.reshape(6, -1)[j]) > 0.1 for i in range(6) for j in range(i))
  mesh = jax.make_mesh((8,), ('data',))
  np.testing.assert_array_equal(keep(np.arange(64), jax.sharding.NamedSharding(
      mesh, jax.sharding.PartitionSpec(None, None, 'data'))), masks)
  assert encoder.apply({}, (8, 64), jnp.arange(8), True, method='tower_keep') is None  # deterministic: no masks

  def draws(draw, layers):
    config = dataclasses.replace(c, num_layers=layers, dropout_draw=draw)
    model, ids = model_lib.Electra(config), jnp.ones((2, 8), jnp.int32)
    params = model.init(jax.random.PRNGKey(0), ids, ids, ids, method='discriminator_logits')
    fn = lambda p: model.apply(p, ids, ids, ids, deterministic=False, method='discriminator_logits',
                               rngs=model_lib.dropout_rngs({'dropout': jax.random.PRNGKey(1)}, draw))
    return jax.jit(fn).lower(params).as_text().count('rng_bit_generator')
  assert draws('rbg_tower', 1) == draws('rbg_tower', 3) < draws('rbg', 1) < draws('rbg', 3)


def test_fused_qkv_is_the_same_model(params):
  """model.fused_qkv: the query, key and value projections as one matmul over their stacked kernels. The parameters
  are the same (paths, shapes, initial values: checkpoints and conversions do not change), and so are both towers'
  logits and the gradients, to float32 rounding."""
  fused = dataclasses.replace(CONFIG, fused_qkv=True)
  inputs = _inputs()
  boxed = jax.jit(_model(fused).init)(jax.random.PRNGKey(0), *inputs)['params']
  jax.tree.map(np.testing.assert_array_equal, nn.meta.unbox(boxed), params)
  for a, b in zip(_forward(fused)(params, *inputs), _forward()(params, *inputs)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)

  def grads(config):
    loss = lambda p: sum(jnp.sum(jnp.sin(out)) for out in _forward(config)(p, *inputs))
    return jax.grad(loss)(params)
  jax.tree.map(functools.partial(np.testing.assert_allclose, rtol=1e-4, atol=1e-6), grads(fused), grads(CONFIG))
  hlo = lambda config: _forward(config).lower(params, *inputs).as_text()
  # Each layer's three projections in one dot_general: 2 towers x 2 layers x 2 fewer.
  assert hlo(fused).count('stablehlo.dot_general') == hlo(CONFIG).count('stablehlo.dot_general') - 8


def test_rbg_dropout_keys_need_no_threefry():
  """Under model.dropout_draw='rbg' the dropout key (model_lib.dropout_rngs) is an unsafe_rbg key: what each Dropout
  module derives from it (make_rng, fold_in by row) and draws is RngBitGenerator, no threefry (on a GPU each is a
  custom call that splits XLA's CUDA graph). The model's forward pass with a threefry dropout key has them."""
  c = ModelConfig(vocab_size=50, embedding_size=16, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=32,
                  dropout_draw='rbg')
  model = model_lib.Electra(c)
  ids = jnp.ones((2, 8), jnp.int32)
  params = model.init(jax.random.PRNGKey(0), ids, ids, ids, method='discriminator_logits')

  def lowered(rngs):
    fn = lambda p: model.apply(p, ids, ids, ids, deterministic=False, method='discriminator_logits', rngs=rngs)
    return jax.jit(fn).lower(params).as_text()
  key = jax.random.PRNGKey(1)
  converted = lowered(model_lib.dropout_rngs({'dropout': key}, 'rbg'))
  assert 'threefry' not in converted and 'rng_bit_generator' in converted
  assert 'threefry' in lowered({'dropout': key})  # make_rng of a threefry key: threefry in every module
  assert model_lib.dropout_rngs({'dropout': key}, 'uniform') == {'dropout': key}  # CPU and TPU: as they were
  rbg = model_lib.rbg_key(key)
  assert model_lib.rbg_key(rbg) is rbg and jax.random.key_data(rbg).tolist() == [*key.tolist(), *key.tolist()]


def test_tied_logits_backward_runs_in_the_inputs_dtype():
  """model.tied_logits: float32 logits from the embedding table; its backward pass takes the logits' gradient in the
  inputs' dtype. In float32 that is autodiff's gradient; in bfloat16 both matmuls of the backward pass take bf16
  operands (autodiff's are float32: dot_generals over the whole vocabulary in float32), and their gradients stay
  within bf16 rounding of the float32 ones."""
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 3, 8))
  table = jax.random.normal(jax.random.PRNGKey(1), (50, 8))
  weights = jax.random.normal(jax.random.PRNGKey(2), (2, 3, 50))
  loss = lambda logits_fn: jax.grad(lambda a, b: jnp.sum(jnp.sin(logits_fn(a, b)) * weights), argnums=(0, 1))
  einsum = lambda a, b: jnp.einsum('bpe,ve->bpv', a, b, preferred_element_type=jnp.float32)
  for ours, autodiff in zip(loss(model_lib.tied_logits)(x, table), loss(einsum)(x, table)):
    np.testing.assert_allclose(ours, autodiff, rtol=1e-6, atol=1e-6)
  half = (x.astype(jnp.bfloat16), table.astype(jnp.bfloat16))
  dots = lambda fn: re.findall(r'stablehlo.dot_general.*\) -> ', jax.jit(loss(fn)).lower(*half).as_text())
  assert all(d.count('bf16') == 2 for d in dots(model_lib.tied_logits)[1:])  # backward: bf16 operands
  assert any('f32' in d.split('->')[0] for d in dots(einsum))  # autodiff's: a float32 operand
  for ours, exact in zip(loss(model_lib.tied_logits)(*half), loss(einsum)(x, table)):
    assert ours.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(ours, np.float32), exact, rtol=0.05, atol=0.05)


@pytest.mark.parametrize('glorot', [False, True])
def test_dense_is_flax_dense_with_its_bias_added_in_float32(glorot):
  """model.dense: nn.Dense's parameters (names, shapes, initial values from the same key), its float32 outputs and
  gradients exactly; under bfloat16 the bias is added in float32 and the sum rounded once (model.add_bias)."""
  init = model_lib._glorot(('embed', 'mlp')) if glorot else model_lib._init(CONFIG, ('embed', 'mlp'))  # pylint: disable=protected-access
  theirs = nn.Dense(16, kernel_init=init, bias_init=model_lib._zeros(('mlp',)))  # pylint: disable=protected-access
  ours = model_lib.dense(16, CONFIG, ('embed', 'mlp'), None, glorot=glorot)
  x = jax.random.normal(jax.random.PRNGKey(0), (6, 8))
  params = ours.init(jax.random.PRNGKey(1), x)
  jax.tree.map(np.testing.assert_array_equal, params, theirs.init(jax.random.PRNGKey(1), x))
  params = jax.tree.map(lambda p: p + jax.random.normal(jax.random.PRNGKey(2), p.shape) / 3, params)  # bias not 0
  loss = lambda module: lambda p, x: jnp.sum(jnp.sin(module.apply(p, x)))
  np.testing.assert_array_equal(ours.apply(params, x), theirs.apply(params, x))
  jax.tree.map(np.testing.assert_array_equal, jax.grad(loss(ours))(params, x), jax.grad(loss(theirs))(params, x))
  bf16 = model_lib.dense(16, dataclasses.replace(CONFIG, dtype='bfloat16'), ('embed', 'mlp'), None)
  y = nn.unbox(params)['params']
  exact = (x.astype(jnp.bfloat16) @ y['kernel'].astype(jnp.bfloat16)).astype(jnp.float32) + y['bias']
  np.testing.assert_array_equal(bf16.apply(params, x), exact.astype(jnp.bfloat16))
  rounded_bias = nn.Dense(16, dtype=jnp.bfloat16).apply(params, x)  # the bias rounded to bf16 before the add
  assert np.any(np.asarray(rounded_bias != exact.astype(jnp.bfloat16)))


def test_dense_gelu_keeps_only_the_matmul_output_for_the_backward_pass(capsys):
  """model.dense_gelu: gelu(dense(x)) with nn.Dense's parameters and the same values and gradients; what it keeps
  for the backward pass of the [tokens, features] size is the matmul's output alone (the bias add and GELU are done
  again there), where autodiff of gelu(dense(x)) keeps more (GELU's intermediate values)."""
  class Both(nn.Module):
    ours: bool

    @nn.compact
    def __call__(self, x):
      if self.ours:
        return model_lib.dense_gelu(x, 16, CONFIG, ('embed', 'mlp'), 'dense')
      return model_lib.gelu(model_lib.dense(16, CONFIG, ('embed', 'mlp'), 'dense')(x))
  x = jax.random.normal(jax.random.PRNGKey(0), (6, 8))
  ours, autodiff = Both(True), Both(False)
  params = ours.init(jax.random.PRNGKey(1), x)
  jax.tree.map(np.testing.assert_array_equal, params, autodiff.init(jax.random.PRNGKey(1), x))
  loss = lambda module: lambda p, x: jnp.sum(jnp.sin(module.apply(p, x)))
  np.testing.assert_allclose(ours.apply(params, x), autodiff.apply(params, x), rtol=1e-6)
  jax.tree.map(functools.partial(np.testing.assert_allclose, rtol=1e-5, atol=1e-7),
               jax.grad(loss(ours), argnums=(0, 1))(params, x), jax.grad(loss(autodiff), argnums=(0, 1))(params, x))
  def kept(module):  # residuals of the [tokens, features] size
    jax.ad_checkpoint.print_saved_residuals(lambda p, x: jnp.sum(module.apply(p, x)), params, x)
    return capsys.readouterr().out.count('f32[6,16]')
  assert kept(ours) == 1 < kept(autodiff)
