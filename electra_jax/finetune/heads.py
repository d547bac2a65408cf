"""Task heads on ELECTRA's discriminator (Electra.encode), and their losses.

`Finetuner` is `Electra` plus a `head`: its parameters are {'embeddings', 'discriminator', 'head'}, the first two
exactly the pre-trained subtrees (the generator is never called, so it has no parameters here; the pre-trained
`discriminator_predictions` are not used). Heads, as in the ELECTRA paper and code:
  classification/regression  h[CLS] -> dropout -> dense(num_labels or 1)
  tagging                    h[token] -> dropout -> dense(num_tags) (the label sits on each word's first sub-token)
  squad                      start = dense(1)(h); end = dense(1)(gelu(dense(512)([h; h_start]))) with the gold
                             start in training and a beam of the top-k starts otherwise; and an "impossible"
                             logit dense(1)(gelu(dense(512)([h_CLS; softmax(start) . H]))), trained on SQuAD 1.1
                             too (official answerable_classifier=True for every QA task; only 2.0 decodes with it).
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from electra_jax.config import ModelConfig
from electra_jax.finetune import tasks
from electra_jax.finetune.config import SquadConfig
from electra_jax.model import Electra, add_bias, dense, gelu

NEG = 1000.0  # subtracted from span logits outside [CLS] + context, as the official code does


class DenseHead(nn.Module):
  """Dropout -> dense on the hidden states: at [CLS] ({'logits': [batch, num_outputs]}, classification and
  regression) or at every token ({'logits': [batch, length, num_outputs]}, tagging)."""
  config: ModelConfig
  num_outputs: int
  dropout_rate: float
  cls_only: bool

  @nn.compact
  def __call__(self, hidden, batch, *, train: bool):
    del batch
    x = hidden[:, 0] if self.cls_only else hidden
    x = nn.Dropout(self.dropout_rate)(x, deterministic=not train)
    return {'logits': dense(self.num_outputs, self.config, ('embed', None), 'dense')(x).astype(jnp.float32)}


class PairDense(nn.Module):
  """dense(features)([a; b]) computed as a W_a + b W_b: `a` [..., H] and `b` [..., H'] broadcast against each
  other (e.g. every token with each of k start tokens) without materialising their concatenation."""
  features: int
  config: ModelConfig

  @nn.compact
  def __call__(self, a, b):
    c = self.config
    init = nn.with_logical_partitioning(nn.initializers.truncated_normal(c.initializer_range), (None, None))
    kernel = self.param('kernel', init, (a.shape[-1] + b.shape[-1], self.features)).astype(c.dtype)
    bias = self.param('bias', nn.with_logical_partitioning(nn.initializers.zeros_init(), (None,)), (self.features,))
    return add_bias(a.astype(c.dtype) @ kernel[:a.shape[-1]] + b.astype(c.dtype) @ kernel[a.shape[-1]:], bias)


class SquadHead(nn.Module):
  """Span (and, for SQuAD 2.0, answerability) logits.

  train: {'start_logits', 'end_logits' [batch, length]}, end logits conditioned on
  the gold start. Otherwise, with k = min(beam_size, length): {'start_top_log_probs', 'start_top_index'
  [batch, k], 'end_top_log_probs', 'end_top_index' [batch, k, k]}. Always 'impossible_logit' [batch].
  """
  config: ModelConfig
  squad: SquadConfig

  @nn.compact
  def __call__(self, hidden, batch, *, train: bool):
    c = self.config
    length = hidden.shape[1]
    answer_mask = (batch['input_mask'] * batch['segment_ids']).astype(jnp.float32).at[:, 0].set(1.0)
    start_logits = dense(1, c, ('embed', None), 'start_logits')(hidden)[..., 0].astype(jnp.float32)
    start_logits -= NEG * (1.0 - answer_mask)
    end_hidden = PairDense(512, c, name='end_hidden')
    end_output = dense(1, c, (None, None), 'end_logits')

    def end_logits_given(start_features):
      """start_features [batch, H] (gold) or [batch, k, H] (beam) -> end logits [batch, (k,) length]."""
      if start_features.ndim == 2:
        h, mask = end_hidden(hidden, start_features[:, None, :]), answer_mask
      else:
        h, mask = end_hidden(hidden[:, None], start_features[:, :, None, :]), answer_mask[:, None]
      return end_output(gelu(h))[..., 0].astype(jnp.float32) - NEG * (1.0 - mask)

    if train:
      gold = jax.nn.one_hot(batch['start_positions'], length, dtype=hidden.dtype)
      outputs = {'start_logits': start_logits,
                 'end_logits': end_logits_given(jnp.einsum('blh,bl->bh', hidden, gold))}
    else:
      k = min(self.squad.beam_size, length)
      start_top_log_probs, start_top_index = jax.lax.top_k(jax.nn.log_softmax(start_logits), k)
      start_features = jnp.take_along_axis(hidden, start_top_index[..., None], axis=1)
      end_top_log_probs, end_top_index = jax.lax.top_k(jax.nn.log_softmax(end_logits_given(start_features)), k)
      outputs = {'start_top_log_probs': start_top_log_probs, 'start_top_index': start_top_index,
                 'end_top_log_probs': end_top_log_probs, 'end_top_index': end_top_index}
    start_feature = jnp.einsum('bl,blh->bh', jax.nn.softmax(start_logits).astype(hidden.dtype), hidden)
    x = gelu(dense(512, c, (None, None), 'answerable_hidden')(jnp.concatenate([hidden[:, 0], start_feature], -1)))
    outputs['impossible_logit'] = dense(1, c, (None, None), 'answerable_logit')(x)[..., 0].astype(jnp.float32)
    return outputs


class Finetuner(Electra):
  """Electra with a task head; `__call__(batch, train=...)` returns the head's outputs (see the heads)."""
  kind: str = tasks.CLASSIFICATION
  num_outputs: int = 2
  head_dropout: float = 0.1
  squad: SquadConfig = SquadConfig()

  def setup(self):
    super().setup()
    if self.kind == tasks.SQUAD:
      self.head = SquadHead(self.config, self.squad)
    else:  # tagging: every token; classification and regression: [CLS]
      self.head = DenseHead(self.config, self.num_outputs, self.head_dropout, cls_only=self.kind != tasks.TAGGING)

  def __call__(self, batch, *, train: bool = False):  # pylint: disable=arguments-differ
    """batch: input_ids, segment_ids, input_mask [batch, length] int32 (+ start_positions [batch] for SQuAD)."""
    hidden = self.encode(batch['input_ids'], batch['segment_ids'], batch['input_mask'], deterministic=not train)
    return self.head(hidden, batch, train=train)


def make_model(task: tasks.Task, config: ModelConfig, head_dropout: float, squad: SquadConfig) -> Finetuner:
  num_outputs = 1 if task.kind in (tasks.REGRESSION, tasks.SQUAD) else len(task.labels)
  return Finetuner(config, kind=task.kind, num_outputs=num_outputs, head_dropout=head_dropout, squad=squad)


def loss(kind: str, outputs, batch, squad: SquadConfig):
  """(The loss summed over the batch, the number of rows or labelled tokens), float32 scalars.

  The sum is what the train step differentiates (as the official code does); the count only turns it into the
  logged mean. Rows/tokens without a label do not count. Per row: classification cross-entropy, labels [batch]
  (-1: none); regression squared error, labels [batch] (NaN: none); tagging the sum of the cross-entropies of
  its labelled tokens, labels [batch, length]; squad, per window, (CE(start) + CE(end)) / 2 +
  answerable_weight * sigmoid CE(impossible logit, is_impossible), on SQuAD 1.1 too.
  """
  if kind == tasks.REGRESSION:
    labels = batch['labels']
    weight = (~jnp.isnan(labels)).astype(jnp.float32)
    error = jnp.square(outputs['logits'][:, 0] - jnp.nan_to_num(labels))
    return jnp.sum(error * weight), jnp.sum(weight)
  if kind in (tasks.CLASSIFICATION, tasks.TAGGING):
    labels = batch['labels']
    weight = (labels >= 0).astype(jnp.float32)
    ce = optax.softmax_cross_entropy_with_integer_labels(outputs['logits'], jnp.maximum(labels, 0))
    return jnp.sum(ce * weight), jnp.sum(weight)
  start = optax.softmax_cross_entropy_with_integer_labels(outputs['start_logits'], batch['start_positions'])
  end = optax.softmax_cross_entropy_with_integer_labels(outputs['end_logits'], batch['end_positions'])
  per_row = (start + end) / 2 + squad.answerable_weight * optax.sigmoid_binary_cross_entropy(
      outputs['impossible_logit'], batch['is_impossible'])
  return jnp.sum(per_row), jnp.asarray(per_row.shape[0], jnp.float32)


def predictions(kind: str, outputs):
  """What evaluation brings to the host: logits (classification/regression), tag ids [batch, length] (tagging),
  the span beam (SQuAD)."""
  if kind == tasks.TAGGING:
    return {'tags': jnp.argmax(outputs['logits'], axis=-1).astype(jnp.int32)}
  return outputs
