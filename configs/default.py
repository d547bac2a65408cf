"""Every key of an electra_jax pre-training run, with its default and what it does.

The defaults themselves live in one place, the typed dataclasses of electra_jax/config.py (and DataConfig in
electra_jax/data): this file reads them from there and says what each key means. Scale configs (`small.py`,
`base.py`, `large.py`, `tiny.py`) start from this one and override a dozen keys.
Any key can be overridden on the command line: `--config.optimizer.learning_rate=1e-3`; `--show_config` lists
them all with their values and the comments written here (a key's comment is the one on its line, or the
comment lines just above it).
"""

import ml_collections

from electra_jax import config as config_lib


def get_config():
  d = ml_collections.ConfigDict(config_lib.defaults(config_lib.TrainConfig))  # every key at its default
  m, o, dd = d.model, d.objective, d.data
  config = ml_collections.ConfigDict()
  config.seed = d.seed  # Seeds initialisation, masking, sampling, dropout and data order.
  config.train_steps = d.train_steps  # Total optimiser steps; the learning rate decays to 0 at this step.
  config.batch_size = d.batch_size  # Global batch (sequences per step, over all devices and hosts).
  # Micro-batches per step (each batch_size / k rows): same result, less memory.
  config.grad_accum_steps = d.grad_accum_steps
  config.log_every = d.log_every  # Steps between metrics lines in WORKDIR/metrics.jsonl and TensorBoard.
  config.checkpoint_every = d.checkpoint_every  # Steps between checkpoints (one is always written at the end).
  config.keep_checkpoints = d.keep_checkpoints  # How many recent checkpoints to keep on disk.
  config.save_steps = d.save_steps  # Extra steps to checkpoint, kept whatever keep_checkpoints says (and resumes).
  # A pre-training WORKDIR or an import to continue pre-training from: its model and tokenizer, a new run at step 0.
  config.init_checkpoint = d.init_checkpoint
  # With init_checkpoint: also take its Adam moments (the schedule starts again).
  config.init_optimizer = d.init_optimizer
  # Steps between held-out evaluations (and one at the last step); 0: none. Needs data.eval_*.
  config.eval_every = d.eval_every
  # Fixed held-out batches (of batch_size) each evaluation runs on: the same every time.
  config.eval_batches = d.eval_batches
  # 'START,COUNT': trace steps START.. into WORKDIR/tensorboard (TensorBoard's Profile tab).
  config.profile_steps = d.profile_steps
  # Train steps in each call of the compiled program (a scan over that many batches): the same steps, with the host's
  # work per call (launches, arguments) spread over them. log_every, checkpoint_every, eval_every, save_steps and
  # profile_steps must then be multiples of it; train_steps too, or its last steps compile a one-step program.
  config.steps_per_call = d.steps_per_call

  config.model = ml_collections.ConfigDict()
  config.model.vocab_size = m.vocab_size  # 0: take it from the tokenizer.
  config.model.embedding_size = m.embedding_size  # E: width of the shared token embeddings.
  config.model.hidden_size = m.hidden_size  # H: discriminator width.
  config.model.num_layers = m.num_layers  # Discriminator depth.
  config.model.num_heads = m.num_heads  # Discriminator attention heads (H / 64 in the paper).
  config.model.intermediate_size = m.intermediate_size  # Discriminator feed-forward width (4 H).
  # Generator width as a fraction of H (heads = width // 64).
  config.model.generator_hidden_fraction = m.generator_hidden_fraction
  # Generator depth as a fraction of the discriminator's.
  config.model.generator_layers_fraction = m.generator_layers_fraction
  config.model.max_position_embeddings = m.max_position_embeddings  # Longest sequence the position table covers.
  config.model.type_vocab_size = m.type_vocab_size  # Segment ids (A/B).
  config.model.dropout_rate = m.dropout_rate  # Hidden-state dropout.
  config.model.attention_dropout_rate = m.attention_dropout_rate  # On attention probabilities (0 where fused).
  config.model.initializer_range = m.initializer_range  # Std of the truncated-normal initialiser.
  config.model.layer_norm_eps = m.layer_norm_eps  # LayerNorm epsilon (BERT/ELECTRA value).
  config.model.dtype = m.dtype  # Activations and matmuls: 'float32', 'bfloat16', 'auto' (bf16 on TPU/GPU, fp32 on CPU).
  config.model.remat = m.remat  # none|full|dots|dots_no_batch|outputs: what a layer keeps for backward (config.REMATS).
  # auto|einsum|fused (config.ATTENTIONS): auto is cuDNN's fused attention, without attention dropout, on GPUs.
  config.model.attention = m.attention
  # auto|uniform|bits16|rbg|rbg_tower (config.DROPOUT_DRAWS): how dropout masks are drawn; auto: bits16 on CPUs,
  # rbg_tower on GPUs (rbg with remat), uniform on TPUs.
  config.model.dropout_draw = m.dropout_draw
  # auto|true|false: the attention's query, key and value projections as one matmul (config.py: model.fused_qkv;
  # same parameters); auto: true on GPUs (false with remat).
  config.model.fused_qkv = m.fused_qkv
  # One lax.scan over the encoder layers (stacked parameters) instead of unrolled.
  config.model.scan_layers = m.scan_layers
  # What the generator shares with the discriminator: 'embeddings' (the paper's default), 'none' (own embeddings,
  # as wide as the generator), 'all' (also the encoder: generator fractions must be 1; only the heads differ),
  # 'gdes' (DeBERTa-v3: the discriminator reads stop_gradient(shared embeddings) + a zero-initialised delta).
  config.model.tying = m.tying

  config.objective = ml_collections.ConfigDict()
  # 'electra', 'electra_15', 'replace_mlm', 'all_tokens_mlm', 'mlm' (BERT), 'electra_adversarial' (generator
  # trained by REINFORCE to fool the discriminator, no MLM loss) or 'electra_frozen' (a frozen, pre-trained one).
  config.objective.name = o.name
  config.objective.mask_prob = o.mask_prob  # Fraction of tokens selected for prediction.
  # Selected positions per sequence; 0: int((mask_prob + 0.005) * L).
  config.objective.max_predictions = o.max_predictions
  config.objective.mask_token_prob = o.mask_token_prob  # Selected positions shown to the generator as [MASK].
  config.objective.random_token_prob = o.random_token_prob  # Selected positions replaced by a random token (BERT: 0.1).
  # True: positions drawn with replacement, as official ELECTRA (fewer distinct ones); False: n distinct positions.
  config.objective.mask_with_replacement = o.mask_with_replacement
  # A position drawn twice: 'mean' writes the floor-mean of its samples' ids, as the official scatter_update does
  # (a token unrelated to either sample, easy to detect: docs/convert.md); 'first' writes its first sample.
  config.objective.duplicate_samples = o.duplicate_samples
  config.objective.temperature = o.temperature  # Generator sampling temperature (after any schedule below).
  # > 0: sample at this temperature at step 0, falling linearly to `temperature` over the first
  # temperature_decay_fraction of train_steps (Fast-ELECTRA's curriculum: flatter samples are easier to detect).
  config.objective.initial_temperature = o.initial_temperature
  # Fraction of train_steps the temperature schedule spans.
  config.objective.temperature_decay_fraction = o.temperature_decay_fraction
  config.objective.gen_weight = o.gen_weight  # Weight of the generator MLM loss.
  config.objective.disc_weight = o.disc_weight  # Weight of the discriminator loss (lambda in the paper).
  # > 0: lambda rises linearly from 0 to disc_weight over this fraction of train_steps (0: constant).
  config.objective.disc_weight_warmup_fraction = o.disc_weight_warmup_fraction
  config.objective.disallow_correct = o.disallow_correct  # Never sample the original token.
  config.objective.uniform_generator = o.uniform_generator  # Replace the generator by uniform sampling (ablation).
  # inverse_cdf|gumbel: how replacements are drawn (config.SAMPLINGS); same distribution, different draws.
  config.objective.sampling = o.sampling
  # Two-stage training (0: off): the generator alone (MLM) for this many steps, then the discriminator, initialised
  # from it, alone while the generator stays frozen. Needs a same-size generator and model.tying != 'all'.
  config.objective.two_stage_generator_steps = o.two_stage_generator_steps
  # objective.name='electra_frozen' (Fast-ELECTRA): replacements from the MLM of this pre-training WORKDIR (an mlm run
  # or a run with a generator), frozen; the run must use its tokenizer (data.tokenizer=WORKDIR).
  config.objective.generator_checkpoint = o.generator_checkpoint
  config.objective.generator_step = o.generator_step  # The generator_checkpoint step to read; 0: its latest.

  config.optimizer = adam()
  config.optimizer.learning_rate = d.optimizer.learning_rate  # Peak learning rate.
  config.optimizer.warmup_steps = d.optimizer.warmup_steps  # Linear warm-up steps (overlapping the linear decay).
  # The step's parameters and moments as a few vectors, one update each (config.py: optimizer.flat_params); 'auto':
  # on GPUs whose parameters are replicated. Checkpoints are the same either way.
  config.optimizer.flat_params = d.optimizer.flat_params

  config.data = ml_collections.ConfigDict()
  # Text files (glob, directory, .gz ok), 'tfds:NAME[/CONFIG]', or a directory `python -m electra_jax.data build`
  # wrote; '': the quickstart corpus in the package.
  config.data.source = dd.source
  # A SentencePiece .model, a WordPiece vocab.txt or a saved dir; '': train one (cached).
  config.data.tokenizer = dd.tokenizer
  # Tokenizer trained here: 'unigram' or 'bpe' (SentencePiece), 'wordpiece'.
  config.data.tokenizer_type = dd.tokenizer_type
  config.data.vocab_size = dd.vocab_size  # Size of a tokenizer trained here.
  config.data.lowercase = dd.lowercase  # Lower-case text before tokenizing (uncased model).
  config.data.max_seq_length = dd.max_seq_length  # Tokens per example, [CLS]/[SEP] included.
  # A text line longer than an example (one paragraph a line; the official builder expects one sentence a line):
  # 'split' keeps all its tokens, over several examples; 'truncate' keeps its first max_seq_length - 2 tokens in
  # one example and drops the rest, as google-research/electra's build_pretraining_dataset.py does.
  config.data.long_lines = dd.long_lines
  config.data.text_field = dd.text_field  # tfds sources: the feature holding a document's text.
  config.data.tfds_split = dd.tfds_split  # tfds sources: the split to read (tfds slicing syntax works).
  # tfds sources: tfds data_dir; '': ~/tensorflow_datasets or $TFDS_DATA_DIR.
  config.data.tfds_data_dir = dd.tfds_data_dir
  # Tokenizers, packed data, compiled steps; '': $ELECTRA_JAX_CACHE or ~/.cache/electra_jax.
  config.data.cache_dir = dd.cache_dir
  # Fraction of the documents of a text data.source held out of training for evaluation (chosen by a hash of each
  # document's text); 0: none. A built data.source cannot hold documents out: give data.eval_source instead.
  config.data.eval_fraction = dd.eval_fraction
  # Held-out text to evaluate on instead (anything data.source accepts); '': none.
  config.data.eval_source = dd.eval_source

  config.mesh = ml_collections.ConfigDict()
  config.mesh.shape = d.mesh.shape  # Devices along ('data', 'fsdp', 'tensor'); one -1 takes the rest.
  # Logical axis -> mesh axes. Activations and the batch carry the activation_* names, parameters the others.
  config.mesh.rules = d.mesh.rules
  return config


def adam():
  """The AdamW keys pre-training and fine-tuning share (`electra_jax.config.AdamConfig`)."""
  d = ml_collections.ConfigDict(config_lib.defaults(config_lib.AdamConfig))
  optimizer = ml_collections.ConfigDict()
  optimizer.weight_decay = d.weight_decay  # Decoupled weight decay (not on LayerNorm or biases).
  optimizer.b1 = d.b1  # Adam's decay of the gradient average (beta1).
  optimizer.b2 = d.b2  # Adam's decay of the squared-gradient average (beta2).
  optimizer.eps = d.eps  # Added to Adam's denominator (the official ELECTRA value).
  optimizer.clip_norm = d.clip_norm  # Global gradient-norm clipping.
  optimizer.bias_correction = d.bias_correction  # The official ELECTRA Adam has none.
  return optimizer
