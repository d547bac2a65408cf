"""Mixed precision (bfloat16 activations, float32 parameters and losses) and gradient accumulation."""

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

from electra_jax import config as config_lib, sharding
from electra_jax.model import Electra
from configs import default as configs_default
import scale_setup as setup
from scale_setup import assert_same_run

# Every test here compiles or trains a model (or shares a module fixture that does): the slow tier.
pytestmark = pytest.mark.slow

BF16 = (('model.dtype', 'bfloat16'),)
ACCUMULATE = (('grad_accum_steps', 2),)


def test_bfloat16_computes_in_bf16_and_keeps_float32_where_it_matters():
  config = setup.config(**dict(BF16)).model
  model = Electra(config)
  ids = jnp.zeros((2, setup.L), jnp.int32)
  positions = jnp.zeros((2, 3), jnp.int32)
  params = jax.eval_shape(model.init, jax.random.PRNGKey(0), ids, ids, ids, positions)['params']
  assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype('float32')}
  apply = lambda method, *args: jax.eval_shape(lambda p: model.apply(p, *args, method=method), {'params': params})
  assert apply('encode', ids, ids, ids).dtype == jnp.bfloat16
  assert apply('generator_logits', ids, ids, ids, positions).dtype == jnp.float32
  assert apply('discriminator_logits', ids, ids, ids).dtype == jnp.float32


def test_bfloat16_learns_like_float32():
  reference, _ = setup.trained()
  history, state = setup.trained((1, 1, 1), BF16)
  fp32, bf16 = setup.losses(reference), setup.losses(history)
  assert {x.dtype for x in jax.tree.leaves(state.params)} == {np.dtype('float32')}
  # bf16 keeps 8 bits of mantissa (0.4% per value); the rounding errors average out in the loss. Over 10 steps the
  # loss falls by ~40%; bf16 must track fp32 within 2% at every step (measured on XLA:CPU: 0.04%).
  assert bf16[-1] < 0.7 * bf16[0]
  np.testing.assert_allclose(bf16, fp32, rtol=2e-2)


def test_the_gpu_defaults_learn_like_the_cpu_defaults():
  """The model keys a GPU resolves 'auto' to (config.for_platform: bf16, fused attention without its dropout, an
  encoder's dropout masks in one RngBitGenerator draw, the query/key/value projections as one matmul), run on a CPU
  with XLA's attention for cuDNN's: the tiny model's loss falls as the CPU defaults' does (other masks, so not step
  for step)."""
  gpu = config_lib.for_platform(configs_default.get_config().model.to_dict(), 'gpu')
  assert (gpu['attention'], gpu['dropout_draw'], gpu['fused_qkv']) == ('cudnn', 'rbg_tower', 'true')
  overrides = tuple((f'model.{k}', 'xla' if v == 'cudnn' else v) for k, v in sorted(gpu.items()))
  reference, _ = setup.trained()
  history, state = setup.trained((1, 1, 1), overrides)
  assert {x.dtype for x in jax.tree.leaves(state.params)} == {np.dtype('float32')}
  cpu, on_gpu = setup.losses(reference), setup.losses(history)
  assert on_gpu[-1] < 0.7 * on_gpu[0]
  np.testing.assert_allclose(on_gpu[-1], cpu[-1], rtol=0.05)


def test_gradient_accumulation_equals_one_batch():
  """2 micro-batches of 4 rows on a data x FSDP mesh of 4 devices = one batch of 8 on one device."""
  reference, reference_state = setup.trained()
  history, state = setup.trained((2, 2, 1), ACCUMULATE)
  # The first step, before any update: the same loss to float32 rounding and the same gradient.
  np.testing.assert_allclose(history[0]['loss'][0], reference[0]['loss'][0], rtol=1e-6)
  np.testing.assert_allclose(history[0]['grad_norm'][0], reference[0]['grad_norm'][0], rtol=1e-5)
  assert_same_run(history, state, reference, reference_state)


def _sums(jaxpr):
  """Every reduce_sum of `jaxpr` and of the jaxprs inside it (jit, checkpoint, custom rules)."""
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == 'reduce_sum':
      yield eqn
    for param in eqn.params.values():
      for inner in param if isinstance(param, (tuple, list)) else (param,):
        if isinstance(inner, (jax.extend.core.ClosedJaxpr, jax.extend.core.Jaxpr)):
          yield from _sums(getattr(inner, 'jaxpr', inner))


def test_bfloat16_sums_its_gradients_over_the_tokens_in_float32():
  """Every sum over the batch's tokens in the bf16 train step (the biases' gradients, LayerNorm's) adds float32
  numbers. XLA:GPU runs a bfloat16 sum in bfloat16 on H100s and newer, where a bias's gradient summed over 16,384
  tokens would lose its low digits; model.add_bias adds the biases in float32 so that autodiff sums in float32."""
  run = setup.pretraining(overrides=BF16)
  jitted, args = run.jitted()
  with sharding.activate(run.mesh, run.config.mesh.rules):
    jaxpr = jitted.trace(*args).jaxpr.jaxpr
  sums = list(_sums(jaxpr))
  tokens = setup.B * setup.L
  over_tokens = [e for e in sums if np.prod([e.invars[0].aval.shape[a] for a in e.params['axes']]) >= tokens]
  assert len(over_tokens) > 10  # the biases' and LayerNorm parameters' gradients, at least
  assert [e for e in over_tokens if e.invars[0].aval.dtype == jnp.bfloat16] == []
