"""ELECTRA-Large as in the paper: 24 layers, H=E=1024, generator 1/4, lr 2e-4, batch 2048 x 512, mask 25%, 400k steps.

Remat policy and accumulation chosen by compiling the step for a v3-64 (`python -m electra_jax.aot
--topology=v3:4x8`, docs/history.md "Remat and accumulation for ELECTRA-Large"): without remat its 32 sequences of
512 per core at once need about 30 GiB, more than a v3 core's 16. In 4 micro-batches of 8 rows per core nothing needs
to be recomputed: 11.95 GiB per core (25% headroom; a v4-64 chip: 17.3 of 32 GiB), 1.06x the model's FLOPs, an
estimated 1.09 s per step (53% MFU) against 1.28 s for `dots_no_batch` in 2 micro-batches and 1.41 s for full
remat. The GPU presets keep full remat, the setting their H100 compiles chose.
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
  config.model.remat = 'none'  # TPU: recompute nothing. GPU presets: full.
  config.grad_accum_steps = 4  # TPU: 8 sequences of 512 per v3-64 core at a time. GPU presets: at most 64 per GPU.
  # GPU preset (configs/gpu.py): full remat and at most 64 sequences of 512 per GPU (one 8-H100 node: 4
  # micro-batches, 44 GiB).
  return gpu.apply(config, preset, max_rows=64, remat='full')
