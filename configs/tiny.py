"""A CPU-sized ELECTRA that visibly learns replaced-token detection in a few minutes on a 2-core laptop.

Chosen by measurement (see BENCHMARKS.md, "tiny config"): placeholder values, tuned below.
"""

from configs import default


def get_config():
  config = default.get_config()
  config.train_steps = 600
  config.batch_size = 32
  config.log_every = 20
  config.checkpoint_every = 200
  config.data.vocab_size = 4000
  config.data.max_seq_length = 128
  config.model.update(embedding_size=128, hidden_size=128, num_layers=4, num_heads=2, intermediate_size=512,
                      generator_hidden_fraction=0.25)
  config.optimizer.learning_rate = 1e-3
  config.optimizer.warmup_steps = 50
  return config
