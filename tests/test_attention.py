"""The attention core: the memory-lean backward pass of bfloat16 models, and the attention implementations."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from electra_jax import attention
from electra_jax import config as config_lib
from electra_jax import model as model_lib
from helpers import MODEL_CONFIG, model_inputs as _inputs, random_model_params as _random_params

RATE = 0.25
CONFIG = dataclasses.replace(MODEL_CONFIG, num_layers=1)  # the attention core is each layer's: one is enough


def _reference(logits, values, keep):
  """What autodiff of the float32 model's einsum attention computes (softmax, inverted dropout, einsum)."""
  probs = jax.nn.softmax(logits, axis=-1)
  if keep is not None:
    probs = jnp.where(keep, probs / (1.0 - RATE), 0.0)
  return jnp.einsum('bhqk,bkhd->bqhd', probs, values)


@pytest.mark.parametrize('dropout', [True, False])
def test_lean_backward_equals_autodiff_in_float32(dropout):
  r = np.random.RandomState(0)
  logits = jnp.asarray(3 * r.normal(size=(2, 3, 6, 6)), jnp.float32)
  values = jnp.asarray(r.normal(size=(2, 6, 3, 4)), jnp.float32)
  keep = jnp.asarray(r.rand(2, 3, 6, 6) > RATE) if dropout else None
  cotangent = jnp.asarray(r.normal(size=(2, 6, 3, 4)), jnp.float32)

  def grads(core):
    return jax.grad(lambda l, v: jnp.sum(core(l, v) * cotangent), argnums=(0, 1))(logits, values)
  lean = lambda l, v: attention.probs_times_values(l, v, keep, RATE)
  np.testing.assert_array_equal(lean(logits, values), _reference(logits, values, keep))
  for got, want in zip(grads(lean), grads(lambda l, v: _reference(l, v, keep))):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_lean_backward_keeps_one_bf16_copy_of_the_probabilities():
  r = np.random.RandomState(0)
  logits = jnp.asarray(r.normal(size=(2, 3, 6, 6)), jnp.float32)
  values = jnp.asarray(r.normal(size=(2, 6, 3, 4)), jnp.bfloat16)
  keep = jnp.asarray(r.rand(2, 3, 6, 6) > RATE)
  _, vjp = jax.vjp(lambda l, v: attention.probs_times_values(l, v, keep, RATE), logits, values)
  scores_sized = [x for x in jax.tree.leaves(vjp) if x.shape == logits.shape]
  # The bf16 probabilities and the bool mask; autodiff of the einsum form also keeps the float32 softmax.
  assert sorted(str(x.dtype) for x in scores_sized) == ['bfloat16', 'bool']


@pytest.mark.slow
def test_bfloat16_model_drops_what_the_float32_model_drops():
  """Same dropout key, same masks: the bf16 discriminator (lean core) follows the float32 one (einsum core)."""
  ids, segments, mask, _ = _inputs()
  params = _random_params(CONFIG)

  def logits(dtype, seed):
    model = model_lib.Electra(dataclasses.replace(CONFIG, dtype=dtype))
    return np.asarray(model.apply({'params': params}, ids, segments, mask, deterministic=False,
                                  method='discriminator_logits', rngs={'dropout': jax.random.PRNGKey(seed)}))
  fp32 = logits('float32', 0)
  bf16_error = np.max(np.abs(logits('bfloat16', 0) - fp32))
  assert bf16_error < 0.1 * np.max(np.abs(logits('float32', 1) - fp32)), bf16_error


@functools.lru_cache
def _discriminator_grads(dtype, remat):
  """Gradients of the summed discriminator logits with dropout on: one compile per (dtype, remat), the 'none'
  reference shared by every policy's test."""
  ids, segments, mask, _ = _inputs()
  model = model_lib.Electra(dataclasses.replace(CONFIG, dtype=dtype, remat=remat))
  loss = lambda p: jnp.sum(model.apply({'params': p}, ids, segments, mask, deterministic=False,
                                       method='discriminator_logits', rngs={'dropout': jax.random.PRNGKey(0)}))
  return jax.jit(jax.grad(loss))(_random_params(CONFIG))


@pytest.mark.slow
@pytest.mark.parametrize('policy', ['full', 'dots', 'dots_no_batch', 'outputs'])
@pytest.mark.parametrize('dtype', ['float32', 'bfloat16'])
def test_remat_policies_do_not_change_the_gradients(policy, dtype):
  got, want = _discriminator_grads(dtype, policy), _discriminator_grads(dtype, 'none')
  if dtype == 'float32':
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), got, want)
  else:  # recomputed under other fusions, bf16 values round differently (one ulp is 0.4-0.8%): compare the whole
    flat = lambda tree: np.concatenate([np.ravel(x) for x in jax.tree.leaves(tree)])
    assert np.linalg.norm(flat(got) - flat(want)) < 0.02 * np.linalg.norm(flat(want))


@pytest.mark.parametrize('old, new', [(True, 'full'), (False, 'none'), ('true', 'full'), ('false', 'none')])
def test_remat_reads_its_old_boolean_values(old, new):
  assert config_lib.from_dict(config_lib.ModelConfig, {'remat': old}, where='model').remat == new
  assert config_lib.ModelConfig(remat=old).remat == new


def test_unknown_remat_policy_names_the_policies():
  with pytest.raises(config_lib.ConfigError, match="model.remat must be one of 'none', 'full', 'dots'"):
    config_lib.ModelConfig(remat='dot')


@pytest.mark.slow
def test_fused_attention_equals_the_einsum_path_without_attention_dropout():
  """model.attention='fused' (jax.nn.dot_product_attention; XLA's on a CPU, cuDNN's on a GPU) is the same math."""
  ids, segments, mask, _ = _inputs(lengths=(16, 9))  # with padding: the bias must mask it the same way
  params = _random_params(CONFIG)
  einsum = dataclasses.replace(CONFIG, attention_dropout_rate=0.0)
  fused = dataclasses.replace(einsum, attention='fused')
  assert fused.attention == 'xla'  # resolved for this (CPU) platform

  def grads(config):  # hidden dropout on: only the attention core differs
    model = model_lib.Electra(config)
    loss = lambda p: jnp.sum(jnp.sin(model.apply({'params': p}, ids, segments, mask, deterministic=False,
                                                 method='discriminator_logits',
                                                 rngs={'dropout': jax.random.PRNGKey(0)})))
    return jax.jit(jax.value_and_grad(loss))(params)
  (got_loss, got), (want_loss, want) = grads(fused), grads(einsum)
  np.testing.assert_allclose(got_loss, want_loss, rtol=1e-6)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), got, want)


def test_attention_switch_resolves_by_platform_and_refuses_dropout():
  resolve = config_lib.attention_implementation
  assert resolve('auto', 'gpu', 'bfloat16') == 'cudnn'
  assert resolve('auto', 'gpu', 'float32') == 'einsum'  # cuDNN's fused attention is bf16/fp16 only
  assert resolve('auto', 'tpu', 'bfloat16') == 'einsum'
  assert resolve('fused', 'gpu', 'float32') == 'cudnn'
  assert resolve('fused', 'tpu', 'bfloat16') == 'xla'
  assert config_lib.ModelConfig(attention='auto').attention == 'einsum'  # CPU
  with pytest.raises(config_lib.ConfigError, match='set model.attention_dropout_rate=0'):
    config_lib.ModelConfig(attention='fused', attention_dropout_rate=0.1)  # asked for: refused, not dropped
