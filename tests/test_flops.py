"""FLOPs of ELECTRA-Small counted by hand, against electra_jax.flops and the paper's 1.3e18.

ELECTRA-Small: V = 30522, E = 128, H = 256, 12 layers, FFN F = 1024, 4 heads; generator H_g = 64 (1/4), 12
layers, F_g = 256, 1 head; L = 128, batch 128, P = int(0.155 * 128) = 19 predictions per sequence; 1M steps.

The paper's ~1.3e18 comes from its flops_computation.py, whose convention differs from a matmul count in three
ways: training = 2 x forward (it takes the backward pass to cost as much as the forward; for matmuls it costs
twice as much), the word-embedding lookup is a dense one-hot matmul (2 E V = 7.8 MFLOPs per token for EACH
tower: more than a third of the total), and element-wise ops count (LayerNorm 5, GELU 8, softmax 5, dropout 4
per element). flops.py has both conventions. 'paper' reproduces 1.29e18 (0.6% below 1.3e18; the official
script uses 20 predictions per sequence, 19 here). 'matmul' (3 x forward matmuls, gathers for lookups, what
the hardware executes) gives 1.15e18, 11.5% below 1.3e18: the dense lookups it leaves out (2 x 2 x 7.8 MFLOPs
per token) outweigh the extra backward pass it counts, so it is NOT within 10% of the paper's figure, and the
test asserts the ratio it really has.
"""

import dataclasses

import pytest

from electra_jax import flops, objective
from electra_jax.config import ModelConfig, ObjectiveConfig, TrainConfig

SMALL = ModelConfig(vocab_size=30522, embedding_size=128, hidden_size=256, num_layers=12, num_heads=4,
                    intermediate_size=1024, generator_hidden_fraction=0.25)
L, B, STEPS = 128, 128, 1_000_000
P = ObjectiveConfig().num_predictions(L)

# ---- 'matmul' convention, forward FLOPs, by hand (a matmul [m, k] x [k, n] is 2 m k n). ----
# Discriminator layer, per token: Q, K, V, output 4 x 2 H H = 524,288; FFN 2 x 2 H F = 1,048,576;
# QK^T 2 L H = 65,536 and PV 2 L H = 65,536.
DISC_LAYER = 4 * 2 * 256 * 256 + 2 * 2 * 256 * 1024 + 2 * 128 * 256 + 2 * 128 * 256  # 1,703,936
DISC_PROJECTION = 2 * 128 * 256  # E -> H: 65,536
RTD_HEAD = 2 * 256 * 256 + 2 * 256  # dense H -> H, dense H -> 1: 131,584
DISC_PER_TOKEN = 12 * DISC_LAYER + DISC_PROJECTION + RTD_HEAD  # 20,644,352
# Generator layer, per token: 4 x 2 x 64 x 64 = 32,768; FFN 2 x 2 x 64 x 256 = 65,536; attention 2 x 2 x 128 x 64.
GEN_LAYER = 4 * 2 * 64 * 64 + 2 * 2 * 64 * 256 + 2 * 2 * 128 * 64  # 131,072
GEN_PER_TOKEN = 12 * GEN_LAYER + 2 * 128 * 64  # + E -> H_g projection: 1,589,248
# MLM head per predicted position: dense H_g -> E, then the tied E -> V projection.
GEN_MLM_HEAD = 2 * 64 * 128 + 2 * 128 * 30522  # 7,830,016
FORWARD_PER_SEQUENCE = L * (DISC_PER_TOKEN + GEN_PER_TOKEN) + P * GEN_MLM_HEAD  # 2,994,671,104

# ---- 'paper' convention: the same matmuls plus dense lookups and element-wise ops. ----
# Per discriminator layer: biases 3H + H + F + H = 2,304; attention softmax + dropout + scale (5 + 4 + 1) x heads
# x L = 5,120; two (dropout 4 + residual 1 + LayerNorm 5) x H = 5,120; GELU 8 F = 8,192.
DISC_LAYER_PAPER = DISC_LAYER + 2304 + 5120 + 5120 + 8192  # 1,724,672
# Embeddings of each tower: one-hot word lookup 2 E V, position + type lookups 2 E (L + 2), 2 adds, LayerNorm,
# dropout (2 + 5 + 4) E.
EMBED_PAPER = 2 * 128 * 30522 + 2 * 128 * 130 + 11 * 128  # 7,848,320
DISC_PER_TOKEN_PAPER = (12 * DISC_LAYER_PAPER + DISC_PROJECTION + 256  # + projection bias
                        + EMBED_PAPER + RTD_HEAD + 9 * 256)  # + RTD head bias and GELU: 28,744,064
# Generator layer: biases 576, attention 10 x 128 = 1,280, dropout/residual/LayerNorm 2 x 10 x 64 = 1,280,
# GELU 8 x 256 = 2,048.
GEN_LAYER_PAPER = GEN_LAYER + 576 + 1280 + 1280 + 2048  # 136,256
GEN_PER_TOKEN_PAPER = 12 * GEN_LAYER_PAPER + 2 * 128 * 64 + 64 + EMBED_PAPER  # 9,499,840
# MLM head: + bias, GELU, LayerNorm on E (14 E), softmax 5 V and the target word 2 V.
GEN_MLM_HEAD_PAPER = GEN_MLM_HEAD + 14 * 128 + 7 * 30522  # 8,045,462
FORWARD_PER_SEQUENCE_PAPER = L * (DISC_PER_TOKEN_PAPER + GEN_PER_TOKEN_PAPER) + P * GEN_MLM_HEAD_PAPER


def test_hand_count_matches_flops_py():
  assert P == 19
  per_step = 3 * B * FORWARD_PER_SEQUENCE  # 1.14995e12
  assert flops.pretraining_flops_per_step(SMALL, B, L, P) == pytest.approx(per_step, rel=1e-9)
  per_step_paper = 2 * B * FORWARD_PER_SEQUENCE_PAPER  # 1.29231e12
  assert flops.pretraining_flops_per_step(SMALL, B, L, P, convention='paper') == pytest.approx(per_step_paper,
                                                                                               rel=1e-9)


def test_paper_total_for_electra_small():
  total = STEPS * flops.pretraining_flops_per_step(SMALL, B, L, P, convention='paper')
  assert total == pytest.approx(1.3e18, rel=0.10)
  assert total == pytest.approx(1.2937e18, rel=0.005)  # the official script's own number (P = 20)
  # The matmul count: 1.15e18 (see the module docstring for why it is lower).
  matmul_total = STEPS * flops.pretraining_flops_per_step(SMALL, B, L, P)
  assert 0.85 < matmul_total / 1.3e18 < 0.90


def test_a_discriminator_alone():
  """electra_frozen's model: the discriminator (embeddings, encoder, RTD head) without a generator of its own."""
  alone = objective.get('electra_frozen')
  assert flops.pretraining_forward_flops_per_sequence(SMALL, L, P, alone) == L * DISC_PER_TOKEN
  assert (flops.pretraining_forward_flops_per_sequence(SMALL, L, P, alone, convention='paper')
          == L * DISC_PER_TOKEN_PAPER)


def test_a_uniform_generator_runs_no_generator():
  """objective.uniform_generator samples uniformly and runs no generator: a step costs the discriminator's training,
  3 x its forward pass."""
  c = TrainConfig(batch_size=B, model=SMALL, objective=ObjectiveConfig(uniform_generator=True))
  assert c.data.max_seq_length == L
  assert objective.train_flops_per_step(c) == 3 * B * L * DISC_PER_TOKEN


def test_objectives():
  per_seq = lambda name: flops.pretraining_forward_flops_per_sequence(SMALL, L, P, objective.get(name))
  assert per_seq('electra') == FORWARD_PER_SEQUENCE
  assert per_seq('electra_15') == FORWARD_PER_SEQUENCE  # the loss is restricted, not the computation
  # Replace MLM: the RTD head on every token becomes an MLM head (H -> E, E -> V) at the P positions.
  disc_mlm_head = 2 * 256 * 128 + 2 * 128 * 30522  # 7,879,168
  assert per_seq('replace_mlm') == FORWARD_PER_SEQUENCE - L * RTD_HEAD + P * disc_mlm_head
  # All-Tokens MLM: that MLM head at all L positions, plus the copy gate (H -> 1).
  assert per_seq('all_tokens_mlm') == FORWARD_PER_SEQUENCE - L * RTD_HEAD + L * (disc_mlm_head + 2 * 256)
  # BERT: no generator at all.
  assert per_seq('mlm') == L * (12 * DISC_LAYER + DISC_PROJECTION) + P * disc_mlm_head
  assert flops.pretraining_flops_per_step(SMALL, B, L, P, objective.get('mlm')) == 3 * B * per_seq('mlm')
  # Adversarial ELECTRA: ELECTRA plus the REINFORCE baseline, dense(H_g -> 1) at the P positions.
  assert per_seq('electra_adversarial') == FORWARD_PER_SEQUENCE + P * 2 * 64
  with pytest.raises(ValueError, match='objective'):
    per_seq('bert')
  with pytest.raises(ValueError, match='convention'):
    flops.pretraining_flops_per_step(SMALL, B, L, P, convention='tf')


def test_tying():
  per_seq = lambda model: flops.pretraining_forward_flops_per_sequence(model, L, P)
  # 'none': the generator's own embeddings are H_g = 64 wide, so no E -> H_g projection, and its MLM head is
  # dense 64 -> 64 then the 64 -> V projection against its own table.
  untied_head = 2 * 64 * 64 + 2 * 64 * 30522
  none = dataclasses.replace(SMALL, tying='none')
  assert per_seq(none) == FORWARD_PER_SEQUENCE - L * 2 * 128 * 64 - P * GEN_MLM_HEAD + P * untied_head
  # 'all' (a same-size generator): the generator runs the discriminator's encoder and projection (not a
  # 4-head, 4 H FFN copy of its own: the same here), with its MLM head dense 256 -> 128, 128 -> V.
  same = dataclasses.replace(SMALL, generator_hidden_fraction=1.0)
  disc_encoder = 12 * DISC_LAYER + DISC_PROJECTION
  assert per_seq(dataclasses.replace(same, tying='all')) == per_seq(same) == (
      L * (DISC_PER_TOKEN + disc_encoder) + P * (2 * 256 * 128 + 2 * 128 * 30522))
