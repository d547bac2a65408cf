"""Replaced-token detection: the ELECTRA loss for one batch, and its metrics; and the paper's ablations.

loss = gen_weight * generator MLM cross-entropy (selected positions)
     + disc_weight * discriminator sigmoid cross-entropy (every non-pad token, [CLS]/[SEP] included).
The generator's samples pass through `stop_gradient`: no gradient flows from the discriminator into the generator.

`OBJECTIVES` maps `config.objective.name` to an `Objective`: its loss function and everything the rest of the
code asks of it (the model it trains, its FLOPs per step, the trainer's initial state), so that nothing else
compares objective names: 'electra', 'electra_15', 'replace_mlm', 'all_tokens_mlm' and 'mlm' (paper section 3.2),
'electra_adversarial' (a generator trained by reinforcement learning to fool the discriminator, appendix F) and
'electra_frozen' (Fast-ELECTRA: another run's MLM as a frozen generator, `electra_jax.frozen`).
`two_stage_loss` is ELECTRA's loss under `objective.two_stage_generator_steps` (the train step switches to it).

Every loss takes `progress` = step / train_steps, a traced scalar: the schedules of the sampling temperature
(`objective.initial_temperature`) and of the discriminator weight (`objective.disc_weight_warmup_fraction`) are
functions of it, so a resumed run samples and weighs exactly as an uninterrupted one. The default 1.0 is past
every schedule: the configured `temperature` and `disc_weight`.

Every objective computes float32 sums over the batch (cross-entropies, counts, correct predictions) and makes
its loss and Metrics from them as ratios; so a batch split into micro-batches (gradient accumulation) adds up its
sums and gradients to what the whole batch gives. Randomness is drawn per example row: row r's masking, sampling
noise and dropout come from fold_in(key, r), never from the other rows, so micro-batches draw what the whole would.
"""

import dataclasses
import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from electra_jax import config_files, flops, frozen, masking
from electra_jax.config import ModelConfig, ObjectiveConfig, TrainConfig
from electra_jax.errors import ConfigError
from electra_jax.model import Electra

# A metric is (numerator, denominator), summed over steps and divided only when logged.
Metrics = dict[str, tuple[jax.Array, jax.Array]]


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Draws:
  """What a step draws before running the model, row by row. Row r's draws depend only on the step's key and r."""
  masked: masking.Masked  # [batch, ...] the selected positions and what the generator sees
  sample_keys: jax.Array  # [batch, ...] one key per row for its sampling noise
  rows: jax.Array  # [batch] int32 each row's index in the batch: the model keys its dropout with it


def _per_row(key, rows):
  return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, rows)


def draw(rng, batch, *, config: ObjectiveConfig, special: masking.SpecialIds, vocab_size: int):
  """Returns (Draws for the whole batch, (generator dropout key, discriminator dropout key))."""
  with jax.named_scope('masking'):  # names its operations in profiles (electra_jax.kernels)
    return _draw(rng, batch, config=config, special=special, vocab_size=vocab_size)


def _draw(rng, batch, *, config: ObjectiveConfig, special: masking.SpecialIds, vocab_size: int):
  mask_rng, gen_rng, sample_rng, disc_rng = jax.random.split(rng, 4)
  input_ids, input_mask = batch['input_ids'], batch['input_mask']
  rows = jnp.arange(input_ids.shape[0], dtype=jnp.int32)

  def mask_row(key, ids, mask):
    masked = masking.mask_tokens(
        key, ids[None], mask[None], special=special, mask_prob=config.mask_prob,
        max_predictions=config.num_predictions(input_ids.shape[-1]), mask_token_prob=config.mask_token_prob,
        random_token_prob=config.random_token_prob, vocab_size=vocab_size,
        with_replacement=config.mask_with_replacement)
    return jax.tree.map(lambda x: x[0], masked)

  masked = jax.vmap(mask_row)(_per_row(mask_rng, rows), input_ids, input_mask)
  return Draws(masked, _per_row(sample_rng, rows), rows), (gen_rng, disc_rng)


def _ramp(start: float, end: float, fraction: float, progress):
  """`start` at progress 0, linearly to `end` at progress `fraction`, `end` from then on."""
  return end + (start - end) * jnp.clip(1.0 - progress / fraction, 0.0, 1.0)


def temperature(config: ObjectiveConfig, progress=1.0):
  """The sampling temperature at `progress` (step / train_steps): `initial_temperature` at 0, falling linearly
  to `temperature` at `temperature_decay_fraction`, then constant (Fast-ELECTRA's descending curriculum).
  Without `initial_temperature` it is `temperature` throughout."""
  if not config.initial_temperature:
    return config.temperature
  return _ramp(config.initial_temperature, config.temperature, config.temperature_decay_fraction, progress)


def disc_weight(config: ObjectiveConfig, progress=1.0):
  """The discriminator loss weight lambda at `progress`: rising linearly from 0 to `disc_weight` over the first
  `disc_weight_warmup_fraction` of training, `disc_weight` throughout when that is 0."""
  if not config.disc_weight_warmup_fraction:
    return config.disc_weight
  return _ramp(0.0, config.disc_weight, config.disc_weight_warmup_fraction, progress)


def sampling_logits(logits, targets, config: ObjectiveConfig, progress=1.0):
  """[batch, P, vocab] logits whose softmax the replacements are drawn from: the generator's (all zero with
  `uniform_generator`: `generator_logits`) at the temperature of `progress`, the original token (`targets`
  [batch, P]) pushed out with `disallow_correct`."""
  if config.disallow_correct:
    logits = logits - 1000.0 * jax.nn.one_hot(targets, logits.shape[-1], dtype=logits.dtype)
  return logits / temperature(config, progress)


def sample_replacements(rng, logits, targets, config: ObjectiveConfig, progress=1.0):
  """Samples [batch, P] from the softmax of generator logits [batch, P, vocab] at the temperature of `progress`.

  By inverse CDF (objective.sampling='inverse_cdf'): one uniform u in (0, 1] per position, and the sample is the
  first id whose cumulative probability reaches u (counted as the ids whose cumulative probability stays below it).
  The official code draws the same distribution with Gumbel noise and an argmax (objective.sampling='gumbel'), which
  needs a random number per vocabulary entry: on CPU that noise was 16% of ELECTRA-Small's step (docs/history.md,
  "Sampling and dropout on a CPU"). An id
  of probability 0 is never drawn, since u > 0. In float32 whatever the model's dtype: a bf16 sum over 30k ids
  would round away the small probabilities.
  """
  logits = jax.lax.stop_gradient(sampling_logits(logits, targets, config, progress)).astype(jnp.float32)
  if config.sampling == 'gumbel':  # the official draw: argmax of logits + Gumbel noise
    return jnp.argmax(logits + jax.random.gumbel(rng, logits.shape), axis=-1).astype(targets.dtype)
  # The softmax's numerators: their cumulative sum ends at the normaliser, which u is scaled by.
  cdf = jnp.cumsum(jnp.exp(logits - jnp.max(logits, axis=-1, keepdims=True)), axis=-1)
  u = 1.0 - jax.random.uniform(rng, logits.shape[:-1] + (1,))
  return jnp.sum(cdf < u * cdf[..., -1:], axis=-1).astype(targets.dtype)


def sampler(keys, masked: masking.Masked, config: ObjectiveConfig, progress=1.0) -> Callable[..., jax.Array]:
  """gen_logits [batch, P, vocab] -> the replacements [batch, P] the batch is corrupted with: `sample_rows` with
  row r's noise from keys[r], a position drawn more than once taking the mean of its samples' ids under
  objective.duplicate_samples='mean' (the official scatter_update). `sample(gen_logits, merge=False)` gives each
  slot's own draw, unmerged (what electra_adversarial's policy drew)."""
  def sample(gen_logits, merge: bool = True):
    samples = sample_rows(keys, gen_logits, masked.targets, config, progress)
    if merge and config.duplicate_samples == 'mean' and config.mask_with_replacement:  # else none drawn twice
      samples = masking.merge_duplicates(samples, masked.positions, masked.weights)
    return samples
  return sample


def sample_rows(keys, logits, targets, config: ObjectiveConfig, progress=1.0):
  """`sample_replacements` row by row: row r's noise comes from keys[r] alone. [batch, P, vocab] -> [batch, P]."""
  one_row = lambda key, row_logits, row_targets: sample_replacements(key, row_logits[None], row_targets[None],
                                                                     config, progress)[0]
  with jax.named_scope('sampling'):  # names its operations in profiles (electra_jax.kernels)
    return jax.vmap(one_row)(keys, logits, targets)


def mask_and_sampler(rng, batch, *, config: ObjectiveConfig, special: masking.SpecialIds, vocab_size: int,
                     progress):
  """The batch's masking (drawn per row), its generator sampler (at the temperature of `progress`), and the
  (generator, discriminator) dropout keys."""
  draws, rngs = draw(rng, batch, config=config, special=special, vocab_size=vocab_size)
  return draws.masked, sampler(draws.sample_keys, draws.masked, config, progress), rngs


def generator_logits(apply_fn: Callable[..., Any], params, batch, masked: masking.Masked, *, method,
                     rng, deterministic: bool, rows: dict):
  """The generator's output on the masked input at the selected positions: the model's `method`
  ('generator_logits': logits [batch, P, vocab] float32). method=None (objective.uniform_generator): zero logits
  [batch, P, vocab], and no generator runs."""
  call = functools.partial(apply_fn, params, masked.input_ids, batch['segment_ids'], batch['input_mask'],
                           masked.positions, deterministic=deterministic, method=method or 'generator_logits',
                           rngs={'dropout': rng}, **rows)
  if method is None:
    # As the official uniform_generator, which builds no generator (`_get_masked_lm_output(inputs, None)`): the
    # samples are uniform, the MLM loss is the constant log V, and nothing (not the shared embeddings either) is
    # trained through it. Only the shape of the generator's logits is traced: it is never computed.
    return jnp.zeros(jax.eval_shape(call).shape, jnp.float32)
  return call()


class Detection(NamedTuple):
  """The generator's samples and the discriminator's verdict on the corrupted batch."""
  samples: jax.Array  # [batch, P] the sampled replacements
  labels: jax.Array  # [batch, length] float32, 1 where the corrupted token differs from the original
  disc_logits: jax.Array  # [batch, length] float32 'replaced' logits
  token_weights: jax.Array  # [batch, length] float32, the tokens the discriminator loss counts
  gen_logits: jax.Array  # [batch, P, vocab] float32
  baseline_logits: jax.Array | None  # [batch, P] the REINFORCE baseline's logits (electra_adversarial), else None


def replaced_token_detection(apply_fn: Callable[..., Any], params, batch, masked: masking.Masked,
                             sample: Callable[[jax.Array], jax.Array], *, rngs=None, deterministic: bool = False,
                             rows=None, selected_only: bool = False, generator: str | None = 'generator_logits'):
  """(the float32 sums the loss and metrics are ratios of, Detection) of a batch whose masking is chosen.

  `sample(gen_logits [batch, P, vocab]) -> [batch, P]` draws the replacements; `rngs` is the pair of dropout keys
  (generator, discriminator), unused when `deterministic`; `rows` [batch] are a micro-batch's rows' indices in
  the full batch (the model keys its dropout with them). `selected_only` counts only the selected positions in the
  discriminator's loss (ELECTRA 15%). `generator='generator_logits_and_baseline'` also runs the REINFORCE
  baseline head (electra_adversarial); generator=None runs no generator: its logits are zeros, uniform sampling
  (`generator_logits`, objective.uniform_generator).
  """
  gen_rng, disc_rng = rngs if rngs is not None else (jax.random.PRNGKey(0),) * 2
  rows = {} if rows is None else {'rows': rows}  # a whole batch: the model numbers its rows itself
  input_ids, segment_ids, input_mask = batch['input_ids'], batch['segment_ids'], batch['input_mask']
  # Generator: a small MLM predicts the selected tokens from the masked input.
  gen_logits = generator_logits(apply_fn, params, batch, masked, method=generator, rng=gen_rng,
                                deterministic=deterministic, rows=rows)
  gen_logits, baseline_logits = gen_logits if generator == 'generator_logits_and_baseline' else (gen_logits, None)
  # Sample a replacement for each selected token (under stop_gradient: the discriminator trains no generator).
  samples = sample(gen_logits)
  # Corrupt the input with them. A sample equal to the original is labelled real, as in the paper.
  corrupted = corrupt(input_ids, masked, samples)
  labels = ((corrupted != input_ids) & (input_mask > 0)).astype(jnp.float32)
  # Discriminator: is each token of the corrupted input replaced?
  disc_logits = apply_fn(params, corrupted, segment_ids, input_mask, deterministic=deterministic,
                         method='discriminator_logits', rngs={'dropout': disc_rng}, **rows)
  # Sums over the batch: the generator's at the selected positions, the discriminator's over the counted tokens.
  weights = token_weights(batch, masked, selected_only)
  predicted = (disc_logits > 0).astype(jnp.float32) * weights
  prob = jax.nn.sigmoid(disc_logits) * weights
  sums = {
      **masked_lm_sums('gen', gen_logits, masked),
      'sampled_original': jnp.sum((samples == masked.targets) * masked.weights),
      'disc_xent': jnp.sum(optax.sigmoid_binary_cross_entropy(disc_logits, labels) * weights),
      'tokens': jnp.sum(weights),
      'disc_correct': jnp.sum((predicted == labels) * weights),
      'predicted': jnp.sum(predicted),
      'true_positives': jnp.sum(predicted * labels),
      'replaced': jnp.sum(labels),
      'replaced_prob': jnp.sum(prob * labels),
      'original_prob': jnp.sum(prob * (1.0 - labels)),
  }
  return sums, Detection(samples, labels, disc_logits, weights, gen_logits, baseline_logits)


def corrupt(input_ids, masked: masking.Masked, samples):
  """input_ids [batch, length] with the samples [batch, P] written at the selected positions."""
  return masking.scatter(input_ids, masked.positions, jnp.where(masked.weights > 0, samples, masked.targets))


def token_weights(batch, masked: masking.Masked, selected_only: bool = False):
  """[batch, length] float32: the tokens a per-token loss counts, every non-pad one or only the selected ones."""
  if selected_only:  # ELECTRA 15%: the discriminator learns only from the selected positions
    return masking.scatter(jnp.zeros(batch['input_ids'].shape, jnp.float32), masked.positions, masked.weights)
  return (batch['input_mask'] > 0).astype(jnp.float32)


def counts(batch, masked: masking.Masked, selected_only: bool = False) -> dict[str, jax.Array]:
  """The denominators of every objective's losses, known before the model runs: the selected positions and the
  counted tokens. Those of the whole batch turn a micro-batch's sums into its share of the whole batch's loss."""
  return {'selected': jnp.sum(masked.weights), 'tokens': jnp.sum(token_weights(batch, masked, selected_only))}


def softmax_xent(logits, labels):
  """optax.softmax_cross_entropy_with_integer_labels(logits [..., classes], labels [...]), the label's logit picked
  by comparing the classes' indices with it rather than gathered: the gradient is then elementwise (softmax minus
  one-hot), one pass over the logits, where a gather's is a scatter into zeros (on a GPU two more passes over the
  generator's [batch, P, vocab] logits). The same values."""
  picked = jnp.sum(jnp.where(jnp.arange(logits.shape[-1]) == labels[..., None], logits, 0), axis=-1)
  return jax.nn.logsumexp(logits, axis=-1) - picked


def masked_lm_sums(prefix: str, logits, masked: masking.Masked) -> dict[str, jax.Array]:
  """An MLM's cross-entropy and correct predictions summed over the selected positions, and their count."""
  xent = softmax_xent(logits, masked.targets)
  return {f'{prefix}_xent': jnp.sum(xent * masked.weights), 'selected': jnp.sum(masked.weights),
          f'{prefix}_correct': jnp.sum((jnp.argmax(logits, -1) == masked.targets) * masked.weights)}


def _ratio(numerator, denominator):
  return numerator / jnp.maximum(denominator, 1e-6)


def _mean(sums, name: str, denominators, count: str):
  """sums[name] over the count `count` ('selected' or 'tokens') of `denominators`, or of `sums` when None."""
  return _ratio(sums[name], (sums if denominators is None else denominators)[count])


def loss_and_metrics(sums: dict[str, jax.Array], config: ObjectiveConfig, denominators=None, progress=1.0):
  """(total loss, Metrics) from a batch's sums, the discriminator weighted by lambda at `progress`.

  `denominators` (`counts` of the full batch) turn a micro-batch's sums into its share of the full batch's loss:
  the shares (and their gradients) add up to the full batch's. A scheduled temperature or lambda is reported as
  the metric `temperature` or `disc_weight`. Every objective's metrics are built the same way.
  """
  gen_loss = _mean(sums, 'gen_xent', denominators, 'selected')
  disc_loss = _mean(sums, 'disc_xent', denominators, 'tokens')
  loss = config.gen_weight * gen_loss + disc_weight(config, progress) * disc_loss
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
  if config.initial_temperature:
    metrics['temperature'] = (jnp.asarray(temperature(config, progress), jnp.float32), one)
  if config.disc_weight_warmup_fraction:
    metrics['disc_weight'] = (jnp.asarray(disc_weight(config, progress), jnp.float32), one)
  return loss, metrics


# The objectives below are each a sums function and a metrics function (`Objective.sums`, `Objective.metrics`):
#   sums(apply_fn, params, batch, masked, sample, *, config, rngs, deterministic, rows, progress) -> float32 sums
#   metrics(sums, config, denominators=None, progress=1.0) -> (loss, Metrics), the loss a ratio of the sums
# so that micro-batches can add their sums and gradients (train_step.accumulate_gradients).


def electra_detection(apply_fn, params, batch, masked, sample, *, config, rngs=None, deterministic=False, rows=None,
                      progress=1.0, selected_only: bool = False):
  """ELECTRA's (sums, Detection): the sums its loss is made of and the discriminator's verdict, which held-out
  evaluation scores its AUC from (`Objective.detection`)."""
  del progress  # in `sample`
  return replaced_token_detection(apply_fn, params, batch, masked, sample, rngs=rngs, deterministic=deterministic,
                                  rows=rows, selected_only=selected_only,
                                  generator=None if config.uniform_generator else 'generator_logits')


def electra_sums(apply_fn, params, batch, masked, sample, **kwargs):
  return electra_detection(apply_fn, params, batch, masked, sample, **kwargs)[0]


def two_stage_metrics(sums, config: ObjectiveConfig, denominators=None, progress=1.0, *, step):
  """ELECTRA trained in two stages (paper section 3.2): `loss_and_metrics` with the loss switched by `step`.

  Before step n = config.two_stage_generator_steps the loss is gen_weight * generator MLM loss alone; from step n
  on it is disc_weight * discriminator loss alone. `step` is a traced scalar (the train state's), so one compiled
  step serves both stages; both towers run in both (the metrics stay those of `electra_loss`). Initialising the
  discriminator from the generator at step n and freezing the tower that does not train are the train step's
  (`electra_jax.train_step.two_stage_params`, `two_stage_updates`).
  """
  _, metrics = loss_and_metrics(sums, config, denominators, progress)
  gen_loss, disc_loss = metrics['gen_loss'][0], metrics['disc_loss'][0]
  loss = jnp.where(step < config.two_stage_generator_steps, config.gen_weight * gen_loss,
                   disc_weight(config, progress) * disc_loss)
  metrics['loss'] = (loss, jnp.ones((), jnp.float32))
  return loss, metrics


def replace_mlm_sums(apply_fn, params, batch, masked, sample, *, config, rngs, deterministic=False, rows=None,
                     progress=1.0):
  """Replace MLM: the discriminator-sized model is an MLM whose selected tokens are generator samples.

  loss = gen_weight * generator MLM loss + MLM cross-entropy of the discriminator-sized model at the selected
  positions of the corrupted input (disc_weight, the scale of the binary loss, is not used).
  """
  del progress  # in `sample`
  gen_logits, corrupted, rows = _generate_and_corrupt(apply_fn, params, batch, masked, sample, rngs[0],
                                                      deterministic, rows, config)
  logits, _ = apply_fn(params, corrupted, batch['segment_ids'], batch['input_mask'], masked.positions,
                       deterministic=deterministic, method='discriminator_mlm_logits', rngs={'dropout': rngs[1]},
                       **rows)
  return {**masked_lm_sums('gen', gen_logits, masked), **masked_lm_sums('mlm', logits, masked)}


def _generator_and_mlm_metrics(sums, config: ObjectiveConfig, denominators, mlm_count: str, **more):
  """loss = gen_weight * generator MLM loss + the discriminator-sized MLM loss (its xent over `mlm_count`)."""
  gen_loss = _mean(sums, 'gen_xent', denominators, 'selected')
  mlm_loss = _mean(sums, 'mlm_xent', denominators, mlm_count)
  loss = config.gen_weight * gen_loss + mlm_loss
  one = jnp.ones((), jnp.float32)
  return loss, {'loss': (loss, one), 'gen_loss': (gen_loss, one), 'mlm_loss': (mlm_loss, one),
                'gen_accuracy': (sums['gen_correct'], sums['selected']), **more}


def replace_mlm_metrics(sums, config: ObjectiveConfig, denominators=None, progress=1.0):
  del progress  # no schedule
  return _generator_and_mlm_metrics(sums, config, denominators, 'selected',
                                    mlm_accuracy=(sums['mlm_correct'], sums['selected']))


def _generate_and_corrupt(apply_fn, params, batch, masked: masking.Masked, sample, rng, deterministic, rows,
                          config: ObjectiveConfig):
  """(generator logits at the selected positions, the input corrupted with its samples, the `rows` kwargs)."""
  rows = {} if rows is None else {'rows': rows}
  gen_logits = generator_logits(apply_fn, params, batch, masked, rng=rng, deterministic=deterministic, rows=rows,
                                method=None if config.uniform_generator else 'generator_logits')
  return gen_logits, corrupt(batch['input_ids'], masked, sample(gen_logits)), rows


def all_tokens_mlm_sums(apply_fn, params, batch, masked, sample, *, config, rngs, deterministic=False, rows=None,
                        progress=1.0):
  """All-Tokens MLM: Replace MLM predicting every non-pad token, with a copy mechanism.

  p(x_t) = D_t * 1[x_t = corrupted_t] + (1 - D_t) * softmax(logits_t)[x_t], D_t = sigmoid(copy-gate logit);
  loss = gen_weight * generator MLM loss + mean over non-pad tokens of -log p(x_t).
  """
  del progress  # in `sample`
  gen_logits, corrupted, rows = _generate_and_corrupt(apply_fn, params, batch, masked, sample, rngs[0],
                                                      deterministic, rows, config)
  input_ids = batch['input_ids']
  logits, copy_logits = apply_fn(params, corrupted, batch['segment_ids'], batch['input_mask'],
                                 deterministic=deterministic, method='discriminator_mlm_logits',
                                 rngs={'dropout': rngs[1]}, **rows)
  log_softmax = -softmax_xent(logits, input_ids)  # log softmax[x_t]
  not_copied = jax.nn.log_sigmoid(-copy_logits) + log_softmax  # log((1 - D) softmax[x_t])
  log_p = jnp.where(corrupted == input_ids, jnp.logaddexp(jax.nn.log_sigmoid(copy_logits), not_copied),
                    not_copied)
  weights = token_weights(batch, masked)
  return {**masked_lm_sums('gen', gen_logits, masked), 'mlm_xent': jnp.sum(-log_p * weights),
          'tokens': jnp.sum(weights), 'copy_probability': jnp.sum(jax.nn.sigmoid(copy_logits) * weights)}


def all_tokens_mlm_metrics(sums, config: ObjectiveConfig, denominators=None, progress=1.0):
  del progress  # no schedule
  return _generator_and_mlm_metrics(sums, config, denominators, 'tokens',
                                    copy_probability=(sums['copy_probability'], sums['tokens']))


def mlm_sums(apply_fn, params, batch, masked, sample, *, config, rngs, deterministic=False, rows=None,
             progress=1.0):
  """BERT: MLM of the discriminator-sized model on the masked input, no generator.

  BERT's 80/10/10 masking is objective.mask_token_prob = 0.8, objective.random_token_prob = 0.1.
  """
  del sample, config, progress  # no generator
  rows = {} if rows is None else {'rows': rows}
  logits, _ = apply_fn(params, masked.input_ids, batch['segment_ids'], batch['input_mask'], masked.positions,
                       deterministic=deterministic, method='discriminator_mlm_logits', rngs={'dropout': rngs[1]},
                       **rows)
  return masked_lm_sums('mlm', logits, masked)


def mlm_metrics(sums, config: ObjectiveConfig, denominators=None, progress=1.0):
  del config, progress  # one loss, no schedule
  loss = _mean(sums, 'mlm_xent', denominators, 'selected')
  one = jnp.ones((), jnp.float32)
  return loss, {'loss': (loss, one), 'mlm_loss': (loss, one), 'mlm_accuracy': (sums['mlm_correct'], sums['selected'])}


def adversarial_detection(apply_fn, params, batch, masked, sample, *, config, rngs=None, deterministic=False,
                          rows=None, progress=1.0):
  """(sums, Detection) of Adversarial ELECTRA: the generator is trained by REINFORCE to maximise the discriminator's
  loss (paper, appendix F), per selected position t (weights w_t, mean over the selected ones):
  - reward R_t: the discriminator's loss on the token there, -log D(correct label) = sigmoid cross-entropy of its
    logit against its label (replaced, or real when the sample equals the original). The paper assumes D's
    verdict at t depends on no other replacement, so each sample is credited with its own position's reward
    alone; the tokens that were not selected do not count.
  - baseline b_t = -log sigmoid(z_t), z_t a learned logit on the generator's encoder output at t (the model's
    `generator/adversarial_baseline`), trained by cross-entropy to match the reward: its target probability is
    exp(-R_t), D's probability of the correct label.
  - generator: the REINFORCE gradient of E[R], one sample per position: the surrogate
        policy_loss = -mean_t[log p_G(x^_t) * (R_t - b_t)],  R_t and b_t under stop_gradient,
    where p_G is the distribution the sample was drawn from (softmax of the logits at temperature T) and x^_t the
    slot's own draw (`sample(..., merge=False)`), not the merged id a position drawn twice is corrupted with. It
    replaces the MLM loss ("instead of maximum likelihood"): gen_loss stays a metric but is not trained.
  - loss = gen_weight * (policy_loss + baseline_loss) + disc_weight * disc_loss, disc_loss exactly ELECTRA's
    (the samples pass through stop_gradient; the reward sends nothing into the discriminator).
  """
  sums, d = replaced_token_detection(apply_fn, params, batch, masked, sample, rngs=rngs, deterministic=deterministic,
                                     rows=rows, generator='generator_logits_and_baseline')
  disc_xent = optax.sigmoid_binary_cross_entropy(d.disc_logits, d.labels)
  reward = jax.lax.stop_gradient(jnp.take_along_axis(disc_xent, masked.positions, axis=1))  # [batch, P]
  baseline = -jax.nn.log_sigmoid(d.baseline_logits)
  log_probs = jax.nn.log_softmax(sampling_logits(d.gen_logits, masked.targets, config, progress))
  # The log-probability of what each slot drew. d.samples holds the corruption: at a position drawn twice under
  # duplicate_samples='mean', the floor of the mean of the draws, an id neither slot may have drawn. (The same
  # keys and logits as the sampling in replaced_token_detection: the same draws.)
  draws = sample(d.gen_logits, merge=False)
  sample_log_prob = jnp.take_along_axis(log_probs, draws[..., None], axis=-1)[..., 0]
  advantage = reward - jax.lax.stop_gradient(baseline)
  sums.update({
      'policy': jnp.sum(sample_log_prob * advantage * masked.weights),
      'baseline_xent': jnp.sum(optax.sigmoid_binary_cross_entropy(d.baseline_logits, jnp.exp(-reward))
                               * masked.weights),
      'reward': jnp.sum(reward * masked.weights),
      'baseline': jnp.sum(jax.lax.stop_gradient(baseline) * masked.weights),
  })
  return sums, d


def adversarial_sums(apply_fn, params, batch, masked, sample, **kwargs):
  return adversarial_detection(apply_fn, params, batch, masked, sample, **kwargs)[0]


def adversarial_metrics(sums, config: ObjectiveConfig, denominators=None, progress=1.0):
  _, metrics = loss_and_metrics(sums, config, denominators, progress)
  policy_loss = -_mean(sums, 'policy', denominators, 'selected')
  baseline_loss = _mean(sums, 'baseline_xent', denominators, 'selected')
  loss = config.gen_weight * (policy_loss + baseline_loss) + disc_weight(config, progress) * metrics['disc_loss'][0]
  one = jnp.ones((), jnp.float32)
  metrics.update({
      'loss': (loss, one),
      'policy_loss': (policy_loss, one),
      'baseline_loss': (baseline_loss, one),
      'reward': (sums['reward'], sums['selected']),
      'baseline': (sums['baseline'], sums['selected']),
  })
  return loss, metrics


def _loss_of(sums_fn, metrics_fn):
  """An objective's loss function, called as `electra_loss`: the masking drawn, its sums, its loss and metrics
  (`metrics_kwargs`: `step` for `two_stage_metrics`)."""

  def loss(apply_fn: Callable[..., Any], params, batch, rng, *, config: ObjectiveConfig, special: masking.SpecialIds,
           vocab_size: int, progress=1.0, deterministic: bool = False, **metrics_kwargs):
    masked, sample, rngs = mask_and_sampler(rng, batch, config=config, special=special, vocab_size=vocab_size,
                                            progress=progress)
    sums = sums_fn(apply_fn, params, batch, masked, sample, config=config, rngs=rngs, deterministic=deterministic,
                   progress=progress)
    return metrics_fn(sums, config, progress=progress, **metrics_kwargs)
  return loss


# ELECTRA's loss, as the official `PretrainingModel.__init__` makes it: mask the input; run the generator, sample
# from it, corrupt the input and run the discriminator (`electra_sums`); the loss from the batch's sums.
electra_loss = _loss_of(electra_sums, loss_and_metrics)
electra_15_sums = functools.partial(electra_sums, selected_only=True)
# ELECTRA 15%: `electra_loss` with the discriminator loss (and its metrics) only on the selected positions.
electra_15_loss = _loss_of(electra_15_sums, loss_and_metrics)
# `two_stage_loss(..., step=...)`: ELECTRA's loss under objective.two_stage_generator_steps (`two_stage_metrics`).
two_stage_loss = _loss_of(electra_sums, two_stage_metrics)
replace_mlm_loss = _loss_of(replace_mlm_sums, replace_mlm_metrics)
all_tokens_mlm_loss = _loss_of(all_tokens_mlm_sums, all_tokens_mlm_metrics)
mlm_loss = _loss_of(mlm_sums, mlm_metrics)
electra_adversarial_loss = _loss_of(adversarial_sums, adversarial_metrics)


def electra_frozen_metrics(sums, config: ObjectiveConfig, denominators=None, progress=1.0):
  """Fast-ELECTRA: ELECTRA's loss and metrics whose generator is a frozen, pre-trained MLM (`electra_jax.frozen`):
  only the discriminator learns (the generator's weight is 0); gen_loss and gen_accuracy report the frozen MLM."""
  return loss_and_metrics(sums, dataclasses.replace(config, gen_weight=0.0), denominators, progress)


electra_frozen_loss = _loss_of(electra_sums, electra_frozen_metrics)


@dataclasses.dataclass(frozen=True)
class Objective:
  """A pre-training objective: its loss, what its model holds (`electra_jax.model.Electra` fields, which also say
  what a step computes: its FLOPs), and its generator when another run's (electra_frozen)."""
  # (apply_fn, params, batch, rng, *, config, special, vocab_size, progress) -> (loss, Metrics)
  loss: Callable[..., Any]
  # Its two halves, for gradient accumulation: the float32 sums of a (micro-)batch, and (loss, Metrics) from them.
  sums: Callable[..., dict[str, jax.Array]] | None = None
  metrics: Callable[..., Any] | None = None
  # (sums, Detection) of a replaced-token detection objective, the sums `sums`'s: what held-out evaluation scores
  # the discriminator's AUC from. None for an MLM discriminator.
  detection: Callable[..., Any] | None = None
  with_generator: bool = True  # a generator tower of its own, trained
  discriminator_head: str = 'rtd'  # 'rtd', 'mlm' or 'mlm_copy'
  generator_baseline: bool = False  # the generator's REINFORCE baseline head (electra_adversarial)
  selected_only: bool = False  # the discriminator's loss and metrics count only the masked positions (electra_15)
  # The generator is another run's MLM, frozen (electra_frozen, `electra_jax.frozen`): it runs beside `model`, the
  # discriminator alone (what fine-tuning reads), is copied into the state at step 0 and never updated.
  frozen_generator: bool = False

  @property
  def detects_replaced(self) -> bool:
    """Whether its discriminator has the replaced-token detection head (what detect and the HF export read)."""
    return self.discriminator_head == 'rtd'

  def model(self, config: ModelConfig) -> Electra:
    """The model this objective trains, as its checkpoints hold it for fine-tuning."""
    if config.tying == 'gdes' and not (self.with_generator and self.detects_replaced):
      raise ConfigError('model.tying=gdes disentangles the generator\'s embeddings from the replaced-token '
                        'detector\'s: it needs an objective with both (electra, electra_15, electra_adversarial)')
    return Electra(config, with_generator=self.with_generator, discriminator_head=self.discriminator_head,
                   generator_baseline=self.generator_baseline)

  def training_model(self, c: TrainConfig) -> Electra:
    """The model the train step runs for run `c`: `model`, beside the frozen generator for electra_frozen."""
    if self.frozen_generator:
      return frozen.model(c, generator_source(c))
    return self.model(c.model)

  def optimizer(self, tx: optax.GradientTransformation) -> optax.GradientTransformation:
    """The run's optimiser `tx`, with no update for what the objective does not train."""
    return frozen.optimizer(tx) if self.frozen_generator else tx

  def initial_state(self, c: TrainConfig, run, state, tokenizer=None):
    """The step-0 state of run `c` from the freshly initialised `state` (`train_step.TrainState`, laid out as `run`
    says): electra_frozen copies its generator's checkpoint in; `tokenizer`, the run's, must be the generator's."""
    if self.frozen_generator:
      return frozen.initial_state(c, run, state, generator_source(c), tokenizer)
    return state

  def train_flops_per_step(self, c: TrainConfig, source: frozen.Source | None = None) -> float:
    """FLOPs of one step of run `c` ('matmul' convention): what the trainer adds to `train_flops` each step.

    electra_frozen: the discriminator's training plus one forward pass of the frozen generator (of `source`, by
    default the run objective.generator_checkpoint names); what training that generator cost is not included.
    objective.uniform_generator: the discriminator's alone (no generator runs, `generator_logits`).
    """
    length = c.data.max_seq_length
    runs = dataclasses.replace(self, with_generator=False) if c.objective.uniform_generator else self
    step = flops.pretraining_flops_per_step(c.model, c.batch_size, length, c.objective.num_predictions(length), runs)
    if self.frozen_generator:
      step += frozen.forward_flops_per_step(c, source or generator_source(c))
    return step


OBJECTIVES = {
    'electra': Objective(electra_loss, electra_sums, loss_and_metrics, electra_detection),
    'electra_15': Objective(electra_15_loss, electra_15_sums, loss_and_metrics,
                            functools.partial(electra_detection, selected_only=True), selected_only=True),
    'replace_mlm': Objective(replace_mlm_loss, replace_mlm_sums, replace_mlm_metrics, discriminator_head='mlm'),
    'all_tokens_mlm': Objective(all_tokens_mlm_loss, all_tokens_mlm_sums, all_tokens_mlm_metrics,
                                discriminator_head='mlm_copy'),
    'mlm': Objective(mlm_loss, mlm_sums, mlm_metrics, with_generator=False, discriminator_head='mlm'),
    'electra_adversarial': Objective(electra_adversarial_loss, adversarial_sums, adversarial_metrics,
                                     adversarial_detection, generator_baseline=True),
    'electra_frozen': Objective(electra_frozen_loss, electra_sums, electra_frozen_metrics, electra_detection,
                                with_generator=False, frozen_generator=True),
}


def get(name: str) -> Objective:
  if name not in OBJECTIVES:
    raise ConfigError(f'unknown objective.name {name!r}; the objectives are: {", ".join(OBJECTIVES)}')
  return OBJECTIVES[name]


def train_flops_per_step(c: TrainConfig) -> float:
  """FLOPs of one step of pre-training run `c` ('matmul' convention): `Objective.train_flops_per_step`."""
  return get(c.objective.name).train_flops_per_step(c)


def generator_source(c: TrainConfig, config: TrainConfig | None = None) -> frozen.Source:
  """The run electra_frozen run `c` samples from, with its objective: the run objective.generator_checkpoint names,
  or one of config `config` not trained yet (an experiment plans it). A ConfigError if `c` cannot sample from it."""
  config = config or config_files.load_config(c.objective.generator_checkpoint)
  return frozen.check_source(c, frozen.Source(config, get(config.objective.name)))
