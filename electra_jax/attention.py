"""The attention core (softmax, attention dropout, probabilities x values) and its memory-lean backward pass.

Under bfloat16, autodiff of `softmax(scores).astype(bf16)` followed by dropout and the probabilities x values
einsum keeps three [batch, heads, length, length] tensors for the backward pass: the float32 softmax output (its
derivative reads it), the bf16 dropped probabilities (the einsum's operand) and the dropout mask, 4 + 2 + 1 bytes
per score. `probs_times_values` computes the softmax in float32 but keeps only its bf16 rounding and the mask (2 + 1
bytes): the backward pass rebuilds the dropped probabilities from them and runs the softmax derivative in float32.
"""

import functools

import jax
import jax.numpy as jnp


def _dropped(probs, keep, rate: float):
  """Inverted dropout of [batch, heads, q, k] `probs` by boolean `keep` (None: no dropout)."""
  return probs if keep is None else jnp.where(keep, probs * jnp.asarray(1.0 / (1.0 - rate), probs.dtype),
                                              jnp.zeros_like(probs))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def probs_times_values(logits, values, keep, rate: float):
  """softmax(logits) in float32, rounded to values.dtype, dropped by `keep`, times the values.

  logits [batch, heads, q, k] float32 (scaled scores plus the padding bias), values [batch, k, heads, head_dim],
  keep [batch, heads, q, k] bool or None -> context [batch, q, heads, head_dim] in values.dtype.
  """
  return _forward(logits, values, keep, rate)[0]


def _forward(logits, values, keep, rate):
  probs = jax.nn.softmax(logits, axis=-1).astype(values.dtype)
  context = jnp.einsum('bhqk,bkhd->bqhd', _dropped(probs, keep, rate), values)
  return context, (probs, values, keep)


def _backward(rate, residuals, grad):
  probs, values, keep = residuals
  grad_values = jnp.einsum('bhqk,bqhd->bkhd', _dropped(probs, keep, rate), grad)
  grad_dropped = jnp.einsum('bqhd,bkhd->bhqk', grad, values, preferred_element_type=jnp.float32)
  grad_probs = _dropped(grad_dropped, keep, rate)
  p = probs.astype(jnp.float32)
  grad_logits = p * (grad_probs - jnp.sum(grad_probs * p, axis=-1, keepdims=True))
  return grad_logits, grad_values, None


probs_times_values.defvjp(_forward, _backward)
