"""GPU targets of electra_jax.aot (`--topology=h100:2x8`): parsing needs nothing; compiling needs the CUDA plugin.

The compile test skips without a CUDA plugin (`jax[cuda12]` or `jax[cuda13]`: about 3 GiB of NVIDIA wheels, not in
CI: BENCHMARKS.md, "Does it fit on GPUs?").
"""

import pytest

from configs import tiny
from electra_jax import aot, gpu_targets
from electra_jax.aot import GIB
from electra_jax.config import ConfigError


def test_topology_names_nodes_and_gpus():
  assert gpu_targets.parse('h100:2x8') == (gpu_targets.GPUS['h100'], 2, 8)
  assert gpu_targets.parse('a100:8') == (gpu_targets.GPUS['a100'], 1, 8)
  assert gpu_targets.parse('h200:1') == (gpu_targets.GPUS['h200'], 1, 1)
  assert gpu_targets.GPUS['h200'].memory_bandwidth == 4.8e12  # the H100's: 3.35 TB/s
  assert gpu_targets.named('NVIDIA H200') is gpu_targets.GPUS['h200']  # jax's device_kind on the H200 lent
  assert gpu_targets.named('NVIDIA H100 80GB HBM3') is gpu_targets.GPUS['h100'] and gpu_targets.named('cpu') is None
  # Variants with less peak (H100 PCIe 756, the NVL parts 835 TFLOP/s) are not the SXM parts described.
  assert gpu_targets.named('NVIDIA H100 PCIe') is None and gpu_targets.named('NVIDIA H200 NVL') is None
  assert gpu_targets.parse('v3:4x4') is None  # a TPU slice: aot's TPU path takes it
  assert aot.chip('h100:1') is gpu_targets.GPUS['h100'] and aot.chip('h100:1').hbm_bytes > 79 * aot.GIB


@pytest.mark.parametrize('topology', ['h100:2x', 'h100:0', 'h100:0x8', 'h100:8x8x8', 'b200:8'])
def test_bad_gpu_topology_is_refused_in_one_line(topology):
  with pytest.raises(ConfigError) as e:
    aot.chip(topology)
  assert 'h100:2x8' in str(e.value) and '\n' not in str(e.value)


def test_target_config_takes_the_installed_cudnn_and_cuda_versions(monkeypatch):
  versions = {'nvidia-cudnn-cu12': '9.8.0.87', 'nvidia-cuda-runtime-cu12': '12.9.79',
              'nvidia-cudnn-cu13': '9.20.0.48', 'nvidia-cuda-runtime': '13.0.96'}  # jax[cuda12]'s, jax[cuda13]'s
  monkeypatch.setattr(gpu_targets.importlib.metadata, 'version', versions.__getitem__)
  text = gpu_targets.target_config(gpu_targets.GPUS['h100'], 'jax_cuda12_plugin')
  assert 'dnn_version_info { major: 9 minor: 8 patch: 0 }' in text and 'runtime_version: "12.9.79"' in text
  assert 'core_count: 132' in text and 'cuda_compute_capability { major: 9 minor: 0 }' in text
  text = gpu_targets.target_config(gpu_targets.GPUS['h100'], 'jax_cuda13_plugin')
  assert 'dnn_version_info { major: 9 minor: 20 patch: 0 }' in text and 'runtime_version: "13.0.96"' in text


@pytest.mark.skipif(gpu_targets.plugin() is not None, reason='a CUDA plugin is installed')
def test_without_the_cuda_plugin_the_report_says_what_to_install():
  with pytest.raises(ConfigError, match=r'the CUDA plugin is not installed: pip install -e "\.\[cuda\]" in a clone'):
    aot.topology_devices('h100:8')


# A one-layer model: H = E = 256, FFN 1024, a same-size generator (no embeddings_project), 1024 words, 128
# positions, batch 16 x 128 on 2 H100s (8 rows each).
H, F, V, L, B = 256, 1024, 1024, 128, 16


@pytest.mark.skipif(gpu_targets.plugin() is None,
                    reason='needs a CUDA plugin (pip install "jax[cuda12]==0.10.2", ~5 GB); not in CI')
def test_compiles_for_two_h100s_with_the_state_and_batch_counted_by_hand():
  """Data-parallel on `h100:2`: each GPU holds the whole state and 8 rows. Unlike a TPU, XLA:GPU pads nothing.

  Parameters (as tests/test_aot.py counts them): 2,008,833 float32, three times (parameters, Adam's two moments);
  the step and the schedule's step count (int32), the [2] uint32 random key; the batch: 3 arrays of [8, 128] int32.
  """
  config = tiny.get_config()
  config.model.update(embedding_size=H, hidden_size=H, num_layers=1, num_heads=4, intermediate_size=F,
                      generator_hidden_fraction=1.0, vocab_size=V, max_position_embeddings=L)
  config.data.max_seq_length, config.batch_size = L, B
  config.optimizer.bias_correction = False
  pretraining, = aot.run(config, 'h100:2', finetune=False)
  assert pretraining.argument_bytes == 12 * 2_008_833 + 4 + 4 + 8 + 3 * 8 * L * 4
  assert 0 < pretraining.peak_bytes < aot.GIB and pretraining.devices == 2
  assert 'all-reduce' in pretraining.collectives  # the gradients, summed over the two GPUs


def test_a_gpu_step_fits_in_what_jax_preallocates_not_in_the_whole_hbm(monkeypatch):
  """JAX takes 75% of a GPU's memory unless XLA_PYTHON_CLIENT_MEM_FRACTION says otherwise: 65 GiB of an H100's
  79.1 does not fit in the default 59.3 GiB, and fits at 0.95 (75.1 GiB). XLA:GPU has no cost analysis."""
  h100 = gpu_targets.GPUS['h100']
  report = aot.Report('pre-training', 8, 256 * 512, 1e14, 60.0, argument_bytes=GIB, temp_bytes=64 * GIB,
                      peak_bytes=65 * GIB, collectives='all-reduce x13', graphs='14 CUDA graphs of 2100 commands')
  monkeypatch.delenv('XLA_PYTHON_CLIENT_MEM_FRACTION', raising=False)
  text = aot.format_report(report, h100)
  assert 'DOES NOT FIT' in text and 'NO step-time estimate' in text and 'not fused' in text
  assert '  CUDA graphs: 14 CUDA graphs of 2100 commands (an estimate' in text
  monkeypatch.setenv('XLA_PYTHON_CLIENT_MEM_FRACTION', '.95')
  assert 'DOES NOT FIT' not in aot.format_report(report, h100)
