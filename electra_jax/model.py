"""ELECTRA in Flax linen: shared embeddings, a post-LN BERT encoder per tower, generator and discriminator heads.

Parameter names follow Hugging Face's `ElectraForPreTraining` / `ElectraForMaskedLM` one-to-one (see
`electra_jax.convert`), e.g. `discriminator/encoder/layer_3/attention/self/query/kernel` is
`electra.encoder.layer.3.attention.self.query.weight` (transposed). Every parameter carries logical axis names
(`vocab`, `embed`, `token_embed`, `heads`, `mlp`) that `electra_jax.sharding` maps onto the device mesh.
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

from electra_jax.config import ModelConfig, TowerConfig

# ELECTRA uses the exact (erf) GELU; flax's default is the tanh approximation.
gelu = functools.partial(nn.gelu, approximate=False)


def _init(config: ModelConfig, names):
  return nn.with_logical_partitioning(nn.initializers.truncated_normal(config.initializer_range), names)


def _zeros(names):
  return nn.with_logical_partitioning(nn.initializers.zeros_init(), names)


def _ones(names):
  return nn.with_logical_partitioning(nn.initializers.ones_init(), names)


def dense(features, config: ModelConfig, names, name):
  """A Dense layer named `name` whose kernel has logical axes `names` and whose bias has `names[1]`."""
  return nn.Dense(features, dtype=config.dtype, kernel_init=_init(config, names),
                  bias_init=_zeros(names[1:]), name=name)


def layer_norm(config: ModelConfig, axis_name: str, name: str = 'LayerNorm'):
  return nn.LayerNorm(epsilon=config.layer_norm_eps, dtype=config.dtype, scale_init=_ones((axis_name,)),
                      bias_init=_zeros((axis_name,)), name=name)


class Embeddings(nn.Module):
  """Word + position + token-type embeddings, LayerNorm and dropout; shared by both towers."""
  config: ModelConfig

  def setup(self):
    c = self.config
    self.word_embeddings = nn.Embed(c.vocab_size, c.embedding_size, dtype=c.dtype,
                                    embedding_init=_init(c, ('vocab', 'token_embed')))
    self.position_embeddings = nn.Embed(c.max_position_embeddings, c.embedding_size, dtype=c.dtype,
                                        embedding_init=_init(c, (None, 'token_embed')))
    self.token_type_embeddings = nn.Embed(c.type_vocab_size, c.embedding_size, dtype=c.dtype,
                                          embedding_init=_init(c, (None, 'token_embed')))
    self.LayerNorm = layer_norm(c, 'token_embed')  # pylint: disable=invalid-name
    self.dropout = nn.Dropout(c.dropout_rate)

  def __call__(self, input_ids, segment_ids, *, deterministic: bool):
    """[batch, length] ids -> [batch, length, embedding_size]."""
    length = input_ids.shape[-1]
    x = (self.word_embeddings(input_ids) + self.position_embeddings(jnp.arange(length))[None]
         + self.token_type_embeddings(segment_ids))
    return self.dropout(self.LayerNorm(x), deterministic=deterministic)

  def attend(self, x):
    """[..., embedding_size] -> [..., vocab] logits against the word-embedding table (weight tying)."""
    return self.word_embeddings.attend(x)


class SelfAttention(nn.Module):
  """HF `attention.self`: query/key/value projections and masked softmax attention."""
  config: ModelConfig
  tower: TowerConfig

  @nn.compact
  def __call__(self, x, attention_bias, *, deterministic: bool):
    """x [tokens = batch * length, hidden], attention_bias [batch, 1, 1, length] -> [tokens, hidden]."""
    c, t = self.config, self.tower
    batch, length = attention_bias.shape[0], attention_bias.shape[-1]
    head_dim = t.hidden_size // t.num_heads
    split = lambda y: y.reshape(batch, length, t.num_heads, head_dim)
    q, k, v = (split(dense(t.hidden_size, c, ('embed', 'heads'), n)(x)) for n in ('query', 'key', 'value'))
    scores = jnp.einsum('bqhd,bkhd->bhqk', q, k).astype(jnp.float32) / jnp.sqrt(head_dim).astype(jnp.float32)
    probs = jax.nn.softmax(scores + attention_bias, axis=-1)
    probs = nn.Dropout(c.attention_dropout_rate)(probs, deterministic=deterministic).astype(v.dtype)
    return jnp.einsum('bhqk,bkhd->bqhd', probs, v).reshape(x.shape[0], t.hidden_size)


class Output(nn.Module):
  """HF `*.output`: dense, dropout, residual add and post-LayerNorm."""
  config: ModelConfig
  tower: TowerConfig
  in_axis: str

  @nn.compact
  def __call__(self, x, residual, *, deterministic: bool):
    x = dense(self.tower.hidden_size, self.config, (self.in_axis, 'embed'), 'dense')(x)
    x = nn.Dropout(self.config.dropout_rate)(x, deterministic=deterministic)
    return layer_norm(self.config, 'embed')(x + residual)


class Attention(nn.Module):
  config: ModelConfig
  tower: TowerConfig

  @nn.compact
  def __call__(self, x, attention_bias, *, deterministic: bool):
    context = SelfAttention(self.config, self.tower, name='self')(x, attention_bias, deterministic=deterministic)
    return Output(self.config, self.tower, 'heads', name='output')(context, x, deterministic=deterministic)


class Intermediate(nn.Module):
  config: ModelConfig
  tower: TowerConfig

  @nn.compact
  def __call__(self, x):
    return gelu(dense(self.tower.intermediate_size, self.config, ('embed', 'mlp'), 'dense')(x))


class Layer(nn.Module):
  """One post-LN Transformer block: LN(x + Attn(x)), then LN(h + FFN(h))."""
  config: ModelConfig
  tower: TowerConfig

  @nn.compact
  def __call__(self, x, attention_bias, deterministic: bool):
    c, t = self.config, self.tower
    h = Attention(c, t, name='attention')(x, attention_bias, deterministic=deterministic)
    inner = Intermediate(c, t, name='intermediate')(h)
    return Output(c, t, 'mlp', name='output')(inner, h, deterministic=deterministic)


class Encoder(nn.Module):
  """A stack of `tower.num_layers` blocks named layer_0 ... layer_{n-1}."""
  config: ModelConfig
  tower: TowerConfig

  @nn.compact
  def __call__(self, x, input_mask, *, deterministic: bool):
    """x [batch, length, hidden], input_mask [batch, length] (1 = token) -> [batch, length, hidden].

    The layers see the tokens as one [batch * length, hidden] matrix: the same math, but XLA:CPU runs the
    backward pass of 2-D matmuls about twice as fast as that of [batch, length, hidden] ones.
    """
    attention_bias = jnp.where(input_mask[:, None, None, :] > 0, 0.0, -1e9).astype(jnp.float32)
    block = nn.remat(Layer, static_argnums=(3,)) if self.config.remat else Layer
    h = x.reshape(-1, x.shape[-1])
    for i in range(self.tower.num_layers):
      h = block(self.config, self.tower, name=f'layer_{i}')(h, attention_bias, deterministic)
    return h.reshape(x.shape[:2] + (h.shape[-1],))


class _Tower(nn.Module):
  """One encoder over the shared embeddings: optional E->H `embeddings_project`, the encoder, then a head."""
  config: ModelConfig
  is_generator = False

  def setup(self):
    c = self.config
    tower = c.tower(self.is_generator)
    self.project = c.embedding_size != tower.hidden_size
    if self.project:
      self.embeddings_project = dense(tower.hidden_size, c, ('token_embed', 'embed'), None)
    self.encoder = Encoder(c, tower)
    self.setup_head()

  def setup_head(self):
    raise NotImplementedError

  def __call__(self, embedded, input_mask, *, deterministic: bool):
    """[batch, length, embedding_size] -> [batch, length, tower hidden]."""
    if self.project:
      embedded = self.embeddings_project(embedded)
    return self.encoder(embedded, input_mask, deterministic=deterministic)


class GeneratorHead(nn.Module):
  """HF `generator_predictions`: dense(H_gen -> E) -> GELU -> LayerNorm."""
  config: ModelConfig

  @nn.compact
  def __call__(self, x):
    x = gelu(dense(self.config.embedding_size, self.config, ('embed', 'token_embed'), 'dense')(x))
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
    x = gelu(dense(self.config.hidden_size, self.config, ('embed', 'mlp'), 'dense')(x))
    return dense(1, self.config, ('mlp', None), 'dense_prediction')(x)[..., 0]


class Generator(_Tower):
  """The small masked-language-model tower and its head."""
  is_generator = True

  def setup_head(self):
    self.generator_predictions = GeneratorHead(self.config)
    self.generator_lm_head = LMHeadBias(self.config.vocab_size)

  def logits(self, hidden, embeddings: Embeddings):
    """[..., H_gen] hidden states -> [..., vocab] float32 MLM logits through the tied embedding table."""
    logits = embeddings.attend(self.generator_predictions(hidden))
    return self.generator_lm_head(logits.astype(jnp.float32))


class Discriminator(_Tower):
  """The discriminator-sized tower and its head: replaced-token detection, or an MLM head (ablations).

  `head` is 'rtd' (`discriminator_predictions`), 'mlm' (`mlm_predictions` + `mlm_lm_head`, named like the
  generator's head) or 'mlm_copy' ('mlm' plus `copy_gate`, a per-token sigmoid logit for All-Tokens MLM).
  """
  head: str = 'rtd'

  def setup_head(self):
    if self.head not in ('rtd', 'mlm', 'mlm_copy'):
      raise ValueError(f"Discriminator head must be 'rtd', 'mlm' or 'mlm_copy', got {self.head!r}")
    if self.head == 'rtd':
      self.discriminator_predictions = DiscriminatorHead(self.config)
    else:
      self.mlm_predictions = GeneratorHead(self.config)
      self.mlm_lm_head = LMHeadBias(self.config.vocab_size)
    if self.head == 'mlm_copy':
      self.copy_gate = dense(1, self.config, ('embed', None), None)

  def logits(self, hidden):
    """[batch, length, H] -> [batch, length] float32 'replaced' logits."""
    return self.discriminator_predictions(hidden).astype(jnp.float32)

  def mlm_logits(self, hidden, embeddings: Embeddings):
    """[..., H] -> ([..., vocab] float32 MLM logits, [...] float32 copy-gate logits or None)."""
    logits = self.mlm_lm_head(embeddings.attend(self.mlm_predictions(hidden)).astype(jnp.float32))
    copy = self.copy_gate(hidden)[..., 0].astype(jnp.float32) if self.head == 'mlm_copy' else None
    return logits, copy


class Electra(nn.Module):
  """Generator and discriminator over one shared embedding module.

  Params: {'embeddings': ..., 'generator': {embeddings_project?, encoder, generator_predictions,
  generator_lm_head}, 'discriminator': {embeddings_project?, encoder, discriminator_predictions}}.
  The objective ablations (`electra_jax.objective.OBJECTIVES`) drop the generator (`with_generator=False`) or
  give the discriminator an MLM head (`discriminator_head='mlm'` or `'mlm_copy'`, see `Discriminator`).
  """
  config: ModelConfig
  with_generator: bool = True
  discriminator_head: str = 'rtd'

  def setup(self):
    self.embeddings = Embeddings(self.config)
    if self.with_generator:
      self.generator = Generator(self.config)
    self.discriminator = Discriminator(self.config, head=self.discriminator_head)

  def generator_logits(self, input_ids, segment_ids, input_mask, positions, *, deterministic: bool = True):
    """Masked inputs [batch, length] and positions [batch, P] -> MLM logits [batch, P, vocab] (float32).

    The vocabulary projection runs only at the P selected positions, not at all `length` tokens.
    """
    embedded = self.embeddings(input_ids, segment_ids, deterministic=deterministic)
    hidden = self.generator(embedded, input_mask, deterministic=deterministic)
    hidden = jnp.take_along_axis(hidden, positions[..., None], axis=1)
    return self.generator.logits(hidden, self.embeddings)

  def discriminator_logits(self, input_ids, segment_ids, input_mask, *, deterministic: bool = True):
    """Corrupted inputs [batch, length] -> per-token 'replaced' logits [batch, length] (float32)."""
    embedded = self.embeddings(input_ids, segment_ids, deterministic=deterministic)
    return self.discriminator.logits(self.discriminator(embedded, input_mask, deterministic=deterministic))

  def discriminator_mlm_logits(self, input_ids, segment_ids, input_mask, positions=None, *,
                               deterministic: bool = True):
    """MLM of the discriminator-sized model: ([batch, P, vocab] logits, [batch, P] copy-gate logits or None).

    At `positions` [batch, P], or at every token ([batch, length, ...]) when `positions` is None.
    """
    embedded = self.embeddings(input_ids, segment_ids, deterministic=deterministic)
    hidden = self.discriminator(embedded, input_mask, deterministic=deterministic)
    if positions is not None:
      hidden = jnp.take_along_axis(hidden, positions[..., None], axis=1)
    return self.discriminator.mlm_logits(hidden, self.embeddings)

  def encode(self, input_ids, segment_ids, input_mask, *, deterministic: bool = True):
    """The discriminator's last hidden states [batch, length, H]: what fine-tuning builds on."""
    embedded = self.embeddings(input_ids, segment_ids, deterministic=deterministic)
    return self.discriminator(embedded, input_mask, deterministic=deterministic)

  def __call__(self, input_ids, segment_ids, input_mask, positions, *, deterministic: bool = True):
    """Runs both towers (used to initialise every parameter)."""
    gen = (self.generator_logits(input_ids, segment_ids, input_mask, positions, deterministic=deterministic)
           if self.with_generator else None)
    if self.discriminator_head == 'rtd':
      return gen, self.discriminator_logits(input_ids, segment_ids, input_mask, deterministic=deterministic)
    return gen, self.discriminator_mlm_logits(input_ids, segment_ids, input_mask, positions,
                                              deterministic=deterministic)
