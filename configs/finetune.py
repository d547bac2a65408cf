"""Every key of a fine-tuning run (`--mode=finetune`), with its default.

  python -m electra_jax.main --mode=finetune --config=configs/finetune.py --config.task=rte \
      --config.init_checkpoint=PRETRAIN_WORKDIR --workdir=/tmp/rte --config.seeds=10

0 for learning_rate, layerwise_lr_decay, epochs and max_seq_length means the paper's value for the model width
(lr 3e-4 small / 1e-4 base / 5e-5 large; decay 0.8 / 0.8 / 0.9) or for the task (3 epochs, 10 for RTE and
STS-B, 2 for SQuAD; length 128, 512 for SQuAD).
"""

import ml_collections

from configs import default


def get_config():
  config = ml_collections.ConfigDict()
  config.task = ''  # A GLUE name (cola sst2 mrpc stsb qqp mnli qnli rte wnli), squad_v1, squad_v2, or a task directory.
  config.task_kind = ''  # For a TSV directory: '' guesses from the labels, or 'classification' / 'regression'.
  config.init_checkpoint = ''  # A pre-training WORKDIR (config.json, tokenizer.model, checkpoints/); '': from scratch.
  config.init_step = 0  # Checkpoint step of init_checkpoint to start from; 0: its latest.
  config.seed = 0  # First seed; seeds seed .. seed + seeds - 1 (head init, dropout, data order).
  config.seeds = 1  # Runs to report the median of (the paper reports the median of 10).
  config.epochs = 0.0  # Training epochs; 0: the task's.
  config.max_train_examples = 0  # Train on this many random training examples (the same for every seed); 0: all.
  config.batch_size = 32  # Training batch.
  config.eval_batch_size = 64  # Evaluation batch (lower it for SQuAD on small memory).
  config.max_seq_length = 0  # Tokens per example; 0: the task's.
  config.head_dropout = 0.1  # Dropout before the classification/tagging dense layer.
  config.log_every = 100  # Steps between loss lines in seeds/<seed>/metrics.jsonl (at most a 20th of the run).
  config.eval_every = 0  # Steps between dev scores in seeds/<seed>/metrics.jsonl; 0: only at the end.
  config.checkpoint_every = 500  # Steps between checkpoints of the seed in training (a rerun resumes from it).
  config.glue_dir = ''  # GLUE's distribution as unzipped (the directory holding CoLA/, RTE/, ...); '': tfds.
  config.squad_dir = ''  # The directory holding SQuAD's train-v1.1.json/dev-v1.1.json (v2.0 likewise); '': tfds.
  config.tfds_data_dir = ''  # tensorflow-datasets data_dir (GLUE/SQuAD without glue_dir/squad_dir); '': its own.
  config.save_model = True  # Save each seed's fine-tuned params under WORKDIR/seeds/<seed>/params.
  config.write_predictions = True  # Dev predictions and test submission files under WORKDIR/seeds/<seed>/predictions.
  config.predict_input = ''  # --mode=predict: a file with one example per line ('-': stdin).
  config.predict_output = ''  # --mode=predict: where predictions go ('': stdout).
  config.predict_format = 'tsv'  # --mode=predict: tsv (prediction, probabilities, input), jsonl, or labels (bare).

  config.optimizer = default.adam()  # + weight_decay, b1, b2, eps, clip_norm, bias_correction
  config.optimizer.learning_rate = 0.0  # Peak learning rate; 0: the paper's for the model width.
  config.optimizer.layerwise_lr_decay = 0.0  # lr * decay^(L+2-depth); 0: the paper's (0.8, 0.9 large); 1: off.
  config.optimizer.warmup_fraction = 0.1  # Warm-up over this fraction of the steps, overlapping the decay to 0.

  config.squad = ml_collections.ConfigDict()
  config.squad.doc_stride = 128  # Tokens between the starts of a context's windows.
  config.squad.max_query_length = 64  # Question tokens kept.
  config.squad.beam_size = 20  # Top start (and, per start, end) positions searched (n-best).
  config.squad.max_answer_length = 30  # Longest answer in tokens.
  config.squad.answerable_weight = 0.5  # Weight of the SQuAD 2.0 answerability loss.

  base = default.get_config()
  config.model = base.model  # From scratch only: the model (a pre-trained WORKDIR brings its own).
  config.data = base.data  # From scratch only: data.tokenizer, or a tokenizer trained on data.source.
  config.mesh = base.mesh  # Device mesh and sharding rules, as in pre-training.
  return config
