"""Frozen, typed views of the ml_collections config: jitted code never sees a ConfigDict.

Each dataclass mirrors one sub-dict of `configs/default.py`; `from_dict` refuses keys it does not know, so a typo
in a config file is one clear error rather than a silently ignored setting.
"""

import dataclasses
import json
import typing
from typing import Any, Mapping, TypeVar

from electra_jax.errors import ConfigError, DataError

T = TypeVar('T')


def from_dict(cls: type[T], values: Mapping[str, Any], *, where: str, **derived) -> T:
  """Builds dataclass `cls` from `values`, rejecting unknown keys and values not of their field's annotated type."""
  fields = {f.name: f for f in dataclasses.fields(cls)}
  unknown = sorted(set(values) - set(fields))
  if unknown:
    raise ConfigError(f'unknown config key(s) {", ".join(where + "." + k for k in unknown)}; '
                      f'the keys of {where} are: {", ".join(sorted(set(fields) - set(derived)))}')
  types = typing.get_type_hints(cls)
  kwargs = dict(derived)
  for name, value in values.items():
    value = current_value(name, value)
    expected = types[name]
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
      value = float(value)
    # bool is a subclass of int: `num_layers=True` must not pass as 1.
    if expected in (int, float, bool, str) and (not isinstance(value, expected)
                                                or (isinstance(value, bool) and expected is not bool)):
      raise ConfigError(f'config key {where}.{name} must be {expected.__name__}, got {value!r}')
    kwargs[name] = value
  return cls(**kwargs)


def defaults(cls) -> dict[str, Any]:
  """Every field of dataclass `cls` at its default, a nested dataclass as a dict of its own: the one source of
  the defaults that configs/default.py (and configs/finetune.py) document and start from."""
  types = typing.get_type_hints(cls)
  return {f.name: defaults(types[f.name]) if dataclasses.is_dataclass(types[f.name]) else f.default
          for f in dataclasses.fields(cls)}


def added_keys(cls, saved: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, Any]:
  """The keys of `current` that `saved` lacks, each at dataclass `cls`'s default: a key added since a run was saved
  counts as unchanged when it has its default. Both are `cls`'s settings as JSON gives them, flattened to
  'section.key'."""
  flat = _flat(json.loads(json.dumps(defaults(cls))))
  return {k: flat[k] for k in current.keys() - saved.keys() if k in flat}


def _flat(values: Mapping[str, Any], prefix: str = '') -> dict[str, Any]:
  """`values` with each nested dict's keys spelled 'section.key'."""
  flat = {}
  for k, v in values.items():
    flat.update(_flat(v, f'{prefix}{k}.') if isinstance(v, dict) else {f'{prefix}{k}': v})
  return flat


DTYPES = ('auto', 'float32', 'bfloat16')


def compute_dtype(dtype: str, platform: str) -> str:
  """model.dtype on `platform` ('cpu', 'gpu', 'tpu'): 'auto' is bfloat16 on TPUs and GPUs, whose matrix units are
  built for it (half the activation memory, the full matmul rate), and float32 on CPUs, where bfloat16 matmuls
  are slower than float32 ones and the tests compare with float32 references."""
  if dtype != 'auto':
    return dtype
  return 'float32' if platform == 'cpu' else 'bfloat16'


# model.remat: what each encoder layer keeps for the backward pass (jax.checkpoint_policies); the rest is recomputed.
#   'none': everything (no recompute); 'full': only the layer's input (recompute the whole layer);
#   'dots': every matmul output, attention scores included; 'dots_no_batch': the matmul outputs without a batch
#   dimension, i.e. the dense projections but not the [batch, heads, length, length] attention scores (the attention
#   core is recomputed); 'outputs': only the outputs of the attention-output and FFN-output projections.
REMATS = ('none', 'full', 'dots', 'dots_no_batch', 'outputs')
# Keys that were booleans once, and what a boolean saved then (config.json, a user's file) means now: remat's
# true/false became 'full'/'none'; fused_qkv's false, its default, became 'auto'.
OLD_BOOLEANS = {'remat': {False: 'none', True: 'full'}, 'fused_qkv': {False: 'auto', True: 'true'}}


def current_value(name: str, value):
  """`value` of config key `name` as the key takes it now (`OLD_BOOLEANS`)."""
  return OLD_BOOLEANS[name][value] if isinstance(value, bool) and name in OLD_BOOLEANS else value


REMAT_BOOLS = {**OLD_BOOLEANS['remat'], 'false': 'none', 'true': 'full'}  # and as command-line strings


def _recomputes(remat) -> bool:
  """Whether model.remat `remat` recomputes anything of a layer in the backward pass."""
  return REMAT_BOOLS.get(remat, remat) != 'none'


# model.attention: how the attention core runs. 'einsum': einsums with a float32 softmax and attention dropout (exact
#   on every platform). 'fused': `jax.nn.dot_product_attention`, cuDNN's fused flash attention on a GPU ('cudnn'),
#   XLA's implementation elsewhere ('xla'); it takes no dropout, so it needs model.attention_dropout_rate=0.
#   'auto': on a GPU in bf16 'fused', with the attention dropout set to 0 (`for_platform`): ELECTRA-Small's step
#   23.5 -> 16.1 ms and Base's 84.8 -> 48.7 ms on an H200 (BENCHMARKS.md); 'einsum' keeps the paper's attention
#   dropout there. 'einsum' elsewhere.
ATTENTIONS = ('auto', 'einsum', 'fused', 'cudnn', 'xla')


def attention_implementation(attention: str, platform: str, dtype: str) -> str:
  """model.attention resolved for `platform`: 'einsum', 'cudnn' or 'xla' (`ATTENTIONS`)."""
  if attention == 'auto':
    attention = 'fused' if platform == 'gpu' and dtype != 'float32' else 'einsum'
  if attention == 'fused':
    return 'cudnn' if platform == 'gpu' else 'xla'
  return attention


# model.dropout_draw: how a dropout mask is drawn. 'uniform': one random float per element (jax.random.bernoulli,
#   as flax's nn.Dropout); 'bits16': 16 random bits per element, one 32-bit draw for two, half the threefry work;
#   both key each row of the batch alike, so gradient accumulation, resume and any mesh draw the same masks.
#   'rbg': the micro-batch's mask in one draw of XLA's RngBitGenerator (Philox on a GPU), keyed by its first row:
#   the same on any mesh and on resume, other masks when the batch is split into micro-batches (model.Dropout).
#   'rbg_tower': 'rbg', but an encoder's layer-output masks (2 a layer) in one draw (model.Encoder.tower_keep), not
#   one each: a few kernels instead of ~150 in ELECTRA-Small's step on a GPU, the masks held all at once; with
#   scan_layers each layer draws its own.
#   'auto': 'bits16' on a CPU, where threefry dropout was ~16% of the ELECTRA-Small step and bits16 makes the step
#   ~8% faster; on a GPU, where threefry's draws are kernels of their own (RngBitGenerator: 4 ms off Base's step
#   with cuDNN attention on an H200, BENCHMARKS.md), 'rbg_tower' when the layers recompute nothing (model.remat
#   'none': their masks are kept for the backward pass either way), 'rbg' when they do (a recomputed layer draws
#   its masks again rather than holding them); 'uniform' on a TPU: its compiler estimates Large's v3-64 step 17%
#   slower with 'bits16'.
DROPOUT_DRAWS = ('auto', 'uniform', 'bits16', 'rbg', 'rbg_tower')


def dropout_draw(draw: str, platform: str, remat: str = 'none') -> str:
  """model.dropout_draw resolved for `platform` ('cpu', 'gpu', 'tpu') and model.remat: 'uniform', 'bits16', 'rbg'
  or 'rbg_tower'."""
  if draw != 'auto':
    return draw
  if platform == 'gpu':
    return 'rbg' if _recomputes(remat) else 'rbg_tower'
  return {'cpu': 'bits16'}.get(platform, 'uniform')


# model.fused_qkv: 'true': the attention's query, key and value projections as one matmul over their three kernels
#   stacked (model.fused_projections) rather than three. The same parameters (names, shapes, initial values:
#   checkpoints and conversions are unchanged) and the same results up to float rounding. 'auto': 'true' on a GPU
#   when the layers recompute nothing (model.remat 'none'): one GEMM for three small ones, compiled for an H100
#   without a GPU ELECTRA-Small's step 1,628 -> 1,336 kernels with the 'rbg_tower' masks, the same bytes, its XLA
#   compile 35 -> 23 s (not yet timed on a GPU: the GPU check's lever 'fused_qkv off, dropout_draw=rbg'); 'false'
#   where they do (Large's GPU presets): there `large.py:gpu` on 8 H100s compiled 5.7 GiB more a GPU with one
#   matmul (30.07 against 24.34 GiB; Base's paper config 8.43 against 7.99; the same per-GPU batch on one H100 the
#   same either way), a cost of XLA's schedule around the gradients' all-reduce that is not understood and whose
#   time no GPU has measured; 'false' on CPUs (on 2 cores no faster) and TPUs. A saved boolean is the key's value
#   before 'auto' (`OLD_BOOLEANS`); ModelConfig(fused_qkv=True or False) means 'true' or 'false'.
FUSED_QKV = ('auto', 'true', 'false')


def fused_qkv(value, platform: str, remat: str = 'none') -> str:
  """model.fused_qkv resolved for `platform` and model.remat: 'true' or 'false'."""
  value = str(value).lower()
  if value == 'auto':
    return 'true' if platform == 'gpu' and not _recomputes(remat) else 'false'
  return value


# objective.sampling: how the generator's replacements are drawn from its softmax. 'inverse_cdf': one uniform number
#   per position and a cumulative sum over the vocabulary (objective.sample_replacements); 'gumbel': Gumbel noise on
#   every logit and an argmax, as the official code does (a random number per vocabulary entry: 16% of the
#   ELECTRA-Small step on a CPU). Same distribution, different draws. The GPU check (bench/gpu_check.py) measures
#   both on a GPU.
SAMPLINGS = ('inverse_cdf', 'gumbel')


def for_platform(model, platform: str) -> dict:
  """The model keys that depend on the platform ('cpu', 'gpu', 'tpu'), resolved as a run there resolves them:
  {'dtype', 'attention', 'attention_dropout_rate', 'dropout_draw', 'fused_qkv'}. `model`: the model section of a
  config file, or a ModelConfig's fields."""
  dtype = compute_dtype(model['dtype'], platform)
  attention = attention_implementation(model['attention'], platform, dtype)
  fused_by_auto = model['attention'] == 'auto' and attention != 'einsum'
  return {'dtype': dtype, 'attention': attention,
          'attention_dropout_rate': 0.0 if fused_by_auto else model['attention_dropout_rate'],
          'dropout_draw': dropout_draw(model['dropout_draw'], platform, model['remat']),
          'fused_qkv': fused_qkv(model['fused_qkv'], platform, model['remat'])}


def platform_line(model: 'ModelConfig') -> str:
  """The line a run starts with: what its platform made of the model's 'auto' keys."""
  line = f'model: {model.dtype}, attention={model.attention}, dropout masks {model.dropout_draw}'
  if model.fused_qkv:
    line += ', query/key/value in one matmul'
  if model.attention != 'einsum' and model.dropout_rate > 0:
    line += ", no attention dropout (fused attention takes none; model.attention=einsum keeps the paper's)"
  return line


def for_this_platform(model) -> dict[str, str]:
  """`for_platform` for the platform this process runs on. jax's backend is asked (which starts it: before
  jax.distributed.initialize is too soon) only when the platforms resolve `model` differently."""
  resolved = [for_platform(model, platform) for platform in ('cpu', 'gpu', 'tpu')]
  if all(r == resolved[0] for r in resolved):
    return resolved[0]
  import jax  # noqa: PLC0415  (only here: the rest of this module is plain Python)
  return for_platform(model, jax.default_backend())


# model.tying: what the generator shares with the discriminator (paper section 3.2, "Weight sharing").
#   'embeddings': the token, position and type embeddings (and their LayerNorm), the default;
#   'none': nothing (the generator has its own embeddings, and its MLM head reads its own word table);
#   'all': embeddings and encoder (a same-size generator; only the heads differ);
#   'gdes': DeBERTa-v3's gradient-disentangled sharing: the discriminator reads stop_gradient(the shared
#     embeddings) + a zero-initialised delta of its own (`electra_jax.model.Electra.discriminator_embedded`).
TYINGS = ('embeddings', 'none', 'all', 'gdes')


def check_ranges(prefix: str, values, *, positive=(), not_negative=(), probability=()):
  """Raises ConfigError for the first of `values`' fields out of its range: > 0, >= 0, or in [0, 1); `prefix`
  ('model.', 'config key ') comes before the field's name in the message."""
  for names, holds, wanted in ((positive, lambda v: v > 0, 'positive'),
                               (not_negative, lambda v: v >= 0, 'at least 0'),
                               (probability, lambda v: 0 <= v < 1, 'in [0, 1)')):
    for name in names:
      if not holds(getattr(values, name)):
        raise ConfigError(f'{prefix}{name} must be {wanted}, got {getattr(values, name)}')


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Sizes of the shared embeddings and of the two Transformer towers."""
  vocab_size: int = 0
  embedding_size: int = 128
  hidden_size: int = 256
  num_layers: int = 12
  num_heads: int = 4
  intermediate_size: int = 1024
  generator_hidden_fraction: float = 0.25
  generator_layers_fraction: float = 1.0
  max_position_embeddings: int = 512
  type_vocab_size: int = 2
  dropout_rate: float = 0.1
  attention_dropout_rate: float = 0.1
  initializer_range: float = 0.02
  layer_norm_eps: float = 1e-12
  dtype: str = 'auto'  # resolved on construction (`compute_dtype`)
  remat: str = 'none'
  scan_layers: bool = False
  attention: str = 'auto'
  dropout_draw: str = 'auto'  # resolved on construction (`dropout_draw`)
  fused_qkv: str | bool = 'auto'  # resolved on construction to a bool (`fused_qkv`)
  tying: str = 'embeddings'

  def __post_init__(self):
    if self.dtype not in DTYPES:
      raise ConfigError(f'model.dtype must be one of {", ".join(map(repr, DTYPES))}, got {self.dtype!r}')
    object.__setattr__(self, 'remat', REMAT_BOOLS.get(self.remat, self.remat))
    if self.remat not in REMATS:
      raise ConfigError(f'model.remat must be one of {", ".join(map(repr, REMATS))} (true is \'full\', false '
                        f'\'none\'), got {self.remat!r}')
    if self.attention not in ATTENTIONS:
      raise ConfigError(f'model.attention must be one of {", ".join(map(repr, ATTENTIONS))}, got {self.attention!r}')
    if self.dropout_draw not in DROPOUT_DRAWS:
      raise ConfigError(f'model.dropout_draw must be one of {", ".join(map(repr, DROPOUT_DRAWS))}, got '
                        f'{self.dropout_draw!r}')
    if str(self.fused_qkv).lower() not in FUSED_QKV:
      raise ConfigError(f'model.fused_qkv must be one of {", ".join(map(repr, FUSED_QKV))}, got {self.fused_qkv!r}')
    for key, value in for_this_platform(vars(self)).items():
      object.__setattr__(self, key, value)
    object.__setattr__(self, 'fused_qkv', self.fused_qkv == 'true')
    check_ranges('model.', self, positive=('embedding_size', 'hidden_size', 'num_layers', 'num_heads',
                                           'intermediate_size', 'max_position_embeddings', 'type_vocab_size',
                                           'generator_hidden_fraction', 'generator_layers_fraction',
                                           'initializer_range', 'layer_norm_eps'),
                  not_negative=('vocab_size',), probability=('dropout_rate', 'attention_dropout_rate'))
    if self.attention in ('cudnn', 'xla') and self.attention_dropout_rate > 0:
      raise ConfigError(f'model.attention={self.attention!r} (jax.nn.dot_product_attention) has no attention dropout: '
                        f'set model.attention_dropout_rate=0, or model.attention=einsum to keep '
                        f'{self.attention_dropout_rate}')
    if self.hidden_size % self.num_heads:
      raise ConfigError(f'model.hidden_size {self.hidden_size} is not divisible by model.num_heads {self.num_heads}')
    generator = self.tower(True)
    if generator.hidden_size < 1 or generator.hidden_size % generator.num_heads:
      raise ConfigError(f'model.generator_hidden_fraction={self.generator_hidden_fraction} gives a generator of '
                        f'{generator.hidden_size} hidden units, which its {generator.num_heads} heads (hidden // 64, '
                        'the official rule) do not divide: choose another fraction')
    if self.tying not in TYINGS:
      raise ConfigError(f'model.tying must be one of {", ".join(map(repr, TYINGS))}, got {self.tying!r}')
    if self.tying == 'all' and not self.same_size_generator():
      raise ConfigError('model.tying=all makes the generator use the discriminator\'s encoder, so it needs a '
                        'generator of the same size: model.generator_hidden_fraction=1 and '
                        f'model.generator_layers_fraction=1 (got {self.generator_hidden_fraction} and '
                        f'{self.generator_layers_fraction})')

  def same_size_generator(self) -> bool:
    return self.generator_hidden_fraction == 1.0 and self.generator_layers_fraction == 1.0

  def tower(self, generator: bool) -> 'TowerConfig':
    """The encoder sizes of the discriminator, or of the generator (official `get_generator_config`).

    With tying='all' the generator runs the discriminator's encoder, so both are the discriminator's.
    """
    if not generator or self.tying == 'all':
      return TowerConfig(self.hidden_size, self.num_layers, self.num_heads, self.intermediate_size)
    hidden = int(round(self.hidden_size * self.generator_hidden_fraction))
    return TowerConfig(hidden_size=hidden,
                       num_layers=max(1, int(round(self.num_layers * self.generator_layers_fraction))),
                       num_heads=max(1, hidden // 64),
                       intermediate_size=4 * hidden)

  def generator_model(self) -> 'ModelConfig':
    """The sizes the generator sees. With tying='none' its own embedding tables are as wide as its hidden layers
    (official `untied_generator_embeddings`: no embeddings_project, and its MLM head maps to that width)."""
    if self.tying != 'none':
      return self
    return dataclasses.replace(self, embedding_size=self.tower(True).hidden_size)


@dataclasses.dataclass(frozen=True)
class TowerConfig:
  hidden_size: int
  num_layers: int
  num_heads: int
  intermediate_size: int


# objective.duplicate_samples: what a position drawn more than once is corrupted with (masking.merge_duplicates).
#   'mean': the floor of the mean of its draws' sampled ids, as the official scatter_update writes it (a token
#   unrelated to the samples, easy to detect: 6-7% of the replaced tokens at 15% masking); 'first': its first
#   draw's sample.
DUPLICATE_SAMPLES = ('first', 'mean')


@dataclasses.dataclass(frozen=True)
class ObjectiveConfig:
  """Masking, sampling and loss weights of replaced-token detection."""
  name: str = 'electra'
  mask_prob: float = 0.15
  max_predictions: int = 0
  mask_token_prob: float = 0.85
  random_token_prob: float = 0.0
  mask_with_replacement: bool = True
  duplicate_samples: str = 'mean'  # DUPLICATE_SAMPLES
  temperature: float = 1.0
  initial_temperature: float = 0.0  # 0: no schedule (`temperature` throughout)
  temperature_decay_fraction: float = 0.0
  gen_weight: float = 1.0
  disc_weight: float = 50.0
  disc_weight_warmup_fraction: float = 0.0
  disallow_correct: bool = False
  uniform_generator: bool = False
  sampling: str = 'inverse_cdf'
  two_stage_generator_steps: int = 0
  generator_checkpoint: str = ''  # electra_frozen: the pre-training WORKDIR whose MLM samples (electra_jax.frozen)
  generator_step: int = 0  # its checkpoint; 0: the latest

  def __post_init__(self):
    if self.sampling not in SAMPLINGS:
      raise ConfigError(f'objective.sampling must be one of {", ".join(map(repr, SAMPLINGS))}, got {self.sampling!r}')
    if not 0 < self.mask_prob < 1:
      raise ConfigError(f'objective.mask_prob must be in (0, 1), got {self.mask_prob}')
    if self.mask_token_prob + self.random_token_prob > 1:
      raise ConfigError('objective.mask_token_prob + objective.random_token_prob must be at most 1')
    if self.duplicate_samples not in DUPLICATE_SAMPLES:
      raise ConfigError(f'objective.duplicate_samples must be one of {", ".join(DUPLICATE_SAMPLES)}, got '
                        f'{self.duplicate_samples!r}')
    if self.temperature <= 0 or self.initial_temperature < 0:
      raise ConfigError(f'objective.temperature must be positive and objective.initial_temperature positive or 0 '
                        f'(no schedule), got {self.temperature} and {self.initial_temperature}')
    if self.initial_temperature and not 0 < self.temperature_decay_fraction <= 1:
      raise ConfigError(f'objective.initial_temperature needs objective.temperature_decay_fraction in (0, 1], the '
                        f'fraction of train_steps over which it falls to objective.temperature; got '
                        f'{self.temperature_decay_fraction}')
    if not 0 <= self.disc_weight_warmup_fraction <= 1:
      raise ConfigError(f'objective.disc_weight_warmup_fraction must be in [0, 1] (0: no warm-up), got '
                        f'{self.disc_weight_warmup_fraction}')
    if self.two_stage_generator_steps < 0:
      raise ConfigError(f'objective.two_stage_generator_steps must be >= 0, got {self.two_stage_generator_steps}')
    if self.two_stage_generator_steps and self.name != 'electra':
      raise ConfigError(f'objective.two_stage_generator_steps is a schedule of the electra objective, not of '
                        f'{self.name!r}')
    if (self.name == 'electra_frozen') != bool(self.generator_checkpoint) or self.generator_step < 0:
      raise ConfigError(f'objective.name=electra_frozen samples from objective.generator_checkpoint (a pre-training '
                        f'WORKDIR: an mlm run or a run with a generator) and only it reads one; got name={self.name!r} '
                        f'and generator_checkpoint={self.generator_checkpoint!r}, generator_step={self.generator_step}')
    if self.uniform_generator and (self.name == 'electra_adversarial' or self.two_stage_generator_steps):
      raise ConfigError('objective.uniform_generator replaces the generator, so there is no generator to train '
                        'adversarially or in two stages')
    if self.uniform_generator and self.name == 'electra_frozen':
      raise ConfigError('objective.uniform_generator replaces the generator, so electra_frozen would load '
                        'objective.generator_checkpoint\'s and never run it: choose one of the two')

  def num_predictions(self, seq_length: int) -> int:
    """Selected positions per sequence: int((mask_prob + 0.005) * L), as in the official code."""
    return self.max_predictions or int((self.mask_prob + 0.005) * seq_length)


@dataclasses.dataclass(frozen=True)
class AdamConfig:
  """AdamW with global-norm clipping, shared by pre-training and fine-tuning (see optimizer.adamw)."""
  weight_decay: float = 0.01
  b1: float = 0.9
  b2: float = 0.999
  eps: float = 1e-6
  clip_norm: float = 1.0
  bias_correction: bool = False

  def __post_init__(self):
    check_ranges('optimizer.', self, positive=('eps', 'clip_norm'), not_negative=('weight_decay',),
                  probability=('b1', 'b2'))


@dataclasses.dataclass(frozen=True)
class OptimizerConfig(AdamConfig):
  """Pre-training: AdamW with warm-up overlapping a linear decay to 0 at train_steps."""
  learning_rate: float = 5e-4
  warmup_steps: int = 10000
  flat_params: str = 'auto'  # FLAT_PARAMS

  def __post_init__(self):
    super().__post_init__()
    check_ranges('optimizer.', self, positive=('learning_rate',), not_negative=('warmup_steps',))
    if self.flat_params not in FLAT_PARAMS:
      raise ConfigError(f'optimizer.flat_params must be one of {", ".join(FLAT_PARAMS)}, got {self.flat_params!r}')


# optimizer.flat_params: how the pre-training step stores the parameters and the optimiser's moments in its state.
#   'true': as a few float32 vectors (optimizer.FlatParams: the weights in one, the biases and LayerNorm parameters in
#   vectors of at most 65,536 numbers), updated by one kernel each on a GPU instead of one per parameter (384 of
#   ELECTRA-Small's 2,174 kernels a step for an H100: bench/gpu_kernels.py); the same values, and
#   checkpoints are saved and read as the tree either way. Needs replicated parameters (no fsdp or tensor axis) and
#   an objective that trains every parameter alike (not electra_frozen nor two-stage training). 'false': one array
#   per parameter. 'auto': 'true' on GPUs where it can be, else 'false'.
FLAT_PARAMS = ('auto', 'true', 'false')


# data.tokenizer_type: the tokenizers `electra_jax.data.tokenizer` trains.
TOKENIZER_TYPES = ('unigram', 'bpe', 'wordpiece')
LONG_LINES = ('split', 'truncate')  # data.long_lines: see electra_jax.data.packing
MIN_SEQ_LENGTH = 8  # the shortest examples electra_jax.data.packing builds


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """`config.data`: see configs/default.py for what each key means."""
  source: str = ''
  tokenizer: str = ''
  tokenizer_type: str = 'unigram'
  vocab_size: int = 8000
  lowercase: bool = True
  max_seq_length: int = 128
  long_lines: str = 'split'  # LONG_LINES
  text_field: str = 'text'
  tfds_split: str = 'train'
  tfds_data_dir: str = ''
  cache_dir: str = ''
  eval_fraction: float = 0.0
  eval_source: str = ''

  def __post_init__(self):
    if self.tokenizer_type not in TOKENIZER_TYPES:
      raise DataError(f'data.tokenizer_type must be one of {", ".join(TOKENIZER_TYPES)}, '
                      f'got {self.tokenizer_type!r}')
    if self.long_lines not in LONG_LINES:
      raise DataError(f'data.long_lines must be one of {", ".join(LONG_LINES)}, got {self.long_lines!r}')
    if self.vocab_size <= 0:
      raise DataError(f'data.vocab_size must be positive (the size of a tokenizer trained here), got {self.vocab_size}')
    if self.max_seq_length < MIN_SEQ_LENGTH:
      raise DataError(f'data.max_seq_length must be at least {MIN_SEQ_LENGTH} ([CLS] A [SEP] B [SEP] with room for '
                      f'text), got {self.max_seq_length}')
    if not 0 <= self.eval_fraction < 1:
      raise DataError(f'data.eval_fraction must be in [0, 1) (0: hold nothing out), got {self.eval_fraction}')
    if self.eval_fraction and self.eval_source:
      raise DataError('data.eval_fraction and data.eval_source both name held-out text; set one of them')


# The device mesh's axes, in the order of mesh.shape (see electra_jax.sharding for what each is for).
AXES = ('data', 'fsdp', 'tensor')


def _is_rule(rule) -> bool:
  """Whether `rule` is a (logical axis name, mesh axes) pair, its mesh axes None, one of AXES or a sequence of them
  (a list when read back from config.json)."""
  if not (isinstance(rule, (tuple, list)) and len(rule) == 2 and isinstance(rule[0], str)):
    return False
  axes = rule[1]
  return axes is None or axes in AXES or (isinstance(axes, (tuple, list)) and all(a in AXES for a in axes))


@dataclasses.dataclass(frozen=True)
class MeshConfig:
  """Devices along each of AXES, and the rules mapping logical axis names to them."""
  shape: tuple = (-1, 1, 1)
  # Logical axis -> mesh axes, a priority list (see electra_jax.sharding). Activations and the batch carry the
  # activation_* names, parameters the others, so that the order of the rules cannot move an activation.
  rules: tuple = (
      ('activation_batch', ('data', 'fsdp')),
      ('activation_length', None),
      ('activation_embed', None),
      ('activation_heads', 'tensor'),
      ('activation_mlp', 'tensor'),
      ('activation_vocab', 'tensor'),
      ('vocab', 'tensor'),
      ('heads', 'tensor'),
      ('mlp', 'tensor'),
      ('embed', 'fsdp'),
      ('token_embed', None),
  )

  def __post_init__(self):
    try:
      object.__setattr__(self, 'shape', tuple(int(s) for s in self.shape))
    except (TypeError, ValueError):
      raise ConfigError(f'mesh.shape takes {len(AXES)} integers for {AXES}, e.g. -1,1,1; got {self.shape}') from None
    if (len(self.shape) != len(AXES) or any(s == 0 or s < -1 for s in self.shape)
        or self.shape.count(-1) > 1):
      raise ConfigError(f'mesh.shape takes {len(AXES)} integers for {AXES}, each a device count of at least 1 or, '
                        f'on one axis, -1 (the devices left), e.g. -1,1,1; got {self.shape}')
    if not isinstance(self.rules, (tuple, list)) or not all(_is_rule(rule) for rule in self.rules):
      raise ConfigError(f"mesh.rules takes (logical axis, mesh axes) pairs, the mesh axes None, one of {AXES} or a "
                        f"tuple of them, e.g. --config.mesh.rules=\"('embed','fsdp'),('mlp','tensor')\"; "
                        f'got {self.rules!r}')
    object.__setattr__(self, 'rules', tuple((name, tuple(axes) if isinstance(axes, list) else axes)
                                            for name, axes in self.rules))
    if any(name in ('batch', 'length') for name, _ in self.rules):
      raise ConfigError("mesh.rules name 'batch' or 'length', which electra_jax no longer uses: the batch and "
                        "activations are 'activation_batch', 'activation_length', ... (see configs/default.py)")
    if len(self.shape) != len(AXES) or list(self.shape).count(-1) > 1:
      raise ConfigError(f'mesh.shape must have {len(AXES)} entries for {AXES} with at most one -1, '
                        f'got {self.shape}')


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """Top-level run settings plus the typed sub-configs."""
  seed: int = 0
  train_steps: int = 1000
  batch_size: int = 128
  grad_accum_steps: int = 1
  log_every: int = 50
  checkpoint_every: int = 1000
  keep_checkpoints: int = 3
  save_steps: tuple[int, ...] = ()
  init_checkpoint: str = ''
  init_optimizer: bool = False
  eval_every: int = 0
  eval_batches: int = 16
  profile_steps: str = ''
  steps_per_call: int = 1
  # Built when a TrainConfig is, not at import: model.dtype='auto' asks jax for the platform.
  model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
  objective: ObjectiveConfig = dataclasses.field(default_factory=ObjectiveConfig)
  optimizer: OptimizerConfig = dataclasses.field(default_factory=OptimizerConfig)
  data: DataConfig = dataclasses.field(default_factory=DataConfig)
  mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)

  def __post_init__(self):
    for name in ('train_steps', 'batch_size', 'grad_accum_steps', 'log_every', 'checkpoint_every',
                 'keep_checkpoints', 'steps_per_call'):
      if getattr(self, name) <= 0:
        raise ConfigError(f'config key {name} must be positive, got {getattr(self, name)}')
    if not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in self.save_steps):
      raise ConfigError(f'config key save_steps must hold positive step numbers, got {self.save_steps}')
    object.__setattr__(self, 'save_steps', tuple(self.save_steps))  # a list when read back from config.json
    self._check_evaluation()
    self.profile_range()  # refuses a malformed profile_steps before anything runs
    if self.data.max_seq_length > self.model.max_position_embeddings:
      raise ConfigError(f'data.max_seq_length={self.data.max_seq_length} exceeds model.max_position_embeddings='
                        f'{self.model.max_position_embeddings}: lower the first or raise the second')
    if self.batch_size % self.grad_accum_steps:
      raise ConfigError(f'batch_size {self.batch_size} is not divisible by grad_accum_steps {self.grad_accum_steps}')
    if self.init_checkpoint and self.objective.name == 'electra_frozen':
      raise ConfigError('objective.name=electra_frozen trains a new discriminator beside the generator of '
                        f'objective.generator_checkpoint; leave init_checkpoint empty (got {self.init_checkpoint!r})')
    if self.objective.two_stage_generator_steps:
      m = self.model
      if m.tying == 'all':
        raise ConfigError('objective.two_stage_generator_steps needs a generator with its own encoder to freeze; '
                          'model.tying=all shares it with the discriminator (use embeddings or none)')
      if m.tower(True) != m.tower(False):
        raise ConfigError(
            'objective.two_stage_generator_steps initialises the discriminator from the generator, so they must '
            f'be the same size; the generator is {m.tower(True)} and the discriminator {m.tower(False)}. Set '
            'model.generator_hidden_fraction=1 and model.generator_layers_fraction=1 (the generator has '
            'hidden // 64 heads and a 4 * hidden FFN: model.num_heads and model.intermediate_size must match)')

  def _check_evaluation(self):
    if self.eval_every < 0 or self.eval_batches <= 0:
      raise ConfigError(f'config keys eval_every (0: no evaluation) and eval_batches must be >= 0 and positive, '
                        f'got {self.eval_every} and {self.eval_batches}')
    if self.eval_every and not (self.data.eval_fraction or self.data.eval_source):
      raise ConfigError(f'eval_every={self.eval_every} evaluates on held-out text, and there is none: set '
                        'data.eval_fraction (e.g. 0.01: documents held out of data.source) or data.eval_source, '
                        'or eval_every=0')

  def check_steps_per_call(self):
    """Raises ConfigError unless the training loop can act after each step it has to: it acts between calls, so
    with k steps a call every step it logs, evaluates, checkpoints or starts and stops a trace after must be a
    multiple of k (train_steps need not be: a run's last steps run one a call). The trainer checks; a benchmark of
    the step alone need not."""
    k = self.steps_per_call
    if k == 1:
      return
    periodic = {'log_every': self.log_every, 'checkpoint_every': self.checkpoint_every, 'eval_every': self.eval_every}
    uneven = [f'{name}={every}' for name, every in periodic.items() if every % k]
    uneven += [f'save_steps {s}' for s in self.save_steps if s % k]
    profile = self.profile_range()
    if profile and ((profile[0] - 1) % k or profile[1] % k):
      uneven.append(f"profile_steps='{self.profile_steps}' (START - 1 and COUNT)")
    if uneven:
      raise ConfigError(f'steps_per_call={k} runs {k} steps in each call, and the loop acts only between calls: '
                        f'make these multiples of {k}: {", ".join(uneven)}; or set steps_per_call=1')

  def profile_range(self) -> tuple[int, int] | None:
    """profile_steps 'START,COUNT' as (START, COUNT): trace steps START to START + COUNT - 1; None when ''."""
    if not self.profile_steps:
      return None
    try:
      start, count = (int(part) for part in self.profile_steps.split(','))
    except ValueError:
      start = count = 0
    if start <= 0 or count <= 0:
      raise ConfigError(f"profile_steps must be 'START,COUNT' with positive numbers (e.g. '10,5': steps 10 to 14), "
                        f"or '' for none; got {self.profile_steps!r}")
    return start, count


def load(config, vocab_size: int | None = None) -> TrainConfig:
  """Turns a ConfigDict (or nested dict) into a validated TrainConfig.

  `vocab_size` (from the tokenizer) fills `model.vocab_size` when the config leaves it at 0. objective.name is
  checked where the objective is looked up (`electra_jax.objective.get`), before anything is compiled: this module
  is below the objectives and does not import them.
  """
  values = config.to_dict() if hasattr(config, 'to_dict') else dict(config)
  sub = {'model': ModelConfig, 'objective': ObjectiveConfig, 'optimizer': OptimizerConfig,
         'data': DataConfig, 'mesh': MeshConfig}
  parts = {}
  for name, cls in sub.items():
    part = dict(values.pop(name, {}))
    if name == 'model' and vocab_size and not part.get('vocab_size'):
      part['vocab_size'] = vocab_size
    parts[name] = from_dict(cls, part, where=name)
  return from_dict(TrainConfig, values, where='config', **parts)
