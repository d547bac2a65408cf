"""TPU generations by jax's device names: a benchmark's MFU divides by the peak of the generation it ran on."""

from electra_jax import gpu_targets, tpu_targets


def test_device_kinds_name_their_generation_whole():
  chips = tpu_targets.CHIPS
  # 'TPU v5' (a v5p) begins 'TPU v5 lite' (a v5e): matched by substring, both took the v5e's peak.
  assert tpu_targets.named('TPU v5') is chips['v5p'] and tpu_targets.named('TPU v5 lite') is chips['v5e']
  assert tpu_targets.named('TPU v6 lite') is chips['v6e'] and tpu_targets.named('TPU v4') is chips['v4']
  assert tpu_targets.named('TPU v3').peak_flops == 123e12 / 2  # a JAX device is one of a v3 chip's two cores
  assert tpu_targets.named('TPU v4').megacore and not tpu_targets.named('TPU v5 lite').megacore
  for kind in ('NVIDIA H200', 'cpu', 'TPU v7x'):
    assert tpu_targets.named(kind) is None
  assert gpu_targets.named('TPU v5') is None  # a TPU is not mistaken for a GPU either
