"""One train step, any mesh: data parallel, FSDP, tensor parallel and mixes give the one-device losses, lay out
parameters and optimiser state as the rules say, and checkpoints move between meshes and device counts."""

import types

import flax.linen as nn
import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec

from electra_jax import model as model_lib, optimizer, sharding
from electra_jax.checkpoint import Checkpointer
from electra_jax.config import MeshConfig
import scale_setup as setup
from scale_setup import RTOL, assert_same_run  # pylint: disable=g-bad-import-order

# Every test here compiles or trains a model (or shares a module fixture that does): the slow tier.
pytestmark = pytest.mark.slow

# (mesh shape, config overrides): data parallel; data x FSDP with rematerialised layers (the usual pairing for big
# models, and remat must not change the loss or the gradients); data x FSDP x tensor; tensor parallel, where the
# vocabulary of 100 does not split 8 ways and stays replicated; the same with the query, key and value projections as
# one matmul (model.fused_qkv: the one-device run it equals projects them one by one).
MESHES = {
    'data': ((8, 1, 1), ()),
    'fsdp+remat': ((2, 4, 1), (('model.remat', 'full'),)),
    'data+fsdp+tensor': ((2, 2, 2), ()),
    'data+fsdp+tensor, fused q/k/v': ((2, 2, 2), (('model.fused_qkv', 'true'),)),
    'tensor': ((1, 1, 8), ()),
}
def _adam(opt_state):
  leaves = jax.tree.leaves(opt_state, is_leaf=lambda s: isinstance(s, optimizer.ScaleByAdamState))
  return next(s for s in leaves if isinstance(s, optimizer.ScaleByAdamState))


@pytest.mark.parametrize('name', MESHES)
def test_losses_equal_one_device(name):
  reference, reference_state = setup.trained()
  assert setup.losses(reference)[-1] < 0.8 * setup.losses(reference)[0]  # it learns
  history, state = setup.trained(*MESHES[name])
  assert_same_run(history, state, reference, reference_state)


def _logical_names(run):
  """{path: logical axis names} of every parameter, from the model's boxed initialisation."""
  boxed = jax.eval_shape(run._init_boxed, jax.random.key_data(jax.random.PRNGKey(0))).params  # pylint: disable=protected-access
  is_box = lambda x: isinstance(x, nn.Partitioned)
  return {jax.tree_util.keystr(path): box.names
          for path, box in jax.tree_util.tree_leaves_with_path(boxed, is_leaf=is_box)}


@pytest.mark.parametrize('name', MESHES)
def test_state_shardings_follow_the_rules(name):
  mesh_shape, overrides = MESHES[name]
  run = setup.pretraining(mesh_shape, overrides)
  rules, sizes = dict(run.config.mesh.rules), dict(run.mesh.shape)
  names = _logical_names(run)
  state = setup.place(run, setup.initial_state())
  adam = _adam(state.opt_state)
  for tree in (state.params, adam.mu, adam.nu):
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
      expected = []
      for size, axis in zip(leaf.shape, names[jax.tree_util.keystr(path)]):
        # A parameter's axes map to distinct mesh axes, so each takes its rule; a size the rule's devices do not
        # divide stays whole.
        mesh_axes = rules[axis] if axis else None
        expected.append(mesh_axes if size % sharding.axis_size(run.mesh, mesh_axes) == 0 else None)
      assert leaf.sharding.spec == PartitionSpec(*expected), (path, leaf.sharding.spec, expected)
      shard = tuple(s // sharding.axis_size(run.mesh, a) for s, a in zip(leaf.shape, expected))
      assert leaf.addressable_shards[0].data.shape == shard
  # Worked out by hand: the query kernel [32, 32] is (embed, heads) -> (fsdp, tensor); the word table [100, 32]
  # is (vocab, token_embed) -> (tensor, None), but 100 rows do not split 8 ways.
  query = adam.nu['discriminator']['encoder']['layer_0']['attention']['self']['query']['kernel']
  assert query.addressable_shards[0].data.shape == (32 // sizes['fsdp'], 32 // sizes['tensor'])
  table = state.params['embeddings']['word_embeddings']['embedding']
  assert table.addressable_shards[0].data.shape == {'data': (100, 32), 'fsdp+remat': (100, 32),
                                                    'data+fsdp+tensor': (50, 32), 'tensor': (100, 32),
                                                    'data+fsdp+tensor, fused q/k/v': (50, 32)}[name]
  assert run.batch_sharding.spec == PartitionSpec(('data', 'fsdp'), None)


def test_batch_must_split_over_the_devices():
  run = setup.pretraining((8, 1, 1), (('grad_accum_steps', 2),))  # building it (abstract_state, ...) is fine
  with pytest.raises(sharding.ConfigError, match=r'batch_size 8 must be a multiple of grad_accum_steps \(2\) x the '
                     r'8 devices the batch is split over'):
    run.lower()


@pytest.mark.parametrize('shape', [(0, -1, 1), (-2, 1, 1), (0, 1, 1), (-1, -1, 1), (2, 2)])
def test_a_mesh_shape_is_device_counts(shape):
  with pytest.raises(sharding.ConfigError, match=r'mesh.shape takes 3 integers .* each a device count of at least 1 '
                     r'or, on one axis, -1'):
    MeshConfig(shape=shape)


def test_a_mesh_shape_with_a_free_axis_divides_the_devices():
  assert sharding.mesh_shape(MeshConfig(shape=(2, -1, 1)), 8) == (2, 4, 1)
  with pytest.raises(sharding.ConfigError, match=r'^mesh.shape \(3, -1, 1\): the 8 devices do not split into 3 for '
                     r'the other axes; make their product divide 8$'):
    sharding.mesh_shape(MeshConfig(shape=(3, -1, 1)), 8)
  with pytest.raises(sharding.ConfigError, match=r'does not fit 8 devices'):
    sharding.mesh_shape(MeshConfig(shape=(16, 1, 1)), 8)
  assert sharding.mesh_shape(MeshConfig(shape=(1, 1, 1)), 8) == (1, 1, 1)  # the first device alone


def test_a_mesh_of_several_processes_takes_as_many_devices_of_each(monkeypatch):
  """Two processes of two devices each: a (2, 1, 1) mesh would take process 0's two alone, leaving process 1 nothing
  to run its rows on (it failed with tracebacks on both). Refused in one line; the whole mesh is taken."""
  devices = [types.SimpleNamespace(process_index=p) for p in (0, 0, 1, 1)]
  monkeypatch.setattr(sharding.jax, 'process_count', lambda: 2)
  made = []
  monkeypatch.setattr(sharding.jax, 'make_mesh', lambda shape, axes, axis_types, devices: made.append(devices))
  with pytest.raises(sharding.ConfigError, match=r'^mesh.shape \(2, 1, 1\) takes 2 of the 4 devices \(\[2, 0\] of '
                     r"the 2 processes' in turn\), but each process feeds its own rows to its own devices: make the "
                     'product the device count, or put a -1 on one axis$'):
    sharding.make_mesh(MeshConfig(shape=(2, 1, 1)), devices)
  sharding.make_mesh(MeshConfig(shape=(-1, 1, 1)), devices)
  assert made == [devices]


@pytest.fixture(scope='module')
def checkpoint_on_8_devices(tmp_path_factory):
  """The (2, 2, 2) run's state after 10 steps, saved from its 8 devices."""
  source = setup.pretraining((2, 2, 2))
  _, trained = setup.trained((2, 2, 2))
  checkpointer = Checkpointer(tmp_path_factory.mktemp('run'))
  checkpointer.save(setup.STEPS, setup.place(source, trained), {'epoch': 0})
  checkpointer.wait()
  yield checkpointer, trained
  checkpointer.close()


# 4 devices: data x FSDP with 2 accumulated micro-batches (the run test_precision checks); 1 device.
@pytest.mark.parametrize('target', [((2, 2, 1), (('grad_accum_steps', 2),)), ((1, 1, 1), ())],
                         ids=['4_devices', '1_device'])
def test_checkpoint_restores_onto_another_mesh(checkpoint_on_8_devices, target):
  checkpointer, trained = checkpoint_on_8_devices
  run = setup.pretraining(*target)
  state, data_state = checkpointer.restore(setup.STEPS, run.abstract_state())
  assert data_state == {'epoch': 0} and int(state.step) == setup.STEPS
  assert jax.tree.map(lambda x: x.sharding, state) == run.state_shardings
  jax.tree.map(np.testing.assert_array_equal, setup.host(state), trained)  # bit-identical
  # The next step continues as it would have on the 8 devices.
  source = setup.pretraining((2, 2, 2))
  batch = setup.numpy_batch()
  _, metrics = setup.compiled_step(*target)(state, sharding.global_batch(batch, run.batch_sharding),
                                            setup.replicated_rng(run))
  _, expected = setup.compiled_step((2, 2, 2))(setup.place(source, trained),
                                               sharding.global_batch(batch, source.batch_sharding),
                                               setup.replicated_rng(source))
  np.testing.assert_allclose(float(metrics['loss'][0]), float(expected['loss'][0]), rtol=RTOL)


def test_activations_are_constrained_while_tracing():
  """The step is lowered with the rules active: the model's activation names become sharding constraints, e.g. the
  feed-forward activations [batch * length, mlp] = [128, 64] split over data x fsdp and tensor."""
  run = setup.pretraining((2, 2, 2))
  text = run.lower().as_text()
  constraints = [line for line in text.splitlines() if 'sharding_constraint' in line or '@Sharding' in line]
  assert len(constraints) > 20
  assert any('128x64' in line and '"tensor"' in line and '"fsdp"' in line for line in constraints)


def test_rule_order_does_not_move_activations(monkeypatch):
  """Activations carry names of their own (activation_*), never a parameter's: each activation dimension gets the
  same mesh axes whatever order the rules are listed in. With shared names, listing ('embed', 'fsdp') before
  ('batch', ...) would move fsdp from an activation's batch to its hidden dimension."""
  run = setup.pretraining((2, 2, 2))
  seen = set()

  def record(x, names):
    seen.add(tuple(names))
    return x

  monkeypatch.setattr(model_lib, 'constrain', record)
  jax.eval_shape(run._init_boxed, jax.random.key_data(jax.random.PRNGKey(0)))  # pylint: disable=protected-access
  assert len(seen) >= 8
  assert {name for names in seen for name in names} - {None} <= {
      'activation_batch', 'activation_length', 'activation_embed', 'activation_heads', 'activation_mlp',
      'activation_vocab'}
  rules = list(run.config.mesh.rules)
  expected = {names: nn.logical_to_mesh_axes(names, rules) for names in seen}
  assert expected[('activation_batch', 'activation_mlp')] == PartitionSpec(('data', 'fsdp'), 'tensor')
  assert expected[('activation_batch', 'activation_embed')] == PartitionSpec(('data', 'fsdp'), None)
  orders = [rules[::-1]] + [list(np.random.default_rng(seed).permutation(len(rules))) for seed in range(20)]
  for order in orders:
    permuted = order if order is orders[0] else [rules[i] for i in order]
    for names in seen:
      assert nn.logical_to_mesh_axes(names, permuted) == expected[names], (names, permuted)
