"""Throughput of the ELECTRA pre-training step: tokens/s, step time, model FLOPs utilisation (MFU).

  python bench/step_throughput.py --config=configs/small.py --batch=32 --steps=10 [--vs_torch]

--vs_torch times the same step done with Hugging Face's PyTorch ElectraForMaskedLM + ElectraForPreTraining
(same sizes, same batch, tied embeddings, AdamW) in the same process and prints the ratio.
--profile=N traces N more steps with jax.profiler and prints the XLA operations that took the most time, summed
over the step (on CPU, run with XLA_FLAGS=--xla_cpu_enable_xprof_traceme=true so that XLA:CPU records them).
Peak FLOP/s: --peak_tflops, or a table of known accelerators; on CPU it is measured with a large matmul.
"""

import collections
import glob
import os
import re
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags
import jax
import jax.numpy as jnp
import numpy as np
from ml_collections import config_flags

from electra_jax import config as config_lib, flops, sharding
from electra_jax.masking import SpecialIds
from electra_jax.train_step import Pretraining

_CONFIG = config_flags.DEFINE_config_file('config', 'configs/small.py', 'Model config.')
_BATCH = flags.DEFINE_integer('batch', 32, 'Global batch size.')
_LENGTH = flags.DEFINE_integer('length', 0, 'Sequence length (0: the config\'s data.max_seq_length).')
_VOCAB = flags.DEFINE_integer('vocab', 30522, 'Vocabulary size.')
_STEPS = flags.DEFINE_integer('steps', 10, 'Timed steps (after 2 warm-up steps).')
_PEAK = flags.DEFINE_float('peak_tflops', 0.0, 'Peak dense TFLOP/s of one device for MFU (0: guess).')
_VS_TORCH = flags.DEFINE_bool('vs_torch', False, 'Also time the PyTorch/transformers step.')
_PROFILE = flags.DEFINE_integer('profile', 0, 'Trace this many more steps and print the costliest XLA operations.')

PEAK_TFLOPS = {'H100': 989.0, 'H200': 989.0, 'A100': 312.0, 'V100': 125.0, 'TPU v4': 275.0, 'TPU v5': 197.0}
SPECIAL = SpecialIds(pad=0, cls=2, sep=3, mask=4, unk=1)


def peak_flops_per_device(dtype: str) -> float:
  if _PEAK.value:
    return _PEAK.value * 1e12
  kind = jax.devices()[0].device_kind
  for name, tflops in PEAK_TFLOPS.items():
    if name.lower() in kind.lower():
      return tflops * 1e12 * (1.0 if dtype == 'bfloat16' else 0.5)
  # CPU: what XLA reaches on a large float32 matmul here stands in for the peak.
  x = jnp.ones((2048, 2048), jnp.float32)
  matmul = jax.jit(lambda a: a @ a)
  matmul(x).block_until_ready()
  start = time.perf_counter()
  for _ in range(5):
    matmul(x).block_until_ready()
  return 5 * 2 * 2048 ** 3 / (time.perf_counter() - start)


def random_batch(batch: int, length: int, vocab: int, seed: int = 0) -> dict[str, np.ndarray]:
  rng = np.random.default_rng(seed)
  ids = rng.integers(5, vocab, (batch, length)).astype(np.int32)
  ids[:, 0], ids[:, length // 2], ids[:, -1] = SPECIAL.cls, SPECIAL.sep, SPECIAL.sep
  segments = np.zeros_like(ids)
  segments[:, length // 2 + 1:] = 1
  return {'input_ids': ids, 'segment_ids': segments, 'input_mask': np.ones_like(ids)}


def time_jax(c, batch):
  run = Pretraining(c, SPECIAL, sharding.make_mesh(c.mesh))
  executable = run.compile()  # what step_fn runs from now on
  state = run.init_state(jax.random.PRNGKey(0))
  rng = jax.device_put(jax.random.key_data(jax.random.PRNGKey(1)), sharding.replicated(run.mesh))
  device_batch = sharding.global_batch(batch, run.batch_sharding)
  for _ in range(2):
    state, metrics = run.step_fn(state, device_batch, rng)
  jax.block_until_ready(metrics)
  start = time.perf_counter()
  for _ in range(_STEPS.value):
    state, metrics = run.step_fn(state, device_batch, rng)
  jax.block_until_ready(metrics)
  seconds = (time.perf_counter() - start) / _STEPS.value
  if _PROFILE.value:
    with tempfile.TemporaryDirectory() as trace:
      with jax.profiler.trace(trace):
        for _ in range(_PROFILE.value):
          state, metrics = run.step_fn(state, device_batch, rng)
        jax.block_until_ready(metrics)
      print_costliest_ops(glob.glob(os.path.join(trace, '**', '*.xplane.pb'), recursive=True)[0], _PROFILE.value,
                          executable.as_text())
  return seconds


def print_costliest_ops(xplane: str, steps: int, hlo: str, top: int = 25):
  """The XLA operations (thunks) with the most time per step in a trace, summed over every thread and call, each
  with its shape and the jax operation it came from (from the compiled HLO text `hlo`)."""
  where = {}
  for m in re.finditer(r'^\s*(?:ROOT )?%?([\w.\-]+) = (\S+) .*?op_name="([^"]*)"', hlo, re.MULTILINE):
    where.setdefault(m.group(1), f'{m.group(2)}  {m.group(3)[-90:]}')
  total = collections.Counter()
  for plane in jax.profiler.ProfileData.from_file(xplane).planes:
    for line in plane.lines:
      if line.name.startswith('tf_XLA'):  # XLA's thread pools; not the Python thread
        for event in line.events:  # the operations, not the pools' own events or waits
          if not event.name.startswith(('ThreadpoolListener', 'ThunkExecutor', 'SlinkyThreadPool', 'end: ')):
            total[event.name] += event.duration_ns / steps / 1e6
  print(f'costliest XLA operations, ms per step (summed over threads; all operations: {sum(total.values()):.1f}):')
  for name, ms in total.most_common(top):
    print(f'  {ms:8.1f}  {name:28s} {where.get(name, "")}')


def time_torch(c, batch):
  """The same step in PyTorch: HF generator + discriminator with tied embeddings, masking, sampling, AdamW."""
  import torch  # noqa: PLC0415
  import transformers  # noqa: PLC0415
  m = c.model
  gen, disc = m.tower(True), m.tower(False)
  common = dict(vocab_size=m.vocab_size, embedding_size=m.embedding_size, max_position_embeddings=
                m.max_position_embeddings, type_vocab_size=m.type_vocab_size, hidden_act='gelu')
  generator = transformers.ElectraForMaskedLM(transformers.ElectraConfig(
      hidden_size=gen.hidden_size, num_hidden_layers=gen.num_layers, num_attention_heads=gen.num_heads,
      intermediate_size=gen.intermediate_size, **common))
  discriminator = transformers.ElectraForPreTraining(transformers.ElectraConfig(
      hidden_size=disc.hidden_size, num_hidden_layers=disc.num_layers, num_attention_heads=disc.num_heads,
      intermediate_size=disc.intermediate_size, **common))
  discriminator.electra.embeddings = generator.electra.embeddings  # shared embeddings, as in ELECTRA
  params = {id(p): p for p in list(generator.parameters()) + list(discriminator.parameters())}.values()
  optimizer = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01, eps=1e-6)
  ids = torch.from_numpy(batch['input_ids']).long()
  segments = torch.from_numpy(batch['segment_ids']).long()
  mask = torch.from_numpy(batch['input_mask']).long()
  num_predictions = c.objective.num_predictions(ids.shape[1])

  def step():
    scores = torch.rand(ids.shape).masked_fill((ids == SPECIAL.cls) | (ids == SPECIAL.sep), -1.0)
    positions = scores.topk(num_predictions, dim=1).indices
    masked = ids.scatter(1, positions, SPECIAL.mask)
    logits = generator(input_ids=masked, attention_mask=mask, token_type_ids=segments).logits
    selected = logits.gather(1, positions[..., None].expand(-1, -1, logits.shape[-1]))
    targets = ids.gather(1, positions)
    gen_loss = torch.nn.functional.cross_entropy(selected.flatten(0, 1), targets.flatten())
    with torch.no_grad():
      gumbel = -torch.log(-torch.log(torch.rand_like(selected).clamp_min(1e-9)))
      samples = (selected + gumbel).argmax(-1)
    corrupted = ids.scatter(1, positions, samples)
    labels = (corrupted != ids).float()
    disc_logits = discriminator(input_ids=corrupted, attention_mask=mask, token_type_ids=segments).logits
    disc_loss = torch.nn.functional.binary_cross_entropy_with_logits(disc_logits, labels)
    loss = gen_loss + c.objective.disc_weight * disc_loss
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    optimizer.step()

  for _ in range(2):
    step()
  start = time.perf_counter()
  for _ in range(_STEPS.value):
    step()
  return (time.perf_counter() - start) / _STEPS.value


def main(argv):
  del argv
  cfg = _CONFIG.value
  cfg.batch_size = _BATCH.value
  if _LENGTH.value:
    cfg.data.max_seq_length = _LENGTH.value
  c = config_lib.load(cfg, vocab_size=_VOCAB.value)
  length = c.data.max_seq_length
  batch = random_batch(c.batch_size, length, c.model.vocab_size)
  step_flops = flops.pretraining_flops_per_step(c.model, c.batch_size, length, c.objective.num_predictions(length))
  peak = peak_flops_per_device(c.model.dtype) * jax.device_count()  # dtype 'auto' resolved for this device
  seconds = time_jax(c, batch)
  tokens = c.batch_size * length
  print(f'device: {jax.device_count()} x {jax.devices()[0].device_kind}; model: {c.model.num_layers} layers, '
        f'H={c.model.hidden_size}, E={c.model.embedding_size}, vocab={c.model.vocab_size}, dtype={c.model.dtype}; '
        f'batch {c.batch_size} x {length}')
  print(f'jax:   step {seconds * 1e3:.1f} ms, {tokens / seconds:,.0f} tokens/s, '
        f'{step_flops / seconds / 1e12:.3f} TFLOP/s model, MFU {step_flops / seconds / peak:.1%} '
        f'(peak {peak / 1e12:.2f} TFLOP/s)')
  if _VS_TORCH.value:
    torch_seconds = time_torch(c, batch)
    print(f'torch: step {torch_seconds * 1e3:.1f} ms, {tokens / torch_seconds:,.0f} tokens/s; '
          f'jax/torch speed ratio {torch_seconds / seconds:.2f}x')


if __name__ == '__main__':
  app.run(main)
