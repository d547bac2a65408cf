"""A CPU-sized ELECTRA for the quickstart: 4 layers, H=128, on the built-in corpus.

Chosen by measurement on a 2-core CPU (BENCHMARKS.md, "tiny config"):
- bias-corrected Adam: ELECTRA's Adam has no bias correction, harmless after its 10k warm-up steps but, with a
  short warm-up, an effective step 3-6x the nominal one for the first hundreds of steps; without it the
  generator stalled at unigram statistics (gen_loss 5.8) where with it it kept improving (5.2 by step 400);
- lr 1e-3: at 3e-3 the generator learns a little faster but by step 500 every discriminator hidden state is the
  same vector (cosine 1.000 between tokens, constant logit); at 1e-3 they stay distinct (cosine 0.78);
- no dropout (a short run on a small corpus does not overfit), sequences of 64 tokens (twice the steps per
  second of 128), vocabulary 4000, 50 warm-up steps, 1000 steps (measured: 3 min 28 s in all,
  tokenizer training and compilation included, on 2 idle cores).
Expect the generator to learn within the first minutes and the discriminator to sit at its prior for longer;
see the README for what the metrics show.
"""

from configs import default


def get_config():
  config = default.get_config()
  config.train_steps = 1000
  config.batch_size = 32
  config.log_every = 25
  config.checkpoint_every = 250
  config.data.vocab_size = 4000
  config.data.max_seq_length = 64
  config.model.update(embedding_size=128, hidden_size=128, num_layers=4, num_heads=2, intermediate_size=512,
                      generator_hidden_fraction=0.25, max_position_embeddings=128, dropout_rate=0.0,
                      attention_dropout_rate=0.0)
  config.optimizer.update(learning_rate=1e-3, warmup_steps=50, bias_correction=True)
  return config
