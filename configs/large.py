"""ELECTRA-Large as in the paper: 24 layers, H=E=1024, generator 1/4, lr 2e-4, batch 2048 x 512, mask 25%, 400k steps."""

from configs import default


def get_config():
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
  return config
