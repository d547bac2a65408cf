"""Held-out evaluation during pre-training: the objective's metrics on fixed batches of held-out examples.

Every `eval_every` steps (and at the last step) `Evaluator` runs a jitted, dropout-free evaluation step over the
same `eval_batches` batches with the same masking keys, so two evaluations of one state give the same numbers and
successive ones differ only by the model. The batches are drawn once, with the run's seed, from the held-out
examples (`data.load_eval_examples`). Every process evaluates its share of each global batch (the metrics are
reduced over the mesh, so every process holds the totals); process 0 writes them (MetricsWriter), as `eval_`
followed by the training metric's name: eval_loss, eval_gen_loss, eval_gen_accuracy, eval_disc_loss,
eval_disc_accuracy, eval_disc_precision, eval_disc_recall, ... and eval_disc_auc.

eval_disc_auc is the area under the discriminator's ROC curve over the eval tokens its loss counts (replaced vs
original), estimated on the device from two histograms of its logits (AUC_BINS bins over [-AUC_RANGE, AUC_RANGE],
summed over batches): `binned_auc` counts a replaced/original pair in one bin as half right, as ties are counted
in the exact AUC, so the estimate differs from the exact one only by pairs closer than a bin (1.5e-3 in logit).
The histograms are a fixed 2 x AUC_BINS integers whatever the batch, where gathering the probabilities to a host
would cost eval_batches x batch x length floats.
"""

import functools
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import tqdm

from electra_jax import masking, metrics as metrics_lib, objective, scaffold, sharding, train_step
from electra_jax.data import loader
from electra_jax.config import ConfigError, TrainConfig

AUC_BINS = 16384
AUC_RANGE = 12.0  # logits beyond +-12 (P(replaced) within 6e-6 of 0 or 1) fall into the end bins
SHOWN = ('eval_loss', 'eval_gen_loss', 'eval_gen_accuracy', 'eval_disc_loss', 'eval_disc_accuracy',
         'eval_disc_recall', 'eval_disc_auc', 'eval_mlm_loss', 'eval_mlm_accuracy')  # printed at each evaluation
EVAL_KEY = 2  # fold_in(PRNGKey(seed), EVAL_KEY): the eval masking keys, apart from training's (1)


def logit_histograms(logits, labels, weights):
  """(replaced, original) [AUC_BINS] int32 counts of the weighted tokens' logits; all arguments [batch, length]."""
  bins = jnp.clip(jnp.floor((logits + AUC_RANGE) * (AUC_BINS / (2 * AUC_RANGE))), 0, AUC_BINS - 1).astype(jnp.int32)
  counted = weights > 0
  replaced = jnp.zeros(AUC_BINS, jnp.int32).at[bins].add((counted & (labels > 0)).astype(jnp.int32))
  original = jnp.zeros(AUC_BINS, jnp.int32).at[bins].add((counted & (labels == 0)).astype(jnp.int32))
  return replaced, original


def binned_auc(replaced: np.ndarray, original: np.ndarray) -> float | None:
  """ROC AUC from counts per score bin (ascending): P(a replaced token scores above an original one), a pair in
  the same bin counting one half. None when either class is empty."""
  replaced, original = np.asarray(replaced, np.float64), np.asarray(original, np.float64)
  if not replaced.sum() or not original.sum():
    return None
  below = np.cumsum(original) - original  # originals in lower bins
  return float(np.sum(replaced * (below + 0.5 * original)) / (replaced.sum() * original.sum()))


def eval_step(state, batch, rng, *, model, config: TrainConfig, special: masking.SpecialIds, flat=None):
  """(Metrics, histograms) of one held-out batch {input_ids, segment_ids, input_mask} [batch, length], without
  dropout, under the objective's schedules at the state's step: its own sums and metrics, as the train step makes
  them (so eval_loss is the training loss's definition). `histograms` is `logit_histograms` of the discriminator
  for replaced-token detection objectives, else None. `flat`: the optimizer.FlatParams the state's parameters are
  stored as (the train step's layout), if any."""
  c = config.objective
  spec = objective.get(c.name)
  params, _, metrics_fn = train_step.at_step(state, c, config.model, flat)  # the stage the state is in, if two
  progress = state.step / config.train_steps
  apply_fn = lambda params, *args, **kwargs: model.apply({'params': params}, *args, **kwargs)
  masked, sample, rngs = objective.mask_and_sampler(rng, batch, config=c, special=special,
                                                    vocab_size=config.model.vocab_size, progress=progress)
  args = (apply_fn, params, batch, masked, sample)
  kwargs = dict(config=c, rngs=rngs, deterministic=True, progress=progress)
  if spec.detection is None:  # an MLM discriminator: no AUC
    sums, histograms = spec.sums(*args, **kwargs), None
  else:
    sums, detection = spec.detection(*args, **kwargs)
    histograms = logit_histograms(detection.disc_logits, detection.labels, detection.token_weights)
  _, metrics = metrics_fn(sums, c, progress=progress)
  return metrics, histograms


def batch_count(examples, *, num_batches: int, batch_size: int) -> int:
  """How many held-out batches an evaluation runs: `num_batches`, or as many as `examples` fill. Raises ConfigError
  if they fill none (the trainer checks this before it writes anything)."""
  count = min(num_batches, len(examples) // batch_size)
  if not count:
    raise ConfigError(f'the held-out text packs into {len(examples)} examples, fewer than one batch of '
                      f'{batch_size}; raise data.eval_fraction or give more text as data.eval_source')
  return count


class Evaluator:
  """Evaluates a run's state on fixed held-out batches; `__call__(step, state)` returns {} when not due."""

  def __init__(self, run, examples, *, every: int, num_batches: int, last_step: int,
               timer: scaffold.Chrono | None = None):
    c = run.config
    self.run, self.every, self.last_step = run, every, last_step
    self.timer = timer or scaffold.Chrono()  # paused while evaluating: a throughput timed by it counts training only
    if examples is None or not every:
      self.batches = []
      return
    count = batch_count(examples, num_batches=num_batches, batch_size=c.batch_size)
    # The same rows every evaluation: drawn once with the run's seed, global batch i = chosen[i*B:(i+1)*B].
    chosen = np.random.default_rng(c.seed).choice(len(examples), count * c.batch_size, replace=False)
    rows = sharding.local_rows(run.batch_sharding, c.batch_size)  # this process's rows of each global batch
    replicated = sharding.replicated(run.mesh)
    # Put on the devices once: every evaluation reads the same batches with the same keys.
    self.batches = [sharding.global_batch(loader.read_batch(
        examples, chosen[i * c.batch_size:(i + 1) * c.batch_size][rows], run.special),
        run.batch_sharding) for i in range(count)]
    base = jax.random.fold_in(jax.random.PRNGKey(c.seed), EVAL_KEY)
    self.keys = [jax.device_put(jax.random.key_data(jax.random.fold_in(base, i)), replicated) for i in range(count)]
    if count < num_batches and jax.process_index() == 0:
      print(f'evaluating on {count} held-out batches, not eval_batches={num_batches}: the held-out text packs into '
            f'{len(examples)} examples', file=sys.stderr)
    step = functools.partial(eval_step, model=run.model, config=c, special=run.special, flat=run.flat)
    jitted = jax.jit(step, in_shardings=(run.step_shardings, run.batch_sharding, replicated),
                     out_shardings=replicated)

    def compile_step():
      with sharding.activate(run.mesh, c.mesh.rules):
        return jitted.lower(run.abstract_step_state(), run.abstract_batch(), run.abstract_key()).compile()
    # Compiled now, in a thread beside the train step's compile, not at the first evaluation hours into the run.
    self._compiled = scaffold.compile_in_thread('the evaluation step', compile_step)
    self._accumulate = jax.jit(metrics_lib.accumulate)

  def compiled(self) -> list[str]:
    """Waits for the evaluation step's compile (if there is an evaluation) and returns the line saying so: the
    caller prints it, so that a run failing while it compiled ends with its error line."""
    return [self._compiled.result()[1]] if self.batches else []

  def due(self, step: int) -> bool:
    return bool(self.batches) and scaffold.itstime(step, self.every, self.last_step)

  def __call__(self, step: int, state) -> dict[str, float]:
    """{'eval_' + metric: value} at the steps evaluation is due, else {}."""
    if not self.due(step):
      return {}
    jax.block_until_ready(state)  # eval_seconds times the evaluation, not the train step still running
    started = time.time()
    with self.timer.paused():
      results = self.evaluate(state)
    results['eval_seconds'] = time.time() - started
    if jax.process_index() == 0:
      tqdm.tqdm.write(f'step {step}: ' + '  '.join(f'{k} {results[k]:.4f}' for k in SHOWN if k in results),
                      file=sys.stderr)
    return results

  def evaluate(self, state) -> dict[str, float]:
    total = histograms = None
    with sharding.activate(self.run.mesh, self.run.config.mesh.rules):
      for batch, key in zip(self.batches, self.keys):
        metrics, counts = self._compiled.result()[0](state, batch, key)
        total = self._accumulate(total, metrics)
        histograms = self._accumulate(histograms, counts) if counts is not None else None
    results = metrics_lib.summarize(total)
    auc = None if histograms is None else binned_auc(*jax.device_get(histograms))
    if auc is not None:
      results['disc_auc'] = auc
    return {f'eval_{name}': value for name, value in results.items()}
