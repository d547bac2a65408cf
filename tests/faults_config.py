"""A pre-training run small enough to start, kill and resume many times in a test (tests/test_faults.py).

  python -m electra_jax.main --config=tests/faults_config.py --workdir=W --config.data.source=CORPUS
"""

from configs import default


def get_config():
  config = default.get_config()
  config.train_steps = 10
  config.batch_size = 8
  config.log_every = 1
  config.checkpoint_every = 1  # a write in progress most of the time: where a kill should land
  config.data.update(vocab_size=64, max_seq_length=32)
  config.model.update(embedding_size=16, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
                      generator_hidden_fraction=0.5, max_position_embeddings=64)
  config.optimizer.update(learning_rate=1e-3, warmup_steps=2)
  config.mesh.shape = (1, 1, 1)
  return config
