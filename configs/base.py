"""ELECTRA-Base as in the paper: 12 layers, H=E=768, generator 1/3, lr 2e-4, batch 256 x 512, 766k steps."""

from configs import default, gpu


def get_config(preset=''):
  config = default.get_config()
  config.train_steps = 766_000
  config.batch_size = 256
  config.checkpoint_every = 10_000
  config.log_every = 100
  config.data.vocab_size = 30522
  config.data.max_seq_length = 512
  config.model.update(embedding_size=768, hidden_size=768, num_layers=12, num_heads=12,
                      intermediate_size=3072, generator_hidden_fraction=1 / 3)
  config.optimizer.learning_rate = 2e-4
  config.objective.mask_prob = 0.15
  # GPU preset (configs/gpu.py): at most 64 sequences of 512 per GPU (one H100: 4 micro-batches; 8 H100s: none).
  return gpu.apply(config, preset, max_rows=64)
