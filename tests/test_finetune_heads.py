"""Task losses, worked out by hand from the official formulas, and the train step differentiating their SUM."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from electra_jax.config import ModelConfig
from electra_jax.finetune import heads, tasks, train
from electra_jax.finetune.config import SquadConfig

LN2, LN3 = math.log(2), math.log(3)


def test_classification_loss_is_summed_over_examples():
  # Row 0: logits (0, 0), label 0: -log(1/2) = ln 2. Row 1: logits (ln 3, 0), label 1: p = 1/4, -log(1/4) = ln 4.
  # Row 2: no label (-1): not counted.
  outputs = {'logits': jnp.array([[0.0, 0.0], [LN3, 0.0], [5.0, -5.0]])}
  total, count = heads.loss(tasks.CLASSIFICATION, outputs, {'labels': jnp.array([0, 1, -1])}, SquadConfig())
  assert float(total) == pytest.approx(math.log(8), rel=1e-6)  # ln 2 + ln 4, not their mean
  assert float(count) == 2


def test_tagging_loss_sums_each_examples_tokens():
  # Official: per example, the sum over its labelled tokens; then the sum over the batch.
  # Token 1: (0, 0), tag 0: ln 2. Token 2: (ln 3, 0), tag 0: p = 3/4, ln(4/3). Token 0 and 3: unlabelled.
  logits = jnp.array([[[9.0, 0.0], [0.0, 0.0], [LN3, 0.0], [0.0, 9.0]]])
  total, count = heads.loss(tasks.TAGGING, {'logits': logits}, {'labels': jnp.array([[-1, 0, 0, -1]])},
                            SquadConfig())
  assert float(total) == pytest.approx(LN2 + math.log(4 / 3), rel=1e-6)
  assert float(count) == 2


def test_regression_loss_is_summed_squared_error():
  outputs = {'logits': jnp.array([[0.3], [0.9], [0.0]])}
  labels = jnp.array([0.5, 1.0, np.nan])  # the NaN row is unlabelled
  total, count = heads.loss(tasks.REGRESSION, outputs, {'labels': labels}, SquadConfig())
  assert float(total) == pytest.approx(0.2 ** 2 + 0.1 ** 2, rel=1e-5)  # 0.05
  assert float(count) == 2


def test_squad_loss_includes_the_answerability_term():
  # start CE: logits (0, 0), gold 0: ln 2; end CE: logits (0, ln 3), gold 1: ln(4/3);
  # answerability: sigmoid CE of logit 0 against 1: ln 2, weighted 0.5. Official: (start + end) / 2 + 0.5 * it.
  outputs = {'start_logits': jnp.array([[0.0, 0.0]]), 'end_logits': jnp.array([[0.0, LN3]]),
             'impossible_logit': jnp.array([0.0])}
  batch = {'start_positions': jnp.array([0]), 'end_positions': jnp.array([1]), 'is_impossible': jnp.array([1.0])}
  total, count = heads.loss(tasks.SQUAD, outputs, batch, SquadConfig(answerable_weight=0.5))
  assert float(total) == pytest.approx((LN2 + math.log(4 / 3)) / 2 + 0.5 * LN2, rel=1e-6)
  assert float(count) == 1


@pytest.mark.parametrize('name', ['squad_v1', 'squad_v2'])
def test_squad_1_1_also_has_the_answerability_head(name):
  model = heads.make_model(tasks.get_task(name), ModelConfig(vocab_size=20, embedding_size=8, hidden_size=8,
                                                             num_layers=1, num_heads=2, intermediate_size=16),
                           0.0, SquadConfig(beam_size=2))
  ids = jnp.zeros((1, 8), jnp.int32)
  batch = {'input_ids': ids, 'segment_ids': ids, 'input_mask': ids + 1, 'start_positions': jnp.zeros((1,), jnp.int32)}
  params = jax.eval_shape(model.init, jax.random.PRNGKey(0), batch)['params']
  assert {'answerable_hidden', 'answerable_logit'} <= set(params['head'])
  variables = jax.jit(model.init)(jax.random.PRNGKey(0), batch)  # jitted: op by op takes 10x longer on CPU
  assert jax.jit(model.apply)(variables, batch)['impossible_logit'].shape == (1,)


@pytest.mark.slow
def test_train_step_differentiates_the_sum_over_the_batch():
  """The batch [x, x] gives twice the gradient of [x] (a mean would give the same gradient)."""
  config = ModelConfig(vocab_size=20, embedding_size=8, hidden_size=8, num_layers=1, num_heads=2,
                       intermediate_size=16, dropout_rate=0.0, attention_dropout_rate=0.0)
  task = tasks.Task('t', tasks.CLASSIFICATION, 'files', '', labels=('a', 'b'))
  model = heads.make_model(task, config, 0.0, SquadConfig())
  one = {'input_ids': jnp.array([[2, 5, 7, 3]]), 'segment_ids': jnp.zeros((1, 4), jnp.int32),
         'input_mask': jnp.ones((1, 4), jnp.int32), 'labels': jnp.array([1])}
  two = jax.tree.map(lambda x: jnp.concatenate([x, x]), one)
  params = jax.jit(model.init)(jax.random.PRNGKey(0), one)['params']
  tx = optax.sgd(1.0)  # new params = params - gradient
  # Jitted: run op by op, the step compiles each of its hundreds of operations apart (minutes on 2 cores).
  step = jax.jit(functools.partial(train.train_step, model=model, tx=tx, schedule=lambda step: 1.0,
                                   squad_config=SquadConfig()))
  grads = []
  for batch in (one, two):
    state = train.TrainState(jnp.zeros((), jnp.int32), params, tx.init(params))
    new_state, step_metrics = step(state, batch, jax.random.key_data(jax.random.PRNGKey(1)))
    grads.append(jax.tree.map(lambda a, b: a - b, params, new_state.params))
  assert max(float(np.abs(g).max()) for g in jax.tree.leaves(grads[0])) > 1e-5  # the step changed the parameters
  for g1, g2 in zip(jax.tree.leaves(grads[0]), jax.tree.leaves(grads[1])):
    np.testing.assert_allclose(g2, 2 * g1, rtol=1e-4, atol=1e-7)
  assert float(step_metrics['loss'][1]) == 2  # the logged loss is the sum over 2 rows, shown as their mean
