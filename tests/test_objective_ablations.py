"""The objective ablations of the paper (section 3.2) and their registry, checked against hand-worked numbers.

The example batch (as in test_objective.py): with mask_prob 0.6 every word is selected, so it is deterministic.
  row 0 [CLS] 5 6 7 [SEP] pad pad pad     row 1 [CLS] 7 5 [SEP] pad pad pad pad
The stub generator (helpers.stub_generator_logits) at T = 1e-3 samples 5 -> 6, 6 -> 5, 7 -> 7, so
  corrupted row 0 [CLS] 6 5 7 [SEP]       corrupted row 1 [CLS] 7 6 [SEP]
3 of the 5 selected tokens are replaced, 2 (the 7s) are sampled correctly; gen_loss = (3 log 4 + 2 log 2) / 5
= 8/5 log 2.
"""

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from electra_jax import config as config_lib
from electra_jax import masking, objective, train_step
from electra_jax.config import ModelConfig, ObjectiveConfig
from electra_jax.model import Electra
from helpers import SPECIAL, STUB_VOCAB as V, token_batch as _batch  # pylint: disable=g-bad-import-order
from helpers import loss_of, stub_generator_logits as _gen_logits_from_targets

LOG2 = math.log(2.0)
IDS = np.array([[2, 5, 6, 7, 3, 0, 0, 0], [2, 7, 5, 3, 0, 0, 0, 0]], np.int32)
CORRUPTED = np.array([[2, 6, 5, 7, 3, 0, 0, 0], [2, 7, 6, 3, 0, 0, 0, 0]], np.int32)


def _half_on(tokens):
  """Stub MLM log-probabilities [..., V]: 1/2 on `tokens` (the token the model sees), 1/14 on each other id."""
  return jnp.log(jnp.where(jnp.arange(V) == tokens[..., None], 0.5, 1 / 14))


def _stub_apply(disc_logits=None, copy_logits=None, seen=None):
  """An Electra-like `apply_fn`: the stub generator, discriminator logits `disc_logits`, and an MLM of the
  discriminator-sized model that puts 1/2 on the token it is shown (`_half_on`), with copy-gate logits
  `copy_logits` (a constant). `seen` collects the inputs of the discriminator-sized model."""
  original = jnp.asarray(IDS)

  def apply_fn(params, input_ids, segment_ids, input_mask, positions=None, *, deterministic, method, rngs):
    del params, segment_ids, input_mask, deterministic, rngs
    if method == 'generator_logits':
      return _gen_logits_from_targets(jnp.take_along_axis(original, positions, axis=1))
    if seen is not None:
      seen.append(input_ids)
    if method == 'discriminator_logits':
      return disc_logits
    assert method == 'discriminator_mlm_logits'
    shown = input_ids if positions is None else jnp.take_along_axis(input_ids, positions, axis=1)
    return _half_on(shown), None if copy_logits is None else jnp.full(shown.shape, copy_logits, jnp.float32)
  return apply_fn


def _loss(name, apply_fn, **config):
  # Distinct positions: at mask_prob 0.6 every word is selected, so the by-hand examples are deterministic.
  config = ObjectiveConfig(name=name, mask_prob=0.6, mask_with_replacement=False, temperature=1e-3, **config)
  fn = functools.partial(objective.get(name).loss, apply_fn, config=config, special=SPECIAL, vocab_size=V)
  loss, metrics = fn({}, {k: jnp.asarray(v) for k, v in _batch(IDS).items()}, jax.random.PRNGKey(0))
  return float(loss), {k: (float(n), float(d)) for k, (n, d) in metrics.items()}


@pytest.mark.slow
def test_electra_15_discriminator_loss_on_selected_positions_only():
  # Discriminator logits as in test_objective.py; only the 5 selected positions count:
  #   row 0 pos 1, 2, 3: logits  1 -1  1, labels 1 1 0 -> correct, wrong, wrong
  #   row 1 pos 1, 2:    logits  1  1,    labels 0 1   -> wrong, correct
  # BCE with |logit| = 1 is s = log(1 + e^-1) when correct, 1 + s when wrong: disc_loss = (5 s + 3) / 5.
  # Predicted positives among them: 4, true positives 2, positives 3.
  logits = jnp.array([[1, 1, -1, 1, -1, 5, 5, 5], [-1, 1, 1, -1, 5, 5, 5, 5]], jnp.float32)
  loss, m = _loss('electra_15', _stub_apply(logits))
  s = math.log(1 + math.exp(-1))
  np.testing.assert_allclose(m['gen_loss'][0], 1.6 * LOG2, rtol=1e-6)
  np.testing.assert_allclose(m['disc_loss'][0], s + 0.6, rtol=1e-6)
  np.testing.assert_allclose(loss, 1.6 * LOG2 + 50 * (s + 0.6), rtol=1e-6)
  assert m['disc_accuracy'] == (2.0, 5.0)
  assert m['disc_precision'] == (2.0, 4.0)
  assert m['disc_recall'] == (2.0, 3.0)
  assert m['replaced_fraction'] == (3.0, 5.0)


@pytest.mark.slow
@pytest.mark.parametrize('gen_weight', [1.0, 2.0])
def test_replace_mlm(gen_weight):
  # The discriminator-sized MLM sees the corrupted input and puts 1/2 on the token shown: CE = log 2 at the two
  # 7s (sampled correctly), log 14 at the 3 replaced positions. mlm_loss = (2 log 2 + 3 log 14) / 5;
  # mlm_accuracy 2/5. loss = gen_weight * 8/5 log 2 + mlm_loss (disc_weight 50 is not used).
  seen = []
  loss, m = _loss('replace_mlm', _stub_apply(seen=seen), gen_weight=gen_weight)
  mlm = (2 * LOG2 + 3 * math.log(14)) / 5
  np.testing.assert_allclose(m['mlm_loss'][0], mlm, rtol=1e-6)
  np.testing.assert_allclose(m['gen_loss'][0], 1.6 * LOG2, rtol=1e-6)
  np.testing.assert_allclose(loss, gen_weight * 1.6 * LOG2 + mlm, rtol=1e-6)
  assert m['mlm_accuracy'] == (2.0, 5.0)
  np.testing.assert_array_equal(np.asarray(seen[0]), CORRUPTED)


def test_all_tokens_mlm_copy_mechanism():
  # Every one of the 9 non-pad tokens is predicted; the MLM puts 1/2 on the token shown and the copy gate
  # logit is 0, so D = 1/2:
  #   not replaced (6 tokens): p = D + (1 - D) * 1/2 = 3/4   -> -log p = log(4/3)
  #   replaced     (3 tokens): p = (1 - D) * 1/14  = 1/28    -> -log p = log 28
  # mlm_loss = (6 log(4/3) + 3 log 28) / 9; loss = 8/5 log 2 + mlm_loss; mean copy probability 1/2.
  loss, m = _loss('all_tokens_mlm', _stub_apply(copy_logits=0.0))
  mlm = (6 * math.log(4 / 3) + 3 * math.log(28)) / 9
  np.testing.assert_allclose(m['mlm_loss'][0], mlm, rtol=1e-6)
  np.testing.assert_allclose(loss, 1.6 * LOG2 + mlm, rtol=1e-6)
  assert m['copy_probability'] == (4.5, 9.0)


def test_all_tokens_mlm_gate_saturated():
  # Copy logit +30 (D = 1 - 9e-14): unreplaced tokens cost ~0, replaced ones -log((1 - D) / 14) = 30 + log 14
  # (log(1 - D) = log_sigmoid(-30) = -30 - 9e-14), so mlm_loss = 3 (30 + log 14) / 9: stable, no log(0).
  _, m = _loss('all_tokens_mlm', _stub_apply(copy_logits=30.0))
  np.testing.assert_allclose(m['mlm_loss'][0], (30 + math.log(14)) / 3, rtol=1e-5)


@pytest.mark.parametrize('mask_token_prob,expected', [(1.0, math.log(14)), (0.0, LOG2)])
def test_mlm_no_generator(mask_token_prob, expected):
  # BERT: the MLM sees the masked input. All 5 selected shown as [MASK] -> the 1/2 goes to [MASK], CE = log 14;
  # all kept (mask_token_prob 0, no random tokens) -> CE = log 2. The generator is never called (the stub
  # would return generator logits, which mlm_loss has no use for: it must not ask).
  def no_generator(params, *args, method, **kwargs):
    assert method != 'generator_logits'
    return _stub_apply()(params, *args, method=method, **kwargs)
  loss, m = _loss('mlm', no_generator, mask_token_prob=mask_token_prob)
  np.testing.assert_allclose(loss, expected, rtol=1e-6)
  assert 'gen_loss' not in m
  assert m['mlm_accuracy'] == ((0.0 if mask_token_prob else 5.0), 5.0)


def test_registry():
  assert set(objective.OBJECTIVES) == {'electra', 'electra_15', 'replace_mlm', 'all_tokens_mlm', 'mlm',
                                       'electra_adversarial', 'electra_frozen'}
  assert objective.get('electra').loss is objective.electra_loss
  assert ObjectiveConfig().name == 'electra'
  with pytest.raises(config_lib.ConfigError, match='all_tokens_mlm'):
    objective.get('bert')
  # config.load leaves the name to the registry (config.py sits below objective.py); the trainer looks the
  # objective up before it writes or compiles anything (tests/test_faults.py runs that through the CLI).
  assert config_lib.load({'objective': {'name': 'mlm'}}, vocab_size=8).objective.name == 'mlm'


def test_train_step_dispatches_through_the_registry(monkeypatch):
  # A registered objective's loss is what train_step differentiates: loss = sum(w^2) -> grad 2w; SGD lr 0.1.
  calls = []

  def toy_loss(apply_fn, params, batch, rng, *, config, special, vocab_size, progress):
    calls.append((config.name, vocab_size, float(progress)))
    return jnp.sum(params['w'] ** 2), {'loss': (jnp.sum(params['w'] ** 2), jnp.ones(()))}

  monkeypatch.setitem(objective.OBJECTIVES, 'toy', objective.Objective(toy_loss))
  model = Electra(ModelConfig(vocab_size=V, hidden_size=8, num_heads=1))
  tx = optax.sgd(0.1)
  params = {'w': jnp.array([1.0, -2.0])}
  state = train_step.TrainState(jnp.zeros((), jnp.int32), params, tx.init(params))
  batch = {k: jnp.asarray(v) for k, v in _batch(IDS).items()}
  new, metrics = train_step.train_step(state, batch, jax.random.PRNGKey(0), model=model, tx=tx,
                                       schedule=lambda step: 0.1, config=ObjectiveConfig(name='toy'),
                                       special=SPECIAL, train_steps=4)
  assert calls == [('toy', V, 0.0)]  # step 0 of 4
  np.testing.assert_allclose(new.params['w'], [0.8, -1.6], rtol=1e-6)
  np.testing.assert_allclose(metrics['loss'][0], 5.0)


@pytest.mark.slow
@pytest.mark.parametrize('name', ['replace_mlm', 'all_tokens_mlm', 'mlm'])
def test_objectives_with_the_real_model(name):
  """The model each objective declares has the heads its loss calls: a finite loss, named like HF's heads."""
  spec = objective.get(name)
  model = Electra(ModelConfig(vocab_size=V, embedding_size=8, hidden_size=16, num_layers=1, num_heads=1,
                              intermediate_size=16, generator_hidden_fraction=0.5, dropout_rate=0.0,
                              attention_dropout_rate=0.0),
                  with_generator=spec.with_generator, discriminator_head=spec.discriminator_head)
  batch = {k: jnp.asarray(v) for k, v in _batch(IDS).items()}
  config = ObjectiveConfig(name=name, mask_prob=0.6, mask_with_replacement=False)
  params = model.init(jax.random.PRNGKey(0), batch['input_ids'], batch['segment_ids'], batch['input_mask'],
                      jnp.zeros((2, config.num_predictions(8)), jnp.int32))['params']
  disc = set(params['discriminator'])
  assert ('generator' in params) == (name != 'mlm')
  assert {'mlm_predictions', 'mlm_lm_head'} <= disc and 'discriminator_predictions' not in disc
  assert ('copy_gate' in disc) == (name == 'all_tokens_mlm')
  apply_fn = lambda p, *args, **kwargs: model.apply({'params': p}, *args, **kwargs)
  loss, _ = jax.jit(functools.partial(spec.loss, apply_fn, config=config, special=SPECIAL, vocab_size=V))(
      params, batch, jax.random.PRNGKey(1))
  assert np.isfinite(float(loss)) and float(loss) > 0


# Adversarial ELECTRA on the example batch, with every selection fixed by hand: row 0 selects positions 1, 2, 3
# (one padding slot), row 1 positions 1, 2 (two padding slots). The samples are the stub generator's argmax
# (5 -> 6, 6 -> 5, 7 -> 7), so the corruption and the labels are those above.
DISC_LOGITS = jnp.array([[1, 1, -1, 1, -1, 5, 5, 5], [-1, 1, 1, -1, 5, 5, 5, 5]], jnp.float32)
POSITIONS = np.array([[1, 2, 3, 0], [1, 2, 0, 0]], np.int32)
WEIGHTS = np.array([[1, 1, 1, 0], [1, 1, 0, 0]], np.float32)


def _masked():
  targets = np.take_along_axis(IDS, POSITIONS, axis=1)
  shown = np.where(WEIGHTS > 0, 4, targets)  # [MASK]
  masked_ids = IDS.copy()
  np.put_along_axis(masked_ids, POSITIONS, shown, axis=1)
  return masking.Masked(*map(jnp.asarray, (masked_ids, POSITIONS, targets, WEIGHTS)))


def _differentiable_stub(params, input_ids, segment_ids, input_mask, positions=None, *, deterministic, method,
                         rngs):
  """Generator logits = the stub's + params['gen'] [2, 4, V]; baseline logits params['baseline'] [2, 4];
  discriminator logits DISC_LOGITS + params['disc'] [2, 8]."""
  del segment_ids, input_mask, deterministic, rngs
  if method in ('generator_logits', 'generator_logits_and_baseline'):
    logits = _gen_logits_from_targets(jnp.take_along_axis(jnp.asarray(IDS), positions, axis=1)) + params['gen']
    return (logits, params['baseline']) if method == 'generator_logits_and_baseline' else logits
  assert method == 'discriminator_logits'
  np.testing.assert_array_equal(np.asarray(input_ids), CORRUPTED)
  return DISC_LOGITS + params['disc']


@pytest.mark.slow
def test_adversarial_reinforce_gradient_by_hand():
  # Rewards R = the discriminator's loss on each selected token, s = log(1 + e^-1):
  #   row 0: pos 1 logit  1 label 1 -> s;   pos 2 logit -1 label 1 -> 1 + s;   pos 3 logit 1 label 0 -> 1 + s
  #   row 1: pos 1 logit  1 label 0 -> 1 + s;   pos 2 logit 1 label 1 -> s
  # Baseline logits z = 0: b = -log sigmoid(0) = log 2, so the advantage is A = R - log 2.
  # Every sample has p = 1/2 (the stub's most likely token): policy_loss = -mean(log(1/2) A) = log 2 mean(A).
  # d policy_loss / d logits = -(1/5) A (onehot(sample) - p): -A/10 at the sample, +A p_v / 5 elsewhere.
  # The baseline's cross-entropy against exp(-R) is log 2 at z = 0 whatever the target; its gradient
  # (sigmoid(z) - exp(-R)) / 5. Both are scaled by gen_weight = 2. The MLM loss is not trained: gen_loss is a
  # metric only. The discriminator's loss and gradient are exactly ELECTRA's.
  s = math.log(1 + math.exp(-1))
  reward = np.array([[s, 1 + s, 1 + s, 0], [1 + s, s, 0, 0]])
  advantage = (reward - LOG2) * WEIGHTS
  params = {'gen': jnp.zeros((2, 4, V)), 'baseline': jnp.zeros((2, 4)), 'disc': jnp.zeros((2, 8))}
  config = ObjectiveConfig(name='electra_adversarial', gen_weight=2.0)
  batch = {k: jnp.asarray(v) for k, v in _batch(IDS).items()}
  argmax = lambda logits, merge=True: jnp.argmax(logits, -1).astype(jnp.int32)  # distinct positions: no merge

  def loss(p, fn):
    return fn(_differentiable_stub, p, batch, _masked(), argmax, config=config)
  (total, m), grads = jax.value_and_grad(functools.partial(loss, fn=loss_of('electra_adversarial')),
                                         has_aux=True)(params)

  # The generator's distribution at each slot (the stub's docstring): target 5 or 6 -> 1/4 on it, 1/2 on the
  # other, 1/24 elsewhere; target 7 -> 1/2 on 7, 1/4 on 5. Samples: 6, 5, 7 in row 0 and 7, 6 in row 1.
  def probs(target, sample):
    p = np.full(V, 1 / 24)
    if target == 7:
      p[7], p[5] = 0.5, 0.25
    else:
      p[target], p[sample] = 0.25, 0.5
    return p
  slots = {(0, 0): (5, 6), (0, 1): (6, 5), (0, 2): (7, 7), (1, 0): (7, 7), (1, 1): (5, 6)}
  expected = np.zeros((2, 4, V))
  for (row, slot), (target, sample) in slots.items():
    expected[row, slot] = -2.0 / 5 * advantage[row, slot] * (np.eye(V)[sample] - probs(target, sample))
  np.testing.assert_allclose(grads['gen'], expected, atol=1e-7)
  np.testing.assert_allclose(grads['baseline'], 2.0 / 5 * (0.5 - np.exp(-reward)) * WEIGHTS, atol=1e-7)
  policy = LOG2 * advantage.sum() / 5
  np.testing.assert_allclose(m['policy_loss'][0], policy, rtol=1e-6)
  np.testing.assert_allclose(m['baseline_loss'][0], LOG2, rtol=1e-6)
  np.testing.assert_allclose(float(m['reward'][0]) / float(m['reward'][1]), (5 * s + 3) / 5, rtol=1e-6)
  np.testing.assert_allclose(m['gen_loss'][0], 1.6 * LOG2, rtol=1e-6)  # measured, not trained
  np.testing.assert_allclose(m['disc_loss'][0], s + 4 / 9, rtol=1e-6)
  np.testing.assert_allclose(total, 2 * (policy + LOG2) + 50 * (s + 4 / 9), rtol=1e-6)

  # The discriminator: d loss / d logit = 50 (sigmoid(logit) - label) / 9 on the 9 real tokens, as ELECTRA's.
  labels = (np.asarray(CORRUPTED) != IDS).astype(np.float64)
  hand = 50 / 9 * (1 / (1 + np.exp(-np.asarray(DISC_LOGITS))) - labels) * (IDS > 0)
  np.testing.assert_allclose(grads['disc'], hand, rtol=1e-5, atol=1e-7)
  electra = jax.grad(lambda p: loss(p, loss_of('electra'))[0])(params)
  np.testing.assert_allclose(grads['disc'], electra['disc'], rtol=1e-6, atol=1e-8)


def test_adversarial_policy_log_prob_is_each_slot_s_own_draw():
  # [CLS] 5 6 [SEP] with position 1 drawn by both slots, at T = 1 from two different distributions (3 on id 9 for
  # slot 0, on id 14 for slot 1). Under duplicate_samples='mean' the position is corrupted with the floor of the
  # mean of the two draws; the policy's log-probability is each slot's at its own draw. The discriminator's logits
  # are 0 (reward log 2 whatever the label) and the baseline's 2 (b = log(1 + e^-2)), so the advantage is known.
  vocab = 16
  ids = jnp.array([[2, 5, 6, 3]], jnp.int32)
  masked = masking.Masked(input_ids=jnp.array([[2, 4, 6, 3]], jnp.int32), positions=jnp.array([[1, 1]], jnp.int32),
                          targets=jnp.array([[5, 5]], jnp.int32), weights=jnp.ones((1, 2), jnp.float32))
  gen_logits = 3.0 * jax.nn.one_hot(jnp.array([[9, 14]]), vocab)

  def apply_fn(params, input_ids, segment_ids, input_mask, positions=None, *, deterministic, method, rngs):
    del params, segment_ids, input_mask, positions, deterministic, rngs
    if method == 'generator_logits_and_baseline':
      return gen_logits, jnp.full((1, 2), 2.0)
    return jnp.zeros(input_ids.shape, jnp.float32)

  config = ObjectiveConfig(name='electra_adversarial', temperature=1.0, duplicate_samples='mean')
  keys = jax.random.split(jax.random.PRNGKey(1), 1)
  draws = np.asarray(objective.sample_rows(keys, gen_logits, masked.targets, config))[0]
  merged = (draws[0] + draws[1]) // 2
  np.testing.assert_array_equal(draws, [9, 14])  # what the key draws: the likely ids, their mean (11) neither
  batch = {'input_ids': ids, 'segment_ids': jnp.zeros_like(ids), 'input_mask': jnp.ones_like(ids)}
  sample = objective.sampler(keys, masked, config)
  sums, detection = objective.adversarial_detection(apply_fn, {}, batch, masked, sample, config=config,
                                                    deterministic=True)
  np.testing.assert_array_equal(detection.samples, [[merged, merged]])  # the corruption
  log_probs = np.asarray(jax.nn.log_softmax(gen_logits))[0]
  advantage = LOG2 - math.log(1 + math.exp(-2))
  own = log_probs[0, draws[0]] + log_probs[1, draws[1]]
  np.testing.assert_allclose(sums['policy'], own * advantage, rtol=1e-6)
  assert abs(own - log_probs[0, merged] - log_probs[1, merged]) > 1  # what the merged id would have given


@pytest.mark.slow
def test_adversarial_with_the_real_model():
  """The model electra_adversarial declares has the baseline head; with the same rng (masks, samples) its
  discriminator gradient is ELECTRA's, and the generator's REINFORCE gradient reaches the baseline too."""
  spec = objective.get('electra_adversarial')
  model = spec.model(ModelConfig(vocab_size=V, embedding_size=8, hidden_size=16, num_layers=1, num_heads=1,
                                 intermediate_size=16, generator_hidden_fraction=0.5, dropout_rate=0.0,
                                 attention_dropout_rate=0.0))
  batch = {k: jnp.asarray(v) for k, v in _batch(IDS).items()}
  params = nn.meta.unbox(model.init(jax.random.PRNGKey(0), batch['input_ids'], batch['segment_ids'],
                                    batch['input_mask'], jnp.zeros((2, 4), jnp.int32))['params'])
  assert set(params['generator']['adversarial_baseline']) == {'kernel', 'bias'}
  apply_fn = lambda p, *args, **kwargs: model.apply({'params': p}, *args, **kwargs)

  @jax.jit
  def grads(p):
    out = {}
    for name in ('electra', 'electra_adversarial'):
      loss = functools.partial(objective.get(name).loss, apply_fn, batch=batch, rng=jax.random.PRNGKey(1),
                               config=ObjectiveConfig(name=name, mask_prob=0.6, mask_with_replacement=False),
                               special=SPECIAL, vocab_size=V)
      out[name] = jax.grad(lambda q, loss=loss: loss(q)[0])(p), loss(p)[1]['disc_loss'][0]
    return out
  out = grads(params)
  (electra, electra_disc), (adversarial, adversarial_disc) = out['electra'], out['electra_adversarial']
  np.testing.assert_allclose(adversarial_disc, electra_disc, rtol=1e-6)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-8), adversarial['discriminator'],
               electra['discriminator'])
  assert np.any(np.asarray(adversarial['generator']['adversarial_baseline']['kernel']) != 0)
  assert all(np.all(np.isfinite(g)) for g in jax.tree.leaves(adversarial))
