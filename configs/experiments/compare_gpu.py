r"""The paper's claim on one GPU: ELECTRA-Small against BERT-Small at equal pre-training compute, and both against
training from scratch (`configs/small.py` model, 1e16 FLOPs each).

  python -m electra_jax.experiments.compare --config=configs/experiments/compare_gpu.py --workdir=WORKDIR \
      [--config.flops_budgets=3e16]

Paths are relative to the directory the command runs in (the repository root: ../shared/data/...; CORPUS is
`pretrain.data.source`, the tasks `tasks`). Runs (as configs/experiments/compare_cpu.py, whose variants it keeps):
`electra` with the paper's settings (generator 1/4 of the width, samples at temperature 1, 15% masked, lambda 50),
`mlm` (BERT-Small: the same 12-layer H=256 encoder, MLM only, BERT's 80/10/10 masking), and from scratch. Both
pre-train on the 128 x 128 batch of the paper, with its learning rate 5e-4 and dropout (on a GPU no attention
dropout, for both: the GPU default, docs/gpu.md), a BERT-style WordPiece vocabulary of 30522 trained on the corpus, a
500-step warm-up (the paper's 10k steps are longer than the run) and the linear decay to 0 at the budget's step.
Fine-tuning: polarity, hedge and POS with compare_cpu's recipe (1000 training examples, 3 epochs, sequences of 64;
polarity 10 epochs), at ELECTRA-Small's fine-tuning learning rate 3e-4 (compare_cpu's 1e-3 was chosen for its 4-layer
model), 3 seeds each, on the GPU.

Held-out evaluation: 1% of the corpus's documents stay out of training (`data.eval_fraction`); every 500 steps
the discriminator (and generator, or the MLM) is evaluated on 8 fixed batches of them. The table then says when
each discriminator left its prior (the first evaluation with eval_disc_recall >= 0.02, flagging better than chance:
see compare.py).
Checkpoints are written at the budgets' steps only (and when a stop signal ends a run: rerunning the same command
resumes there), so a budget costs one checkpoint. One tokenizer and one packed corpus serve every run (cached in
`data.cache_dir`), and JAX's compile cache (in it too) shares the programs of the 27 fine-tunings (3
initialisations x 3 tasks x 3 seeds): 3 train steps (a task's step count is part of its program) and 2 evaluation
steps (the classification tasks share theirs) are compiled, and a resumed command loads every program from disk.

Full-size cost. FLOPs per step (`objective.train_flops_per_step`, matmuls, 3 x forward; vocabulary 30522):
electra 1.150e12 (70.2 MFLOP per token), mlm 1.066e12 (65.0 MFLOP per token). At 1e16 FLOPs: electra 8695 steps
(142 M tokens), mlm 9385 steps (154 M tokens; multiples of 5), about 6 passes over the corpus's 185 k packed
examples of 128 tokens. That convention counts what the GPU computes: XLA's cost analysis of the compiled step
(the tiny model, CPU) counts 7.8% more than it for electra and 6.4% more for mlm. The paper matched compute with the
official flops_computation.py instead (lookups as one-hot matmuls, training 2 x forward: `flops` 'paper'
convention), which charges electra's second tower's lookup: 1.292e12 and 0.977e12 per step, so that 1e16 would give
electra 7738 steps to mlm's 10237 (0.76 of mlm's steps; here 0.93).
Equal FLOPs take equal time at a given model FLOP/s, so one run takes budget / (electra tokens/s x 70.2e6):

| electra tokens/s (one GPU) | 1e16 FLOPs, one run | electra + mlm | whole command, estimated (+ 3-4 min) |
|---|---:|---:|---:|
| 148 k (measured, H200, 2026-11-26, before issue 44's work) | 16.0 min | 32 min | 35-36 min: does not fit |
| 566 k (measured: the GPU quickstart's training loop, H200, 2026-11-27) | 4.2 min | 8.4 min | 11.5-12.5 min: 2 calls |
| 997 k (measured: the step alone, H200, 2026-11-27) | 2.4 min | 4.8 min | 8-9 min: one call, just |
| 1.22 M (measured: the step alone, 5 steps a call, H200, 2026-11-28) | 1.9 min | 3.9 min | 7-8 min: one call |
| 1.5 M (issue 44's goal on one H100) | 95 s | 3.2 min | 6-7 min: one call |

The rest (the 3-4 minutes above), estimated: wheels and imports ~15 s; the WordPiece tokenizer, once, ~15 s (13 s on
a 2-core CPU); every step compiled at once before electra trains (`precompile`), the corpus packed meanwhile (18 s
alone on a 2-core CPU): the two runs' train and evaluation steps and the 5 fine-tuning steps (3 train steps: a task's
step count is part of its program; 2 evaluation steps: the classification tasks share theirs), ~1.5-2 min where one
after another they take ~5 (alone, the quickstart's train and evaluation steps took 74 and 13 s on the H200,
2026-11-28, from empty caches; 6 train steps at once took 94-100 s each on its 16-core host; compiled for an H200
without a GPU, jax 0.11.2's XLA takes 2.5-3x as long as 0.10.2's for today's program, most of it in its fusion
autotuner: BENCHMARKS.md, "How long XLA:GPU compiles the step"; if a GPU pays the same,
`XLA_FLAGS=--xla_gpu_experimental_enable_fusion_autotuner=false` saves it); per run the initialiser (~6 s) and 18
evaluations of 8 forward passes (~0.5% of the run); fine-tuning: 27 seed runs (3 initialisations x 3 tasks x 3 seeds)
of 313 (polarity), 94 and 94 steps of 32 x 64 tokens, 4.5 k steps and 5.5e14 FLOPs in all (~1 min at 10 ms per step,
plus ~1 s per seed run to restore and evaluate). The compiles and fine-tuning come to about 3-4 minutes, so 1e16 may
just not fit one 9-minute command: run it then with a time limit (`timeout -s TERM`), which stops it as a preemption
would, and again to continue (docs/experiments.md). The budget is the one override: `--config.flops_budgets=3e16` (3
x the steps), or two budgets (`=3e15,1e16`: still one run each, a checkpoint and 18 more fine-tunings at 3e15).

`--config=configs/experiments/compare_gpu.py:tiny` is the same preset at a CPU's size (a 1-layer H=32 model,
32-token sequences, 64 pieces, a budget of 160 electra and 245 mlm steps): what tests/test_compare.py runs end to
end through the command line, interrupted and resumed, on generated text and tasks given as overrides (about a
minute or two of CPU time). See docs/experiments.md.
"""

from configs import small
from configs.experiments import compare_cpu


def get_config(arg: str = ''):
  if arg not in ('', 'tiny'):
    raise ValueError(f'unknown variant {arg!r}: use configs/experiments/compare_gpu.py (one GPU) or '
                     'configs/experiments/compare_gpu.py:tiny (a CPU, for tests)')
  config = compare_cpu.get_config()  # its runs, variants, tasks, seeds and fine-tuning recipe
  config.objectives = ('electra', 'mlm')
  config.flops_budgets = (1e16,)  # Pre-training FLOPs per run (as the trainer counts train_flops).
  config.precompile = True  # every pre-training and fine-tuning step compiled at once, before electra trains

  config.pretrain = small.get_config()  # ELECTRA-Small as in the paper (its 1M steps are set from the budget)
  pretrain = config.pretrain
  pretrain.data.source = '../shared/data/corpus/*.txt.gz'  # CORPUS: ~11 M words
  pretrain.data.tokenizer_type = 'wordpiece'  # BERT's kind of vocabulary, as the paper's 30522 uncased pieces
  pretrain.objective.temperature = 1.0  # the paper's sampling (already the default; stated, not inherited)
  pretrain.optimizer.warmup_steps = 500  # the paper's 10k steps of warm-up exceed a 1e16 run (8.7k steps)
  # Held-out evaluation every 500 steps on 8 fixed batches of the 1% of documents kept out of training.
  pretrain.data.eval_fraction = 0.01
  pretrain.eval_every = 500
  pretrain.eval_batches = 8
  # Checkpoints at the budgets' steps only (save_steps, set by the runner), at the end and on a stop signal.
  pretrain.checkpoint_every = 10**9
  del pretrain.train_steps, pretrain.save_steps
  del pretrain.objective['name']

  # ELECTRA-Small's fine-tuning learning rate (0: the paper's for the width, 3e-4), for every task: compare_cpu's
  # 1e-3 was chosen for its 4-layer H=128 model. Polarity keeps its recipe (10 epochs at 3e-4).
  config.finetune.optimizer.learning_rate = 0.0
  if arg == 'tiny':
    _tiny(config)
  return config


def _tiny(config):
  """The same experiment at a CPU's size: every key the full preset sets, shrunk; data and tasks still name
  ../shared (a test gives generated ones)."""
  pretrain = config.pretrain
  pretrain.model.update(embedding_size=32, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
                        max_position_embeddings=64, generator_hidden_fraction=0.5, dropout_rate=0.0,
                        attention_dropout_rate=0.0)
  pretrain.data.update(vocab_size=64, max_seq_length=32)
  pretrain.update(batch_size=8, log_every=10, eval_every=50, eval_batches=2)
  pretrain.data.eval_fraction = 0.1
  pretrain.optimizer.update(learning_rate=1e-3, warmup_steps=10)
  pretrain.mesh.shape = (1, 1, 1)
  config.flops_budgets = (4e9,)  # electra 160.5 steps of this model (2.49e7 FLOPs each): 160 at 5 a call; mlm 245
  config.finetune.update(batch_size=16, eval_batch_size=32, max_seq_length=32, max_train_examples=48, epochs=1.0)
  config.finetune.mesh.shape = (1, 1, 1)
