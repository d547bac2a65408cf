"""Dynamic masking: choose the positions the generator must predict, freshly for every batch.

Official ELECTRA (pretrain_helpers.mask): per sequence n = max(1, min(P, round(#tokens * mask_prob))) positions
are drawn among the real tokens that are not [CLS]/[SEP]/[MASK], uniformly and WITH replacement (one categorical
draw per slot), so a position can be drawn twice: 9 draws among 62 candidates select 62 (1 - (61/62)^9) = 8.44
distinct positions on average. Every draw keeps its weight (the generator loss counts a twice-drawn position
twice); a position is shown as [MASK] if any of its draws is (each with probability 0.85), else it keeps its
token (no random replacement unless `random_token_prob` > 0, as BERT does). `with_replacement=False` draws n
distinct positions instead.

Where a position is drawn twice, `scatter` writes the first draw's value (the generator's first sample). The
official scatter_update writes the integer floor-mean of the token ids sampled there, an artefact of summing the
updates: a token unrelated to either sample, easy for the discriminator to spot. That is 6-7% of the replaced
tokens at 9 draws among 62 candidates, and it lifts the discriminator's recall (docs/convert.md).
`merge_duplicates` reproduces it (objective.duplicate_samples='mean', the default; 'first' keeps the first).
"""

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class SpecialIds:
  """Token ids the model treats specially; the tokenizer defines them."""
  pad: int
  cls: int
  sep: int
  mask: int
  unk: int = -1

  def never_masked(self) -> Sequence[int]:
    return (self.pad, self.cls, self.sep, self.mask)


# The ids every tokenizer electra_jax trains gives its special pieces ([PAD], [UNK], [CLS], [SEP], [MASK] come
# first): what compile reports and step benchmarks, which need no tokenizer, build their batches with.
TRAINED_TOKENIZER_IDS = SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Masked:
  """Output of `mask_tokens`; P = max_predictions."""
  input_ids: jax.Array  # [batch, length] what the generator sees
  positions: jax.Array  # [batch, P] selected positions (sorted by draw, meaningless where weights == 0)
  targets: jax.Array  # [batch, P] original tokens at `positions`
  weights: jax.Array  # [batch, P] float32, 1 for a real selection, 0 for padding of the P slots


def mask_tokens(rng, input_ids, input_mask, *, special: SpecialIds, mask_prob: float, max_predictions: int,
                mask_token_prob: float = 0.85, random_token_prob: float = 0.0, vocab_size: int = 0,
                with_replacement: bool = True) -> Masked:
  """Selects and masks positions of `input_ids` [batch, length]; `input_mask` is 1 on real tokens."""
  select_rng, replace_rng, random_rng = jax.random.split(rng, 3)
  candidate = (input_mask > 0) & ~jnp.isin(input_ids, jnp.asarray(special.never_masked()))
  num_tokens = jnp.sum(input_mask > 0, axis=-1)
  num_selected = jnp.clip(jnp.round(num_tokens * mask_prob).astype(jnp.int32), 1, max_predictions)

  if with_replacement:  # the official draw: P independent uniform draws over the candidates
    logits = jnp.where(candidate, 0.0, -jnp.inf)[:, None, :]
    positions = jax.random.categorical(select_rng, logits, shape=(input_ids.shape[0], max_predictions))
  else:  # the top-P of uniform scores over candidates is a uniformly random subset
    scores = jnp.where(candidate, jax.random.uniform(select_rng, input_ids.shape), -1.0)
    _, positions = jax.lax.top_k(scores, max_predictions)
  is_candidate = jnp.take_along_axis(candidate, positions, axis=1)
  weights = (jnp.arange(max_predictions)[None] < num_selected[:, None]) & is_candidate
  targets = jnp.take_along_axis(input_ids, positions, axis=1)

  u = jax.random.uniform(replace_rng, positions.shape)
  shown = jnp.where(u < mask_token_prob, special.mask, targets)
  if random_token_prob > 0:
    random_tokens = jax.random.randint(random_rng, positions.shape, 0, vocab_size)
    shown = jnp.where((u >= mask_token_prob) & (u < mask_token_prob + random_token_prob), random_tokens, shown)
  # A position drawn more than once shows [MASK] if any of its draws does (as the official scatter_update).
  same = (positions[:, :, None] == positions[:, None, :]) & weights[:, None, :]  # [batch, P, P]
  shown = jnp.where(jnp.any(same & (u < mask_token_prob)[:, None, :], axis=-1), special.mask, shown)
  masked_ids = scatter(input_ids, positions, jnp.where(weights, shown, targets))
  return Masked(masked_ids, positions, targets, weights.astype(jnp.float32))


def merge_duplicates(values, positions, weights):
  """values [batch, P] with each selected position's values replaced by the floor of their mean, as the official
  scatter_update writes token ids drawn more than once (slots with weight 0 take no part and keep their value)."""
  selected = weights > 0
  same = (positions[:, :, None] == positions[:, None, :]) & selected[:, None, :]  # [batch, P, P]
  total = jnp.sum(jnp.where(same, values[:, None, :], 0), axis=-1)
  return jnp.where(selected, total // jnp.maximum(jnp.sum(same, axis=-1), 1), values).astype(values.dtype)


def scatter(input_ids, positions, values):
  """input_ids [batch, length] with `values` [batch, P] written at `positions` [batch, P].

  A position listed more than once takes the value of its first listing (a plain scatter leaves the order of
  duplicate writes unspecified).
  """
  rows = jnp.arange(input_ids.shape[0])[:, None]
  slots = positions.shape[-1]
  earlier = jnp.tril(jnp.ones((slots, slots), bool), -1)  # [i, j]: slot j comes before slot i
  repeated = jnp.any((positions[:, :, None] == positions[:, None, :]) & earlier, axis=-1)
  positions = jnp.where(repeated, input_ids.shape[-1], positions)  # out of range: dropped
  return input_ids.at[rows, positions].set(values, mode='drop')
