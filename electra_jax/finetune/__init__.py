"""Fine-tuning and evaluation of pre-trained ELECTRA discriminators (GLUE, SQuAD, tagging, local tasks).

  tasks      task declarations (GLUE, SQuAD, local TSV/CoNLL directories) and where their examples come from
  files      the files users have (GLUE's distribution, SQuAD's JSON, task directories) read and checked
  features   examples -> fixed-shape arrays, batching;  squad: context windows and answer decoding
  heads      the task heads on Electra.encode, and their losses
  optimizer  AdamW with layer-wise learning-rate decay and the official schedule
  metrics    accuracy, F1, MCC, Pearson/Spearman, SQuAD EM/F1, span F1
  train      the multi-seed fine-tuning loop (resumable), results;  predict: inference and prediction files
"""

from electra_jax.finetune.predict import Predictor, predict_main
from electra_jax.finetune.train import precompile, run

__all__ = ['Predictor', 'precompile', 'predict_main', 'run']
