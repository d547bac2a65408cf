"""ELECTRA in Flax linen: shared embeddings, a post-LN BERT encoder per tower, generator and discriminator heads.

Parameter names follow Hugging Face's `ElectraForPreTraining` / `ElectraForMaskedLM` one-to-one (see
`electra_jax.convert`), e.g. `discriminator/encoder/layer_3/attention/self/query/kernel` is
`electra.encoder.layer.3.attention.self.query.weight` (transposed). Every parameter carries logical axis names
(`vocab`, `embed`, `token_embed`, `heads`, `mlp`) that `electra_jax.sharding` maps onto the device mesh, and so do
the key activations, under names of their own (`activation_batch`, `activation_length`, `activation_embed`,
`activation_heads`, `activation_mlp`, `activation_vocab`, as in MaxText) so that how the rules split a weight never
moves an activation, through `nn.with_logical_constraint`: no-ops unless the rules and a mesh are active while
tracing (`electra_jax.sharding.activate`).

Mixed precision: with `dtype='bfloat16'` activations and matmuls are bf16 while parameters stay float32; attention
scores and softmax are computed in float32 (the backward pass keeps only their bf16 rounding: `attention`), the
generator's vocabulary logits and the discriminator's logit are float32 (so are the losses), and biases are added
in float32, so that their gradients sum over the tokens in float32 (`add_bias`).

Dropout is drawn per example row (`Dropout`): what row r drops depends only on the dropout key and r, so a
micro-batch (gradient accumulation) drops exactly what the whole batch would. `rows` arguments carry each row's
index in the full batch; they default to 0..batch-1.
"""

import dataclasses
import functools
from collections.abc import Mapping
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from electra_jax import attention
from electra_jax.config import ModelConfig, TowerConfig

# ELECTRA uses the exact (erf) GELU; flax's default is the tanh approximation.
gelu = functools.partial(nn.gelu, approximate=False)
constrain = nn.with_logical_constraint


def _rows(rows, input_ids):
  """Each row's index in the full batch: `rows` [batch] if given, else 0..batch-1."""
  return jnp.arange(input_ids.shape[0], dtype=jnp.int32) if rows is None else rows


def _init(config: ModelConfig, names):
  return nn.with_logical_partitioning(nn.initializers.truncated_normal(config.initializer_range), names)


def _glorot(names):
  # What official ELECTRA's tf.layers.dense gets without a kernel_initializer (its `embeddings_project` and the
  # discriminator's H -> 1 `dense_1`): glorot_uniform, std sqrt(2 / (fan_in + fan_out)), not truncated_normal(0.02).
  return nn.with_logical_partitioning(nn.initializers.glorot_uniform(), names)


def _zeros(names):
  return nn.with_logical_partitioning(nn.initializers.zeros_init(), names)


def _ones(names):
  return nn.with_logical_partitioning(nn.initializers.ones_init(), names)


def dense(features, config: ModelConfig, names, name, glorot: bool = False):
  """A Dense layer named `name` whose kernel has logical axes `names` and whose bias has `names[1]`.

  Its kernel starts truncated_normal(initializer_range), or glorot_uniform with `glorot` (see `_glorot`).
  """
  return Dense(features, config, tuple(names), glorot, name=name)


def add_bias(y, bias):
  """y + bias (a float32 parameter), added in float32 and rounded once to y's dtype. Autodiff then sums the bias's
  gradient over the tokens in float32: with the bias cast to y's bfloat16 first (as nn.Dense does), the sum is a
  bfloat16 reduction, which XLA:GPU runs in bfloat16 on H100s and newer (it widens it to float32 on older GPUs, as
  XLA:CPU does), the error growing with the tokens summed. In float32 the two are the same."""
  return (y.astype(jnp.float32) + bias).astype(y.dtype)


def _dense_params(module: nn.Module, in_features: int, features: int, config: ModelConfig, names,
                  glorot: bool = False):
  """A dense layer's kernel [in_features, features] and bias [features] in `module` (a compact method's): named,
  initialised (in the same order, so from the same keys) and partitioned as nn.Dense's."""
  return (module.param('kernel', _glorot(names) if glorot else _init(config, names), (in_features, features),
                       jnp.float32),
          module.param('bias', _zeros(names[1:]), (features,), jnp.float32))


class Dense(nn.Module):
  """nn.Dense in config.dtype (the same parameters), its bias added by `add_bias`."""
  features: int
  config: ModelConfig
  names: tuple
  glorot: bool = False

  @nn.compact
  def __call__(self, x):
    kernel, bias = _dense_params(self, x.shape[-1], self.features, self.config, self.names, self.glorot)
    return add_bias(jnp.dot(x.astype(self.config.dtype), kernel.astype(self.config.dtype)), bias)


def layer_norm(config: ModelConfig, axis_name: str, name: str = 'LayerNorm'):
  return nn.LayerNorm(epsilon=config.layer_norm_eps, dtype=config.dtype, scale_init=_ones((axis_name,)),
                      bias_init=_zeros((axis_name,)), name=name)


def rbg_key(key) -> jax.Array:
  """`key` as a jax 'unsafe_rbg' key (its 64 bits twice, as jax seeds its rbg keys), unless it is one: its fold_in
  and its bits are XLA's RngBitGenerator, never threefry. On a GPU each threefry of a key is a custom call (jax's
  cu_threefry2x32 kernel) that XLA cannot record into a command buffer (CUDA graph): an ELECTRA-Small step whose
  dropout keys were threefry's ran as ~160 graphs and launches (151 of its 158 threefry calls)."""
  if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
    if jax.random.key_impl(key) == 'unsafe_rbg':
      return key
    key = jax.random.key_data(key)
  return jax.random.wrap_key_data(jnp.concatenate([key, key]).astype(jnp.uint32), impl='unsafe_rbg')


RBG_DRAWS = ('rbg', 'rbg_tower')  # model.dropout_draw values that draw from XLA's RngBitGenerator


def dropout_rngs(rngs: dict | None, draw: str) -> dict | None:
  """`rngs` for Module.apply, their 'dropout' key an `rbg_key` under draw='rbg' or 'rbg_tower' (model.dropout_draw):
  the key every Dropout module derives from it (make_rng) is then no threefry either."""
  if draw not in RBG_DRAWS or not rngs or 'dropout' not in rngs:
    return rngs
  return {**rngs, 'dropout': rbg_key(rngs['dropout'])}


class Dropout(nn.Module):
  """Inverted dropout whose mask for example row r is drawn from fold_in(this module's 'dropout' key, r).

  x is [rows * n, ...] with its rows in order (n > 1 for the flattened [batch * length, hidden] tokens), rows
  [rows] int32 the index of each row in the full batch. Splitting a batch into micro-batches does not change what
  any row drops (except with draw='rbg').

  draw='uniform' compares one uniform float per element with the keep probability (jax.random.bernoulli).
  draw='bits16' compares 16 random bits with round(rate * 2^16), so one 32-bit draw serves two elements: along the
  second-to-last axis (of length m) index i takes the low halves and index i + ceil(m / 2) the high halves of the
  same words. Half the threefry work (faster on a CPU, slower on a TPU: config.DROPOUT_DRAWS); the drop
  probability is round(rate * 2^16) / 2^16, within 2^-17 of `rate` (0.1 -> 0.1000061).
  draw='rbg' draws the whole mask at once from XLA's RngBitGenerator (Philox on a GPU: 3 or 4 small kernels per mask
  in the XLA:GPU compile of Small's step, the key's fold_in and Philox's rounds, none of them a custom call that
  ends a CUDA graph as threefry's kernel does) keyed by fold_in(key, first row), the key a jax 'unsafe_rbg' key
  (`rbg_key`, `dropout_rngs`). XLA splits that draw over a mesh without changing it, so any mesh draws the
  same masks; micro-batches draw others. draw='rbg_tower' is 'rbg' where the caller gives no mask (`keep`): an
  Encoder draws the masks of all its layers' outputs at once (`tower_keep`).
  """
  rate: float
  draw: str  # model.dropout_draw, resolved: 'uniform', 'bits16', 'rbg' or 'rbg_tower'

  @nn.compact
  def __call__(self, x, rows, *, deterministic: bool, keep=None):
    """`keep`: the mask to apply, drawn by the caller (`tower_keep`); None: drawn here."""
    if deterministic or self.rate == 0.0:
      return x
    keep = self.keep(x.shape, rows) if keep is None else keep
    return jnp.where(keep, x / (1.0 - self.rate), jnp.zeros_like(x))

  def keep(self, shape, rows):
    """The boolean mask [shape] of what survives (the one `__call__` applies)."""
    key = self.make_rng('dropout')
    if self.draw in RBG_DRAWS:
      return jax.random.bernoulli(jax.random.fold_in(rbg_key(key), rows[0]), 1.0 - self.rate, shape)
    *outer, m, last = (shape[0] // rows.shape[0],) + tuple(shape[1:])

    def row(r):
      key_r = jax.random.fold_in(key, r)
      if self.draw == 'uniform':
        return jax.random.bernoulli(key_r, 1.0 - self.rate, (*outer, m, last))
      bits = jax.random.bits(key_r, (*outer, (m + 1) // 2, last), jnp.uint32)
      halves = jnp.concatenate([bits & 0xFFFF, bits >> 16], axis=-2)[..., :m, :]
      return halves >= jnp.uint32(round(self.rate * 2**16))

    return jax.vmap(row)(rows).reshape(shape)


class Embeddings(nn.Module):
  """Word + position + token-type embeddings, LayerNorm and dropout; shared by both towers."""
  config: ModelConfig

  def setup(self):
    c = self.config
    # The lookups read the float32 tables and cast what they read (the same values as a lookup in a bf16 copy), so
    # that the word table's gradient is a float32 scatter-add. In bf16, on a GPU, each update of a scatter-add is a
    # compare-and-swap loop: the rows that many tokens share ([MASK], [PAD]) serialise, and the word and token-type
    # tables' scatter-adds took 95 of the 110 ms of an ELECTRA-Small step on an H200 (BENCHMARKS.md).
    self.word_embeddings = nn.Embed(c.vocab_size, c.embedding_size, embedding_init=_init(c, ('vocab', 'token_embed')))
    self.position_embeddings = nn.Embed(c.max_position_embeddings, c.embedding_size,
                                        embedding_init=_init(c, (None, 'token_embed')))
    self.token_type_embeddings = nn.Embed(c.type_vocab_size, c.embedding_size,
                                          embedding_init=_init(c, (None, 'token_embed')))
    self.LayerNorm = layer_norm(c, 'token_embed')  # pylint: disable=invalid-name
    self.dropout = Dropout(c.dropout_rate, c.dropout_draw)

  def __call__(self, input_ids, segment_ids, *, deterministic: bool, rows=None):
    """[batch, length] ids -> [batch, length, embedding_size]."""
    c, length = self.config, input_ids.shape[-1]
    positions = self.position_embeddings.embedding[:length]  # a slice: its gradient is a pad, not a scatter
    # Two token types (or a few): each token's row chosen by a comparison per row, so that the gradient is one
    # reduction per row rather than a scatter-add into a table that every token of the batch updates.
    types = self.token_type_embeddings.embedding
    chosen = segment_ids[..., None, None] == jnp.arange(types.shape[0])[:, None]  # [batch, length, types, 1]
    token_types = jnp.sum(jnp.where(chosen, types, 0.0), axis=-2)
    x = (self.word_embeddings(input_ids) + positions[None] + token_types).astype(c.dtype)
    x = self.dropout(self.LayerNorm(x), _rows(rows, input_ids), deterministic=deterministic)
    return constrain(x, ('activation_batch', 'activation_length', 'activation_embed'))

  def attend(self, x):
    """[batch, P, embedding_size] -> [batch, P, vocab] float32 logits against the word-embedding table (tying).

    The matmul runs in the model dtype but accumulates and returns float32: bf16 logits would round away the
    differences between likely tokens (`tied_logits`).
    """
    table = jnp.asarray(self.word_embeddings.embedding, self.config.dtype)
    logits = tied_logits(x.astype(self.config.dtype), table)
    return constrain(logits, ('activation_batch', 'activation_length', 'activation_vocab'))


@jax.custom_vjp
def tied_logits(x, table):
  """x [batch, P, E] times the table [vocab, E], accumulated and returned in float32. Its backward pass takes the
  logits' gradient in the inputs' dtype, as every other layer's does: autodiff would run both of its matmuls (the
  input's and the table's gradients, each over the whole vocabulary) in float32, with TF32 or float32 GEMMs on a
  GPU over float32 copies of the gradient and the table."""
  return jnp.einsum('bpe,ve->bpv', x, table, preferred_element_type=jnp.float32)


def _tied_logits_forward(x, table):
  return tied_logits(x, table), (x, table)


def _tied_logits_backward(residuals, grad):
  x, table = residuals
  grad = grad.astype(x.dtype)
  return (jnp.einsum('bpv,ve->bpe', grad, table, preferred_element_type=jnp.float32).astype(x.dtype),
          jnp.einsum('bpv,bpe->ve', grad, x, preferred_element_type=jnp.float32).astype(table.dtype))


tied_logits.defvjp(_tied_logits_forward, _tied_logits_backward)


class ZerosLike(nn.Module):
  """Zero-initialised parameters with the names, shapes and logical axes of the parameter tree `like`; returns them
  as a tree of the same structure. GDES's delta (`Electra` with tying='gdes') is the embeddings' tree of zeros."""

  @nn.compact
  def __call__(self, like):
    out = {}
    for name, value in like.items():
      if isinstance(value, Mapping):
        out[name] = ZerosLike(name=name)(value)
      else:
        axes = value.names if isinstance(value, nn.LogicallyPartitioned) else (None,) * jnp.ndim(nn.meta.unbox(value))
        out[name] = self.param(name, _zeros(axes), jnp.shape(nn.meta.unbox(value)))
    return out


def fold_embeddings_delta(params):
  """The discriminator's own embeddings of a tying='gdes' model: `embeddings` + `discriminator/embeddings_delta`,
  in the tree of tying='embeddings' (the delta removed; the generator's view is lost). Other params pass through.

  What the discriminator computes is unchanged: fine-tuning and the Hugging Face export read this.
  """
  discriminator = params.get('discriminator', {})
  if 'embeddings_delta' not in discriminator:
    return params
  folded = dict(params)
  folded['discriminator'] = {k: v for k, v in discriminator.items() if k != 'embeddings_delta'}
  folded['embeddings'] = jax.tree.map(jnp.add, params['embeddings'], discriminator['embeddings_delta'])
  return folded


class DenseParams(nn.Module):
  """A `dense` layer's parameters (`_dense_params`), returned rather than applied: `fused_projections` applies
  several at once."""
  features: int
  config: ModelConfig
  names: tuple

  @nn.compact
  def __call__(self, in_features: int):
    return _dense_params(self, in_features, self.features, self.config, self.names)


def dense_gelu(x, features: int, config: ModelConfig, names, name: str):
  """gelu(dense(features, config, names, name)(x)): the same parameters and values, but the backward pass adds the
  bias and takes GELU's derivative again from the matmul's output (`biased_gelu`), so that the forward pass writes
  one [tokens, features] tensor, GELU's, where autodiff also kept the biased pre-activation for the backward pass
  (the FFN's widest tensor; for an H100, compiled without a GPU: Base's step bound 26.2 -> 25.3 ms)."""
  kernel, bias = DenseParams(features, config, names, name=name)(x.shape[-1])
  h = jnp.dot(x.astype(config.dtype), kernel.astype(config.dtype))
  return biased_gelu(h, bias)


@jax.custom_vjp
def biased_gelu(h, bias):
  """gelu(add_bias(h, bias)), its backward pass recomputing the biased input from `h` and `bias`. As
  jax.checkpoint would, but only `h` passes the optimization barrier that keeps XLA from merging the recomputation
  with the forward pass: jax.checkpoint passes `bias` too, and a parameter sliced from optimizer.FlatParams' vector
  then needs a kernel of its own to become a buffer (compiled for an H100 without a GPU: Small's step 1,657 -> 1,628
  kernels, the same bytes; with no barrier at all XLA writes the biased input in the forward pass, 0.3 ms more)."""
  return _gelu_of_sum(h, bias)


def _gelu_of_sum(h, bias):
  return gelu(add_bias(h, bias))


def _biased_gelu_forward(h, bias):
  return _gelu_of_sum(h, bias), (h, bias)


def _biased_gelu_backward(residuals, grad):
  h, bias = residuals
  return jax.vjp(_gelu_of_sum, jax.lax.optimization_barrier(h), bias)[1](grad)


biased_gelu.defvjp(_biased_gelu_forward, _biased_gelu_backward)


def fused_projections(x, layers, config: ModelConfig) -> list:
  """[dense(x) for each of `layers`] (`DenseParams` of one shape) as one matmul over their kernels stacked [in,
  layers, out] (model.fused_qkv). On a GPU: one GEMM, one weight cast and one bias add instead of one each per
  layer, and in the backward pass one GEMM for the input's gradient and one for the kernels'. Stacked, not
  concatenated, so that each kernel keeps its partitioning of `out`."""
  kernels, biases = zip(*(layer(x.shape[-1]) for layer in layers))
  y = jnp.einsum('ti,ilo->tlo', x.astype(config.dtype), jnp.stack(kernels, axis=1).astype(config.dtype))
  y = constrain(add_bias(y, jnp.stack(biases)), ('activation_batch', None, 'activation_heads'))
  return [y[:, i] for i in range(len(layers))]


class Padding(NamedTuple):
  """A batch's padding in the two forms the attention takes it (`padding`; XLA drops the one a config does not use).
  bias [batch, 1, 1, length]: 0 on tokens, -1e9 on padding, added to the scores (model.attention='einsum'). keys
  [batch] int32: each row's count of tokens, at least 1 (jax.nn.dot_product_attention's key_value_seq_lengths):
  input_mask is a prefix of ones, the tokens then the padding, in every example the data pipelines make. A caller
  of the model's own (`Electra.encode`, ...) must keep that contract: under model.attention xla or cudnn a mask
  with padding between tokens (1,1,0,1) is read as its count of leading tokens."""
  bias: jax.Array
  keys: jax.Array


def padding(input_mask) -> Padding:
  """The Padding of input_mask [batch, length] (1 = token). A row of padding only keeps one key in `keys` (a count
  of 0 is no length cuDNN takes); its outputs are weighed by 0, as with the bias."""
  return Padding(jnp.where(input_mask[:, None, None, :] > 0, 0.0, -1e9).astype(jnp.float32),
                 jnp.maximum(jnp.sum(input_mask > 0, axis=-1), 1).astype(jnp.int32))


class SelfAttention(nn.Module):
  """HF `attention.self`: query/key/value projections and masked softmax attention."""
  config: ModelConfig
  tower: TowerConfig

  @nn.compact
  def __call__(self, x, pad: Padding, rows, *, deterministic: bool):
    """x [tokens = batch * length, hidden], the batch's Padding -> [tokens, hidden]."""
    c, t = self.config, self.tower
    batch, length = pad.bias.shape[0], pad.bias.shape[-1]
    head_dim = t.hidden_size // t.num_heads
    split = lambda y: constrain(y.reshape(batch, length, t.num_heads, head_dim),
                                ('activation_batch', 'activation_length', 'activation_heads', None))
    names = ('query', 'key', 'value')
    if c.fused_qkv:
      projected = fused_projections(x, [DenseParams(t.hidden_size, c, ('embed', 'heads'), name=n) for n in names], c)
    else:
      projected = [dense(t.hidden_size, c, ('embed', 'heads'), n)(x) for n in names]
    q, k, v = map(split, projected)
    if c.attention in ('cudnn', 'xla'):  # jax.nn.dot_product_attention: no attention dropout (config.ATTENTIONS)
      # The padding as each row's count of keys, not as a bias: cuDNN then reads no [batch, 1, length, length]
      # bias (it takes none shaped [batch, 1, 1, length]), computes no gradient for it, and skips the padded keys.
      context = jax.nn.dot_product_attention(q, k, v, key_value_seq_lengths=pad.keys, implementation=c.attention)
      return constrain(context.reshape(x.shape[0], t.hidden_size), ('activation_batch', 'activation_heads'))
    # Scores, softmax and the attention bias in float32 whatever the model dtype.
    scores = jnp.einsum('bqhd,bkhd->bhqk', q, k, preferred_element_type=jnp.float32) / jnp.sqrt(
        jnp.float32(head_dim))
    scores_axes = ('activation_batch', 'activation_heads', 'activation_length', None)
    if jnp.dtype(c.dtype) == jnp.float32:
      probs = constrain(jax.nn.softmax(scores + pad.bias, axis=-1), scores_axes)
      probs = Dropout(c.attention_dropout_rate, c.dropout_draw)(probs, rows, deterministic=deterministic)
      probs = probs.astype(v.dtype)
      context = jnp.einsum('bhqk,bkhd->bqhd', probs, v)
    else:  # keeps one bf16 copy of the probabilities for the backward pass, not a float32 one beside it
      dropout = Dropout(c.attention_dropout_rate, c.dropout_draw)
      keep = None if deterministic or dropout.rate == 0.0 else dropout.keep(scores.shape, rows)
      logits = constrain(scores + pad.bias, scores_axes)
      context = attention.probs_times_values(logits, v, keep, dropout.rate)
    context = context.reshape(x.shape[0], t.hidden_size)
    return constrain(context, ('activation_batch', 'activation_heads'))


class Output(nn.Module):
  """HF `*.output`: dense, dropout, residual add and post-LayerNorm."""
  config: ModelConfig
  tower: TowerConfig
  in_axis: str

  @nn.compact
  def __call__(self, x, residual, rows, *, deterministic: bool, keep=None):
    """x [tokens, heads or mlp features], residual [tokens, hidden] -> [tokens, hidden]; `keep`: the dropout mask
    (Dropout) or None."""
    x = checkpoint_name(dense(self.tower.hidden_size, self.config, (self.in_axis, 'embed'), 'dense')(x), 'output')
    x = Dropout(self.config.dropout_rate, self.config.dropout_draw)(x, rows, deterministic=deterministic, keep=keep)
    return constrain(layer_norm(self.config, 'embed')(x + residual), ('activation_batch', 'activation_embed'))


class Attention(nn.Module):
  config: ModelConfig
  tower: TowerConfig

  @nn.compact
  def __call__(self, x, pad: Padding, rows, *, deterministic: bool, keep=None):
    context = SelfAttention(self.config, self.tower, name='self')(x, pad, rows, deterministic=deterministic)
    return Output(self.config, self.tower, 'heads', name='output')(context, x, rows, deterministic=deterministic,
                                                                   keep=keep)


class Intermediate(nn.Module):
  config: ModelConfig
  tower: TowerConfig

  @nn.compact
  def __call__(self, x):
    return constrain(dense_gelu(x, self.tower.intermediate_size, self.config, ('embed', 'mlp'), 'dense'),
                     ('activation_batch', 'activation_mlp'))


class Layer(nn.Module):
  """One post-LN Transformer block: LN(x + Attn(x)), then LN(h + FFN(h))."""
  config: ModelConfig
  tower: TowerConfig

  @nn.compact
  def __call__(self, x, pad: Padding, deterministic: bool, rows, keep=None):
    """`keep`: the masks of the two output dropouts [2, tokens, hidden] (`tower_keep`), or None."""
    c, t = self.config, self.tower
    h = Attention(c, t, name='attention')(x, pad, rows, deterministic=deterministic,
                                          keep=None if keep is None else keep[0])
    inner = Intermediate(c, t, name='intermediate')(h)
    return Output(c, t, 'mlp', name='output')(inner, h, rows, deterministic=deterministic,
                                              keep=None if keep is None else keep[1])


class Encoder(nn.Module):
  """A stack of `tower.num_layers` blocks named layer_0 ... layer_{n-1}."""
  config: ModelConfig
  tower: TowerConfig

  @nn.compact
  def __call__(self, x, input_mask, *, deterministic: bool, rows=None):
    """x [batch, length, hidden], input_mask [batch, length] (1 = token) -> [batch, length, hidden].

    The layers see the tokens as one [batch * length, hidden] matrix: the same math, but XLA:CPU runs the
    backward pass of 2-D matmuls about twice as fast as that of [batch, length, hidden] ones. Its first axis is
    named 'activation_batch': the rows of one sequence stay together, so it splits over devices as the batch does.

    With `config.scan_layers` one `nn.scan` runs the layers, whose parameters are stacked in `layers` ([num_layers,
    ...] arrays, see `unstack_layers`): the compiler sees one layer instead of num_layers copies. Each layer then
    draws its dropout from its own split of the key, not from its name, so only dropout differs from the
    unrolled stack.
    """
    rows = _rows(rows, input_mask)
    pad = padding(input_mask)
    block = remat(Layer, self.config.remat)
    h = constrain(x.reshape(-1, x.shape[-1]), ('activation_batch', 'activation_embed'))
    if self.config.scan_layers:
      step = lambda layer, carry, pad, r: (layer(carry, pad, deterministic, r), None)
      scanned = nn.scan(step, variable_axes={'params': 0}, split_rngs={'params': True, 'dropout': True},
                        in_axes=(nn.broadcast, nn.broadcast), length=self.tower.num_layers,
                        metadata_params={nn.PARTITION_NAME: None})
      h, _ = scanned(block(self.config, self.tower, name='layers'), h, pad, rows)
    else:
      keep = self.tower_keep(h.shape, rows, deterministic)
      for i in range(self.tower.num_layers):
        h = block(self.config, self.tower, name=f'layer_{i}')(h, pad, deterministic, rows,
                                                              None if keep is None else keep[i])
    return constrain(h.reshape(x.shape[:2] + (h.shape[-1],)),
                     ('activation_batch', 'activation_length', 'activation_embed'))

  def tower_keep(self, shape, rows, deterministic: bool):
    """Under model.dropout_draw='rbg_tower' (and dropout on): the masks of every layer's two output dropouts,
    [num_layers, 2, *shape], in one RngBitGenerator draw keyed as an 'rbg' Dropout keys its one (fold_in(this
    module's key, first row)); else None (each Dropout draws its own). One draw, not 2 x num_layers: on a GPU each
    draw is 3 or 4 small kernels, ~150 of ELECTRA-Small's step. The masks are held all at once (Small: 12 x 2 x
    16,384 x 256 booleans, 100 MB, for the discriminator)."""
    c = self.config
    if c.dropout_draw != 'rbg_tower' or deterministic or c.dropout_rate == 0.0:
      return None
    key = jax.random.fold_in(rbg_key(self.make_rng('dropout')), rows[0])
    return jax.random.bernoulli(key, 1.0 - c.dropout_rate, (self.tower.num_layers, 2, *shape))


REMAT_POLICIES = {
    'full': None,  # nothing saveable: the layer's input only
    'dots': jax.checkpoint_policies.dots_saveable,
    'dots_no_batch': jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    'outputs': jax.checkpoint_policies.save_only_these_names('output'),
}


def remat(layer, name: str):
  """`layer` (a Layer class) rematerialised by `model.remat` policy `name` (see `config.REMATS`)."""
  if name == 'none':
    return layer
  return nn.remat(layer, static_argnums=(3,), policy=REMAT_POLICIES[name])


def unstack_layers(params):
  """`params` of a `model.scan_layers` model in the unrolled layout: each encoder's `layers` subtree, whose arrays
  are stacked along a leading [num_layers] axis, becomes `layer_0` ... `layer_{n-1}`. Unrolled params pass through.

  The unrolled layout is the one fine-tuning (layer-wise learning rates), the converters and `detect` work with.
  """
  if not isinstance(params, dict):
    return params
  if 'layers' in params:  # an encoder
    stacked = params['layers']
    return {f'layer_{i}': jax.tree.map(lambda x, i=i: x[i], stacked)
            for i in range(jax.tree.leaves(stacked)[0].shape[0])}
  return {name: unstack_layers(value) for name, value in params.items()}


class _Tower(nn.Module):
  """One encoder over the embeddings: optional E->H `embeddings_project`, the encoder, then a head."""
  config: ModelConfig
  is_generator = False
  has_encoder = True

  def setup(self):
    if self.has_encoder:
      c = self.config
      tower = c.tower(self.is_generator)
      self.project = c.embedding_size != tower.hidden_size
      if self.project:
        self.embeddings_project = dense(tower.hidden_size, c, ('token_embed', 'embed'), None, glorot=True)
      self.encoder = Encoder(c, tower)
    self.setup_head()

  def setup_head(self):
    raise NotImplementedError

  def __call__(self, embedded, input_mask, *, deterministic: bool, rows=None):
    """[batch, length, embedding_size] -> [batch, length, tower hidden]."""
    if self.project:
      embedded = self.embeddings_project(embedded)
    return self.encoder(embedded, input_mask, deterministic=deterministic, rows=rows)


class GeneratorHead(nn.Module):
  """HF `generator_predictions`: dense(H_gen -> E) -> GELU -> LayerNorm."""
  config: ModelConfig

  @nn.compact
  def __call__(self, x):
    x = dense_gelu(x, self.config.embedding_size, self.config, ('embed', 'token_embed'), 'dense')
    return layer_norm(self.config, 'token_embed')(x)


class LMHeadBias(nn.Module):
  """HF `generator_lm_head`: its weight is the tied word-embedding table, only the bias is its own."""
  vocab_size: int

  @nn.compact
  def __call__(self, logits):
    return logits + self.param('bias', _zeros(('vocab',)), (self.vocab_size,)).astype(logits.dtype)


class DiscriminatorHead(nn.Module):
  """HF `discriminator_predictions`: dense(H -> H) -> GELU -> dense(H -> 1), one logit per token."""
  config: ModelConfig

  @nn.compact
  def __call__(self, x):
    x = dense_gelu(x, self.config.hidden_size, self.config, ('embed', 'mlp'), 'dense')
    x = constrain(x, ('activation_batch', 'activation_length', 'activation_mlp'))
    # The H -> 1 projection is cheap: float32 keeps the logit (and the loss) exact under bfloat16.
    f32 = dataclasses.replace(self.config, dtype='float32')
    return constrain(dense(1, f32, ('mlp', None), 'dense_prediction', glorot=True)(x)[..., 0],
                     ('activation_batch', 'activation_length'))


class Generator(_Tower):
  """The masked-language-model tower and its head.

  `config` is `ModelConfig.generator_model()`. `own_embeddings` (tying='none'): an `embeddings` module of its own
  (as wide as the generator) that its head also reads; `has_encoder` False (tying='all'): no encoder, it runs the
  discriminator's (`Electra` passes the hidden states in). `baseline`: an `adversarial_baseline` logit per
  position (the learned REINFORCE baseline of objective 'electra_adversarial').
  """
  own_embeddings: bool = False
  has_encoder: bool = True
  baseline: bool = False
  is_generator = True

  def setup_head(self):
    if self.own_embeddings:
      self.embeddings = Embeddings(self.config)
    self.generator_predictions = GeneratorHead(self.config)
    self.generator_lm_head = LMHeadBias(self.config.vocab_size)
    if self.baseline:  # float32, as the discriminator's H -> 1 logit: the loss reads it
      self.adversarial_baseline = dense(1, dataclasses.replace(self.config, dtype='float32'), ('embed', None), None)

  def logits(self, hidden, embeddings: Embeddings):
    """[batch, P, H_gen] hidden states -> [batch, P, vocab] float32 MLM logits through the tied embedding table."""
    return self.generator_lm_head(embeddings.attend(self.generator_predictions(hidden)))

  def baseline_logits(self, hidden):
    """[batch, P, H_gen] -> [batch, P] float32 logits z of the REINFORCE baseline b = -log sigmoid(z)."""
    return self.adversarial_baseline(hidden)[..., 0].astype(jnp.float32)


class Discriminator(_Tower):
  """The discriminator-sized tower and its head: replaced-token detection, or an MLM head (ablations).

  `head` is 'rtd' (`discriminator_predictions`), 'mlm' (`mlm_predictions` + `mlm_lm_head`, named like the
  generator's head) or 'mlm_copy' ('mlm' plus `copy_gate`, a per-token sigmoid logit for All-Tokens MLM).
  """
  head: str = 'rtd'
  gdes: bool = False  # tying='gdes': an `embeddings_delta` of its own (see `Electra.discriminator_embedded`)

  def setup_head(self):
    if self.head not in ('rtd', 'mlm', 'mlm_copy'):
      raise ValueError(f"Discriminator head must be 'rtd', 'mlm' or 'mlm_copy', got {self.head!r}")
    if self.gdes:
      self.embeddings_delta = ZerosLike()
    if self.head == 'rtd':
      self.discriminator_predictions = DiscriminatorHead(self.config)
    else:
      self.mlm_predictions = GeneratorHead(self.config)
      self.mlm_lm_head = LMHeadBias(self.config.vocab_size)
    if self.head == 'mlm_copy':  # float32, as the discriminator's H -> 1 logit: the loss reads it
      self.copy_gate = dense(1, dataclasses.replace(self.config, dtype='float32'), ('embed', None), None)

  def logits(self, hidden):
    """[batch, length, H] -> [batch, length] float32 'replaced' logits."""
    return self.discriminator_predictions(hidden)

  def mlm_logits(self, hidden, embeddings: Embeddings):
    """[..., H] -> ([..., vocab] float32 MLM logits, [...] float32 copy-gate logits or None)."""
    logits = self.mlm_lm_head(embeddings.attend(self.mlm_predictions(hidden)).astype(jnp.float32))
    copy = self.copy_gate(hidden)[..., 0].astype(jnp.float32) if self.head == 'mlm_copy' else None
    return logits, copy


class Electra(nn.Module):
  """Generator and discriminator over one shared embedding module (by default).

  Params: {'embeddings': ..., 'generator': {embeddings_project?, encoder, generator_predictions,
  generator_lm_head}, 'discriminator': {embeddings_project?, encoder, discriminator_predictions}}.
  `config.tying` changes what the generator shares: 'none' gives it its own 'generator/embeddings' (then the
  top-level 'embeddings' are the discriminator's alone), 'all' removes its encoder and embeddings_project: it
  runs the discriminator's, and 'generator' holds only its heads; 'gdes' adds 'discriminator/embeddings_delta'
  (see `discriminator_embedded`).
  The objective ablations (`electra_jax.objective.OBJECTIVES`) drop the generator (`with_generator=False`), give
  the discriminator an MLM head (`discriminator_head='mlm'` or `'mlm_copy'`, see `Discriminator`), or give the
  generator a REINFORCE baseline head (`generator_baseline`).
  """
  config: ModelConfig
  with_generator: bool = True
  discriminator_head: str = 'rtd'
  generator_baseline: bool = False

  def setup(self):
    c = self.config
    self.embeddings = Embeddings(c)
    if self.with_generator:
      self.generator = Generator(c.generator_model(), own_embeddings=c.tying == 'none',
                                 has_encoder=c.tying != 'all', baseline=self.generator_baseline)
    self.discriminator = Discriminator(c, head=self.discriminator_head, gdes=c.tying == 'gdes')

  def discriminator_embedded(self, input_ids, segment_ids, *, deterministic: bool, rows=None):
    """[batch, length] ids -> [batch, length, embedding_size]: the embeddings the discriminator reads.

    The shared `embeddings`, or with tying='gdes' (DeBERTa-v3's gradient-disentangled embedding sharing, arXiv
    2111.09543) an `Embeddings` whose every parameter is stop_gradient(the shared one) + the discriminator's own
    zero-initialised `embeddings_delta`: the discriminator's loss moves only the delta, the generator's MLM alone
    trains the shared tables, and at initialisation the discriminator computes what tying='embeddings' does.
    Its embedding dropout is then drawn from another key than the shared module's (still row by row).
    """
    if self.config.tying != 'gdes':
      return self.embeddings(input_ids, segment_ids, deterministic=deterministic, rows=rows)
    if self.is_initializing():  # the shared tables must exist before they are read (encode alone initialises)
      self.embeddings(input_ids, segment_ids, deterministic=True)
    shared = self.embeddings.variables['params']
    delta = self.discriminator.embeddings_delta(shared)
    params = jax.tree.map(lambda s, d: jax.lax.stop_gradient(s) + d, nn.meta.unbox(shared), delta)
    rngs = {} if deterministic else {'dropout': self.make_rng('dropout')}
    return Embeddings(self.config, parent=None).apply({'params': params}, input_ids, segment_ids,
                                                      deterministic=deterministic, rows=rows, rngs=rngs)

  def _generator_hidden(self, input_ids, segment_ids, input_mask, positions, *, deterministic: bool, rows):
    """(generator hidden states at `positions` [batch, P, H_gen], the embeddings its head reads)."""
    embeddings = self.generator.embeddings if self.config.tying == 'none' else self.embeddings
    embedded = embeddings(input_ids, segment_ids, deterministic=deterministic, rows=rows)
    tower = self.discriminator if self.config.tying == 'all' else self.generator
    hidden = tower(embedded, input_mask, deterministic=deterministic, rows=rows)
    return jnp.take_along_axis(hidden, positions[..., None], axis=1), embeddings

  def generator_logits(self, input_ids, segment_ids, input_mask, positions, *, deterministic: bool = True,
                       rows=None):
    """Masked inputs [batch, length] and positions [batch, P] -> MLM logits [batch, P, vocab] (float32).

    The vocabulary projection runs only at the P selected positions, not at all `length` tokens. `rows` [batch]:
    each row's index in the full batch (keys its dropout; default 0..batch-1).
    """
    hidden, embeddings = self._generator_hidden(input_ids, segment_ids, input_mask, positions,
                                                deterministic=deterministic, rows=rows)
    return self.generator.logits(hidden, embeddings)

  def generator_logits_and_baseline(self, input_ids, segment_ids, input_mask, positions, *,
                                    deterministic: bool = True, rows=None):
    """`generator_logits` and the baseline logits [batch, P] (float32) of the adversarial generator."""
    hidden, embeddings = self._generator_hidden(input_ids, segment_ids, input_mask, positions,
                                                deterministic=deterministic, rows=rows)
    return self.generator.logits(hidden, embeddings), self.generator.baseline_logits(hidden)

  def discriminator_logits(self, input_ids, segment_ids, input_mask, *, deterministic: bool = True, rows=None):
    """Corrupted inputs [batch, length] -> per-token 'replaced' logits [batch, length] (float32)."""
    embedded = self.discriminator_embedded(input_ids, segment_ids, deterministic=deterministic, rows=rows)
    return self.discriminator.logits(self.discriminator(embedded, input_mask, deterministic=deterministic,
                                                        rows=rows))

  def discriminator_mlm_logits(self, input_ids, segment_ids, input_mask, positions=None, *,
                               deterministic: bool = True, rows=None):
    """MLM of the discriminator-sized model: ([batch, P, vocab] logits, [batch, P] copy-gate logits or None).

    At `positions` [batch, P], or at every token ([batch, length, ...]) when `positions` is None.
    """
    embedded = self.embeddings(input_ids, segment_ids, deterministic=deterministic, rows=rows)
    hidden = self.discriminator(embedded, input_mask, deterministic=deterministic, rows=rows)
    if positions is not None:
      hidden = jnp.take_along_axis(hidden, positions[..., None], axis=1)
    return self.discriminator.mlm_logits(hidden, self.embeddings)

  def encode(self, input_ids, segment_ids, input_mask, *, deterministic: bool = True, rows=None):
    """The discriminator's last hidden states [batch, length, H]: what fine-tuning builds on."""
    embedded = self.discriminator_embedded(input_ids, segment_ids, deterministic=deterministic, rows=rows)
    return self.discriminator(embedded, input_mask, deterministic=deterministic, rows=rows)

  def __call__(self, input_ids, segment_ids, input_mask, positions, *, deterministic: bool = True):
    """Runs both towers (used to initialise every parameter)."""
    gen = None
    if self.with_generator:
      method = self.generator_logits_and_baseline if self.generator_baseline else self.generator_logits
      gen = method(input_ids, segment_ids, input_mask, positions, deterministic=deterministic)
    if self.discriminator_head == 'rtd':
      return gen, self.discriminator_logits(input_ids, segment_ids, input_mask, deterministic=deterministic)
    return gen, self.discriminator_mlm_logits(input_ids, segment_ids, input_mask, positions,
                                              deterministic=deterministic)
