"""ELECTRA-Small as in the paper: 12 layers, H=256, E=128, generator 1/4, lr 5e-4, batch 128 x 128, 1M steps.

`configs/small.py:quickstart` is the GPU quickstart: ELECTRA-Small on the built-in corpus, on one GPU, out of the box
(README, "On a GPU"). The built-in corpus (0.8 M words) supports at most ~11k SentencePiece pieces, so it trains
a vocabulary of 8000 rather than 30522; 2000 steps of 128 x 128 (about 30 passes over the corpus), 200 warm-up
steps, bias-corrected Adam and samples at temperature 2, as the tiny config (configs/tiny.py) found a short run
needs, and a held-out evaluation every 500 steps. The paper's dropout (0.1) stays.

Every variant runs 5 steps in each call of the compiled step (`steps_per_call`): a Small step is short enough that
the host's work of calling it (arguments, CUDA-graph updates, the loop's logging) set its pace. On one H200 the
quickstart's loop trained at 1.29 M tokens/s with 5 steps a call against 485 k with 1 (BENCHMARKS.md); on a 2-core
CPU the tiny quickstart at 1.3-1.5x. Its periods (log_every, checkpoint_every, eval_every) are multiples of 5;
`--config.steps_per_call=1` lifts that.
"""

from configs import default, gpu


def quickstart(config):
  """The GPU quickstart's settings over ELECTRA-Small's."""
  config.train_steps = 2000
  config.log_every = 50
  config.checkpoint_every = 500
  config.eval_every = 500
  config.eval_batches = 8
  config.data.vocab_size = 8000
  config.data.eval_fraction = 0.03
  config.optimizer.update(warmup_steps=200, bias_correction=True)
  config.objective.temperature = 2.0
  return config


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
  config.steps_per_call = 5  # the same steps, 5 in each call of one program (docstring)
  if preset == 'quickstart':
    return quickstart(config)
  # GPU preset (configs/gpu.py): the whole batch of 128 x 128 takes 3.2 GiB of one H100, so it never accumulates.
  return gpu.apply(config, preset, max_rows=128, others='quickstart (one GPU, the built-in corpus), ')
