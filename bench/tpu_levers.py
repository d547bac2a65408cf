"""Performance levers judged by the TPU compiler: the same config compiled with and without a change.

  python bench/tpu_levers.py --config=configs/small.py --topology=v3:2x2 --config.model.num_layers=2 \
      --levers=baseline,no_dropout,no_attention_dropout,dot_product_attention,float32

Results (BENCHMARKS.md) are from fewer layers where the question is per layer: the compile is then minutes.

Each lever is compiled for the slice by `electra_jax.aot` and reported as the compiler's estimated step time,
compiled FLOPs, per-device peak HBM and compile time (estimates of the compiler's cost model, not measurements):
  baseline               the config as it is;
  no_dropout             hidden and attention dropout 0: what drawing the dropout masks costs;
  no_attention_dropout   attention dropout 0 only (jax.nn.dot_product_attention has no dropout);
  dot_product_attention  attention dropout 0 and jax.nn.dot_product_attention in place of the einsum form;
  scan_layers            model.scan_layers: one nn.scan over the encoder layers instead of unrolled layers;
  float32                model.dtype=float32 (the baseline is the TPU's 'auto': bfloat16).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from electra_jax import aot  # sets JAX_PLATFORMS first

from absl import app, flags
import jax

from electra_jax import model

_AOT = aot.define_flags()  # --config and --topology (and the fine-tuning flags, unused here)
_LEVERS = flags.DEFINE_list('levers', 'baseline,no_dropout,dot_product_attention', 'Variants to compile.')


def dot_product_attention(self, x, pad, rows, *, deterministic: bool):
  """SelfAttention.__call__ through jax.nn.dot_product_attention (no attention dropout: it has none)."""
  del rows, deterministic
  c, t = self.config, self.tower
  batch, length = pad.bias.shape[0], pad.bias.shape[-1]
  head_dim = t.hidden_size // t.num_heads
  split = lambda y: model.constrain(y.reshape(batch, length, t.num_heads, head_dim),
                                    ('activation_batch', 'activation_length', 'activation_heads', None))
  q, k, v = (split(model.dense(t.hidden_size, c, ('embed', 'heads'), n)(x)) for n in ('query', 'key', 'value'))
  context = jax.nn.dot_product_attention(q, k, v, mask=pad.bias > -1)  # [batch, 1, 1, length]: 1 = token
  return model.constrain(context.reshape(x.shape[0], t.hidden_size), ('activation_batch', 'activation_heads'))


def main(argv):
  del argv
  hw = aot.chip(_AOT['topology'].value)
  devices = aot.topology_devices(_AOT['topology'].value)
  einsum_attention = model.SelfAttention.__call__
  print('| lever | estimated step ms | compiled TFLOPs per step | peak GiB per device | compile s |')
  print('|---|---|---|---|---|')
  for lever in _LEVERS.value:
    cfg = _AOT['config'].value.copy_and_resolve_references()
    if lever in ('no_dropout', 'no_attention_dropout', 'dot_product_attention'):
      cfg.model.attention_dropout_rate = 0.0
    if lever == 'no_dropout':
      cfg.model.dropout_rate = 0.0
    if lever == 'scan_layers':
      cfg.model.scan_layers = True
    if lever == 'float32':
      cfg.model.dtype = 'float32'
    model.SelfAttention.__call__ = (dot_product_attention if lever == 'dot_product_attention'
                                    else einsum_attention)
    c = aot.load_config(cfg)
    mesh = aot.sharding.make_mesh(c.mesh, devices)
    r = aot.pretraining_report(c, mesh)
    if r.error:
      print(f'| {lever} | does not fit: {r.error} | | | {r.compile_seconds:.0f} |', flush=True)
      continue
    print(f'| {lever} | {r.estimated_seconds * 1e3:.2f} | {r.compiled_flops * r.devices / 1e12:.2f} | '
          f'{r.peak_bytes / aot.GIB:.2f} of {hw.hbm_bytes / aot.GIB:.0f} | {r.compile_seconds:.0f} |', flush=True)


if __name__ == '__main__':
  app.run(main)
