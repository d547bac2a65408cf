"""ELECTRA-Large as in the paper: 24 layers, H=E=1024, generator 1/4, lr 2e-4, batch 2048 x 512, mask 25%, 400k steps.

Rematerialised layers by default, chosen by compiling the step for a v3-64 (`python -m electra_jax.aot
--topology=v3:4x8`, BENCHMARKS.md): without remat its 32 sequences of 512 per core need 22-32 GiB of activations
(float32 data-parallel, bf16 FSDP), more than a v3 core's 16 GiB; with remat, data-parallel bf16 peaks at 7.1 GiB.
"""

from configs import default, gpu


def get_config(preset=''):
  config = default.get_config()
  config.train_steps = 400_000
  config.batch_size = 2048
  config.checkpoint_every = 5_000
  config.log_every = 100
  config.data.vocab_size = 30522
  config.data.max_seq_length = 512
  config.model.update(embedding_size=1024, hidden_size=1024, num_layers=24, num_heads=16,
                      intermediate_size=4096, generator_hidden_fraction=0.25)
  config.optimizer.learning_rate = 2e-4
  config.objective.mask_prob = 0.25
  config.model.remat = 'full'  # Recompute each layer in the backward pass (see above).
  # GPU preset (configs/gpu.py): at most 64 sequences of 512 per GPU (one 8-H100 node: 4 micro-batches, 44 GiB).
  return gpu.apply(config, preset, max_rows=64)
