"""ELECTRA-Small as in the paper: 12 layers, H=256, E=128, generator 1/4, lr 5e-4, batch 128 x 128, 1M steps."""

from configs import default, gpu


def get_config(preset=''):
  config = default.get_config()
  config.train_steps = 1_000_000
  config.batch_size = 128
  config.checkpoint_every = 10_000
  config.log_every = 100
  config.data.vocab_size = 30522
  config.data.max_seq_length = 128
  config.model.update(embedding_size=128, hidden_size=256, num_layers=12, num_heads=4,
                      intermediate_size=1024, generator_hidden_fraction=0.25)
  config.optimizer.learning_rate = 5e-4
  config.objective.mask_prob = 0.15
  # GPU preset (configs/gpu.py): the whole batch of 128 x 128 takes 3.2 GiB of one H100, so it never accumulates.
  return gpu.apply(config, preset, max_rows=128)
