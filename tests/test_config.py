"""Configs: typed loading with clear errors, and the shipped configs against the paper's settings."""

import dataclasses
import glob
import importlib
import os
import re
import subprocess
import sys

import jax
import pytest

from electra_jax import config as config_lib
from electra_jax import sharding
from electra_jax.errors import UserError
from electra_jax.finetune import config as finetune_config
from configs import default
from helpers import override  # pylint: disable=g-bad-import-order

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG_DIR = os.path.join(REPO, 'configs')
FINETUNE_CONFIGS = ('finetune',)  # read by electra_jax.finetune.config, not the pre-training config
NOT_CONFIGS = FINETUNE_CONFIGS + ('gpu',)  # gpu.py: the GPU presets the scale configs apply (tests/test_gpu_presets.py)
CONFIG_NAMES = sorted(os.path.basename(f)[:-3] for f in glob.glob(os.path.join(CONFIG_DIR, '*.py'))
                      if not f.endswith('__init__.py') and os.path.basename(f)[:-3] not in NOT_CONFIGS)


def _values(**overrides):
  """The default config as a plain dict, with `section.key=value` overrides (ConfigDict would type-check)."""
  return override(default.get_config().to_dict(), overrides, sep='__')


@pytest.mark.parametrize('dotted, name', [
    ('model__hiden_size', 'model.hiden_size'),
    ('objective__mask_probability', 'objective.mask_probability'),
    ('optimizer__lr', 'optimizer.lr'),
    ('data__max_seq_len', 'data.max_seq_len'),
    ('mesh__axes', 'mesh.axes'),
    ('trian_steps', 'config.trian_steps'),
])
def test_unknown_key_is_named(dotted, name):
  with pytest.raises(config_lib.ConfigError, match=name.replace('.', r'\.')):
    config_lib.load(_values(**{dotted: 1}), vocab_size=100)


@pytest.mark.parametrize('dotted, value, name', [
    ('model__hidden_size', 'big', 'model.hidden_size'),
    ('model__num_layers', 2.5, 'model.num_layers'),
    ('model__num_layers', True, 'model.num_layers'),  # a bool is not an int here
    ('optimizer__learning_rate', '1e-3', 'optimizer.learning_rate'),
    ('objective__disallow_correct', 1, 'objective.disallow_correct'),
    ('model__dtype', 32, 'model.dtype'),
    ('batch_size', 8.0, 'config.batch_size'),
])
def test_wrong_type(dotted, value, name):
  with pytest.raises(config_lib.ConfigError, match=name.replace('.', r'\.')):
    config_lib.load(_values(**{dotted: value}), vocab_size=100)


def test_int_is_accepted_for_float():
  c = config_lib.load(_values(objective__disc_weight=50, optimizer__learning_rate=1), vocab_size=100)
  assert c.objective.disc_weight == 50.0 and isinstance(c.objective.disc_weight, float)
  assert isinstance(c.optimizer.learning_rate, float)


@pytest.mark.parametrize('overrides', [
    {'objective__mask_prob': 1.5},
    {'objective__mask_prob': 0.0},
    {'objective__mask_token_prob': 0.9, 'objective__random_token_prob': 0.2},
    {'model__dtype': 'float16'},
    {'model__hidden_size': 250, 'model__num_heads': 4},
    {'mesh__shape': (-1, -1, 1)},
    {'mesh__shape': (8, 1)},
    {'mesh__shape': ('a', 'b', '1')},  # --config.mesh.shape=a,b,1 arrives as strings
    {'batch_size': 0},
    {'model__tying': 'encoder'},
    {'model__tying': 'all'},  # with the default generator, a quarter of the discriminator's width
])
def test_invalid_values(overrides):
  with pytest.raises(config_lib.ConfigError):
    config_lib.load(_values(**overrides), vocab_size=100)


def test_vocab_size_fills_only_an_unset_model_vocab():
  assert config_lib.load(_values(), vocab_size=123).model.vocab_size == 123
  assert config_lib.load(_values(model__vocab_size=77), vocab_size=123).model.vocab_size == 77


def test_all_configs_found():
  assert {'default', 'small', 'base', 'large', 'tiny'} <= set(CONFIG_NAMES)


def test_finetune_config_loads_and_validates():
  from electra_jax.finetune import config as finetune_config  # noqa: PLC0415
  c = finetune_config.load(importlib.import_module('configs.finetune').get_config())
  assert isinstance(c, finetune_config.FinetuneConfig)
  assert c.optimizer.warmup_fraction == 0.1 and c.optimizer.weight_decay == 0.01  # the paper's fine-tuning


@pytest.mark.parametrize('name', CONFIG_NAMES)
def test_every_config_loads_and_validates(name):
  c = config_lib.load(importlib.import_module(f'configs.{name}').get_config(), vocab_size=30522)
  assert isinstance(c, config_lib.TrainConfig)
  assert c.model.vocab_size == 30522
  assert sharding.mesh_shape(c.mesh, 8) == (8, 1, 1)
  assert c.model.hidden_size % c.model.num_heads == 0
  assert c.objective.num_predictions(c.data.max_seq_length) >= 1
  assert c.data.max_seq_length <= c.model.max_position_embeddings
  for generator in (False, True):
    tower = c.model.tower(generator)
    assert tower.hidden_size % tower.num_heads == 0


@pytest.mark.parametrize('name, expected', [
    # E, H, layers, heads, FFN, generator fraction, lr, batch, L, mask prob, steps: the ELECTRA paper's Table 6
    # (Clark et al., 2020, appendix A); heads H / 64 and FFN 4 H as google-research/electra get_bert_config.
    ('small', (128, 256, 12, 4, 1024, 0.25, 5e-4, 128, 128, 0.15, 1_000_000)),
    ('base', (768, 768, 12, 12, 3072, 1 / 3, 2e-4, 256, 512, 0.15, 766_000)),
    ('large', (1024, 1024, 24, 16, 4096, 0.25, 2e-4, 2048, 512, 0.25, 400_000)),
])
def test_paper_configs(name, expected):
  c = config_lib.load(importlib.import_module(f'configs.{name}').get_config(), vocab_size=30522)
  m = c.model
  got = (m.embedding_size, m.hidden_size, m.num_layers, m.num_heads, m.intermediate_size,
         m.generator_hidden_fraction, c.optimizer.learning_rate, c.batch_size, c.data.max_seq_length,
         c.objective.mask_prob, c.train_steps)
  assert got == pytest.approx(expected)
  # Settings common to all sizes.
  assert (m.max_position_embeddings, m.type_vocab_size, m.dropout_rate, m.attention_dropout_rate) == (
      512, 2, 0.1, 0.1)
  assert (m.initializer_range, m.layer_norm_eps, m.generator_layers_fraction) == (0.02, 1e-12, 1.0)
  o = c.optimizer
  assert (o.b1, o.b2, o.eps, o.weight_decay, o.clip_norm, o.warmup_steps, o.bias_correction) == (
      0.9, 0.999, 1e-6, 0.01, 1.0, 10000, False)
  obj = c.objective
  assert (obj.gen_weight, obj.disc_weight, obj.mask_token_prob, obj.random_token_prob, obj.temperature) == (
      1.0, 50.0, 0.85, 0.0, 1.0)
  assert not obj.disallow_correct and not obj.uniform_generator
  assert c.data.vocab_size == 30522


SAME_SIZE = {'model__generator_hidden_fraction': 1.0}  # the default discriminator: 4 heads = 256 // 64, FFN 4 H


@pytest.mark.parametrize('overrides, message', [
    ({'objective__name': 'electra_adversarial', 'objective__uniform_generator': True}, 'no generator to train'),
    ({'objective__name': 'electra_frozen', 'objective__generator_checkpoint': 'RUN',
      'objective__uniform_generator': True}, 'would load objective.generator_checkpoint\'s and never run it'),
    ({'objective__two_stage_generator_steps': 100}, 'must be the same size'),  # default generator: H / 4
    ({'objective__two_stage_generator_steps': 100, 'model__num_heads': 8, **SAME_SIZE}, 'must be the same size'),
    ({'objective__two_stage_generator_steps': 100, 'model__tying': 'all', **SAME_SIZE}, 'model.tying=all'),
    ({'objective__two_stage_generator_steps': 100, 'objective__name': 'replace_mlm', **SAME_SIZE},
     'schedule of the electra objective'),
    ({'objective__two_stage_generator_steps': -1}, '>= 0'),
    ({'objective__initial_temperature': 3.0}, 'temperature_decay_fraction in'),  # a schedule needs its length
    ({'objective__initial_temperature': 3.0, 'objective__temperature_decay_fraction': 1.5},
     'temperature_decay_fraction in'),
    ({'objective__temperature': 0.0}, 'temperature must be positive'),
    ({'objective__initial_temperature': -1.0}, 'temperature must be positive'),
    ({'objective__disc_weight_warmup_fraction': -0.1}, 'disc_weight_warmup_fraction must be in'),
    ({'objective__duplicate_samples': 'last'}, 'duplicate_samples must be one of first, mean'),
    ({'steps_per_call': 0}, 'steps_per_call must be positive'),
])
def test_variant_errors(overrides, message):
  with pytest.raises(config_lib.ConfigError, match=message):
    config_lib.load(_values(**overrides), vocab_size=100)


@pytest.mark.parametrize('overrides, message', [
    # log_every 50 and checkpoint_every 1000 by default: multiples of 5, not of 3.
    ({'steps_per_call': 3}, r'multiples of 3: log_every=50, checkpoint_every=1000;'),
    ({'steps_per_call': 5, 'save_steps': (10, 12), 'profile_steps': '12,5'},
     r"multiples of 5: save_steps 12, profile_steps='12,5' \(START - 1 and COUNT\);"),
    ({'steps_per_call': 5, 'profile_steps': '10,5'}, r"multiples of 5: profile_steps='10,5'"),
    ({'steps_per_call': 5, 'eval_every': 12, 'data__eval_fraction': 0.1}, r'multiples of 5: eval_every=12;'),
])
def test_the_loop_acts_between_calls_of_several_steps(overrides, message):
  c = config_lib.load(_values(**overrides), vocab_size=100)  # a benchmark of the step alone takes it
  with pytest.raises(config_lib.ConfigError, match=message):
    c.check_steps_per_call()
  config_lib.load(_values(**{**overrides, 'steps_per_call': 1}), vocab_size=100).check_steps_per_call()


@pytest.mark.parametrize('overrides, message', [
    # Each of these trained before: a NaN at step 1 blamed on the learning rate, a traceback, or silently wrong.
    ({'data__max_seq_length': 256, 'model__max_position_embeddings': 128},
     'data.max_seq_length=256 exceeds model.max_position_embeddings=128'),  # NaN: positions past the table
    ({'data__max_seq_length': 4}, r'data.max_seq_length must be at least 8'),  # a traceback from packing
    ({'data__vocab_size': 0}, 'data.vocab_size must be positive'),  # SentencePiece's own check, with no advice
    ({'model__hidden_size': 0}, 'model.hidden_size must be positive, got 0'),  # ZeroDivisionError
    ({'model__dropout_rate': 1.5}, r'model.dropout_rate must be in \[0, 1\), got 1.5'),  # NaN
    ({'model__hidden_size': 800, 'model__num_heads': 8}, 'a generator of 200 hidden units, which its 3 heads'),
    ({'optimizer__learning_rate': -1.0}, 'optimizer.learning_rate must be positive'),  # gradient ascent
    ({'optimizer__warmup_steps': -5}, 'optimizer.warmup_steps must be at least 0'),  # a negative learning rate
    ({'optimizer__clip_norm': 0.0}, 'optimizer.clip_norm must be positive'),  # every update zero
    ({'optimizer__b2': 1.0}, r'optimizer.b2 must be in \[0, 1\)'),
])
def test_values_out_of_range_are_one_line(overrides, message):
  with pytest.raises(UserError, match=message):
    config_lib.load(_values(**overrides), vocab_size=100)


@pytest.mark.parametrize('key, value, message', [
    ('optimizer.learning_rate', -1e-4, "or 0 for the paper's value"),
    ('head_dropout', 2.0, r'config key head_dropout must be in \[0, 1\), got 2.0'),  # trained to garbage before
])
def test_fine_tuning_refuses_values_out_of_range(key, value, message):
  values = importlib.import_module('configs.finetune').get_config()
  with pytest.raises(config_lib.ConfigError, match=message):
    finetune_config.load(override(values, {key: value}))


@pytest.mark.parametrize('overrides', [
    {'objective__name': 'electra_adversarial', 'model__tying': 'none'},
    {'objective__name': 'electra_adversarial', 'grad_accum_steps': 2},  # every objective accumulates
    {'objective__two_stage_generator_steps': 100, 'grad_accum_steps': 2, **SAME_SIZE},
    {'objective__two_stage_generator_steps': 100, 'model__tying': 'none', **SAME_SIZE},
    {'objective__two_stage_generator_steps': 100, **SAME_SIZE},
    {'model__tying': 'all', **SAME_SIZE},
    {'objective__duplicate_samples': 'mean'},
    {'objective__initial_temperature': 3.0, 'objective__temperature_decay_fraction': 0.5,
     'objective__disc_weight_warmup_fraction': 0.25},
])
def test_variants_load(overrides):
  """Combinations that are allowed load, each setting as given (none dropped or rewritten by a check)."""
  c = config_lib.load(_values(**overrides), vocab_size=100)
  for dotted, value in overrides.items():
    section, _, key = dotted.rpartition('__')
    assert getattr(getattr(c, section) if section else c, key) == value, dotted


def test_auto_dtype_is_bfloat16_on_accelerators_and_float32_on_cpu():
  """model.dtype='auto' (the default): one config runs bf16 on a TPU pod and float32 on a laptop."""
  assert [config_lib.compute_dtype('auto', p) for p in ('tpu', 'gpu', 'cpu')] == ['bfloat16', 'bfloat16', 'float32']
  assert config_lib.compute_dtype('float32', 'tpu') == 'float32'
  assert config_lib.compute_dtype('bfloat16', 'cpu') == 'bfloat16'
  # The tests run on the CPU backend: 'auto' resolves to float32 when the config is loaded.
  assert default.get_config().model.dtype == 'auto'
  assert config_lib.load(default.get_config(), vocab_size=100).model.dtype == 'float32'


def test_auto_dropout_draw_is_bits16_on_cpu_and_rbg_on_gpu():
  """model.dropout_draw='auto': 16-bit masks where they are faster (CPU); on GPUs one RngBitGenerator draw for an
  encoder's masks, or one a mask where layers are recomputed (remat); uniform floats on TPUs."""
  assert [config_lib.dropout_draw('auto', p) for p in ('tpu', 'gpu', 'cpu')] == ['uniform', 'rbg_tower', 'bits16']
  assert [config_lib.dropout_draw('auto', 'gpu', r) for r in ('full', 'dots', True, False)] == [
      'rbg', 'rbg', 'rbg', 'rbg_tower']
  assert config_lib.dropout_draw('auto', 'tpu', 'full') == 'uniform'
  assert config_lib.dropout_draw('uniform', 'cpu') == 'uniform'
  assert config_lib.load(default.get_config(), vocab_size=100).model.dropout_draw == 'bits16'
  with pytest.raises(config_lib.ConfigError, match='model.dropout_draw must be one of'):
    config_lib.load(_values(model__dropout_draw='bits8'), vocab_size=100)


@pytest.mark.parametrize('given, platform, remat, fused', [
    ('auto', 'gpu', 'none', True), ('auto', 'cpu', 'none', False), ('auto', 'tpu', 'none', False),
    ('auto', 'gpu', 'full', False), ('auto', 'gpu', 'dots', False), ('auto', 'gpu', False, True),
    ('false', 'gpu', 'none', False), ('true', 'cpu', 'none', True), ('True', 'gpu', 'full', True),
    (True, 'cpu', 'none', True), (False, 'gpu', 'none', False),  # given in Python: true or false
])
def test_fused_qkv_auto_is_true_on_gpus_without_remat(given, platform, remat, fused):
  """model.fused_qkv: 'auto' (the default) is one matmul for the query, key and value projections on a GPU whose
  layers recompute nothing, three elsewhere; the resolved ModelConfig holds a bool."""
  assert default.get_config().model.fused_qkv == 'auto'
  assert config_lib.fused_qkv(given, platform, remat) == str(fused).lower()
  if platform == 'cpu':  # what the tests' backend makes of it on construction
    assert config_lib.ModelConfig(fused_qkv=given, remat=remat).fused_qkv is fused
    assert config_lib.load(_values(model__fused_qkv=given, model__remat=remat), vocab_size=100).model.fused_qkv is fused


def test_a_saved_boolean_is_what_the_key_meant_then():
  """config.json files and user configs from before a key stopped being a boolean: remat's true/false are 'full' and
  'none', fused_qkv's false (its default then) is 'auto'; other keys and current values pass as they are."""
  assert [config_lib.current_value('remat', v) for v in (True, False, 'dots')] == ['full', 'none', 'dots']
  assert [config_lib.current_value('fused_qkv', v) for v in (False, True, 'false')] == ['auto', 'true', 'false']
  assert config_lib.current_value('scan_layers', False) is False
  assert config_lib.load(_values(model__remat=True), vocab_size=100).model.remat == 'full'


def test_fused_qkv_refuses_other_values():
  with pytest.raises(config_lib.ConfigError, match="model.fused_qkv must be one of 'auto', 'true', 'false', got 'yes'"):
    config_lib.ModelConfig(fused_qkv='yes')


def test_every_auto_key_resolved_for_a_platform_at_once(monkeypatch):
  """config.for_platform gives what a run on each platform makes of the default model section: on a GPU bf16,
  cuDNN's fused attention without attention dropout, an encoder's masks in one RngBitGenerator draw and the
  query, key and value projections as one matmul; on a TPU bf16, the einsum attention with its dropout and uniform
  masks; on a CPU float32, einsum and 16-bit masks. Asked for, the einsum attention keeps its dropout on a GPU."""
  model = default.get_config().model
  keys = lambda platform: tuple(config_lib.for_platform(model, platform)[k]
                                for k in ('dtype', 'attention', 'attention_dropout_rate', 'dropout_draw', 'fused_qkv'))
  assert keys('gpu') == ('bfloat16', 'cudnn', 0.0, 'rbg_tower', 'true')
  assert keys('tpu') == ('bfloat16', 'einsum', 0.1, 'uniform', 'false')
  assert keys('cpu') == ('float32', 'einsum', 0.1, 'bits16', 'false')
  model.attention = 'einsum'
  assert keys('gpu') == ('bfloat16', 'einsum', 0.1, 'rbg_tower', 'true')
  model.attention = 'auto'
  # On construction, for this CPU:
  built = config_lib.load(default.get_config(), vocab_size=100).model
  assert (built.dtype, built.attention, built.attention_dropout_rate, built.dropout_draw, built.fused_qkv) == (
      'float32', 'einsum', 0.1, 'bits16', False)
  assert config_lib.platform_line(built) == 'model: float32, attention=einsum, dropout masks bits16'
  # for_this_platform asks jax's backend (which starts it) only when the platforms resolve the model differently.
  asked = []
  monkeypatch.setattr(jax, 'default_backend', lambda: asked.append(1) or 'gpu')
  assert tuple(config_lib.for_this_platform(model).values()) == ('bfloat16', 'cudnn', 0.0, 'rbg_tower', 'true')
  assert asked == [1]
  on_gpu = config_lib.load(default.get_config(), vocab_size=100).model
  assert on_gpu.fused_qkv is True
  assert config_lib.platform_line(on_gpu) == (
      "model: bfloat16, attention=cudnn, dropout masks rbg_tower, query/key/value in one matmul, no attention dropout "
      "(fused attention takes none; model.attention=einsum keeps the paper's)")
  given = {'dtype': 'bfloat16', 'attention': 'einsum', 'dropout_draw': 'uniform', 'attention_dropout_rate': 0.1,
           'fused_qkv': 'false'}
  assert config_lib.for_this_platform({**given, 'remat': 'none'}) == given
  assert asked == [1, 1]


@pytest.mark.parametrize('module, cls', [('default', config_lib.TrainConfig),
                                         ('finetune', finetune_config.FinetuneConfig)])
def test_config_files_hold_the_dataclass_defaults(module, cls):
  """configs/default.py and configs/finetune.py document every key and read its default from the dataclasses, the
  one source of defaults: a key left out, added, or given its own value there is a disagreement."""
  assert importlib.import_module(f'configs.{module}').get_config().to_dict() == config_lib.defaults(cls)
  # The two disagreements there were: the dataclasses now hold what the config files always gave.
  assert config_lib.defaults(cls)['model']['dtype'] == 'auto'
  assert dict(config_lib.defaults(cls)['mesh']['rules'])['activation_batch'] == ('data', 'fsdp')


def _dataclasses(cls):
  yield cls
  for field in dataclasses.fields(cls):
    if dataclasses.is_dataclass(field.type):
      yield from _dataclasses(field.type)


@pytest.mark.parametrize('cls', [config_lib.TrainConfig, finetune_config.FinetuneConfig])
def test_every_default_has_its_annotated_type(cls):
  """from_dict checks a value against its field's annotation, so each default must be of that type too."""
  for part in _dataclasses(cls):
    for field in dataclasses.fields(part):
      if field.type in (int, float, bool, str):
        assert type(field.default) is field.type, f'{part.__name__}.{field.name}'


def test_types_come_from_the_annotations():
  @dataclasses.dataclass(frozen=True)
  class Rates:
    rate: float = 0  # an int default: the annotation, not the default, says what the key takes
    name: str = ''

  assert config_lib.from_dict(Rates, {'rate': 0.5}, where='rates').rate == 0.5
  with pytest.raises(config_lib.ConfigError, match='rates.rate must be float'):
    config_lib.from_dict(Rates, {'rate': '0.5'}, where='rates')


def test_config_module_imports_nothing_above_it():
  """config.py is the bottom of the package: the modules that use its dataclasses (objective, sharding, model,
  ...) must not be imported by it, or an import cycle hides behind a deferred import."""
  code = ('import sys; from electra_jax import config; config.load({}, vocab_size=8); '
          'print(" ".join(sys.modules))')
  result = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True,
                          env=dict(os.environ, PYTHONPATH=REPO), cwd=REPO)
  imported = set(result.stdout.split())
  assert 'electra_jax.config' in imported
  assert not imported & {'electra_jax.objective', 'electra_jax.sharding', 'electra_jax.model',
                         'electra_jax.train_step', 'electra_jax.checkpoint', 'electra_jax.trainer'}


def _command(module, *args, cwd=REPO):
  # PYTHONPATH: from another directory too, this checkout's electra_jax (not another one installed).
  return subprocess.run([sys.executable, '-m', module, *args], cwd=cwd, capture_output=True, text=True,
                        timeout=120, check=False, env=dict(os.environ, PYTHONPATH=REPO))


@pytest.mark.parametrize('module', ['electra_jax.main', 'electra_jax.experiments.compare'])
def test_help_exits_0_with_the_usage(module):
  result = _command(module, '--help')
  assert result.returncode == 0, result.stderr
  assert f'python -m {module} --config=' in result.stdout and '--workdir' in result.stdout
  # The usage's continued command line reads as typed (`\` then the next line), not as a run of spaces.
  assert re.search(r' \\\n +\S', result.stdout) and not re.search(r'\S {3,}[-\[]', result.stdout)


@pytest.mark.parametrize('override, message', [
    ('--config.data.lowercase=maybe',
     "--config.data.lowercase=maybe: data.lowercase takes true or false (configs/tiny.py sets true), not 'maybe'"),
    ('--config.train_steps=abc',
     "--config.train_steps=abc: train_steps takes an integer (configs/tiny.py sets 1000), not 'abc'"),
])
def test_a_value_of_the_wrong_type_is_one_line_naming_key_type_and_value(override, message, tmp_path):
  result = _command('electra_jax.main', '--config=configs/tiny.py', f'--workdir={tmp_path}', override)
  assert result.returncode == 2 and result.stderr == f'error: {message}\n'
  assert not os.listdir(tmp_path)


@pytest.mark.parametrize('where, args, message', [
    ('clone', ['--config', 'configs/tiny.py', '--config.model.hidden_sise=3'],
     'configs/tiny.py has no key model.hidden_sise (did you mean model.hidden_size?); '
     '--config=configs/tiny.py --show_config lists every key'),
    ('clone', ['--config', 'configs/tiny.py', '--config.data.lowercase=maybe'],
     "--config.data.lowercase=maybe: data.lowercase takes true or false (configs/tiny.py sets true), not 'maybe'"),
    ('clone', ['--config', 'configs/nope.py'],
     "--config=configs/nope.py cannot be loaded (OSError: [Errno 2] No such file or directory: 'configs/nope.py'); "
     'give a config file such as configs/tiny.py or configs/finetune.py'),
    ('elsewhere', ['--config=configs/tiny.py', '--config.model.hidden_sise=3'],
     'configs/tiny.py has no key model.hidden_sise (did you mean model.hidden_size?); '
     '--config=configs/tiny.py --show_config lists every key'),
    ('elsewhere', ['--config=configs/small.py:quickstart', '--config.data.lowercase=maybe'],
     "--config.data.lowercase=maybe: data.lowercase takes true or false (configs/small.py:quickstart sets true), "
     "not 'maybe'"),
])
def test_errors_name_the_config_file_in_either_form_and_outside_a_clone(where, args, message, tmp_path):
  """`--config FILE` is the file as much as `--config=FILE`; from a directory without configs/ (an installed
  electra_jax), the packaged file's keys and values make the same one line."""
  elsewhere = tmp_path / 'elsewhere'
  elsewhere.mkdir()
  result = _command('electra_jax.main', *args, f'--workdir={tmp_path / "run"}',
                    cwd=elsewhere if where == 'elsewhere' else REPO)
  assert result.returncode == 2 and result.stderr == f'error: {message}\n'
  assert not (tmp_path / 'run').exists()


@pytest.mark.parametrize('rules', [('',), ('embed,fsdp',), (('embed', 'fsdp', 'tensor'),), (('embed', 'fdsp'),),
                                   ((3, 'fsdp'),), 'embed'])
def test_rules_that_are_not_name_axes_pairs_are_one_line(rules):
  """What `--config.mesh.rules=` or `--config.mesh.rules=embed,fsdp` gives (('',), ('embed,fsdp',)), a mesh axis that
  does not exist: refused with the expected form, not a ValueError from unpacking."""
  with pytest.raises(config_lib.ConfigError) as error:
    config_lib.MeshConfig(rules=rules)
  assert str(error.value).startswith('mesh.rules takes (logical axis, mesh axes) pairs')
  assert f'got {rules!r}' in str(error.value) and '\n' not in str(error.value)
  # The forms that are pairs: axes None, one axis, several (a list when read back from config.json).
  assert config_lib.MeshConfig(rules=[['a', None], ['b', 'tensor'], ['c', ['data', 'fsdp']]]).rules == (
      ('a', None), ('b', 'tensor'), ('c', ('data', 'fsdp')))


def test_rules_with_the_old_batch_name_are_refused():
  """A config from before the activation_* names would leave the batch unsplit without a word: refused instead."""
  with pytest.raises(config_lib.ConfigError, match='activation_batch'):
    config_lib.MeshConfig(rules=(('batch', ('data', 'fsdp')), ('embed', 'fsdp')))
