"""Where a GPU step's kernels come from, without a GPU: the pre-training step and the initialiser compiled by
XLA:GPU for an H100 on this machine (electra_jax.gpu_targets; needs the CUDA plugin, `pip install -e ".[cuda]"`,
no GPU or driver), then counted from the compiled program (electra_jax.kernels).

  JAX_PLATFORMS=cpu python bench/gpu_kernels.py --config=configs/small.py [--config.model.attention=cudnn ...]
      [--batch=128] [--length=128] [--topology=h100:1] [--dump=DIR]

Prints, for the train step: its trace, lowering and XLA compile seconds; its kernels per step by part of the step
(masking, sampling, model, dropout, loss, optimizer) and by kind (fusions, cuBLAS GEMMs, cuDNN, Triton, sorts,
scatters, host transfers); the CUDA graphs XLA's runtime would record them in (an estimate); its while loops with
their trip counts; the fusions that hold threefry (random bits) and cumulative sums; and the same counts for the
initialiser. Counts are the compiler's and do not depend on this machine; the seconds do (a loaded CPU compiles
slower), and a GPU's own compile adds autotuning, which a compile without a GPU skips. The levers that are
environment variables (JAX_DEFAULT_PRNG_IMPL, JAX_THREEFRY_GPU_KERNEL_LOWERING, XLA_FLAGS) apply here as on a GPU.
"""

import collections
import os
import re
import sys
import time

os.environ.setdefault('JAX_PLATFORMS', 'cpu')
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags
import jax
from ml_collections import config_flags

from electra_jax import aot, gpu_targets, kernels, scaffold, sharding
from electra_jax.masking import TRAINED_TOKENIZER_IDS
from electra_jax.train_step import Pretraining

_CONFIG = config_flags.DEFINE_config_file('config', 'configs/small.py', 'Pre-training config.')
_BATCH = flags.DEFINE_integer('batch', 0, 'Global batch (0: the config\'s).')
_LENGTH = flags.DEFINE_integer('length', 0, 'Sequence length (0: the config\'s).')
_VOCAB = flags.DEFINE_integer('vocab', 30522, 'Vocabulary size.')
_TOPOLOGY = flags.DEFINE_string('topology', 'h100:1', 'GPUs to compile for (electra_jax.gpu_targets).')
_DUMP = flags.DEFINE_string('dump', '', 'Write the compiled HLO texts into this directory.')
_STEP = flags.DEFINE_bool('step', True, 'Compile the train step.')
_INIT = flags.DEFINE_bool('init', True, 'Compile the initialiser.')


def timed_compile(jitted, args):
  """(compiled, {trace, lower, compile: seconds}) of jitted(*args)."""
  t0 = time.perf_counter()
  traced = jitted.trace(*args)
  t1 = time.perf_counter()
  lowered = traced.lower()
  t2 = time.perf_counter()
  compiled = lowered.compile()
  t3 = time.perf_counter()
  return compiled, {'trace': t1 - t0, 'lower': t2 - t1, 'compile': t3 - t2}


def describe(name: str, compiled, seconds: dict, steps: int = 1) -> str:
  """What the compiled program launches per call (of `steps` train steps)."""
  module = kernels.read(compiled.as_text())
  found = kernels.parse(module)
  lines = [f'{name}: trace {seconds["trace"]:.1f} s, lower {seconds["lower"]:.1f} s, XLA compile '
           f'{seconds["compile"]:.1f} s; {sum(i.count for i in found if i.kind != "while")} kernel launches per '
           f'call, {len(found)} kernels in the program', kernels.format_counts(found),
           f'  {kernels.graphs(module)} (an ESTIMATE from the compiled text, by XLA\'s default command-buffer rules)']
  if any(i.kind == 'while' for i in found):
    lines.append('  loops recorded too (+WHILE, --xla_gpu_command_buffer_unroll_loops=true): '
                 f'{kernels.graphs(module, loops=True, unroll=True)}')
  gpu = gpu_targets.parse(_TOPOLOGY.value)[0]
  bandwidth = gpu.memory_bandwidth
  least = kernels.roofline(module, found, bandwidth, gpu.peak_flops)
  per_group = collections.Counter()
  for i in found:
    per_group[kernels.group(i.op_name)] += least.get(i.name, 0.0) * i.count * 1e3
  total = sum(per_group.values())
  lines.append(f'  least time per call (an ESTIMATE, a lower bound: bytes at {bandwidth / 1e12:.2f} TB/s or matmul '
               f'FLOPs at {gpu.peak_flops / 1e12:.0f} TFLOP/s per kernel, no launch cost): {total:.2f} ms'
               + (f' ({total / steps:.2f} ms a step)' if steps > 1 else '') + '; '
               + ', '.join(f'{g} {ms:.2f}' for g, ms in per_group.most_common()))
  loops = [i for i in found if i.kind == 'while']
  for i in loops:
    body = re.search(r'body=%?([\w.\-]+)', module.lines[i.name])
    lines.append(f'  while loop {i.name}: {i.trips} iterations, from {i.op_name[-100:]}; each iteration: '
                 f'{kernels.graphs(module, computation=body.group(1)) if body else "?"}')
  special = {
      'threefry (random bits) in': r'threefry|shift_right_logical.*xor|random_bits',
      'cumulative sum in': r'cumsum|reduce-window',
      'sort in': r' sort\(',
      'scatter in': r' scatter\(',
      'gather in': r' gather\(',
  }
  for label, pattern in special.items():
    hits = [i for i in found if re.search(pattern, module.fused(i.name) + i.op_name)]
    if hits:
      launches = collections.Counter()
      for i in hits:
        launches[kernels.group(i.op_name)] += i.count
      lines.append(f'  {label} {sum(launches.values())} launches per call: ' + ', '.join(
          f'{g} {n}' for g, n in launches.most_common()))
  return '\n'.join(lines)


def main(argv):
  del argv
  cfg = _CONFIG.value
  if _BATCH.value:
    cfg.batch_size = _BATCH.value
  if _LENGTH.value:
    cfg.data.max_seq_length = _LENGTH.value
  cfg.model.vocab_size = cfg.model.vocab_size or _VOCAB.value
  devices = gpu_targets.devices(_TOPOLOGY.value)
  c = aot.load_config(cfg, 'gpu')
  mesh = sharding.make_mesh(c.mesh, devices)
  m = c.model
  with scaffold.threefry_kernels():
    kernel = 'its CUDA kernel' if jax.config.jax_threefry_gpu_kernel_lowering else 'inline code'
  print(f'{_TOPOLOGY.value}: {devices[0].device_kind}; jax {jax.__version__}; prng {jax.config.jax_default_prng_impl}'
        f', threefry lowered as {kernel}; XLA_FLAGS='
        f'{os.environ.get("XLA_FLAGS", "")!r}; {m.num_layers} layers H={m.hidden_size} vocab={m.vocab_size} '
        f'dtype={m.dtype} attention={m.attention} dropout {m.dropout_rate}/{m.attention_dropout_rate} '
        f'({m.dropout_draw}) scan_layers={m.scan_layers}; batch {c.batch_size} x {c.data.max_seq_length}',
        flush=True)
  run = Pretraining(c, TRAINED_TOKENIZER_IDS, mesh)
  run.check_batch()
  if _STEP.value:
    k = c.steps_per_call
    with sharding.activate(mesh, c.mesh.rules), scaffold.threefry_kernels():  # as Pretraining.lower lowers it
      step, seconds = timed_compile(*run.jitted(k))
    dump('train_step', step)
    print(describe('train step' if k == 1 else f'{k} train steps in one call', step, seconds, k), flush=True)
  if _INIT.value:
    with scaffold.threefry_kernels():  # as Pretraining.init_state compiles it
      init, seconds = timed_compile(run._init.device, (run.abstract_key(),))  # pylint: disable=protected-access
    dump('init', init)
    print(describe('initialiser', init, seconds), flush=True)


def dump(name: str, compiled):
  if _DUMP.value:
    os.makedirs(_DUMP.value, exist_ok=True)
    with open(os.path.join(_DUMP.value, f'{name}.hlo.txt'), 'w', encoding='utf-8') as f:
      f.write(compiled.as_text())


if __name__ == '__main__':
  app.run(main)
