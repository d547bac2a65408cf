"""Model FLOPs of pre-training and inference, counted analytically (multiply-add = 2 FLOPs).

Two conventions:
  'matmul' (default): matmuls only (embedding lookups are gathers, free); training = 3 x forward (the backward
    pass costs twice the forward). What the accelerator really does: use it for model FLOPs utilisation.
  'paper': the ELECTRA paper's official flops_computation.py. Training = 2 x forward (it takes the backward pass
    as costly as the forward), embedding lookups are dense one-hot matmuls (2 E V per token and tower), and the
    element-wise ops count too (per element: LayerNorm 5, GELU 8, softmax 5, dropout 4, bias or residual 1).
    ELECTRA-Small, 1M steps of 128 x 128: 1.29e18 ('matmul': 1.15e18). Use it to compare with the paper's figures.
The MLM heads run only where they are evaluated: at the P selected positions (All-Tokens MLM: every position).

What an objective runs is what its model holds (`electra_jax.objective.Objective`: `with_generator`,
`discriminator_head`, `generator_baseline`); a run's FLOPs per step, the frozen generator's forward pass of
electra_frozen included, are `objective.train_flops_per_step`.
"""

from typing import Any

from electra_jax.config import ModelConfig, TowerConfig

CONVENTIONS = ('matmul', 'paper')
# Element-wise FLOPs per element in the 'paper' convention (official flops_computation.py).
DROPOUT, LAYER_NORM, GELU, SOFTMAX = 4, 5, 8, 5


def _check(convention: str) -> bool:
  if convention not in CONVENTIONS:
    raise ValueError(f'FLOPs convention must be one of {CONVENTIONS}, got {convention!r}')
  return convention == 'paper'


def tower_forward_flops_per_token(tower: TowerConfig, embedding_size: int, seq_length: int,
                                  convention: str = 'matmul') -> float:
  """Forward FLOPs per token of one encoder tower, with its E->H projection if any (no embeddings, no head)."""
  paper = _check(convention)
  h, f, heads = tower.hidden_size, tower.intermediate_size, tower.num_heads
  per_layer = 2 * (4 * h * h + 2 * h * f) + 2 * 2 * seq_length * h  # projections + FFN + QK^T and PV
  if paper:
    per_layer += (3 * h + h + f + h  # biases: q/k/v, attention output, intermediate, output
                  + (SOFTMAX + DROPOUT + 1) * heads * seq_length  # attention softmax, dropout, 1/sqrt(d) scale
                  + 2 * (DROPOUT + 1 + LAYER_NORM) * h  # two (dropout, residual add, LayerNorm)
                  + GELU * f)
  projection = (2 * embedding_size * h + paper * h) if embedding_size != h else 0
  return tower.num_layers * per_layer + projection


def embedding_flops_per_token(model: ModelConfig, seq_length: int, convention: str = 'matmul') -> float:
  """Forward FLOPs per token of the (shared) embeddings: 0 as gathers, the dense lookup in 'paper'."""
  if not _check(convention):
    return 0
  e = model.embedding_size
  # Word lookup as a one-hot matmul; position and token-type lookups as the official script counts them (a
  # one-hot matmul over L + 2 rows); two adds, LayerNorm, dropout.
  return 2 * e * model.vocab_size + 2 * e * (seq_length + 2) + (2 + LAYER_NORM + DROPOUT) * e


def mlm_head_flops_per_prediction(hidden_size: int, model: ModelConfig, convention: str = 'matmul') -> float:
  """Forward FLOPs of an MLM head at one position: dense(H -> E), GELU, LayerNorm, tied E -> V projection."""
  e, v = model.embedding_size, model.vocab_size
  flops = 2 * (hidden_size * e + e * v)
  if _check(convention):
    flops += (1 + GELU + LAYER_NORM) * e + SOFTMAX * v + 2 * v  # bias, GELU, LayerNorm, softmax, target word
  return flops


def rtd_head_flops_per_token(hidden_size: int, convention: str = 'matmul') -> float:
  """Forward FLOPs of the replaced-token-detection head: dense(H -> H), GELU, dense(H -> 1)."""
  return 2 * (hidden_size * hidden_size + hidden_size) + _check(convention) * (1 + GELU) * hidden_size


def pretraining_forward_flops_per_sequence(model: ModelConfig, seq_length: int, num_predictions: int,
                                           objective: Any = None, convention: str = 'matmul') -> float:
  """Forward FLOPs for one sequence of `objective` (an `electra_jax.objective.Objective`; None: ELECTRA's), of the
  towers and heads its model holds (a frozen generator is not one: `objective.train_flops_per_step` adds it)."""
  with_generator, head, baseline = ((True, 'rtd', False) if objective is None else
                                    (objective.with_generator, objective.discriminator_head,
                                     objective.generator_baseline))
  e, length = model.embedding_size, seq_length
  generator, discriminator = model.tower(generator=True), model.tower(generator=False)
  embed = embedding_flops_per_token(model, length, convention)  # paid by each tower (it runs them separately)
  flops = length * (embed + tower_forward_flops_per_token(discriminator, e, length, convention))
  if head == 'rtd':
    flops += length * rtd_head_flops_per_token(discriminator.hidden_size, convention)
  elif head == 'mlm':
    flops += num_predictions * mlm_head_flops_per_prediction(discriminator.hidden_size, model, convention)
  else:  # 'mlm_copy': All-Tokens MLM predicts every token
    flops += length * (mlm_head_flops_per_prediction(discriminator.hidden_size, model, convention)
                       + 2 * discriminator.hidden_size)  # + the copy gate
  if with_generator:
    # With tying='none' the generator's own embeddings are as wide as its hidden layers (no projection).
    gen_model = model.generator_model()
    flops += length * (embedding_flops_per_token(gen_model, length, convention)
                       + tower_forward_flops_per_token(generator, gen_model.embedding_size, length, convention))
    flops += num_predictions * mlm_head_flops_per_prediction(generator.hidden_size, gen_model, convention)
  if baseline:
    flops += num_predictions * 2 * generator.hidden_size  # the REINFORCE baseline, dense(H_gen -> 1)
  return flops


def pretraining_flops_per_step(model: ModelConfig, batch_size: int, seq_length: int, num_predictions: int,
                               objective: Any = None, convention: str = 'matmul') -> float:
  """Training FLOPs of one step of `objective` (as `pretraining_forward_flops_per_sequence` takes it): forward and
  backward passes of every tower and head it uses."""
  multiplier = 2 if _check(convention) else 3
  return multiplier * batch_size * pretraining_forward_flops_per_sequence(model, seq_length, num_predictions,
                                                                          objective, convention)


def mlm_forward_flops_per_sequence(model: ModelConfig, discriminator_sized: bool, seq_length: int,
                                   num_predictions: int, convention: str = 'matmul') -> float:
  """Forward FLOPs for one sequence of an MLM alone: embeddings and encoder at every token, the MLM head at the
  `num_predictions` selected positions. `discriminator_sized`: an mlm run's model, else a run's generator tower."""
  tower = model.tower(generator=not discriminator_sized)
  embedded = model if discriminator_sized else model.generator_model()
  return (seq_length * (embedding_flops_per_token(embedded, seq_length, convention)
                        + tower_forward_flops_per_token(tower, embedded.embedding_size, seq_length, convention))
          + num_predictions * mlm_head_flops_per_prediction(tower.hidden_size, embedded, convention))


def finetuning_flops_per_step(model: ModelConfig, batch_size: int, seq_length: int, num_outputs: int,
                              convention: str = 'matmul') -> float:
  """Training FLOPs of one fine-tuning step with a [CLS] head: the discriminator's embeddings and encoder at every
  token, dense(H -> num_outputs) once per sequence (no generator, no RTD head), forward and backward."""
  multiplier = 2 if _check(convention) else 3
  discriminator = model.tower(generator=False)
  per_sequence = (seq_length * (embedding_flops_per_token(model, seq_length, convention)
                                + tower_forward_flops_per_token(discriminator, model.embedding_size, seq_length,
                                                                convention))
                  + 2 * discriminator.hidden_size * num_outputs)
  return multiplier * batch_size * per_sequence

