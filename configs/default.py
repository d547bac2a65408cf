"""Every key of an electra_jax pre-training run, with its default.

Scale configs (`small.py`, `base.py`, `large.py`, `tiny.py`) start from this one and override a dozen keys.
Any key can be overridden on the command line: `--config.optimizer.learning_rate=1e-3`; `--show_config` lists
them all with their values and the comments written here (a key's comment is the one on its line, or the
comment lines just above it).
"""

import ml_collections


def get_config():
  config = ml_collections.ConfigDict()
  config.seed = 0  # Seeds initialisation, masking, sampling, dropout and data order.
  config.train_steps = 1000  # Total optimiser steps; the learning rate decays to 0 at this step.
  config.batch_size = 128  # Global batch (sequences per step, over all devices and hosts).
  config.grad_accum_steps = 1  # Micro-batches per step (each batch_size / k rows): same result, less memory.
  config.log_every = 50  # Steps between metrics lines in WORKDIR/metrics.jsonl and TensorBoard.
  config.checkpoint_every = 1000  # Steps between checkpoints (one is always written at the end).
  config.keep_checkpoints = 3  # How many recent checkpoints to keep on disk.
  config.save_steps = ()  # Extra steps to checkpoint, kept on disk whatever keep_checkpoints says.
  # A pre-training WORKDIR or an import to continue pre-training from: its model and tokenizer, a new run at step 0.
  config.init_checkpoint = ''
  config.init_optimizer = False  # With init_checkpoint: also take its Adam moments (the schedule starts again).
  config.eval_every = 0  # Steps between held-out evaluations (and one at the last step); 0: none. Needs data.eval_*.
  config.eval_batches = 16  # Fixed held-out batches (of batch_size) each evaluation runs on: the same every time.
  config.profile_steps = ''  # 'START,COUNT': trace steps START.. into WORKDIR/tensorboard (TensorBoard's Profile tab).

  config.model = ml_collections.ConfigDict()
  config.model.vocab_size = 0  # 0: take it from the tokenizer.
  config.model.embedding_size = 128  # E: width of the shared token embeddings.
  config.model.hidden_size = 256  # H: discriminator width.
  config.model.num_layers = 12  # Discriminator depth.
  config.model.num_heads = 4  # Discriminator attention heads (H / 64 in the paper).
  config.model.intermediate_size = 1024  # Discriminator feed-forward width (4 H).
  config.model.generator_hidden_fraction = 0.25  # Generator width as a fraction of H (heads = width // 64).
  config.model.generator_layers_fraction = 1.0  # Generator depth as a fraction of the discriminator's.
  config.model.max_position_embeddings = 512  # Longest sequence the position table covers.
  config.model.type_vocab_size = 2  # Segment ids (A/B).
  config.model.dropout_rate = 0.1  # Hidden-state dropout.
  config.model.attention_dropout_rate = 0.1  # Dropout on attention probabilities.
  config.model.initializer_range = 0.02  # Std of the truncated-normal initialiser.
  config.model.layer_norm_eps = 1e-12  # LayerNorm epsilon (BERT/ELECTRA value).
  config.model.dtype = 'auto'  # Activations and matmuls: 'float32', 'bfloat16', 'auto' (bf16 on TPU/GPU, fp32 on CPU).
  config.model.remat = 'none'  # none|full|dots|dots_no_batch|outputs: what a layer keeps for backward (config.REMATS).
  config.model.attention = 'auto'  # auto|einsum|fused (config.ATTENTIONS): auto fuses on GPUs if attention dropout is 0.
  config.model.scan_layers = False  # One lax.scan over the encoder layers (stacked parameters) instead of unrolled.
  # What the generator shares with the discriminator: 'embeddings' (the paper's default), 'none' (own embeddings,
  # as wide as the generator), 'all' (also the encoder: generator fractions must be 1; only the heads differ).
  config.model.tying = 'embeddings'

  config.objective = ml_collections.ConfigDict()
  # 'electra', 'electra_15', 'replace_mlm', 'all_tokens_mlm', 'mlm' (BERT) or 'electra_adversarial' (generator
  # trained by REINFORCE to fool the discriminator, no MLM loss).
  config.objective.name = 'electra'
  config.objective.mask_prob = 0.15  # Fraction of tokens selected for prediction.
  config.objective.max_predictions = 0  # Selected positions per sequence; 0: int((mask_prob + 0.005) * L).
  config.objective.mask_token_prob = 0.85  # Selected positions shown to the generator as [MASK].
  config.objective.random_token_prob = 0.0  # Selected positions replaced by a random token (BERT: 0.1).
  # True: positions drawn with replacement, as official ELECTRA (fewer distinct ones); False: n distinct positions.
  config.objective.mask_with_replacement = True
  config.objective.temperature = 1.0  # Generator sampling temperature (after any schedule below).
  # > 0: sample at this temperature at step 0, falling linearly to `temperature` over the first
  # temperature_decay_fraction of train_steps (Fast-ELECTRA's curriculum: flatter samples are easier to detect).
  config.objective.initial_temperature = 0.0
  config.objective.temperature_decay_fraction = 0.0  # Fraction of train_steps the temperature schedule spans.
  config.objective.gen_weight = 1.0  # Weight of the generator MLM loss.
  config.objective.disc_weight = 50.0  # Weight of the discriminator loss (lambda in the paper).
  # > 0: lambda rises linearly from 0 to disc_weight over this fraction of train_steps (0: constant).
  config.objective.disc_weight_warmup_fraction = 0.0
  config.objective.disallow_correct = False  # Never sample the original token.
  config.objective.uniform_generator = False  # Replace the generator by uniform sampling (ablation).
  # Two-stage training (0: off): the generator alone (MLM) for this many steps, then the discriminator, initialised
  # from it, alone while the generator stays frozen. Needs a same-size generator and model.tying != 'all'.
  config.objective.two_stage_generator_steps = 0

  config.optimizer = adam()
  config.optimizer.learning_rate = 5e-4  # Peak learning rate.
  config.optimizer.warmup_steps = 10000  # Linear warm-up steps (overlapping the linear decay).

  config.data = ml_collections.ConfigDict()
  # Text files (glob, directory, .gz ok), 'tfds:NAME[/CONFIG]', or a directory `python -m electra_jax.data build`
  # wrote; '': the quickstart corpus in the package.
  config.data.source = ''
  config.data.tokenizer = ''  # A SentencePiece .model, a WordPiece vocab.txt or a saved dir; '': train one (cached).
  config.data.tokenizer_type = 'unigram'  # Tokenizer trained here: 'unigram' or 'bpe' (SentencePiece), 'wordpiece'.
  config.data.vocab_size = 8000  # Size of a tokenizer trained here.
  config.data.lowercase = True  # Lower-case text before tokenizing (uncased model).
  config.data.max_seq_length = 128  # Tokens per example, [CLS]/[SEP] included.
  config.data.text_field = 'text'  # tfds sources: the feature holding a document's text.
  config.data.tfds_split = 'train'  # tfds sources: the split to read (tfds slicing syntax works).
  config.data.tfds_data_dir = ''  # tfds sources: tfds data_dir; '': ~/tensorflow_datasets or $TFDS_DATA_DIR.
  config.data.cache_dir = ''  # Tokenizers, packed data, compiled steps; '': $ELECTRA_JAX_CACHE or ~/.cache/electra_jax.
  # Fraction of the documents of a text data.source held out of training for evaluation (chosen by a hash of each
  # document's text); 0: none. A built data.source cannot hold documents out: give data.eval_source instead.
  config.data.eval_fraction = 0.0
  config.data.eval_source = ''  # Held-out text to evaluate on instead (anything data.source accepts); '': none.

  config.mesh = ml_collections.ConfigDict()
  config.mesh.shape = (-1, 1, 1)  # Devices along ('data', 'fsdp', 'tensor'); one -1 takes the rest.
  # Logical axis -> mesh axes. Parameters and the batch carry the logical names on the left.
  config.mesh.rules = (
      ('batch', ('data', 'fsdp')),
      ('vocab', 'tensor'),
      ('heads', 'tensor'),
      ('mlp', 'tensor'),
      ('embed', 'fsdp'),
      ('token_embed', None),
  )
  return config


def adam():
  """The AdamW keys pre-training and fine-tuning share (`electra_jax.config.AdamConfig`)."""
  optimizer = ml_collections.ConfigDict()
  optimizer.weight_decay = 0.01  # Decoupled weight decay (not on LayerNorm or biases).
  optimizer.b1 = 0.9  # Adam's decay of the gradient average (beta1).
  optimizer.b2 = 0.999  # Adam's decay of the squared-gradient average (beta2).
  optimizer.eps = 1e-6  # Added to Adam's denominator (the official ELECTRA value).
  optimizer.clip_norm = 1.0  # Global gradient-norm clipping.
  optimizer.bias_correction = False  # The official ELECTRA Adam has none.
  return optimizer
