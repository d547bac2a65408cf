"""Model FLOPs of ELECTRA pre-training, counted analytically (matmuls only, multiply-add = 2 FLOPs).

Training FLOPs = 3 x forward (the backward pass costs about twice the forward), the convention of the paper's
FLOPs figures. Used by the throughput benchmark (model FLOPs utilisation) and to match runs by compute.
"""

from electra_jax.config import ModelConfig, TowerConfig


def tower_forward_flops_per_token(tower: TowerConfig, embedding_size: int, seq_length: int) -> float:
  """Forward matmul FLOPs per token of one encoder tower, with its E->H projection if any."""
  h, f = tower.hidden_size, tower.intermediate_size
  per_layer = 2 * (4 * h * h + 2 * h * f) + 2 * 2 * seq_length * h  # projections + FFN + QK^T and PV
  projection = 2 * embedding_size * h if embedding_size != h else 0
  return tower.num_layers * per_layer + projection


def pretraining_flops_per_step(model: ModelConfig, batch_size: int, seq_length: int,
                               num_predictions: int) -> float:
  """Training FLOPs of one ELECTRA step: generator (+ MLM head at the selected positions) and discriminator."""
  e, v = model.embedding_size, model.vocab_size
  generator, discriminator = model.tower(generator=True), model.tower(generator=False)
  per_token = (tower_forward_flops_per_token(generator, e, seq_length)
               + tower_forward_flops_per_token(discriminator, e, seq_length)
               + 2 * (discriminator.hidden_size ** 2 + discriminator.hidden_size))  # discriminator head
  mlm_head = 2 * (generator.hidden_size * e + e * v) * num_predictions  # per sequence
  return 3 * batch_size * (seq_length * per_token + mlm_head)
