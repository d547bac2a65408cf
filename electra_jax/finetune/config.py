"""Frozen, typed views of a fine-tuning config (configs/finetune.py); jitted code never sees a ConfigDict."""

import dataclasses

from electra_jax import config as config_lib
from electra_jax.config import ConfigError, DataConfig, MeshConfig, ModelConfig

# Paper settings by model width (ELECTRA appendix): (peak learning rate, layer-wise decay).
PAPER_SETTINGS = ((1024, 5e-5, 0.9), (768, 1e-4, 0.8), (0, 3e-4, 0.8))  # large, base, small
PREDICT_FORMATS = ('tsv', 'jsonl', 'labels')  # what --mode=predict prints (see predict.format_predictions)


@dataclasses.dataclass(frozen=True)
class SquadConfig:
  doc_stride: int = 128
  max_query_length: int = 64
  beam_size: int = 20
  max_answer_length: int = 30
  answerable_weight: float = 0.5
  na_threshold: float = -2.75  # official qa_na_threshold: a 2.0 question is unanswered when its null odds exceed it


@dataclasses.dataclass(frozen=True)
class OptimizerConfig(config_lib.AdamConfig):
  """AdamW with layer-wise learning-rate decay; 0 for learning_rate/layerwise_lr_decay means the paper value."""
  learning_rate: float = 0.0
  layerwise_lr_decay: float = 0.0
  warmup_fraction: float = 0.1

  def __post_init__(self):
    super().__post_init__()
    if self.learning_rate < 0:
      raise ConfigError(f'optimizer.learning_rate must be positive, or 0 for the paper\'s value for the model\'s '
                        f'width; got {self.learning_rate}')
    if not 0 <= self.warmup_fraction < 1:
      raise ConfigError(f'optimizer.warmup_fraction must be in [0, 1), got {self.warmup_fraction}')
    if not 0 <= self.layerwise_lr_decay <= 1:
      raise ConfigError(f'optimizer.layerwise_lr_decay must be in [0, 1] (1: no decay), got '
                        f'{self.layerwise_lr_decay}')

  def for_model(self, hidden_size: int) -> 'OptimizerConfig':
    """Fills learning_rate and layerwise_lr_decay left at 0 with the paper's values for this model width."""
    _, lr, decay = next(s for s in PAPER_SETTINGS if hidden_size >= s[0])
    return dataclasses.replace(self, learning_rate=self.learning_rate or lr,
                               layerwise_lr_decay=self.layerwise_lr_decay or decay)


@dataclasses.dataclass(frozen=True)
class FinetuneConfig:
  """A fine-tuning run; `model` is used only from scratch (a pre-trained workdir brings its own)."""
  task: str = ''
  task_kind: str = ''
  init_checkpoint: str = ''
  init_step: int = 0
  seed: int = 0
  seeds: int = 1
  epochs: float = 0.0
  max_train_examples: int = 0
  batch_size: int = 32
  eval_batch_size: int = 64
  max_seq_length: int = 0
  head_dropout: float = 0.1
  log_every: int = 100
  eval_every: int = 0
  checkpoint_every: int = 500
  glue_dir: str = ''
  squad_dir: str = ''
  tfds_data_dir: str = ''
  save_model: bool = True
  write_predictions: bool = True
  predict_input: str = ''
  predict_output: str = ''
  predict_format: str = 'tsv'
  optimizer: OptimizerConfig = dataclasses.field(default_factory=OptimizerConfig)
  squad: SquadConfig = dataclasses.field(default_factory=SquadConfig)
  model: ModelConfig = dataclasses.field(default_factory=ModelConfig)  # not at import: dtype 'auto' asks jax
  data: DataConfig = dataclasses.field(default_factory=DataConfig)  # the tokenizer when training from scratch
  mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)

  def __post_init__(self):
    for name in ('seeds', 'batch_size', 'eval_batch_size', 'log_every', 'checkpoint_every'):
      if getattr(self, name) <= 0:
        raise ConfigError(f'config key {name} must be positive, got {getattr(self, name)}')
    if self.epochs < 0 or self.max_seq_length < 0:
      raise ConfigError('config keys epochs and max_seq_length must be >= 0 (0: the task default)')
    if self.init_step < 0 or self.max_train_examples < 0:
      raise ConfigError('config keys init_step and max_train_examples must be >= 0 (0: the latest step, all '
                        'examples)')
    config_lib.check_ranges('config key ', self, probability=('head_dropout',))
    if self.eval_every < 0:
      raise ConfigError(f'config key eval_every must be >= 0 (0: score the dev set only at the end), got '
                        f'{self.eval_every}')
    if self.predict_format not in PREDICT_FORMATS:
      raise ConfigError(f'config key predict_format must be one of {", ".join(PREDICT_FORMATS)}, got '
                        f'{self.predict_format!r}')
    if self.init_step and not self.init_checkpoint:
      raise ConfigError('config key init_step needs init_checkpoint (a pre-training WORKDIR)')


def load(config) -> FinetuneConfig:
  """ConfigDict (or nested dict) of configs/finetune.py -> a validated FinetuneConfig."""
  values = config.to_dict() if hasattr(config, 'to_dict') else dict(config)
  sub = {'optimizer': OptimizerConfig, 'squad': SquadConfig, 'model': ModelConfig, 'data': DataConfig,
         'mesh': MeshConfig}
  parts = {name: config_lib.from_dict(cls, dict(values.pop(name, {})), where=name) for name, cls in sub.items()}
  return config_lib.from_dict(FinetuneConfig, values, where='config', **parts)
