"""TPU generations by jax's device names: a benchmark's MFU divides by the peak of the generation it ran on."""

from electra_jax import gpu_targets, tpu_targets


def test_device_kinds_name_their_generation_whole():
  chips = tpu_targets.CHIPS
  assert tpu_targets.named('TPU v5') is chips['v5p'] and chips['v5p'].peak_flops == 459e12
  assert tpu_targets.named('TPU v5 lite') is chips['v5e'] and chips['v5e'].peak_flops == 197e12
  assert tpu_targets.named('TPU v6 lite').peak_flops == 918e12
  assert tpu_targets.named('TPU v3').peak_flops == 61.5e12  # per core: half a chip's 123
  assert tpu_targets.named('TPU v4').megacore and not tpu_targets.named('TPU v5 lite').megacore
  for kind in ('NVIDIA H200', 'cpu', 'TPU v7x'):
    assert tpu_targets.named(kind) is None
  assert gpu_targets.named('TPU v5') is None  # a TPU is not mistaken for a GPU either
