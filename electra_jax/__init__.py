"""electra_jax: pre-train and fine-tune ELECTRA text encoders with JAX and Flax."""

import glob
import importlib.util
import os

__version__ = '0.1.0'


def _cpu_only_with_libtpu() -> bool:
  """True on a machine where only the CPU can run JAX although libtpu is installed (the test extra brings it for
  the compile-only TPU test). JAX would then probe for TPU chips when it starts and print libtpu's errors."""
  if 'JAX_PLATFORMS' in os.environ or importlib.util.find_spec('libtpu') is None:
    return False
  if importlib.util.find_spec('jax_plugins') is not None:  # a GPU (or other) PJRT plugin: let JAX choose
    return False
  for vendor in glob.glob('/sys/bus/pci/devices/*/vendor'):  # TPU chips are Google (0x1ae0) PCI devices
    with open(vendor, encoding='ascii') as f:
      if f.read().strip() == '0x1ae0':
        return False
  return True


if _cpu_only_with_libtpu():
  os.environ['JAX_PLATFORMS'] = 'cpu'
