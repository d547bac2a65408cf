"""TPU generations as electra_jax.aot compiles for them (`--topology=v4:2x2x1`) and as benchmarks name their peaks.

A JAX device is a v3 core, a v4/v5p chip (two TensorCores acting as one: megacore) or a v5e/v6e chip. HBM and peak
dense bfloat16 FLOP/s per device are Cloud TPU's documented figures.
"""

import dataclasses

GIB = 2 ** 30


@dataclasses.dataclass(frozen=True)
class Chip:
  """One JAX device of a TPU generation: its HBM, its peak dense bfloat16 FLOP/s and jax's names for it."""
  hbm_bytes: int
  peak_flops: float
  device_kinds: tuple[str, ...]  # `jax.Device.device_kind` on this generation (v5e's 'TPU v5 lite', v5p's 'TPU v5')
  megacore: bool = False  # two TensorCores act as one device (get_topology_desc needs to be told)


CHIPS = {
    'v3': Chip(16 * GIB, 123e12 / 2, ('TPU v3',)),  # per core: a v3 chip is 2 devices of 16 GiB, 123 TFLOP/s a chip
    'v4': Chip(32 * GIB, 275e12, ('TPU v4',), megacore=True),
    'v5e': Chip(16 * GIB, 197e12, ('TPU v5 lite', 'TPU v5e')),
    'v5p': Chip(95 * GIB, 459e12, ('TPU v5', 'TPU v5p'), megacore=True),
    'v6e': Chip(32 * GIB, 918e12, ('TPU v6 lite', 'TPU v6e')),
}


def named(device_kind: str) -> Chip | None:
  """The generation whose devices jax calls `device_kind`, if any: matched whole, since 'TPU v5' (a v5p) begins
  'TPU v5 lite' (a v5e, less than half its peak)."""
  return next((chip for chip in CHIPS.values() if device_kind in chip.device_kinds), None)
