"""Per-device memory of the pre-training step on big meshes, from the compiler alone (nothing is allocated or run).

  python bench/compile_memory.py --config=configs/large.py --meshes=64,1,1:8,8,1:8,4,2 [--batch=2048] [--lower_only]

Without accelerators it fakes the devices on the CPU (XLA_FLAGS=--xla_force_host_platform_device_count=N, set
here before jax starts), so it answers "does large fit a 64-chip slice as data / FSDP / FSDP x tensor?" on a
laptop. The numbers are XLA's buffer assignment for the CPU backend: arguments (parameters, optimiser state, batch)
and outputs are exact; temporaries depend on the backend's fusion and scheduling, so treat them as an estimate of
what a TPU or GPU needs.
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _fake_devices(argv):
  """Sets the CPU device count to the largest mesh before jax is imported (a no-op if XLA_FLAGS already has one)."""
  meshes = next((a.split('=', 1)[1] for a in argv if a.startswith('--meshes=')), '64,1,1')
  count = max(int(__import__('numpy').prod([int(s) for s in m.split(',')])) for m in meshes.split(':'))
  if 'xla_force_host_platform_device_count' not in os.environ.get('XLA_FLAGS', ''):
    os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') +
                               f' --xla_force_host_platform_device_count={count}').strip()


_fake_devices(sys.argv)

from absl import app, flags  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
from ml_collections import config_flags  # pylint: disable=g-import-not-at-top,wrong-import-position

from electra_jax import config as config_lib, sharding  # pylint: disable=g-import-not-at-top,wrong-import-position
from electra_jax.masking import SpecialIds  # pylint: disable=g-import-not-at-top,wrong-import-position
from electra_jax.train_step import Pretraining  # pylint: disable=g-import-not-at-top,wrong-import-position

_CONFIG = config_flags.DEFINE_config_file('config', 'configs/large.py', 'Model config.')
_MESHES = flags.DEFINE_string('meshes', '64,1,1', 'Mesh shapes (data,fsdp,tensor), separated by ":".')
_BATCH = flags.DEFINE_integer('batch', 0, 'Global batch size (0: the config\'s).')
_VOCAB = flags.DEFINE_integer('vocab', 30522, 'Vocabulary size (when the config takes it from a tokenizer).')
_LOWER_ONLY = flags.DEFINE_bool('lower_only', False, 'Only lower (trace): no compile, no memory figures.')

SPECIAL = SpecialIds(pad=0, cls=2, sep=3, mask=4, unk=1)
GIB = 2 ** 30


def main(argv):
  del argv
  cfg = _CONFIG.value
  if _BATCH.value:
    cfg.batch_size = _BATCH.value
  m = cfg.model
  print(f'{jax.device_count()} x {jax.devices()[0].device_kind}, jax {jax.__version__}; model {m.num_layers} layers '
        f'H={m.hidden_size} E={m.embedding_size} dtype={m.dtype} remat={m.remat}; batch {cfg.batch_size} x '
        f'{cfg.data.max_seq_length}, grad_accum_steps {cfg.grad_accum_steps}')
  print('| mesh (data, fsdp, tensor) | arguments GiB | outputs GiB | aliased GiB | temporaries GiB | peak GiB '
        '| lower s | compile s |')
  print('|---|---|---|---|---|---|---|---|')
  for text in _MESHES.value.split(':'):
    cfg.mesh.shape = tuple(int(s) for s in text.split(','))
    c = config_lib.load(cfg, vocab_size=_VOCAB.value)
    mesh = sharding.make_mesh(c.mesh)
    start = time.perf_counter()
    lowered = Pretraining(c, SPECIAL, mesh).lower()
    lower_s = time.perf_counter() - start
    if _LOWER_ONLY.value:
      print(f'| {c.mesh.shape} | | | | | | {lower_s:.0f} | |', flush=True)
      continue
    start = time.perf_counter()
    stats = lowered.compile().memory_analysis()
    compile_s = time.perf_counter() - start
    args, outs = stats.argument_size_in_bytes, stats.output_size_in_bytes
    alias, temps = stats.alias_size_in_bytes, stats.temp_size_in_bytes
    # Donated state: outputs aliased to arguments take no extra space.
    peak = args + outs - alias + temps
    print(f'| {c.mesh.shape} | {args / GIB:.2f} | {outs / GIB:.2f} | {alias / GIB:.2f} | {temps / GIB:.2f} | '
          f'{peak / GIB:.2f} | {lower_s:.0f} | {compile_s:.0f} |', flush=True)


if __name__ == '__main__':
  app.run(main)
