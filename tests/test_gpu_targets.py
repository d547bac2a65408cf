"""GPU targets of electra_jax.aot (`--topology=h100:2x8`): parsing needs nothing; compiling needs the CUDA plugin.

The compile test skips without `jax[cuda12]` (about 3 GiB of NVIDIA wheels, not in CI: BENCHMARKS.md, "GPU
compile-only checks").
"""

import importlib.util

import pytest

from configs import tiny
from electra_jax import aot, gpu_targets
from electra_jax.config import ConfigError


def test_topology_names_nodes_and_gpus():
  assert gpu_targets.parse('h100:2x8') == (gpu_targets.GPUS['h100'], 2, 8)
  assert gpu_targets.parse('a100:8') == (gpu_targets.GPUS['a100'], 1, 8)
  assert gpu_targets.parse('v3:4x4') is None  # a TPU slice: aot's TPU path takes it
  assert aot.chip('h100:1') is gpu_targets.GPUS['h100'] and aot.chip('h100:1').hbm_bytes > 79 * aot.GIB


@pytest.mark.parametrize('topology', ['h100:2x', 'h100:0', 'h100:0x8', 'h100:8x8x8', 'h200:8'])
def test_bad_gpu_topology_is_refused_in_one_line(topology):
  with pytest.raises(ConfigError) as e:
    aot.chip(topology)
  assert 'h100:2x8' in str(e.value) and '\n' not in str(e.value)


def test_target_config_takes_the_installed_cudnn_and_cuda_versions(monkeypatch):
  versions = {'nvidia-cudnn-cu12': '9.8.0.87', 'nvidia-cuda-runtime-cu12': '12.9.79'}
  monkeypatch.setattr(gpu_targets.importlib.metadata, 'version', versions.__getitem__)
  text = gpu_targets.target_config(gpu_targets.GPUS['h100'])
  assert 'dnn_version_info { major: 9 minor: 8 patch: 0 }' in text and 'runtime_version: "12.9.79"' in text
  assert 'core_count: 132' in text and 'cuda_compute_capability { major: 9 minor: 0 }' in text


@pytest.mark.skipif(importlib.util.find_spec('jax_cuda12_plugin') is not None, reason='the CUDA plugin is installed')
def test_without_the_cuda_plugin_the_report_says_what_to_install():
  with pytest.raises(ConfigError, match=r'pip install "jax\[cuda12\]'):
    aot.topology_devices('h100:8')
