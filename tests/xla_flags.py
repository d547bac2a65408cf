"""The XLA:CPU flags the test suite compiles with (tests/conftest.py sets them before jax starts;
bench/machine_speed.py times a compile with them). Imports nothing of jax: they must be set before it loads.

LLVM -O0: XLA:CPU compiles the tiny test programs 3-4x faster (the tests are compile-bound, not run-bound). The
older loop-fusion emitters take another ~20% off the suite's CPU time (measured on tests/test_evaluation.py: 51 ->
40 CPU s); the programs and their semantics are the same. The XLA of jaxlib 0.11 has no such flag and aborts on a
flag it does not know, so it is set for older jaxlibs only.
"""

from importlib import metadata


def fast_compile() -> str:
  flags = '--xla_backend_optimization_level=0'
  if tuple(int(part) for part in metadata.version('jaxlib').split('.')[:2]) < (0, 11):
    flags += ' --xla_cpu_use_fusion_emitters=false'
  return flags
