"""NVIDIA GPU nodes described for compilation only (electra_jax.aot), so that a CPU machine compiles for them.

`--topology=GPU:N` is one node of N GPUs, `GPU:MxN` is M nodes of N GPUs each (e.g. h100:8, h100:2x8, a100:8).
XLA:GPU learns the device from a `GpuTargetConfigProto` (xla/stream_executor/device_description.proto) in text
form: its `gpu_device_info` (SM count, shared memory, registers, HBM size, compute capability, clocks) plus the
cuDNN and CUDA versions, which are read from the installed NVIDIA wheels. The device-info figures below are
those of XLA's own target specs (xla/backends/gpu/target_config/specs/{h100_sxm,a100_sxm_80}.txtpb), trimmed
to the fields this jaxlib knows. Compiling needs a CUDA plugin and NVIDIA's compiler wheels, not a GPU or a
driver: `pip install "jax[cuda12]==<the jax version>"` or `jax[cuda13]` (checked with jax 0.10.2 and 0.11.2).
"""

import dataclasses
import importlib.metadata
import importlib.util
import os
import re

from electra_jax.config import ConfigError


@dataclasses.dataclass(frozen=True)
class Gpu:
  """One GPU model: its HBM, its peak dense bfloat16 FLOP/s (NVIDIA's datasheet) and its XLA device info."""
  hbm_bytes: int
  peak_flops: float
  device_info: str  # the fields of GpuTargetConfigProto.gpu_device_info, text format
  description: str  # what XLA names the device

  @property
  def memory_bandwidth(self) -> float:
    """Bytes/s of its HBM (device_info's memory_bandwidth)."""
    return float(re.search(r'memory_bandwidth: (\d+)', self.device_info).group(1))


_COMMON = """
  threads_per_block_limit: 1024 threads_per_warp: 32 shared_memory_per_block: 49152 threads_per_core_limit: 2048
  block_dim_limit_x: 2147483647 block_dim_limit_y: 65535 block_dim_limit_z: 65535
  registers_per_core_limit: 65536 registers_per_block_limit: 65536"""

# Hopper's SMs, caches and clocks (H100 and H200 SXM share the chip), with the memory's bandwidth and size.
_HOPPER = _COMMON + """
  shared_memory_per_core: 233472 shared_memory_per_block_optin: 232448 core_count: 132 fpus_per_core: 128
  memory_bandwidth: {bandwidth} l2_cache_size: 52428800 clock_rate_ghz: 1.98 device_memory_size: {memory}
  cuda_compute_capability {{ major: 9 minor: 0 }}"""

GPUS = {
    # H100 SXM 80 GB: 989 TFLOP/s dense bf16 (NVIDIA H100 datasheet: 1,979 with 2:4 sparsity).
    'h100': Gpu(84_942_979_072, 989e12, _HOPPER.format(bandwidth=3352320000000, memory=84942979072),
                'NVIDIA H100 80GB HBM3'),
    # H200 SXM 141 GB: the H100's chip with 143,771 MiB of HBM3e (nvidia-smi on the H200 lent, 2026-11-26) at 4.8
    # TB/s (NVIDIA H200 datasheet).
    'h200': Gpu(150_754_820_096, 989e12, _HOPPER.format(bandwidth=4800000000000, memory=150754820096), 'NVIDIA H200'),
    # A100 SXM 80 GB: 312 TFLOP/s dense bf16 (NVIDIA A100 datasheet: 624 with 2:4 sparsity).
    'a100': Gpu(85_100_068_864, 312e12, _COMMON + """
  shared_memory_per_core: 167936 shared_memory_per_block_optin: 166912 core_count: 108 fpus_per_core: 64
  memory_bandwidth: 2039040000000 l2_cache_size: 41943040 clock_rate_ghz: 1.41 device_memory_size: 85100068864
  cuda_compute_capability { major: 8 minor: 0 }""", 'NVIDIA A100-SXM4-80GB'),
}


def named(device_kind: str) -> Gpu | None:
  """The GPU of GPUS whose `description` is a jax device's `device_kind` (e.g. 'NVIDIA H200'), if any: matched whole,
  since 'NVIDIA H100 PCIe' and 'NVIDIA H200 NVL' have less peak and bandwidth than the SXM parts described here."""
  return next((gpu for gpu in GPUS.values() if gpu.description == device_kind), None)


def parse(topology: str) -> tuple[Gpu, int, int] | None:
  """('h100:2x8') -> (GPUS['h100'], 2 nodes, 8 GPUs per node); None when `topology` names no GPU (a TPU slice)."""
  name, _, shape = topology.partition(':')
  if name not in GPUS:
    return None
  match = re.fullmatch(r'(?:(\d+)x)?(\d+)', shape)
  if not match or int(match[2]) == 0 or match[1] == '0':
    raise ConfigError(f'--topology={topology!r}: expected {name}:GPUS (one node, e.g. {name}:8) or '
                      f'{name}:NODESxGPUS (e.g. {name}:2x8, two nodes of 8)')
  return GPUS[name], int(match[1] or 1), int(match[2])


def memory_fraction() -> float:
  """The share of a GPU's memory JAX preallocates for arrays (its default 0.75, or XLA_PYTHON_CLIENT_MEM_FRACTION)."""
  return float(os.environ.get('XLA_PYTHON_CLIENT_MEM_FRACTION', 0.75))


# The CUDA plugins jax ships (module names) with the wheels of NVIDIA's cuDNN and CUDA runtime each brings.
PLUGINS = {
    'jax_cuda12_plugin': ('nvidia-cudnn-cu12', 'nvidia-cuda-runtime-cu12'),
    'jax_cuda13_plugin': ('nvidia-cudnn-cu13', 'nvidia-cuda-runtime'),
}


def plugin() -> str | None:
  """The installed CUDA plugin (a module name of PLUGINS), if any."""
  return next((name for name in PLUGINS if importlib.util.find_spec(name) is not None), None)


def _version(package: str) -> tuple[int, int, int]:
  return tuple((list(map(int, re.findall(r'\d+', importlib.metadata.version(package))[:3])) + [0, 0])[:3])


def target_config(gpu: Gpu, cuda_plugin: str) -> str:
  """The GpuTargetConfigProto text for `gpu`, with the cuDNN and CUDA runtime versions of the wheels that
  `cuda_plugin` brings (XLA chooses cuDNN's fused attention and its fusions by the cuDNN version)."""
  cudnn, cuda_runtime = PLUGINS[cuda_plugin]
  dnn = _version(cudnn)
  runtime = '.'.join(map(str, _version(cuda_runtime)))
  return (f'gpu_device_info {{{gpu.device_info}\n  runtime_version: "{runtime}" }}\n'
          f'platform_name: "CUDA"\ndnn_version_info {{ major: {dnn[0]} minor: {dnn[1]} patch: {dnn[2]} }}\n'
          f'device_description_str: "{gpu.description}"\n')


def devices(topology: str) -> list:
  """The devices of `topology` (nodes x GPUs), described for compilation only."""
  gpu, nodes, per_node = parse(topology)
  cuda_plugin = plugin()
  if cuda_plugin is None:
    raise ConfigError('the CUDA plugin is not installed: pip install -e ".[cuda]" in a clone, or "jax[cuda12]==<your '
                      'jax version>" (about 5 GB of NVIDIA wheels; no GPU needed)')
  from jax.experimental import topologies  # noqa: PLC0415
  try:
    topo = topologies.get_topology_desc(platform='cuda', target_config=target_config(gpu, cuda_plugin),
                                        topology=f'1x{nodes}x{per_node}')
  except Exception as e:  # pylint: disable=broad-except  (JaxRuntimeError)
    raise ConfigError(f'XLA:GPU cannot describe --topology={topology!r}: {str(e).splitlines()[0]}') from e
  return list(topo.devices)
