"""Every key of a fine-tuning run (`--mode=finetune`), with its default.

  python -m electra_jax.main --mode=finetune --config=configs/finetune.py --config.task=rte \
      --config.init_checkpoint=PRETRAIN_WORKDIR --workdir=RTE_WORKDIR --config.seeds=10

0 for learning_rate, layerwise_lr_decay, epochs and max_seq_length means the paper's value for the model width
(lr 3e-4 small / 1e-4 base / 5e-5 large; decay 0.8 / 0.8 / 0.9) or for the task (3 epochs, 10 for RTE and
STS-B, 2 for SQuAD; length 128, 512 for SQuAD).
"""

import ml_collections

from configs import default
from electra_jax import config as config_lib
from electra_jax.finetune import config as finetune_config


def get_config():
  # Every key at its default: electra_jax/finetune/config.py's dataclasses, the one source of the defaults.
  d = ml_collections.ConfigDict(config_lib.defaults(finetune_config.FinetuneConfig))
  config = ml_collections.ConfigDict()
  # A GLUE name (cola sst2 mrpc stsb qqp mnli qnli rte wnli), squad_v1, squad_v2, or a task directory.
  config.task = d.task
  config.task_kind = d.task_kind  # For a TSV directory: '' guesses from the labels, or 'classification' / 'regression'.
  # A pre-training WORKDIR (config.json, tokenizer.model, checkpoints/); '': from scratch.
  config.init_checkpoint = d.init_checkpoint
  config.init_step = d.init_step  # Checkpoint step of init_checkpoint to start from; 0: its latest.
  config.seed = d.seed  # First seed; seeds seed .. seed + seeds - 1 (head init, dropout, data order).
  config.seeds = d.seeds  # Runs to report the median of (the paper reports the median of 10).
  config.epochs = d.epochs  # Training epochs; 0: the task's.
  # Train on this many random training examples (the same for every seed); 0: all.
  config.max_train_examples = d.max_train_examples
  config.batch_size = d.batch_size  # Training batch.
  config.eval_batch_size = d.eval_batch_size  # Evaluation batch (lower it for SQuAD on small memory).
  config.max_seq_length = d.max_seq_length  # Tokens per example; 0: the task's.
  config.head_dropout = d.head_dropout  # Dropout before the classification/tagging dense layer.
  config.log_every = d.log_every  # Steps between loss lines in seeds/<seed>/metrics.jsonl (at most a 20th of the run).
  config.eval_every = d.eval_every  # Steps between dev scores in seeds/<seed>/metrics.jsonl; 0: only at the end.
  # Steps between checkpoints of the seed in training (a rerun resumes from it).
  config.checkpoint_every = d.checkpoint_every
  config.glue_dir = d.glue_dir  # GLUE's distribution as unzipped (the directory holding CoLA/, RTE/, ...); '': tfds.
  # The directory holding SQuAD's train-v1.1.json/dev-v1.1.json (v2.0 likewise); '': tfds.
  config.squad_dir = d.squad_dir
  # tensorflow-datasets data_dir (GLUE/SQuAD without glue_dir/squad_dir); '': its own.
  config.tfds_data_dir = d.tfds_data_dir
  config.save_model = d.save_model  # Save each seed's fine-tuned params under WORKDIR/seeds/<seed>/params.
  # Dev predictions and test submission files under WORKDIR/seeds/<seed>/predictions.
  config.write_predictions = d.write_predictions
  config.predict_input = d.predict_input  # --mode=predict: a file with one example per line ('-': stdin).
  config.predict_output = d.predict_output  # --mode=predict: where predictions go ('': stdout).
  # --mode=predict: tsv (prediction, probabilities, input), jsonl, or labels (bare).
  config.predict_format = d.predict_format

  config.optimizer = default.adam()  # + weight_decay, b1, b2, eps, clip_norm, bias_correction
  config.optimizer.learning_rate = d.optimizer.learning_rate  # Peak learning rate; 0: the paper's for the model width.
  # lr * decay^(L+2-depth); 0: the paper's (0.8, 0.9 large); 1: off.
  config.optimizer.layerwise_lr_decay = d.optimizer.layerwise_lr_decay
  # Warm-up over this fraction of the steps, overlapping the decay to 0.
  config.optimizer.warmup_fraction = d.optimizer.warmup_fraction

  config.squad = ml_collections.ConfigDict()
  config.squad.doc_stride = d.squad.doc_stride  # Tokens between the starts of a context's windows.
  config.squad.max_query_length = d.squad.max_query_length  # Question tokens kept.
  config.squad.beam_size = d.squad.beam_size  # Top start (and, per start, end) positions searched (n-best).
  config.squad.max_answer_length = d.squad.max_answer_length  # Longest answer in tokens.
  config.squad.answerable_weight = d.squad.answerable_weight  # Weight of the SQuAD 2.0 answerability loss.
  config.squad.na_threshold = d.squad.na_threshold  # SQuAD 2.0: answer '' when the null odds exceed this.

  base = default.get_config()
  config.model = base.model  # From scratch only: the model (a pre-trained WORKDIR brings its own).
  config.data = base.data  # From scratch only: data.tokenizer, or a tokenizer trained on data.source.
  config.mesh = base.mesh  # Device mesh and sharding rules, as in pre-training.
  return config
