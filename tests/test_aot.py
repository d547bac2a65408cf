"""The TPU compiler on a CPU machine (electra_jax.aot): a small model compiled for a v3-8 slice (v3:2x2, 8 cores).

Needs libtpu (the test extra installs it); about 30-60 s of compilation on 2 CPU cores.
"""

import dataclasses
import os
import subprocess
import sys

import pytest

from configs import finetune, tiny
from electra_jax import aot, sharding, tpu_targets
from electra_jax.aot import GIB
from electra_jax.config import ConfigError

pytest.importorskip('libtpu', reason='the TPU compiler: pip install -e ".[test]"')

# Every test here compiles or trains a model (or shares a module fixture that does): the slow tier.
pytestmark = pytest.mark.slow

# Sizes chosen so that every array fills whole TPU tiles (multiples of 8 x 128 elements or of 1 KiB): the
# argument bytes are then the plain array sizes. H = E = 256, 1 layer, FFN 1024, a same-size generator (no
# embeddings_project), 1024 words, 128 positions, batch 64 x 128 (8 rows on each of the 8 cores).
H, F, V, L, B = 256, 1024, 1024, 128, 64
OVERRIDES = {'embedding_size': H, 'hidden_size': H, 'num_layers': 1, 'num_heads': 4, 'intermediate_size': F,
             'generator_hidden_fraction': 1.0, 'vocab_size': V, 'max_position_embeddings': L}


def _config():
  config = tiny.get_config()
  config.model.update(OVERRIDES)
  config.data.max_seq_length = L
  config.batch_size = B
  config.optimizer.bias_correction = False  # ELECTRA's Adam: no step count of its own
  return config


@pytest.fixture(scope='module')
def reports():
  return aot.run(_config(), 'v3:2x2', finetune=True, finetune_batch=32, finetune_length=L)


def test_argument_bytes_are_the_state_and_batch_by_hand(reports):
  """Data-parallel: every core holds the whole state (parameters and two Adam moments, float32) and 8 rows.

  Parameters, counted from the architecture:
    embeddings     V H + L H + 2 H + 2 H (LayerNorm)                        = 295,936
    one layer      4 (H H + H) + 2 H + (H F + F) + (F H + H) + 2 H          = 789,760  (each tower has one)
    RTD head       H H + H + H + 1                                          =  66,049
    MLM head       H H + H + 2 H (LayerNorm) + V (output bias)              =  67,328
    total                                                                   = 2,008,833
  Two TPU layout rules (probed one array at a time): an array takes at least 1 KiB, so the RTD output bias (1
  float, and its two moments), the step, the learning-rate schedule's step count and the [2] uint32 random key
  take 1 KiB each; an [N, 1] array is stored as [N, 2], so the RTD output kernel [H, 1] (and its moments) takes
  2 KiB, not 1. The batch: 3 arrays of [8, 128] int32 = 4 KiB each.
  """
  params = 295_936 + 2 * 789_760 + 66_049 + 67_328
  assert params == 2_008_833
  expected = 12 * (params - H - 1) + 3 * 2 * H * 4 + 3 * 1024 + 2 * 1024 + 1024 + 3 * 8 * L * 4
  assert reports[0].argument_bytes == expected


def test_model_flops_by_hand(reports):
  """electra_jax.flops' count (matmuls, training = 3 x forward), worked out for these sizes:

  one layer per token: 2 (4 H^2 + 2 H F) + 4 L H = 1,703,936 (projections, FFN, QK^T and PV), in each tower;
  RTD head per token 2 (H^2 + H) = 131,584; MLM head at P = int(0.155 L) = 19 positions 2 (H E + E V) = 655,360.
  Forward per sequence 128 (2 x 1,703,936 + 131,584) + 19 x 655,360 = 465,502,208; x 3 x 64 sequences.
  Fine-tuning (32 x 128, a two-class [CLS] head): 3 x 32 x (128 x 1,703,936 + 2 H 2).
  """
  pretraining, finetuning = reports
  assert pretraining.model_flops == 3 * 64 * 465_502_208 == 89_376_423_936
  assert finetuning.model_flops == 3 * 32 * (128 * 1_703_936 + 2 * H * 2)
  for r in reports:
    # The compiler counts every op (softmax, LayerNorm, GELU, the optimiser) per device: a little more in all.
    assert 1.0 < r.compiled_flops * r.devices / r.model_flops < 1.3, r
    assert 0 < r.peak_bytes < tpu_targets.CHIPS['v3'].hbm_bytes and r.estimated_seconds > 0 and not r.error


def test_report_says_what_to_change_when_it_does_not_fit():
  report = aot.Report('pre-training', 8, B * L, 1e12, 3.0, error='HLO temporaries (22.28G) exceeds available HBM')
  assert 'DOES NOT FIT' in aot.format_report(report, tpu_targets.CHIPS['v3'])
  # The v4 (megacore) cost model answered optimal_seconds < 0 for ELECTRA-Small: no estimate rather than nonsense.
  v4 = aot.Report('pre-training', 4, B * L, 1e12, 3.0, argument_bytes=GIB, peak_bytes=GIB, compiled_flops=3e11,
                  estimated_seconds=-315.0)
  assert 'no usable step-time estimate' in aot.format_report(v4, tpu_targets.CHIPS['v4'])
  config = aot.load_config(_config())
  mesh = sharding.make_mesh(config.mesh, aot.topology_devices('v3:2x2'))
  advice = aot.advice(config, mesh)
  # bf16 is already what 'auto' gives a TPU; 8 rows per core split into 2 micro-batches of 4.
  assert 'dtype' not in advice and 'remat=full' in advice and 'grad_accum_steps=2' in advice
  assert 'mesh.shape=1,8,1' in advice
  assert tpu_targets.CHIPS['v4'].hbm_bytes == 32 * GIB


def test_layer_fit_extrapolates_the_unrolled_step_linearly(monkeypatch):
  compiled = []

  def fake_report(c, mesh):  # a step costing 1 ms + 0.5 ms per layer, 2 + 3 TFLOPs per layer per device
    compiled.append((c.model.num_layers, c.grad_accum_steps, c.model.scan_layers))
    layers = c.model.num_layers
    return aot.Report('pre-training', 8, B * L, 1e12, 1.0, compiled_flops=(2 + 3 * layers) * 1e12,
                      estimated_seconds=1e-3 + 0.5e-3 * layers)

  monkeypatch.setattr(aot, 'pretraining_report', fake_report)
  config = aot.load_config(_config())
  deep = dataclasses.replace(config, grad_accum_steps=2,
                             model=dataclasses.replace(config.model, num_layers=12, scan_layers=True))
  fit = aot.layer_fit(deep, mesh=None)
  assert compiled == [(2, 1, False), (4, 1, False)]
  assert fit.depths == (2, 4)
  assert fit.estimated_seconds == pytest.approx(7e-3) and fit.compiled_flops == pytest.approx(38e12)
  # 8192 tokens / 7 ms; MFU 1e12 model FLOPs / (7 ms x 8 cores x 61.5 TFLOP/s) = 0.29; 8 x 38e12 / 1e12 = 304.
  line = aot.format_fit(fit, fake_report(deep, None), tpu_targets.CHIPS['v3'])
  assert '7.0 ms per step, 1,170,286 tokens/s, MFU 29% of 61.5 TFLOP/s' in line
  assert 'compiled FLOPs 3.040e+14 (all devices), ratio 304.00' in line
  # A generator of a quarter of the layers has 1, 1 and 3 layers at depths 2, 4 and 12: not on one line; at 4, 8
  # and 12 it has 1, 2 and 3, which are, so those depths are compiled instead.
  quarter = dataclasses.replace(deep, model=dataclasses.replace(deep.model, generator_layers_fraction=0.25))
  compiled.clear()
  assert aot.layer_fit(quarter, mesh=None).depths == (4, 8) and [d for d, _, _ in compiled] == [4, 8]
  assert aot.layer_fit(dataclasses.replace(deep, model=dataclasses.replace(deep.model, num_layers=4)), None) is None


def test_plain_runs_do_not_probe_for_a_tpu():
  """With libtpu installed, JAX on a machine without TPU chips would print libtpu's start-up errors; importing
  a command's setup (cli.setup, which cli.run calls) first tells JAX it has only the CPU."""
  # Not the settings the tests or electra_jax.aot (imported above) made for this process.
  env = {k: v for k, v in os.environ.items()
         if k not in ('JAX_PLATFORMS', 'XLA_FLAGS', 'ALLOW_MULTIPLE_LIBTPU_LOAD') and not k.startswith('TPU_')}
  program = 'from electra_jax import cli; import jax; cli.setup(); print(jax.default_backend())'
  done = subprocess.run([sys.executable, '-c', program], env=env, capture_output=True, text=True, check=True,
                        timeout=120)
  assert done.stdout.strip() == 'cpu' and done.stderr == ''


def test_bad_commands_are_refused_before_any_compile():
  with pytest.raises(ConfigError, match='aot compiles a pre-training config'):
    aot.run(finetune.get_config(), 'v3:2x2')
  with pytest.raises(ConfigError, match='--finetune_batch=0 and --finetune_length=128 must be at least 1'):
    aot.run(_config(), 'v3:2x2', finetune_batch=0)
  with pytest.raises(ConfigError, match='--finetune_length=512 is more than the model.s 128 positions'):
    aot.run(_config(), 'v3:2x2', finetune_length=512)
  odd = _config()
  odd.steps_per_call = 7  # as the trainer refuses it: log_every 25 is not a multiple
  with pytest.raises(ConfigError, match='make these multiples of 7: log_every=25'):
    aot.run(odd, 'v3:2x2')


def test_the_pretraining_report_compiles_the_trainers_program(monkeypatch):
  """configs/small.py runs 5 steps a call: aot compiled one step, whose kernels and CUDA graphs were not the
  program the trainer runs."""
  monkeypatch.setattr(aot.Pretraining, 'lower', lambda self, steps=1: steps)
  monkeypatch.setattr(aot, 'compile_report', lambda name, lower, **kwargs: (name, lower(), kwargs['loop']))
  config = _config()
  config.steps_per_call = 5
  c = aot.load_config(config)
  assert aot.pretraining_report(c, sharding.make_mesh(c.mesh)) == ('pre-training (5 steps a call)', 5,
                                                                   '5 steps a call')


def test_the_vocabulary_is_the_one_a_run_would_read(tmp_path):
  """data.tokenizer's size, not data.vocab_size's (the size of a tokenizer the run would train instead)."""
  (tmp_path / 'vocab.txt').write_text('\n'.join(['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]', 'a', 'b']) + '\n')
  config = tiny.get_config()
  assert aot.load_config(config).model.vocab_size == config.data.vocab_size
  config.data.tokenizer = str(tmp_path / 'vocab.txt')
  assert aot.load_config(config).model.vocab_size == 7
