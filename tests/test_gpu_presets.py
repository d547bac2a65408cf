"""The GPU presets (configs/gpu.py): `--config=configs/large.py:gpu[:N]` sets the accumulation chosen from the
XLA:GPU compiles in BENCHMARKS.md and changes nothing else of the paper's recipe."""

import importlib
import os
import subprocess
import sys

import pytest

from electra_jax import aot

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def scale(name: str, preset: str = ''):
  return importlib.import_module(f'configs.{name}').get_config(preset)


@pytest.mark.parametrize('name, preset, accum, rows', [
    # rows: sequences per GPU per micro-batch = batch / GPUs / accum, at most the config's max_rows.
    ('large', 'gpu', 4, 64),  # 2048 over one 8-GPU node: 256 per GPU in 4 micro-batches
    ('large', 'gpu:16', 2, 64),  # two nodes: 128 per GPU
    ('large', 'gpu:1', 32, 64),
    ('large', 'gpu:64', 1, 32),
    ('base', 'gpu', 1, 32),  # 256 over 8 GPUs: 32 per GPU, as the paper batch compiled (19.2 GiB)
    ('base', 'gpu:1', 4, 64),
    ('small', 'gpu:1', 1, 128),  # the whole 128 x 128 batch on one GPU
    ('small', 'gpu', 1, 16),
])
def test_preset_sets_only_the_accumulation(name, preset, accum, rows):
  paper, gpu = scale(name), scale(name, preset)
  assert gpu.grad_accum_steps == accum
  gpus = int(preset.partition(':')[2] or 8)
  assert gpu.batch_size // gpus // gpu.grad_accum_steps == rows
  paper.grad_accum_steps = accum
  if name == 'large':
    paper.model.remat = 'full'  # on TPUs no remat in 4 micro-batches; the H100 compiles chose full remat
  assert gpu.to_dict() == paper.to_dict()  # batch, mesh, dtype='auto' (bf16 on GPU): the paper's
  c = aot.load_config(gpu, 'gpu')  # as a GPU run resolves the 'auto' keys (config.for_platform)
  remat = 'full' if name == 'large' else 'none'
  assert (c.grad_accum_steps, c.model.dtype, c.model.remat) == (accum, 'bfloat16', remat)
  # An encoder's dropout masks in one draw and one query/key/value matmul unless its layers are recomputed
  # (config.dropout_draw, config.fused_qkv).
  draw, fused = ('rbg', False) if name == 'large' else ('rbg_tower', True)
  assert (c.model.attention, c.model.attention_dropout_rate, c.model.dropout_draw, c.model.fused_qkv) == (
      'cudnn', 0.0, draw, fused)


def test_no_preset_is_the_paper_config():
  assert scale('base').grad_accum_steps == 1
  large = scale('large')  # the paper's batch, in 4 micro-batches so that a v3-64 core has 20% of its HBM spare
  assert (large.batch_size, large.grad_accum_steps, large.model.remat) == (2048, 4, 'none')


@pytest.mark.parametrize('preset, message', [
    ('tpu', "unknown preset 'tpu'"),
    ('gpu:0', "unknown preset 'gpu:0'"),
    ('gpu:x', "unknown preset 'gpu:x'"),
    ('gpu:3', 'the batch of 2048 sequences does not split over 3 GPUs'),
])
def test_bad_preset_says_what_to_use(preset, message):
  with pytest.raises(ValueError, match=message):
    scale('large', preset)


def test_preset_through_the_entry_point():
  def main(config):
    return subprocess.run([sys.executable, '-m', 'electra_jax.main', f'--config={config}', '--show_config'],
                          cwd=REPO, capture_output=True, text=True, check=False)
  shown = main('configs/large.py:gpu:16')
  assert shown.returncode == 0, shown.stderr
  lines = shown.stdout.splitlines()
  assert lines[0].startswith('# configs/large.py:gpu:16: every key')
  comment = '# TPU: 8 sequences of 512 per v3-64 core at a time. GPU presets: at most 64 per GPU.'
  assert f'grad_accum_steps = 2  {comment}' in lines
  assert "model.remat = 'full'  # TPU: recompute nothing. GPU presets: full." in lines
  refused = main('configs/large.py:gpu:3')
  assert refused.returncode == 2
  assert refused.stderr.strip() == ('error: --config=configs/large.py:gpu:3: ValueError: the batch of 2048 '
                                    'sequences does not split over 3 GPUs: use a number of GPUs that divides it')
  # A config file with no presets given one (it was get_config's TypeError), and small.py's list names its own.
  assert main('configs/tiny.py:gpu').stderr.strip() == ('error: --config=configs/tiny.py:gpu: configs/tiny.py has no '
                                                        'presets; give --config=configs/tiny.py')
  assert 'use quickstart (one GPU, the built-in corpus), gpu (one node' in main('configs/small.py:tpu').stderr
