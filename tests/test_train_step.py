"""The jitted, sharded train step: metrics, learning, purity, rng folding, donation, shardings, big-config lowering."""

import dataclasses
import functools
import importlib
import math
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec

from configs import default
from electra_jax import config as config_lib
from electra_jax import model as model_lib
from electra_jax import metrics as metrics_lib
from electra_jax import objective, optimizer, sharding, train_step
from electra_jax.train_step import Pretraining
from helpers import SPECIAL, override  # pylint: disable=g-bad-import-order

V, B, L = 64, 8, 16
LENGTHS = (16, 16, 12, 10, 8, 5, 3, 16)  # real tokens per row
RULES = dict(default.get_config().mesh.rules)  # logical axis -> mesh axes, as configured


def _config(mesh_shape=(-1, 1, 1), **overrides):
  """The test model's config, with `section__key=value` overrides. Dropout off: its random bits double the step's
  compile on CPU; the dropout of a step is test_gradient_accumulation_equals_one_batch_for_every_objective's."""
  cfg = default.get_config()
  cfg.model.update(embedding_size=16, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
                   generator_hidden_fraction=0.5, max_position_embeddings=32, dropout_rate=0.0,
                   attention_dropout_rate=0.0)
  cfg.data.max_seq_length = L
  cfg.batch_size = B
  cfg.train_steps = 100
  cfg.optimizer.learning_rate = 2e-3
  cfg.optimizer.warmup_steps = 3
  cfg.mesh.shape = mesh_shape
  return config_lib.load(override(cfg, overrides, sep='__'), vocab_size=V)


def _numpy_batch(seed=0):
  r = np.random.RandomState(seed)
  ids = np.zeros((B, L), np.int32)
  segments = np.zeros((B, L), np.int32)
  for i, n in enumerate(LENGTHS):
    # A learnable pattern: each word is followed by a word from a small set, so the generator can improve.
    words = (np.arange(n) * 7 + 3 * i) % 20 + 10 + r.randint(0, 3, n)
    ids[i, :n] = words
    ids[i, 0], ids[i, n - 1] = SPECIAL.cls, SPECIAL.sep
    segments[i, n // 2:n] = 1
  return {'input_ids': ids, 'segment_ids': segments, 'input_mask': (ids > 0).astype(np.int32)}


@pytest.fixture(scope='module')
def run():
  mesh = sharding.make_mesh(_config().mesh)
  assert mesh.devices.size == 8
  return Pretraining(_config(), SPECIAL, mesh)


@pytest.fixture(scope='module')
def batch(run):
  return sharding.global_batch(_numpy_batch(), run.batch_sharding)


def test_staged_batches_keep_their_device_buffers(run, monkeypatch):
  """put_batch with ELECTRA_JAX_STAGE_BATCHES=1: each batch's values, in the same buffers once two batches have gone
  by. On a CPU a batch's arrays may share its numpy arrays' memory, which jax 0.11 refuses to donate while numpy
  holds it (0.10 writes the next batch there): the batches are new numpy arrays each time, as the data loader's, and
  no numpy array views the staged ones."""
  monkeypatch.setenv('ELECTRA_JAX_STAGE_BATCHES', '1')
  pointers = lambda b: [s.data.unsafe_buffer_pointer() for k in sorted(b) for s in b[k].addressable_shards]
  local = _numpy_batch()
  rolled = lambda shift: {k: np.roll(v, shift, axis=0) for k, v in local.items()}  # new arrays
  run.put_batch(rolled(0))
  run.put_batch(rolled(1))
  where = pointers(run.put_batch(rolled(0)))
  for shift in (1, 2):
    moved = rolled(shift)
    staged = run.put_batch(moved)
    assert pointers(staged) == where and staged['input_ids'].sharding == run.batch_sharding
    for k in local:  # compared on the device: np.asarray would keep a view of the buffer, which jax 0.11 won't donate
      assert bool(jnp.all(staged[k] == moved[k]))
  # Stacked batches (put_batches, for steps_fn) have arrays of their own, staged alike.
  run.put_batches([local, local])
  run.put_batches([local, local])
  first = pointers(run.put_batches([local, local]))
  stacked = run.put_batches([local, moved])
  assert pointers(stacked) == first and stacked['input_ids'].sharding == run.steps_batch_sharding
  np.testing.assert_array_equal(np.asarray(stacked['input_ids'][1]), moved['input_ids'])
  assert pointers(run.put_batch(rolled(0))) == where
  monkeypatch.delenv('ELECTRA_JAX_STAGE_BATCHES')
  assert pointers(run.put_batch(local)) != where  # new arrays, as without the switch


@pytest.fixture(scope='module')
def initial_on_device(run):
  return run.init_state(jax.random.PRNGKey(0))


@pytest.fixture(scope='module')
def initial(initial_on_device):
  """The initial state on the host: steps donate their input, so each test places a fresh copy."""
  return jax.tree.map(np.asarray, initial_on_device)


def _fresh(run, initial, step=0):
  return jax.device_put(initial.replace(step=np.asarray(step, np.int32)), run.state_shardings)


def _rng(seed=1):
  return jax.random.key_data(jax.random.PRNGKey(seed))


def _host(tree):
  return jax.tree.map(np.asarray, tree)


def _value(metrics, name):
  numerator, denominator = metrics[name]
  return float(numerator) / float(denominator)


@pytest.mark.slow
def test_one_step_returns_every_metric(run, batch, initial):
  state = _fresh(run, initial)
  before = initial.params
  state, metrics = run.step_fn(state, batch, _rng())
  expected = {'loss', 'gen_loss', 'disc_loss', 'gen_accuracy', 'disc_accuracy', 'disc_precision', 'disc_recall',
              'replaced_fraction', 'grad_norm', 'learning_rate', 'disc_prob_replaced', 'disc_prob_original'}
  assert expected <= set(metrics)
  for name in expected - {'disc_precision'}:  # precision is 0/0 when nothing is predicted replaced
    assert np.isfinite(_value(metrics, name)), name
  assert int(state.step) == 1
  # Denominators worked out by hand. Tokens: 16+16+12+10+8+5+3+16 = 86.
  # Selections n = max(1, min(P=int(0.155*16)=2, round(0.15 N))): N=16 -> 2.4 -> 2, 12 -> 1.8 -> 2,
  # 10 -> 1.5 -> 2, 8 -> 1.2 -> 1, 5 -> 0.75 -> 1, 3 -> 0.45 -> 1 (its single word): 2+2+2+2+1+1+1+2 = 13.
  assert float(metrics['disc_accuracy'][1]) == 86
  assert float(metrics['replaced_fraction'][1]) == 86
  assert float(metrics['gen_accuracy'][1]) == 13
  np.testing.assert_allclose(_value(metrics, 'loss'),
                             _value(metrics, 'gen_loss') + 50 * _value(metrics, 'disc_loss'), rtol=1e-5)
  # A freshly initialised generator is near uniform: its MLM loss is about log V = log 64 = 4.16.
  assert abs(_value(metrics, 'gen_loss') - np.log(V)) < 0.3
  assert _value(metrics, 'grad_norm') > 0
  # Step 0 of the warm-up has learning rate 0, so the parameters are exactly unchanged.
  assert _value(metrics, 'learning_rate') == 0.0
  jax.tree.map(np.testing.assert_array_equal, _host(state.params), before)
  # The next step uses lr * min(1, 1/3) * (1 - 1/100) = 2e-3 * 0.33 = 6.6e-4 and changes them.
  state, metrics = run.step_fn(state, batch, _rng())
  np.testing.assert_allclose(_value(metrics, 'learning_rate'), 2e-3 / 3 * 0.99, rtol=1e-6)
  assert int(state.step) == 2
  changed = jax.tree.map(lambda a, b: not np.array_equal(a, b), _host(state.params), before)
  assert all(jax.tree.leaves(changed))


def test_steps_in_one_call_are_the_steps_one_call_each(initial):
  """steps_per_call=3: three steps scanned in one program take the state that three calls of the step do, each on
  its own batch, and give their metrics summed (sums and counts, as the loop adds steps)."""
  mesh = sharding.make_mesh(_config().mesh)
  one = Pretraining(_config(), SPECIAL, mesh)
  three = Pretraining(_config(steps_per_call=3, log_every=3, checkpoint_every=3), SPECIAL, mesh)
  local = [_numpy_batch(seed) for seed in range(3)]
  state, summed = _fresh(one, initial, step=1), None
  for b in local:
    state, metrics = one.step_fn(state, one.put_batch(b), _rng())
    summed = metrics_lib.accumulate(summed, metrics)
  together, metrics = three.steps_fn(_fresh(three, initial, step=1), three.put_batches(local), _rng())
  assert int(together.step) == 4 and set(metrics) == set(summed)
  for name, (numerator, denominator) in _host(summed).items():
    np.testing.assert_allclose(np.asarray(metrics[name][0]), numerator, rtol=2e-5, err_msg=name)
    np.testing.assert_array_equal(np.asarray(metrics[name][1]), denominator, err_msg=name)
  assert float(metrics['gen_accuracy'][1]) == 3 * 13  # three batches of 13 selected positions (see above)
  jax.tree.map(functools.partial(np.testing.assert_allclose, rtol=1e-5, atol=1e-7), _host(together.params),
               _host(state.params))


@pytest.mark.slow
def test_flat_norm_steps_as_the_per_leaf_norm(run, batch, initial):
  """The GPUs' gradient norm over one concatenation (optimizer.global_norm, flat_norm) clips and reports as optax's
  leaf by leaf does: the same step up to float32 summation order."""
  tx, schedule = optimizer.make_optimizer(run.config.optimizer, run.config.train_steps, flat_norm=True)
  fn = functools.partial(train_step.train_step, model=run.model, tx=tx, schedule=schedule,
                         config=run.config.objective, special=run.special, train_steps=run.config.train_steps,
                         flat_norm=True)
  with sharding.activate(run.mesh, run.config.mesh.rules):
    flat, flat_metrics = _host(jax.jit(fn)(_fresh(run, initial, step=1), batch, _rng()))
  per_leaf, metrics = _host(run.step_fn(_fresh(run, initial, step=1), batch, _rng()))  # a CPU mesh: per leaf
  assert _value(metrics, 'grad_norm') > 1.0  # the clip acts (clip_norm 1.0)
  np.testing.assert_allclose(_value(flat_metrics, 'grad_norm'), _value(metrics, 'grad_norm'), rtol=1e-5)
  jax.tree.map(functools.partial(np.testing.assert_allclose, rtol=1e-5, atol=1e-7), flat.params, per_leaf.params)


@pytest.mark.slow
def test_flat_params_step_as_the_tree_step(run, batch, initial, monkeypatch):
  """optimizer.flat_params=true (the GPUs' default where parameters are replicated): the state's parameters and
  moments stored as a few vectors (optimizer.FlatParams; here the biases and LayerNorm parameters in vectors of at
  most 300 elements), the same two steps and metrics as one array per parameter, up to float32 summation order (the
  gradients' norm over a few vectors, not ~60 leaves); the layouts convert both ways exactly. Sharded parameters
  refuse it in one line."""
  monkeypatch.setattr(optimizer, 'NO_DECAY_CHUNK', 300)
  flat_run = Pretraining(_config(optimizer__flat_params='true'), SPECIAL, run.mesh)
  assert run.flat is None and flat_run.flat is not None
  state, flat_state = _fresh(run, initial, step=1), flat_run.step_layout(_fresh(run, initial, step=1))
  sizes = [v.size for v in jax.tree.leaves(flat_state.params)]
  assert len(flat_state.params[optimizer.DECAY]) == 1 and len(flat_state.params[optimizer.NO_DECAY]) > 1
  assert sum(sizes) == sum(x.size for x in jax.tree.leaves(initial.params)) and min(sizes) > 0
  jax.tree.map(np.testing.assert_array_equal, _host(flat_run.tree_layout(flat_state)), _host(_fresh(run, initial, 1)))
  for seed in (1, 2):
    state, metrics = run.step_fn(state, batch, _rng(seed))
    flat_state, flat_metrics = flat_run.step_fn(flat_state, batch, _rng(seed))
    for name in metrics:
      np.testing.assert_allclose(_value(flat_metrics, name), _value(metrics, name), rtol=1e-5, err_msg=name)
  assert _value(metrics, 'grad_norm') > 1.0  # the clip acts (clip_norm 1.0)
  tree = _host(flat_run.tree_layout(flat_state))
  assert int(tree.step) == 3
  jax.tree.map(functools.partial(np.testing.assert_allclose, rtol=1e-5, atol=1e-7), (tree.params, tree.opt_state),
               _host((state.params, state.opt_state)))
  with pytest.raises(config_lib.ConfigError, match=r'optimizer.flat_params=true: the parameters are sharded'):
    Pretraining(_config((2, 2, 2), optimizer__flat_params='true'), SPECIAL, sharding.make_mesh(_config((2, 2, 2)).mesh))


@pytest.mark.slow
def test_loss_goes_down_on_a_fixed_batch(run, batch, initial):
  state = _fresh(run, initial)
  losses = []
  for _ in range(30):
    state, metrics = run.step_fn(state, batch, _rng())
    losses.append((_value(metrics, 'loss'), _value(metrics, 'gen_loss'), _value(metrics, 'disc_loss')))
  losses = np.array(losses)
  assert int(state.step) == 30
  first, last = losses[:3].mean(0), losses[-3:].mean(0)
  # Masks change every step (fold_in(rng, step)), so compare 3-step means.
  assert last[0] < 0.8 * first[0], losses[:, 0]
  assert last[1] < first[1] - 0.5, losses[:, 1]  # the generator learns the pattern
  assert np.all(np.isfinite(losses))


@pytest.mark.slow
def test_embedding_gradients_scatter_only_into_the_float32_word_table():
  """On a GPU each update of a bf16 scatter-add is a compare-and-swap loop, and the updates of one row serialise:
  the bf16 scatter-adds of the embedding tables' gradients took 95 of the 110 ms of an ELECTRA-Small step on an
  H200 (the type table: every token of the batch in 2 rows). In bf16, the step's only scatter into a table is the
  word table's, in float32; positions and token types take none."""
  c = _config(mesh_shape=(1, 1, 1), model__dtype='bfloat16')
  text = Pretraining(c, SPECIAL, sharding.make_mesh(c.mesh)).lower().as_text()
  results = re.findall(r'"stablehlo\.scatter"\(.*?\}\) : \([^)]*\) -> tensor<([^>]*)>', text, re.S)
  tables = {f'{rows}x{c.model.embedding_size}x{dtype}' for rows in (V, c.model.max_position_embeddings,
                                                                     c.model.type_vocab_size)
            for dtype in ('f32', 'bf16')}
  assert results and {r for r in results if r in tables} == {f'{V}x{c.model.embedding_size}xf32'}


@pytest.mark.slow
def test_step_is_pure(run, batch, initial):
  a, metrics_a = run.step_fn(_fresh(run, initial), batch, _rng(1))
  b, metrics_b = run.step_fn(_fresh(run, initial), batch, _rng(1))
  jax.tree.map(np.testing.assert_array_equal, _host((a, metrics_a)), _host((b, metrics_b)))
  _, metrics_c = run.step_fn(_fresh(run, initial), batch, _rng(2))
  assert _value(metrics_c, 'loss') != _value(metrics_a, 'loss')  # a different rng draws different masks


def test_rng_is_folded_with_the_step(run, batch, initial):
  """Step s draws its masks and samples (and dropout, off here) from fold_in(rng, s): same rng, different steps
  differ."""
  losses = {}
  for step in (0, 5):
    _, metrics = run.step_fn(_fresh(run, initial, step), batch, _rng())
    losses[step] = _value(metrics, 'loss')
  assert losses[0] != losses[5]
  _, metrics = run.step_fn(_fresh(run, initial, 5), batch, _rng())
  assert _value(metrics, 'loss') == losses[5]  # and the same step draws the same


@pytest.mark.slow
def test_objective_schedules_follow_the_state_step(batch, initial):
  """Temperature and lambda are functions of state.step inside the compiled step (a restored state at step s
  samples and weighs as the uninterrupted run did at s), with the values worked out by hand.

  train_steps 8; T from 3 to 1 over the first half: T(s) = 1 + 2 max(0, 1 - (s / 8) / 0.5) = 1 + 2 max(0, 1 - s / 4)
  -> s = 0: 3, 1: 2.5, 3: 1.5, 6: 1. lambda from 0 to 50 over the first quarter: 50 min(1, s / 2) -> 0, 25, 50, 50.
  """
  config = _config(train_steps=8, objective__initial_temperature=3.0,
                   objective__temperature_decay_fraction=0.5, objective__disc_weight_warmup_fraction=0.25)
  run = Pretraining(config, SPECIAL, sharding.make_mesh(config.mesh))
  for step, t, w in [(0, 3.0, 0.0), (1, 2.5, 25.0), (3, 1.5, 50.0), (6, 1.0, 50.0)]:
    _, metrics = run.step_fn(_fresh(run, initial, step), batch, _rng())
    np.testing.assert_allclose(_value(metrics, 'temperature'), t, rtol=1e-6)
    np.testing.assert_allclose(_value(metrics, 'disc_weight'), w, rtol=1e-6)
    np.testing.assert_allclose(_value(metrics, 'loss'),
                               _value(metrics, 'gen_loss') + w * _value(metrics, 'disc_loss'), rtol=1e-5)
  # A resumed run: two steps in one go, and the same second step from a host copy of the state after the first.
  state, _ = run.step_fn(_fresh(run, initial), batch, _rng())
  saved = _host(state)
  state, metrics = run.step_fn(state, batch, _rng())
  resumed, metrics_resumed = run.step_fn(jax.device_put(saved, run.state_shardings), batch, _rng())
  jax.tree.map(np.testing.assert_array_equal, _host((state, metrics)), _host((resumed, metrics_resumed)))


def test_state_is_donated(run, batch, initial):
  state = _fresh(run, initial)
  new_state, _ = run.step_fn(state, batch, _rng())
  assert all(x.is_deleted() for x in jax.tree.leaves(state))
  assert not any(x.is_deleted() for x in jax.tree.leaves(new_state))
  assert not any(x.is_deleted() for x in jax.tree.leaves(batch))  # the batch is not donated


def _logical_axes(path):
  """The logical axis names each parameter should carry (Megatron-style: q/k/v and FFN-in split their output
  features over 'heads'/'mlp', attention-out and FFN-out their input features)."""
  name = '/'.join(path)
  leaf = path[-1]
  kernel = leaf in ('kernel', 'embedding')
  table = {
      'word_embeddings': ('vocab', 'token_embed'),
      'position_embeddings': (None, 'token_embed'),
      'token_type_embeddings': (None, 'token_embed'),
      'embeddings_project': ('token_embed', 'embed'),
      'self': ('embed', 'heads'),
      'attention/output/dense': ('heads', 'embed'),
      'intermediate/dense': ('embed', 'mlp'),
      'generator_predictions/dense': ('embed', 'token_embed'),
      'discriminator_predictions/dense/': ('embed', 'mlp'),
      'dense_prediction': ('mlp', None),
      'generator_lm_head': (None, 'vocab'),
  }
  if 'LayerNorm' in name:
    return ('token_embed',) if name.startswith('embeddings/') or 'generator_predictions' in name else ('embed',)
  if '/encoder/' in name and '/output/dense' in name and 'attention' not in name:
    axes = ('mlp', 'embed')
  else:
    axes = next(v for k, v in table.items() if k in name)
  return axes if kernel else axes[1:]


def _expected_spec(path):
  return PartitionSpec(*(RULES[a] if a is not None else None for a in _logical_axes(path)))


def _check_shardings(state, mesh):
  sizes = dict(zip(mesh.axis_names, mesh.devices.shape))
  checked = 0
  adam = [s for s in jax.tree.leaves(state.opt_state, is_leaf=lambda s: isinstance(s, optimizer.ScaleByAdamState))
          if isinstance(s, optimizer.ScaleByAdamState)]
  assert len(adam) == 1
  for tree in (state.params, adam[0].mu, adam[0].nu):
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
      keys = tuple(k.key for k in path)
      spec = _expected_spec(keys)
      assert leaf.sharding.mesh.shape == mesh.shape
      assert leaf.sharding.spec == spec, (keys, leaf.sharding.spec, spec)
      # The shard really is the global shape divided by the sizes of the mesh axes in the spec.
      shard = tuple(dim // (sizes[axis] if axis else 1) for dim, axis in zip(leaf.shape, tuple(spec)
                                                                         + (None,) * leaf.ndim))
      assert leaf.addressable_shards[0].data.shape == shard, keys
      checked += 1
  assert checked == 3 * len(jax.tree.leaves(state.params))
  assert state.step.sharding.is_fully_replicated


def test_shardings_on_the_default_mesh(run, batch, initial, initial_on_device):
  assert run.mesh.devices.shape == (8, 1, 1)
  _check_shardings(initial_on_device, run.mesh)  # as initialised
  state, _ = run.step_fn(_fresh(run, initial), batch, _rng())
  _check_shardings(state, run.mesh)  # as the step returns it
  assert run.batch_sharding.spec == PartitionSpec(('data', 'fsdp'), None)


def test_shardings_on_a_3d_mesh(initial):
  config = _config(mesh_shape=(2, 2, 2))
  mesh = sharding.make_mesh(config.mesh)
  run = Pretraining(config, SPECIAL, mesh)
  # What init_state would return (its out_shardings), without compiling a second initialiser: the same
  # values placed with the state shardings of this mesh.
  abstract = run.abstract_state()
  state = jax.device_put(initial, run.state_shardings)
  jax.tree.map(lambda a, s: a.sharding == s.sharding or pytest.fail(f'{a.sharding} != {s.sharding}'),
               state, abstract)
  _check_shardings(state, mesh)
  # Two examples: (64, 16) word table on ('tensor', None) -> (32, 16) per device; (32, 32) query kernel on
  # ('fsdp', 'tensor') -> (16, 16).
  table = state.params['embeddings']['word_embeddings']['embedding']
  assert table.addressable_shards[0].data.shape == (32, 16)
  query = state.params['discriminator']['encoder']['layer_0']['attention']['self']['query']['kernel']
  assert query.addressable_shards[0].data.shape == (16, 16)
  # The batch is split over data x fsdp = 4 groups of 2 rows.
  local = sharding.global_batch(_numpy_batch(), run.batch_sharding)
  assert local['input_ids'].addressable_shards[0].data.shape == (2, L)


def _disc_params(v, e, h, layers, ffn):
  """Shared embeddings + discriminator parameter count, by hand from the architecture."""
  embeddings = v * e + 512 * e + 2 * e + 2 * e  # word, position, type tables + LayerNorm
  project = e * h + h if e != h else 0
  layer = 4 * (h * h + h) + 2 * h + (h * ffn + ffn) + (ffn * h + h) + 2 * h
  head = (h * h + h) + (h + 1)
  return embeddings + project + layers * layer + head


@pytest.mark.slow
@pytest.mark.parametrize('name, dims, paper_millions', [
    ('small', (128, 256, 12, 1024), 14),  # 13,549,057
    ('base', (768, 768, 12, 3072), 110),  # 109,483,009
    ('large', (1024, 1024, 24, 4096), 335),  # 335,142,913
])
def test_paper_configs_lower(name, dims, paper_millions):
  """Each paper scale has the paper's parameters, and its train step lowers (traced with its shardings, not
  compiled or run) on 8 devices at full width with 2 of its layers. Every layer is the same code, so the model is
  built with 2 and its parameters counted by hand for 2, then for the config's depth (tracing Large's 24 unrolled
  layers took 25 s of the suite; building Small's 12 to count them, 5 s)."""
  config = config_lib.load(importlib.import_module(f'configs.{name}').get_config(), vocab_size=30522)
  embedding_size, hidden_size, layers, intermediate_size = dims
  assert config.model.num_layers == layers
  config = dataclasses.replace(config, model=dataclasses.replace(config.model, num_layers=2))
  run = Pretraining(config, SPECIAL, sharding.make_mesh(config.mesh))
  params = run.abstract_state().params
  count = sum(math.prod(x.shape) for k in ('embeddings', 'discriminator') for x in jax.tree.leaves(params[k]))
  assert count == _disc_params(30522, embedding_size, hidden_size, 2, intermediate_size)
  paper_scale = _disc_params(30522, *dims)
  assert abs(paper_scale / 1e6 - paper_millions) / paper_millions < 0.04
  lowered = run.lower()
  state_info = lowered.args_info[0][0]  # (args, kwargs) -> the TrainState argument
  assert state_info.step.shape == () and state_info.step.donated
  assert len(state_info.params['discriminator']['encoder']) == 2
  assert lowered.out_info[1]['loss'][0].shape == ()


def _subtree(params, *path):
  for key in path:
    params = params[key]
  return params


def _equal(a, b):
  return all(jax.tree.leaves(jax.tree.map(np.array_equal, a, b)))


@pytest.mark.slow
@pytest.mark.parametrize('tying, embedding_size', [('embeddings', 8), ('none', 16)])
def test_two_stage_training(tying, embedding_size):
  """objective.two_stage_generator_steps = 2: steps 0 and 1 train the generator alone (MLM), step 2 initialises
  the discriminator from it, and from then on the generator is frozen bit for bit while the discriminator trains.

  A same-size generator (H = 16, 1 head, FFN 4 H). tying='embeddings' with E = 8: both towers have an
  embeddings_project, copied with the encoder; tying='none' with E = H = 16: the generator's own embeddings are
  copied into the discriminator's (which stage 1 must not touch: they are the discriminator's alone). AdamW
  with weight decay: masking the gradient alone would let momentum and decay move the frozen tower.
  """
  n, lr = 2, 1e-3
  model_config = config_lib.ModelConfig(vocab_size=V, embedding_size=embedding_size, hidden_size=16, num_layers=1,
                                        num_heads=1, intermediate_size=64, generator_hidden_fraction=1.0,
                                        max_position_embeddings=32, dropout_rate=0.0, attention_dropout_rate=0.0,
                                        tying=tying)
  objective_config = config_lib.ObjectiveConfig(two_stage_generator_steps=n)
  model = objective.get('electra').model(model_config)
  tx, schedule = optimizer.make_optimizer(config_lib.OptimizerConfig(learning_rate=lr, warmup_steps=0), 100)
  batch = {k: jnp.asarray(v) for k, v in _numpy_batch().items()}
  params = jax.jit(model.init)(jax.random.PRNGKey(0), batch['input_ids'], batch['segment_ids'],
                               batch['input_mask'], jnp.zeros((B, 2), jnp.int32))['params']
  state = train_step.TrainState(jnp.zeros((), jnp.int32), nn.meta.unbox(params), None)
  state = state.replace(opt_state=tx.init(state.params))
  step = jax.jit(functools.partial(train_step.train_step, model=model, tx=tx, schedule=schedule,
                                   config=objective_config, special=SPECIAL, train_steps=100))
  history, metrics = [_host(state.params)], []
  for _ in range(4):
    state, m = step(state, batch, _rng())
    history.append(_host(state.params))
    metrics.append({k: _value(m, k) for k in ('loss', 'gen_loss', 'disc_loss')})

  # Stage 1: the loss is the MLM loss; the discriminator (and with 'none' the top-level embeddings) stay put.
  frozen_first = ('discriminator', 'embeddings') if tying == 'none' else ('discriminator',)
  for s in (0, 1):
    assert metrics[s]['loss'] == metrics[s]['gen_loss']
    for part in frozen_first:
      assert _equal(history[s + 1][part], history[0][part]), (s, part)
    assert not _equal(history[s + 1]['generator']['encoder'], history[s]['generator']['encoder'])
  if tying == 'embeddings':
    assert not _equal(history[2]['embeddings'], history[0]['embeddings'])  # shared: trained by the generator

  # At step 2 the discriminator is initialised from the generator: exactly, as two_stage_params computes ...
  copies = [(('generator', 'encoder'), ('discriminator', 'encoder'))]
  copies.append((('generator', 'embeddings_project'), ('discriminator', 'embeddings_project')) if tying ==
                'embeddings' else (('generator', 'embeddings'), ('embeddings',)))
  moved = train_step.two_stage_params(history[2], jnp.int32(n), n, model_config)
  for source, target in copies:
    assert _equal(_subtree(moved, *target), _subtree(history[2], *source)), target
  assert _equal(moved['discriminator']['discriminator_predictions'],
                history[2]['discriminator']['discriminator_predictions'])  # the heads differ: not copied
  assert _equal(train_step.two_stage_params(history[2], jnp.int32(n - 1), n, model_config), history[2])
  # ... and inside the jitted step, which then takes one Adam step of at most ~3.2 lr (no bias correction:
  # 0.1 g / sqrt(0.001 g^2)) plus a negligible decay: the discriminator now sits by the generator, far from its
  # own initial weights.
  for source, target in copies:
    gap = jax.tree.map(lambda a, b: np.max(np.abs(a - b)), _subtree(history[3], *target),
                       _subtree(history[2], *source))
    assert max(jax.tree.leaves(gap)) < 3.5 * lr, target
  start = jax.tree.map(lambda a, b: np.max(np.abs(a - b)), history[3]['discriminator']['encoder'],
                       history[0]['discriminator']['encoder'])
  assert max(jax.tree.leaves(start)) > 20 * lr

  # Stage 2: the loss is the discriminator's; the generator never moves again, the discriminator does.
  for s in (2, 3):
    np.testing.assert_allclose(metrics[s]['loss'], 50 * metrics[s]['disc_loss'], rtol=1e-6)
  assert _equal(history[3]['generator'], history[2]['generator'])
  assert _equal(history[4]['generator'], history[2]['generator'])
  assert not _equal(history[4]['discriminator'], history[3]['discriminator'])



class _Tower(nn.Module):
  """One embedding table, each token plus its row's mean, row-keyed dropout (the model's), dense `heads`."""
  heads: tuple[int, ...]

  @nn.compact
  def __call__(self, input_ids, input_mask, rows, *, deterministic):
    x = nn.Embed(V, 8)(input_ids)
    mask = input_mask[..., None].astype(jnp.float32)
    x = x + jnp.sum(x * mask, 1, keepdims=True) / jnp.sum(mask, 1, keepdims=True)
    x = model_lib.Dropout(0.1, 'bits16')(x, rows, deterministic=deterministic)  # what a CPU run draws
    return [nn.Dense(n)(x) for n in self.heads]


class _TinyElectra(nn.Module):
  """The Electra methods the objectives call, on one-table towers: it compiles in a fraction of the real model's
  time (the real one's accumulation is tests/test_precision.py's). The parameters' top-level names are Electra's,
  so two-stage training freezes its towers."""
  config: config_lib.ModelConfig = config_lib.ModelConfig(vocab_size=V)

  def setup(self):
    self.generator = _Tower((V, 1))  # MLM logits, REINFORCE baseline logit
    self.discriminator = _Tower((1, V, 1))  # 'replaced' logit, MLM logits, copy-gate logit

  def _run(self, tower, input_ids, input_mask, positions, deterministic, rows):
    rows = jnp.arange(input_ids.shape[0]) if rows is None else rows
    outs = tower(input_ids, input_mask, rows, deterministic=deterministic)
    return [o if positions is None else jnp.take_along_axis(o, positions[..., None], 1) for o in outs]

  def generator_logits_and_baseline(self, input_ids, segment_ids, input_mask, positions, *, deterministic=True,
                                    rows=None):
    del segment_ids
    logits, baseline = self._run(self.generator, input_ids, input_mask, positions, deterministic, rows)
    return logits, baseline[..., 0]

  def generator_logits(self, *args, **kwargs):
    return self.generator_logits_and_baseline(*args, **kwargs)[0]

  def discriminator_logits(self, input_ids, segment_ids, input_mask, *, deterministic=True, rows=None):
    del segment_ids
    return self._run(self.discriminator, input_ids, input_mask, None, deterministic, rows)[0][..., 0]

  def discriminator_mlm_logits(self, input_ids, segment_ids, input_mask, positions=None, *, deterministic=True,
                               rows=None):
    del segment_ids
    _, logits, copy = self._run(self.discriminator, input_ids, input_mask, positions, deterministic, rows)
    return logits, copy[..., 0]

  def __call__(self, input_ids, segment_ids, input_mask, positions):
    return (self.generator_logits_and_baseline(input_ids, segment_ids, input_mask, positions),
            self.discriminator_logits(input_ids, segment_ids, input_mask))


@pytest.fixture(scope='module')
def tiny_params():
  ids = jnp.zeros((B, L), jnp.int32)
  return jax.jit(_TinyElectra().init)(jax.random.PRNGKey(0), ids, ids, ids, jnp.zeros((B, 2), jnp.int32))['params']


@pytest.mark.slow
@pytest.mark.parametrize('name', [*objective.OBJECTIVES, 'two_stage'])
def test_gradient_accumulation_equals_one_batch_for_every_objective(name, tiny_params):
  """grad_accum_steps=2 takes the steps grad_accum_steps=1 takes, for every objective (and two-stage ELECTRA, its
  stage switching at step 1): each loss is a ratio of sums that micro-batches add up. With dropout on: each row's
  dropout, masking and samples are keyed by its index in the whole batch. Two steps, so the second step starts
  from the first one's update."""
  two_stage = name == 'two_stage'
  # electra_frozen's frozen generator is a stand-in tower here (its loading is tests/test_frozen.py's).
  objective_config = config_lib.ObjectiveConfig(name='electra' if two_stage else name,
                                                two_stage_generator_steps=int(two_stage),
                                                generator_checkpoint='WORKDIR' if name == 'electra_frozen' else '')
  model = _TinyElectra()
  tx, schedule = optax.sgd(0.1), lambda step: 0.1
  batch = {k: jnp.asarray(v) for k, v in _numpy_batch().items()}
  params = tiny_params

  def run_steps(grad_accum_steps):
    step = jax.jit(functools.partial(train_step.train_step, model=model, tx=tx, schedule=schedule,
                                     config=objective_config, special=SPECIAL, train_steps=100,
                                     grad_accum_steps=grad_accum_steps))
    state, history = train_step.TrainState(jnp.zeros((), jnp.int32), params, tx.init(params)), []
    for _ in range(2):
      state, metrics = step(state, batch, _rng())
      history.append(_host(metrics))
    return history, _host(state.params)

  (reference, reference_params), (history, accumulated_params) = run_steps(1), run_steps(2)
  for one, two in zip(reference, history):
    assert set(one) == set(two)
    for metric in one:
      np.testing.assert_allclose(two[metric], one[metric], rtol=1e-5, atol=1e-7, err_msg=metric)
  assert reference[1]['loss'][0] != reference[0]['loss'][0]  # the first step changed the parameters
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), accumulated_params,
               reference_params)
