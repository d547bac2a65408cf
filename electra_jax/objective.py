"""Replaced-token detection: the ELECTRA loss for one batch, and its metrics.

loss = gen_weight * generator MLM cross-entropy (selected positions)
     + disc_weight * discriminator sigmoid cross-entropy (every non-pad token, [CLS]/[SEP] included).
The generator's samples pass through `stop_gradient`: no gradient flows from the discriminator into the generator.
"""

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

from electra_jax import masking
from electra_jax.config import ObjectiveConfig

# A metric is (numerator, denominator), summed over steps and divided only when logged.
Metrics = dict[str, tuple[jax.Array, jax.Array]]


def sample_replacements(rng, logits, targets, config: ObjectiveConfig):
  """Gumbel-argmax samples [batch, P] from generator logits [batch, P, vocab] at temperature T."""
  logits = jax.lax.stop_gradient(logits)
  if config.uniform_generator:
    logits = jnp.zeros_like(logits)
  if config.disallow_correct:
    logits = logits - 1000.0 * jax.nn.one_hot(targets, logits.shape[-1], dtype=logits.dtype)
  gumbel = jax.random.gumbel(rng, logits.shape, logits.dtype)
  return jnp.argmax(logits / config.temperature + gumbel, axis=-1).astype(targets.dtype)


def weighted_mean(values, weights):
  return jnp.sum(values * weights) / jnp.maximum(jnp.sum(weights), 1e-6)


def electra_loss(apply_fn: Callable[..., Any], params, batch, rng, *, config: ObjectiveConfig,
                 special: masking.SpecialIds, vocab_size: int, deterministic: bool = False):
  """Returns (total loss, Metrics) for a batch of {input_ids, segment_ids, input_mask}, each [batch, length].

  `apply_fn(params, *args, method=..., rngs=...)` is the Electra module's apply.
  """
  mask_rng, gen_rng, sample_rng, disc_rng = jax.random.split(rng, 4)
  input_ids, input_mask = batch['input_ids'], batch['input_mask']
  masked = masking.mask_tokens(
      mask_rng, input_ids, input_mask, special=special, mask_prob=config.mask_prob,
      max_predictions=config.num_predictions(input_ids.shape[-1]), mask_token_prob=config.mask_token_prob,
      random_token_prob=config.random_token_prob, vocab_size=vocab_size)
  sample = lambda gen_logits: sample_replacements(sample_rng, gen_logits, masked.targets, config)
  return replaced_token_loss(apply_fn, params, batch, masked, sample, config=config, deterministic=deterministic,
                             rngs=(gen_rng, disc_rng))


def replaced_token_loss(apply_fn: Callable[..., Any], params, batch, masked: masking.Masked,
                        sample: Callable[[jax.Array], jax.Array], *, config: ObjectiveConfig,
                        deterministic: bool = False, rngs=None):
  """(total loss, Metrics) once the masking is chosen: `electra_loss` without its randomness.

  `sample(gen_logits [batch, P, vocab]) -> [batch, P]` draws the replacement tokens; `rngs` is the pair of
  dropout keys (generator, discriminator), unused when `deterministic`. Tests fix `masked` and `sample` to compare
  the loss with another implementation.
  """
  gen_rng, disc_rng = rngs if rngs is not None else (jax.random.PRNGKey(0),) * 2
  input_ids, segment_ids, input_mask = batch['input_ids'], batch['segment_ids'], batch['input_mask']
  gen_logits = apply_fn(params, masked.input_ids, segment_ids, input_mask, masked.positions,
                        deterministic=deterministic, method='generator_logits', rngs={'dropout': gen_rng})
  gen_losses = optax.softmax_cross_entropy_with_integer_labels(gen_logits, masked.targets)
  gen_loss = weighted_mean(gen_losses, masked.weights)

  samples = sample(gen_logits)
  corrupted = masking.scatter(input_ids, masked.positions,
                              jnp.where(masked.weights > 0, samples, masked.targets))
  # A sample equal to the original is labelled real, as in the paper.
  labels = ((corrupted != input_ids) & (input_mask > 0)).astype(jnp.float32)
  disc_logits = apply_fn(params, corrupted, segment_ids, input_mask, deterministic=deterministic,
                         method='discriminator_logits', rngs={'dropout': disc_rng})
  token_weights = (input_mask > 0).astype(jnp.float32)
  disc_loss = weighted_mean(optax.sigmoid_binary_cross_entropy(disc_logits, labels), token_weights)
  loss = config.gen_weight * gen_loss + config.disc_weight * disc_loss

  one = jnp.ones((), jnp.float32)
  predicted = (disc_logits > 0).astype(jnp.float32) * token_weights
  true_positives = jnp.sum(predicted * labels)
  metrics = {
      'loss': (loss, one),
      'gen_loss': (gen_loss, one),
      'disc_loss': (disc_loss, one),
      'gen_accuracy': (jnp.sum((jnp.argmax(gen_logits, -1) == masked.targets) * masked.weights),
                       jnp.sum(masked.weights)),
      'disc_accuracy': (jnp.sum((predicted == labels) * token_weights), jnp.sum(token_weights)),
      'disc_precision': (true_positives, jnp.sum(predicted)),
      'disc_recall': (true_positives, jnp.sum(labels)),
      'replaced_fraction': (jnp.sum(labels), jnp.sum(token_weights)),
      'sampled_original': (jnp.sum((samples == masked.targets) * masked.weights), jnp.sum(masked.weights)),
  }
  return loss, metrics
