"""Replaced-token detection: the ELECTRA loss for one batch, and its metrics; and the paper's ablations.

loss = gen_weight * generator MLM cross-entropy (selected positions)
     + disc_weight * discriminator sigmoid cross-entropy (every non-pad token, [CLS]/[SEP] included).
The generator's samples pass through `stop_gradient`: no gradient flows from the discriminator into the generator.

`OBJECTIVES` maps `config.objective.name` to the loss function and to what it needs of the model (the train
step looks it up): 'electra', 'electra_15', 'replace_mlm', 'all_tokens_mlm' and 'mlm' (paper section 3.2).

Randomness is drawn per example row: row r's masking, Gumbel noise and dropout come from fold_in(key, r), never
from the other rows, so a batch split into micro-batches (gradient accumulation) draws exactly what it would whole.
"""

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

from electra_jax import masking
from electra_jax.config import ConfigError, ObjectiveConfig

# A metric is (numerator, denominator), summed over steps and divided only when logged.
Metrics = dict[str, tuple[jax.Array, jax.Array]]
# The float32 sums over a batch that the loss and every metric are ratios of (see `replaced_token_sums`).
SUMS = ('gen_xent', 'selected', 'gen_correct', 'sampled_original', 'disc_xent', 'tokens', 'disc_correct',
        'predicted', 'true_positives', 'replaced', 'replaced_prob', 'original_prob')


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Draws:
  """What a step draws before running the model, row by row. Row r's draws depend only on the step's key and r."""
  masked: masking.Masked  # [batch, ...] the selected positions and what the generator sees
  sample_keys: jax.Array  # [batch, ...] one key per row for its Gumbel noise
  rows: jax.Array  # [batch] int32 each row's index in the batch: the model keys its dropout with it


def _per_row(key, rows):
  return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, rows)


def draw(rng, batch, *, config: ObjectiveConfig, special: masking.SpecialIds, vocab_size: int):
  """Returns (Draws for the whole batch, (generator dropout key, discriminator dropout key))."""
  mask_rng, gen_rng, sample_rng, disc_rng = jax.random.split(rng, 4)
  input_ids, input_mask = batch['input_ids'], batch['input_mask']
  rows = jnp.arange(input_ids.shape[0], dtype=jnp.int32)

  def mask_row(key, ids, mask):
    masked = masking.mask_tokens(
        key, ids[None], mask[None], special=special, mask_prob=config.mask_prob,
        max_predictions=config.num_predictions(input_ids.shape[-1]), mask_token_prob=config.mask_token_prob,
        random_token_prob=config.random_token_prob, vocab_size=vocab_size)
    return jax.tree.map(lambda x: x[0], masked)

  masked = jax.vmap(mask_row)(_per_row(mask_rng, rows), input_ids, input_mask)
  return Draws(masked, _per_row(sample_rng, rows), rows), (gen_rng, disc_rng)


def sample_replacements(rng, logits, targets, config: ObjectiveConfig):
  """Gumbel-argmax samples [batch, P] from generator logits [batch, P, vocab] at temperature T."""
  logits = jax.lax.stop_gradient(logits)
  if config.uniform_generator:
    logits = jnp.zeros_like(logits)
  if config.disallow_correct:
    logits = logits - 1000.0 * jax.nn.one_hot(targets, logits.shape[-1], dtype=logits.dtype)
  gumbel = jax.random.gumbel(rng, logits.shape, logits.dtype)
  return jnp.argmax(logits / config.temperature + gumbel, axis=-1).astype(targets.dtype)


def sample_rows(keys, logits, targets, config: ObjectiveConfig):
  """`sample_replacements` row by row: row r's noise comes from keys[r] alone. [batch, P, vocab] -> [batch, P]."""
  one_row = lambda key, row_logits, row_targets: sample_replacements(key, row_logits[None], row_targets[None],
                                                                     config)[0]
  return jax.vmap(one_row)(keys, logits, targets)


def weighted_mean(values, weights):
  return jnp.sum(values * weights) / jnp.maximum(jnp.sum(weights), 1e-6)


def electra_loss(apply_fn: Callable[..., Any], params, batch, rng, *, config: ObjectiveConfig,
                 special: masking.SpecialIds, vocab_size: int, deterministic: bool = False):
  """Returns (total loss, Metrics) for a batch of {input_ids, segment_ids, input_mask}, each [batch, length].

  `apply_fn(params, *args, method=..., rngs=...)` is the Electra module's apply.
  """
  masked, sample, rngs = _mask_and_sampler(rng, batch, config=config, special=special, vocab_size=vocab_size)
  return replaced_token_loss(apply_fn, params, batch, masked, sample, config=config, deterministic=deterministic,
                             rngs=rngs)


def _mask_and_sampler(rng, batch, *, config: ObjectiveConfig, special: masking.SpecialIds, vocab_size: int):
  """The batch's masking (drawn per row), its generator sampler, and the (generator, discriminator) dropout keys."""
  draws, rngs = draw(rng, batch, config=config, special=special, vocab_size=vocab_size)
  sample = lambda gen_logits: sample_rows(draws.sample_keys, gen_logits, draws.masked.targets, config)
  return draws.masked, sample, rngs


def electra_15_loss(apply_fn: Callable[..., Any], params, batch, rng, *, config: ObjectiveConfig,
                    special: masking.SpecialIds, vocab_size: int, deterministic: bool = False):
  """ELECTRA 15%: `electra_loss` with the discriminator loss (and its metrics) only on the selected positions."""
  masked, sample, rngs = _mask_and_sampler(rng, batch, config=config, special=special, vocab_size=vocab_size)
  return replaced_token_loss(apply_fn, params, batch, masked, sample, config=config, deterministic=deterministic,
                             rngs=rngs, selected_only=True)


def replaced_token_loss(apply_fn: Callable[..., Any], params, batch, masked: masking.Masked,
                        sample: Callable[[jax.Array], jax.Array], *, config: ObjectiveConfig,
                        deterministic: bool = False, rngs=None, selected_only: bool = False):
  """(total loss, Metrics) once the masking is chosen: `electra_loss` without its randomness.

  `sample(gen_logits [batch, P, vocab]) -> [batch, P]` draws the replacement tokens; `rngs` is the pair of
  dropout keys (generator, discriminator), unused when `deterministic`. Tests fix `masked` and `sample` to compare
  the loss with another implementation. `selected_only` restricts the discriminator loss to the selected
  positions (ELECTRA 15%).
  """
  sums = replaced_token_sums(apply_fn, params, batch, masked, sample, deterministic=deterministic, rngs=rngs,
                             selected_only=selected_only)
  return loss_and_metrics(sums, config)


def replaced_token_sums(apply_fn: Callable[..., Any], params, batch, masked: masking.Masked,
                        sample: Callable[[jax.Array], jax.Array], *, deterministic: bool = False, rngs=None,
                        rows=None, selected_only: bool = False) -> dict[str, jax.Array]:
  """The float32 sums named in SUMS over a batch (or a micro-batch: `rows` [batch] are its rows' indices in the
  full batch, passed to the model for its dropout)."""
  gen_rng, disc_rng = rngs if rngs is not None else (jax.random.PRNGKey(0),) * 2
  row_kwargs = {} if rows is None else {'rows': rows}
  input_ids, segment_ids, input_mask = batch['input_ids'], batch['segment_ids'], batch['input_mask']
  gen_logits = apply_fn(params, masked.input_ids, segment_ids, input_mask, masked.positions,
                        deterministic=deterministic, method='generator_logits', rngs={'dropout': gen_rng},
                        **row_kwargs)
  gen_losses = optax.softmax_cross_entropy_with_integer_labels(gen_logits, masked.targets)

  samples = sample(gen_logits)
  corrupted = masking.scatter(input_ids, masked.positions,
                              jnp.where(masked.weights > 0, samples, masked.targets))
  # A sample equal to the original is labelled real, as in the paper.
  labels = ((corrupted != input_ids) & (input_mask > 0)).astype(jnp.float32)
  disc_logits = apply_fn(params, corrupted, segment_ids, input_mask, deterministic=deterministic,
                         method='discriminator_logits', rngs={'dropout': disc_rng}, **row_kwargs)
  if selected_only:  # ELECTRA 15%: the discriminator learns only from the selected positions
    token_weights = masking.scatter(jnp.zeros(input_ids.shape, jnp.float32), masked.positions, masked.weights)
  else:
    token_weights = (input_mask > 0).astype(jnp.float32)
  predicted = (disc_logits > 0).astype(jnp.float32) * token_weights
  prob = jax.nn.sigmoid(disc_logits) * token_weights
  return {
      'gen_xent': jnp.sum(gen_losses * masked.weights),
      'selected': jnp.sum(masked.weights),
      'gen_correct': jnp.sum((jnp.argmax(gen_logits, -1) == masked.targets) * masked.weights),
      'sampled_original': jnp.sum((samples == masked.targets) * masked.weights),
      'disc_xent': jnp.sum(optax.sigmoid_binary_cross_entropy(disc_logits, labels) * token_weights),
      'tokens': jnp.sum(token_weights),
      'disc_correct': jnp.sum((predicted == labels) * token_weights),
      'predicted': jnp.sum(predicted),
      'true_positives': jnp.sum(predicted * labels),
      'replaced': jnp.sum(labels),
      'replaced_prob': jnp.sum(prob * labels),
      'original_prob': jnp.sum(prob * (1.0 - labels)),
  }


def loss_and_metrics(sums: dict[str, jax.Array], config: ObjectiveConfig, denominators=None):
  """(total loss, Metrics) from a batch's sums.

  `denominators` (selected positions, tokens) of the full batch turn a micro-batch's sums into its share of the
  full batch's loss: the shares (and their gradients) add up to the full batch's.
  """
  selected, tokens = (sums['selected'], sums['tokens']) if denominators is None else denominators
  gen_loss = sums['gen_xent'] / jnp.maximum(selected, 1e-6)
  disc_loss = sums['disc_xent'] / jnp.maximum(tokens, 1e-6)
  loss = config.gen_weight * gen_loss + config.disc_weight * disc_loss
  one = jnp.ones((), jnp.float32)
  metrics = {
      'loss': (loss, one),
      'gen_loss': (gen_loss, one),
      'disc_loss': (disc_loss, one),
      'gen_accuracy': (sums['gen_correct'], sums['selected']),
      'disc_accuracy': (sums['disc_correct'], sums['tokens']),
      'disc_precision': (sums['true_positives'], sums['predicted']),
      'disc_recall': (sums['true_positives'], sums['replaced']),
      'replaced_fraction': (sums['replaced'], sums['tokens']),
      # Mean P(replaced) the discriminator gives replaced and original tokens: detection shows as a gap between
      # the two long before any token crosses 0.5 (recall); a collapsed discriminator gives both the base rate.
      'disc_prob_replaced': (sums['replaced_prob'], sums['replaced']),
      'disc_prob_original': (sums['original_prob'], sums['tokens'] - sums['replaced']),
      'sampled_original': (sums['sampled_original'], sums['selected']),
  }
  return loss, metrics


def _generator_step(apply_fn, params, batch, masked: masking.Masked, sample, *, deterministic: bool, rng):
  """Generator MLM at the selected positions: (its loss, its logits, the corrupted input_ids)."""
  gen_logits = apply_fn(params, masked.input_ids, batch['segment_ids'], batch['input_mask'], masked.positions,
                        deterministic=deterministic, method='generator_logits', rngs={'dropout': rng})
  gen_loss = weighted_mean(optax.softmax_cross_entropy_with_integer_labels(gen_logits, masked.targets),
                           masked.weights)
  corrupted = masking.scatter(batch['input_ids'], masked.positions,
                              jnp.where(masked.weights > 0, sample(gen_logits), masked.targets))
  return gen_loss, gen_logits, corrupted


def _accuracy(logits, targets, weights):
  return jnp.sum((jnp.argmax(logits, -1) == targets) * weights), jnp.sum(weights)


def replace_mlm_loss(apply_fn: Callable[..., Any], params, batch, rng, *, config: ObjectiveConfig,
                     special: masking.SpecialIds, vocab_size: int, deterministic: bool = False):
  """Replace MLM: the discriminator-sized model is an MLM whose selected tokens are generator samples.

  loss = gen_weight * generator MLM loss + MLM cross-entropy of the discriminator-sized model at the selected
  positions of the corrupted input (disc_weight, the scale of the binary loss, is not used).
  """
  masked, sample, (gen_rng, disc_rng) = _mask_and_sampler(rng, batch, config=config, special=special,
                                                          vocab_size=vocab_size)
  gen_loss, gen_logits, corrupted = _generator_step(apply_fn, params, batch, masked, sample,
                                                    deterministic=deterministic, rng=gen_rng)
  logits, _ = apply_fn(params, corrupted, batch['segment_ids'], batch['input_mask'], masked.positions,
                       deterministic=deterministic, method='discriminator_mlm_logits', rngs={'dropout': disc_rng})
  mlm_loss = weighted_mean(optax.softmax_cross_entropy_with_integer_labels(logits, masked.targets), masked.weights)
  loss = config.gen_weight * gen_loss + mlm_loss
  one = jnp.ones((), jnp.float32)
  return loss, {'loss': (loss, one), 'gen_loss': (gen_loss, one), 'mlm_loss': (mlm_loss, one),
                'gen_accuracy': _accuracy(gen_logits, masked.targets, masked.weights),
                'mlm_accuracy': _accuracy(logits, masked.targets, masked.weights)}


def all_tokens_mlm_loss(apply_fn: Callable[..., Any], params, batch, rng, *, config: ObjectiveConfig,
                        special: masking.SpecialIds, vocab_size: int, deterministic: bool = False):
  """All-Tokens MLM: Replace MLM predicting every non-pad token, with a copy mechanism.

  p(x_t) = D_t * 1[x_t = corrupted_t] + (1 - D_t) * softmax(logits_t)[x_t], D_t = sigmoid(copy-gate logit);
  loss = gen_weight * generator MLM loss + mean over non-pad tokens of -log p(x_t).
  """
  masked, sample, (gen_rng, disc_rng) = _mask_and_sampler(rng, batch, config=config, special=special,
                                                          vocab_size=vocab_size)
  gen_loss, gen_logits, corrupted = _generator_step(apply_fn, params, batch, masked, sample,
                                                    deterministic=deterministic, rng=gen_rng)
  input_ids = batch['input_ids']
  logits, copy_logits = apply_fn(params, corrupted, batch['segment_ids'], batch['input_mask'],
                                 deterministic=deterministic, method='discriminator_mlm_logits',
                                 rngs={'dropout': disc_rng})
  log_softmax = -optax.softmax_cross_entropy_with_integer_labels(logits, input_ids)  # log softmax[x_t]
  not_copied = jax.nn.log_sigmoid(-copy_logits) + log_softmax  # log((1 - D) softmax[x_t])
  log_p = jnp.where(corrupted == input_ids, jnp.logaddexp(jax.nn.log_sigmoid(copy_logits), not_copied),
                    not_copied)
  token_weights = (batch['input_mask'] > 0).astype(jnp.float32)
  mlm_loss = weighted_mean(-log_p, token_weights)
  loss = config.gen_weight * gen_loss + mlm_loss
  one = jnp.ones((), jnp.float32)
  return loss, {'loss': (loss, one), 'gen_loss': (gen_loss, one), 'mlm_loss': (mlm_loss, one),
                'gen_accuracy': _accuracy(gen_logits, masked.targets, masked.weights),
                'copy_probability': (jnp.sum(jax.nn.sigmoid(copy_logits) * token_weights), jnp.sum(token_weights))}


def mlm_loss(apply_fn: Callable[..., Any], params, batch, rng, *, config: ObjectiveConfig,
             special: masking.SpecialIds, vocab_size: int, deterministic: bool = False):
  """BERT: MLM of the discriminator-sized model on the masked input, no generator.

  BERT's 80/10/10 masking is objective.mask_token_prob = 0.8, objective.random_token_prob = 0.1.
  """
  masked, _, (_, disc_rng) = _mask_and_sampler(rng, batch, config=config, special=special, vocab_size=vocab_size)
  logits, _ = apply_fn(params, masked.input_ids, batch['segment_ids'], batch['input_mask'], masked.positions,
                       deterministic=deterministic, method='discriminator_mlm_logits', rngs={'dropout': disc_rng})
  loss = weighted_mean(optax.softmax_cross_entropy_with_integer_labels(logits, masked.targets), masked.weights)
  one = jnp.ones((), jnp.float32)
  return loss, {'loss': (loss, one), 'mlm_loss': (loss, one),
                'mlm_accuracy': _accuracy(logits, masked.targets, masked.weights)}


@dataclasses.dataclass(frozen=True)
class Objective:
  """A pre-training objective: its loss function and the model it trains (`electra_jax.model.Electra` fields)."""
  loss: Callable[..., Any]  # (apply_fn, params, batch, rng, *, config, special, vocab_size) -> (loss, Metrics)
  with_generator: bool = True
  discriminator_head: str = 'rtd'  # 'rtd', 'mlm' or 'mlm_copy'


OBJECTIVES = {
    'electra': Objective(electra_loss),
    'electra_15': Objective(electra_15_loss),
    'replace_mlm': Objective(replace_mlm_loss, discriminator_head='mlm'),
    'all_tokens_mlm': Objective(all_tokens_mlm_loss, discriminator_head='mlm_copy'),
    'mlm': Objective(mlm_loss, with_generator=False, discriminator_head='mlm'),
}


def get(name: str) -> Objective:
  if name not in OBJECTIVES:
    raise ConfigError(f'unknown objective.name {name!r}; the objectives are: {", ".join(OBJECTIVES)}')
  return OBJECTIVES[name]
