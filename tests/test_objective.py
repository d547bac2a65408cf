"""Replaced-token detection: sampling, labels, losses and metrics, checked against hand-worked numbers. The paper's
ablation objectives and the registry are test_objective_ablations.py's."""

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from electra_jax import masking, objective
from electra_jax.config import ModelConfig, ObjectiveConfig
from electra_jax.model import Electra
from helpers import SPECIAL, STUB_VOCAB as V, token_batch as _batch  # pylint: disable=g-bad-import-order
from helpers import stub_generator_logits as _gen_logits_from_targets

LOG2 = math.log(2.0)


def _stub_apply(original, disc_fn):
  """An `apply_fn` with the Electra signature: generator logits from the original tokens at `positions`,
  discriminator logits `disc_fn(corrupted_ids)`."""

  def apply_fn(params, input_ids, segment_ids, input_mask, positions=None, *, deterministic, method, rngs):
    del params, segment_ids, input_mask, deterministic, rngs
    if method == 'generator_logits':
      return _gen_logits_from_targets(jnp.take_along_axis(original, positions, axis=1))
    assert method == 'discriminator_logits'
    return disc_fn(input_ids)
  return apply_fn


def _loss(apply_fn, batch, config, rng=0):
  fn = jax.jit(functools.partial(objective.electra_loss, apply_fn, config=config, special=SPECIAL, vocab_size=V))
  loss, metrics = fn({}, {k: jnp.asarray(v) for k, v in batch.items()}, jax.random.PRNGKey(rng))
  return float(loss), {k: (float(n), float(d)) for k, (n, d) in metrics.items()}


@pytest.mark.slow
@pytest.mark.parametrize('seed', [0, 1])
def test_losses_by_hand_random_selection(seed):
  # L = 16, mask_prob 0.15 -> P = int(0.155 * 16) = 2.
  #   row 0: N = 5 real tokens  -> n = max(1, round(0.75)) = 1
  #   row 1: N = 10 real tokens -> n = round(1.5) = 2
  # Words are only 5 and 6, so with T = 1e-3 the sample is always the other word c (its logit exceeds the
  # target's by log 2 / 1e-3 = 693: it has probability 1 - e^-693): all 3 selected tokens are replaced.
  # Generator: CE = log 4 at each selected position -> gen_loss = log 4 = 2 log 2.
  # Discriminator stub: logit 0 where the token was replaced (label 1: BCE = log 2) and log 3 where it is the
  # original (label 0: BCE = -log(1 - 3/4) = log 4). Mean over the 15 non-pad tokens, [CLS]/[SEP] included:
  #   disc_loss = (3 log 2 + 12 log 4) / 15 = 27/15 log 2 = 1.8 log 2
  #   loss = 2 log 2 + 50 * 1.8 log 2 = 92 log 2
  ids = np.zeros((2, 16), np.int32)
  ids[0, :5] = [2, 5, 6, 5, 3]
  ids[1, :10] = [2, 6, 5, 5, 6, 3, 6, 6, 5, 3]
  original = jnp.asarray(ids)
  disc = lambda corrupted: jnp.where(corrupted != original, 0.0, jnp.log(3.0))
  config = ObjectiveConfig(mask_prob=0.15, temperature=1e-3, mask_with_replacement=False)  # 3 distinct positions
  loss, m = _loss(_stub_apply(original, disc), _batch(ids), config, rng=seed)
  np.testing.assert_allclose(m['gen_loss'][0], 2 * LOG2, rtol=1e-6)
  np.testing.assert_allclose(m['disc_loss'][0], 1.8 * LOG2, rtol=1e-6)
  np.testing.assert_allclose(loss, 92 * LOG2, rtol=1e-6)
  np.testing.assert_allclose(m['loss'][0], loss, rtol=1e-7)
  assert m['replaced_fraction'] == (3.0, 15.0)
  assert m['sampled_original'] == (0.0, 3.0)
  assert m['gen_accuracy'] == (0.0, 3.0)


def _ratio(metric):
  return float(metric[0]) / float(metric[1])


@pytest.mark.slow
@pytest.mark.parametrize('mask_token_prob', [0.85, 0.0])
def test_losses_and_metrics_by_hand(mask_token_prob):
  # L = 8, mask_prob 0.6 -> P = int(0.605 * 8) = 4; row 0: N = 5 -> n = round(3.0) = 3, row 1: N = 4 ->
  # n = round(2.4) = 2: every word is selected, so the example is deterministic.
  #   row 0 [CLS] 5 6 7 [SEP]   samples (T = 1e-3, argmax): 5->6, 6->5, 7->7   labels 0 1 1 0 0
  #   row 1 [CLS] 7 5 [SEP]     samples:                    7->7, 5->6         labels 0 0 1 0
  # The 7s are sampled correctly and so count as real. The sample replaces the token at EVERY selected
  # position, [MASK]ed or kept (mask_token_prob 0.85 or 0 must give the same labels).
  # gen CE: 5 and 6 -> log 4, 7 -> log 2: (3 log 4 + 2 log 2) / 5 = 8/5 log 2. gen_accuracy: the 7s, 2/5.
  # Discriminator logits are fixed, +-1 on real tokens and +5 on padding (which must not count):
  #   row 0 logits  1  1 -1  1 -1 | predicted 1 1 0 1 0 | labels 0 1 1 0 0 | correct . x . . x
  #   row 1 logits -1  1  1 -1    | predicted 0 1 1 0   | labels 0 0 1 0   | correct x . x x
  # TP = 2 (row 0 pos 1, row 1 pos 2); predicted positives 5 -> precision 2/5; positives 3 -> recall 2/3;
  # accuracy 5/9; replaced_fraction 3/9.
  # With |logit| = 1: BCE = s = log(1 + e^-1) when correct, log(1 + e) = 1 + s when wrong, so
  #   disc_loss = (9 s + 4) / 9 = s + 4/9,   loss = 8/5 log 2 + 50 (s + 4/9).
  ids = np.array([[2, 5, 6, 7, 3, 0, 0, 0], [2, 7, 5, 3, 0, 0, 0, 0]], np.int32)
  logits = jnp.array([[1, 1, -1, 1, -1, 5, 5, 5], [-1, 1, 1, -1, 5, 5, 5, 5]], jnp.float32)
  config = ObjectiveConfig(mask_prob=0.6, mask_with_replacement=False,
                           temperature=1e-3, mask_token_prob=mask_token_prob)
  loss, m = _loss(_stub_apply(jnp.asarray(ids), lambda corrupted: logits), _batch(ids), config)
  s = math.log(1 + math.exp(-1))
  np.testing.assert_allclose(m['gen_loss'][0], 1.6 * LOG2, rtol=1e-6)
  np.testing.assert_allclose(m['disc_loss'][0], s + 4 / 9, rtol=1e-6)
  np.testing.assert_allclose(loss, 1.6 * LOG2 + 50 * (s + 4 / 9), rtol=1e-6)
  assert m['gen_accuracy'] == (2.0, 5.0)
  assert m['disc_precision'] == (2.0, 5.0)
  assert m['disc_recall'] == (2.0, 3.0)
  assert m['disc_accuracy'] == (5.0, 9.0)
  assert m['replaced_fraction'] == (3.0, 9.0)
  assert m['sampled_original'] == (2.0, 5.0)
  # Mean P(replaced): replaced tokens have logits 1, -1, 1 -> (2 sig(1) + sig(-1)) / 3 = (1 + sig(1)) / 3;
  # the six original ones have three +1 and three -1 -> 3 (sig(1) + sig(-1)) / 6 = 1/2.
  sig1 = 1 / (1 + math.exp(-1))
  np.testing.assert_allclose(_ratio(m['disc_prob_replaced']), (1 + sig1) / 3, rtol=1e-6)
  np.testing.assert_allclose(_ratio(m['disc_prob_original']), 0.5, rtol=1e-6)


def test_loss_weights():
  # Same example as above with gen_weight 2 and disc_weight 10: loss = 2 * 8/5 log 2 + 10 (s + 4/9).
  ids = np.array([[2, 5, 6, 7, 3, 0, 0, 0], [2, 7, 5, 3, 0, 0, 0, 0]], np.int32)
  logits = jnp.array([[1, 1, -1, 1, -1, 5, 5, 5], [-1, 1, 1, -1, 5, 5, 5, 5]], jnp.float32)
  config = ObjectiveConfig(mask_prob=0.6, mask_with_replacement=False,
                           temperature=1e-3, gen_weight=2.0, disc_weight=10.0)
  loss, _ = _loss(_stub_apply(jnp.asarray(ids), lambda corrupted: logits), _batch(ids), config)
  s = math.log(1 + math.exp(-1))
  np.testing.assert_allclose(loss, 3.2 * LOG2 + 10 * (s + 4 / 9), rtol=1e-6)


@pytest.mark.slow
def test_disallow_correct_labels_every_selection_replaced():
  # The stub generator ranks the original 7 first; with disallow_correct its logit drops by 1000, so the
  # sample is never 7: all 5 selected tokens of the example above are replaced (T = 1, real random draws).
  ids = np.array([[2, 7, 7, 7, 3, 0, 0, 0], [2, 7, 7, 3, 0, 0, 0, 0]], np.int32)
  zeros = lambda corrupted: jnp.zeros(corrupted.shape, jnp.float32)
  for disallow in (False, True):
    config = ObjectiveConfig(mask_prob=0.6, mask_with_replacement=False, disallow_correct=disallow)
    _, m = _loss(_stub_apply(jnp.asarray(ids), zeros), _batch(ids), config)
    if disallow:
      assert m['sampled_original'] == (0.0, 5.0)
      assert m['replaced_fraction'] == (5.0, 9.0)
    # Whatever is sampled: a token is labelled replaced exactly when its sample differs from the original.
    assert m['replaced_fraction'][0] == m['sampled_original'][1] - m['sampled_original'][0]


def _draws(logits, config, n, targets=None, seed=0):
  """`n` samples for one position with the given [vocab] logits, as a [n] numpy array."""
  logits = jnp.broadcast_to(jnp.asarray(logits, jnp.float32), (n, 1, len(logits)))
  targets = jnp.zeros((n, 1), jnp.int32) if targets is None else jnp.full((n, 1), targets, jnp.int32)
  fn = jax.jit(functools.partial(objective.sample_replacements, config=config))
  return np.asarray(fn(jax.random.PRNGKey(seed), logits, targets))[:, 0]


@pytest.mark.parametrize('sampling', ['inverse_cdf', 'gumbel'])
def test_sample_equal_to_original_and_disallow_correct(sampling):
  # Logits +20 on token 3, 0 elsewhere: without disallow_correct the original (3) wins essentially always;
  # with it, 3 gets -980 and is never drawn, the other 4 ids are equally likely.
  logits = [0, 0, 0, 20, 0]
  plain = _draws(logits, ObjectiveConfig(sampling=sampling), 4000, targets=3)
  assert np.mean(plain == 3) > 0.99  # P(3) = e^20 / (e^20 + 4) = 1 - 8e-9
  banned = _draws(logits, ObjectiveConfig(disallow_correct=True, sampling=sampling), 4000, targets=3)
  assert not np.any(banned == 3)
  assert set(banned.tolist()) == {0, 1, 2, 4}
  # The first and the last id, banned, are never drawn either (the ends of the cumulative sum).
  for end in (0, 4):
    config = ObjectiveConfig(disallow_correct=True, sampling=sampling)
    ends = _draws(np.roll(logits, end - 3), config, 4000, targets=end)
    assert set(ends.tolist()) == {0, 1, 2, 3, 4} - {end}


@pytest.mark.parametrize('sampling', ['inverse_cdf', 'gumbel'])
@pytest.mark.parametrize('temperature', [1.0, 2.0, 0.5])
def test_temperature(temperature, sampling):
  # The sampler draws from softmax(logits/T); with logits = log p that is p^(1/T) normalised:
  #   T = 1:   [0.5, 0.3, 0.2]
  #   T = 2:   sqrt(p) = [0.7071, 0.5477, 0.4472] / 1.7020 = [0.4155, 0.3218, 0.2628]
  #   T = 0.5: p^2     = [0.25, 0.09, 0.04] / 0.38        = [0.6579, 0.2368, 0.1053]
  # 20000 draws: sd of a frequency <= sqrt(0.25 / 20000) = 0.0035; tolerance 0.018 is ~5 sd.
  p = np.array([0.5, 0.3, 0.2])
  expected = {1.0: [0.5, 0.3, 0.2], 2.0: [0.4155, 0.3218, 0.2628], 0.5: [0.6579, 0.2368, 0.1053]}[temperature]
  np.testing.assert_allclose(p ** (1 / temperature) / np.sum(p ** (1 / temperature)), expected, atol=1e-4)
  samples = _draws(np.log(p), ObjectiveConfig(temperature=temperature, sampling=sampling), 20000)
  freq = np.bincount(samples, minlength=3) / len(samples)
  np.testing.assert_allclose(freq, expected, atol=0.018)


def test_temperature_and_disc_weight_schedules_by_hand():
  # T falls linearly from initial_temperature 4 to temperature 1 over the first half of training:
  #   T(p) = 1 + 3 max(0, 1 - p / 0.5): p = 0 -> 4, 0.125 -> 3.25, 0.25 -> 2.5, 0.4 -> 1.6, 0.5 -> 1, 0.9 -> 1.
  # lambda rises linearly from 0 to disc_weight 50 over the first 20%: 50 min(1, p / 0.2): 0 -> 0, 0.05 -> 12.5,
  # 0.1 -> 25, 0.2 -> 50, 0.7 -> 50.
  config = ObjectiveConfig(temperature=1.0, initial_temperature=4.0, temperature_decay_fraction=0.5,
                           disc_weight_warmup_fraction=0.2)
  for p, t in [(0.0, 4.0), (0.125, 3.25), (0.25, 2.5), (0.4, 1.6), (0.5, 1.0), (0.9, 1.0)]:
    np.testing.assert_allclose(float(objective.temperature(config, jnp.float32(p))), t, rtol=1e-6)
  for p, w in [(0.0, 0.0), (0.05, 12.5), (0.1, 25.0), (0.2, 50.0), (0.7, 50.0)]:
    np.testing.assert_allclose(float(objective.disc_weight(config, jnp.float32(p))), w, rtol=1e-6)
  # Without a schedule both are the configured constants at any progress (the paper's settings).
  plain = ObjectiveConfig(temperature=2.0)
  assert objective.temperature(plain, 0.0) == 2.0 and objective.disc_weight(plain, 0.0) == 50.0


def test_scheduled_temperature_is_what_samples_are_drawn_at():
  # T(0.25) = 1 + 3 (1 - 0.25 / 0.5) = 2.5: logits log p sample p^(1/2.5) = p^0.4 normalised:
  #   [0.5, 0.3, 0.2]^0.4 = [0.7579, 0.6178, 0.5253] / 1.9010 = [0.3987, 0.3250, 0.2763].
  # At p = 0.75 the schedule is over: T = 1, [0.5, 0.3, 0.2]. 20000 draws, tolerance 0.018 (~5 sd, as above).
  config = ObjectiveConfig(temperature=1.0, initial_temperature=4.0, temperature_decay_fraction=0.5)
  logits = jnp.broadcast_to(jnp.log(jnp.array([0.5, 0.3, 0.2])), (20000, 1, 3))
  targets = jnp.zeros((20000, 1), jnp.int32)
  sample = jax.jit(functools.partial(objective.sample_replacements, config=config))
  for progress, expected in [(0.25, [0.3987, 0.3250, 0.2763]), (0.75, [0.5, 0.3, 0.2])]:
    samples = np.asarray(sample(jax.random.PRNGKey(0), logits, targets, progress=jnp.float32(progress)))[:, 0]
    np.testing.assert_allclose(np.bincount(samples, minlength=3) / len(samples), expected, atol=0.018)


def test_low_temperature_is_argmax():
  samples = _draws(np.log([0.3, 0.45, 0.25]), ObjectiveConfig(temperature=1e-3), 2000)
  assert np.all(samples == 1)


def test_uniform_generator():
  # A uniform generator's logits are zeros (generator_logits, below): each of 4 ids has p = 1/4. 20000 draws:
  # sd = sqrt(3/16 / 20000) = 0.0031; tolerance 0.016 (~5 sd).
  samples = _draws([0.0, 0.0, 0.0, 0.0], ObjectiveConfig(uniform_generator=True), 20000)
  freq = np.bincount(samples, minlength=4) / len(samples)
  np.testing.assert_allclose(freq, 0.25, atol=0.016)


def test_a_uniform_generator_runs_no_generator_and_trains_nothing():
  """objective.uniform_generator, as the official code's: no generator runs; its logits are zeros [batch, P, V], so
  gen_loss is the constant log V and sends no gradient anywhere (the shared embeddings included): with
  disc_weight 0 every gradient is zero, while the discriminator's loss still trains the embeddings. Through the
  train step's loss (`objective.electra_loss`) and its halves (`Objective.sums`, `.metrics`, as gradient
  accumulation runs them)."""
  vocab = 32
  model = Electra(ModelConfig(vocab_size=vocab, embedding_size=8, hidden_size=16, num_layers=1, num_heads=1,
                              intermediate_size=16, generator_hidden_fraction=0.5, dropout_rate=0.0,
                              attention_dropout_rate=0.0))
  ids = np.random.RandomState(0).randint(5, vocab, (2, 8)).astype(np.int32)
  ids[:, 0], ids[:, -1] = 2, 3
  batch = {k: jnp.asarray(v) for k, v in _batch(ids).items()}
  params = nn.meta.unbox(model.init(jax.random.PRNGKey(0), batch['input_ids'], batch['segment_ids'],
                                    batch['input_mask'], jnp.zeros((2, 2), jnp.int32))['params'])
  # The generator's weights NaN: had it run, they would reach the logits and the gradients.
  params['generator'] = jax.tree.map(lambda x: jnp.full_like(x, jnp.nan), params['generator'])
  apply_fn = lambda p, *args, **kwargs: model.apply({'params': p}, *args, **kwargs)
  spec = objective.get('electra')

  def loss(p, halves, **config):
    config = ObjectiveConfig(uniform_generator=True, **config)
    rng = jax.random.PRNGKey(1)
    if not halves:
      return spec.loss(apply_fn, p, batch, rng, config=config, special=SPECIAL, vocab_size=vocab)
    masked, sample, rngs = objective.mask_and_sampler(rng, batch, config=config, special=SPECIAL, vocab_size=vocab,
                                                      progress=1.0)
    return spec.metrics(spec.sums(apply_fn, p, batch, masked, sample, config=config, rngs=rngs), config)

  grad = jax.jit(jax.grad(loss, has_aux=True), static_argnames=('halves', 'disc_weight'))
  for halves in (False, True):
    no_disc, metrics = grad(params, halves, disc_weight=0.0)
    np.testing.assert_allclose(metrics['gen_loss'][0], math.log(vocab), rtol=1e-6)
    for path, g in jax.tree_util.tree_leaves_with_path(no_disc):
      assert np.all(np.asarray(g) == 0), jax.tree_util.keystr(path)
    trained, _ = grad(params, halves)
    assert np.any(np.asarray(trained['embeddings']['word_embeddings']['embedding']) != 0)  # the discriminator's
  config = ObjectiveConfig(uniform_generator=True)
  masked, sample, _ = objective.mask_and_sampler(jax.random.PRNGKey(1), batch, config=config, special=SPECIAL,
                                                 vocab_size=vocab, progress=1.0)
  _, detection = objective.electra_detection(apply_fn, params, batch, masked, sample, config=config)
  np.testing.assert_array_equal(detection.gen_logits, np.zeros((2, config.num_predictions(8), vocab)))


@pytest.mark.slow
def test_discriminator_loss_sends_no_gradient_into_the_generator():
  """Sampling is under stop_gradient: with gen_weight 0, every generator-tower gradient is exactly zero."""
  model_config = ModelConfig(vocab_size=32, embedding_size=16, hidden_size=32, num_layers=1, num_heads=2,
                             intermediate_size=64, generator_hidden_fraction=0.5, dropout_rate=0.0,
                             attention_dropout_rate=0.0)
  model = Electra(model_config)
  r = np.random.RandomState(0)
  ids = r.randint(5, 32, (4, 16)).astype(np.int32)
  ids[:, 0], ids[:, -1] = 2, 3
  ids[1, 10:] = 0
  batch = {k: jnp.asarray(v) for k, v in _batch(ids).items()}
  # Generic parameter values of the right shapes (the initialiser itself is tested in test_model.py).
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), batch['input_ids'], batch['segment_ids'],
                          batch['input_mask'], jnp.zeros((4, 2), jnp.int32))['params']
  params = jax.tree.map(lambda s: jnp.asarray(r.normal(0, 0.2, s.shape), jnp.float32), nn.meta.unbox(shapes))
  apply_fn = lambda p, *args, **kwargs: model.apply({'params': p}, *args, **kwargs)

  def loss(p, config):
    return objective.electra_loss(apply_fn, p, batch, jax.random.PRNGKey(1), config=config, special=SPECIAL,
                                  vocab_size=32, deterministic=True)

  disc_only = jax.jit(jax.grad(lambda q: loss(q, ObjectiveConfig(gen_weight=0.0))[0]))(params)
  for path, g in jax.tree_util.tree_leaves_with_path(disc_only['generator']):
    assert np.all(np.asarray(g) == 0), jax.tree_util.keystr(path)
  # The discriminator loss does reach the discriminator and the shared embeddings. (The key bias is excluded:
  # softmax is invariant to a per-query constant, so its gradient is zero up to rounding.) That the generator's
  # own loss trains the generator is shown in test_train_step.py (its MLM loss goes down).
  for tree in (disc_only['discriminator'], disc_only['embeddings']):
    for path, g in jax.tree_util.tree_leaves_with_path(tree):
      name = jax.tree_util.keystr(path)
      if "'key'" not in name or "'bias'" not in name:
        assert np.any(np.asarray(g) != 0), name


@pytest.mark.parametrize('duplicates, sampled, expected, label', [
    ('first', (9, 14), 9, 1.0),  # the first draw's sample
    ('mean', (9, 14), 11, 1.0),  # floor((9 + 14) / 2): neither sample, as the official scatter_update writes
    ('first', (6, 5), 6, 1.0),
    ('mean', (6, 5), 5, 0.0),  # floor((6 + 5) / 2) = 5 is the original token: labelled real
])
def test_a_twice_drawn_position_is_corrupted_by_objective_duplicate_samples(duplicates, sampled, expected, label):
  # [CLS] 5 6 [SEP] with position 1 (token 5) drawn by both slots. The generator stub puts all the mass of slot k
  # on sampled[k] (T = 1e-3: the sample is that id); the discriminator stub's logits are the corrupted ids, so
  # they show what the batch was corrupted with.
  vocab = 16
  ids = jnp.array([[2, 5, 6, 3]], jnp.int32)
  masked = masking.Masked(input_ids=jnp.array([[2, 4, 6, 3]], jnp.int32), positions=jnp.array([[1, 1]], jnp.int32),
                          targets=jnp.array([[5, 5]], jnp.int32), weights=jnp.ones((1, 2), jnp.float32))
  gen_logits = 10.0 * jax.nn.one_hot(jnp.array([sampled]), vocab)

  def apply_fn(params, input_ids, segment_ids, input_mask, positions=None, *, deterministic, method, rngs):
    del params, segment_ids, input_mask, positions, deterministic, rngs
    return gen_logits if method == 'generator_logits' else input_ids.astype(jnp.float32)

  config = ObjectiveConfig(temperature=1e-3, duplicate_samples=duplicates)
  sample = objective.sampler(jax.random.split(jax.random.PRNGKey(0), 1), masked, config)
  batch = {'input_ids': ids, 'segment_ids': jnp.zeros_like(ids), 'input_mask': jnp.ones_like(ids)}
  _, detection = objective.replaced_token_detection(apply_fn, {}, batch, masked, sample, deterministic=True)
  np.testing.assert_array_equal(detection.disc_logits, [[2, expected, 6, 3]])
  np.testing.assert_array_equal(detection.labels, [[0, label, 0, 0]])


def test_softmax_xent_is_optax_with_an_elementwise_gradient():
  """objective.softmax_xent: optax's integer-label cross-entropy, the label's logit picked by a comparison instead of
  a gather. Same values and gradients; its gradient has no scatter (one elementwise pass on a GPU)."""
  logits = jax.random.normal(jax.random.PRNGKey(0), (3, 5, 50)) * 4
  labels = jax.random.randint(jax.random.PRNGKey(1), (3, 5), 0, 50)
  np.testing.assert_array_equal(objective.softmax_xent(logits, labels),
                                optax.softmax_cross_entropy_with_integer_labels(logits, labels))
  weights = jnp.linspace(0.5, 2.0, 15).reshape(3, 5)
  grad = lambda xent: jax.grad(lambda x: jnp.sum(xent(x, labels) * weights))
  ours, theirs = grad(objective.softmax_xent), grad(optax.softmax_cross_entropy_with_integer_labels)
  np.testing.assert_allclose(ours(logits), theirs(logits), rtol=1e-6, atol=1e-7)
  assert 'scatter' not in jax.jit(ours).lower(logits).as_text() and 'scatter' in jax.jit(theirs).lower(logits).as_text()
