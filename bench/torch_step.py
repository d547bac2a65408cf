"""The ELECTRA pre-training step in PyTorch with Hugging Face's models: the anchor `bench/step_throughput.py
--vs_torch` runs in a process of its own (so that JAX's preallocation of GPU memory does not starve it).

  python bench/torch_step.py --config=configs/small.py --batch=128 --length=128 --steps=20

As a PyTorch user would write it: ElectraForMaskedLM + ElectraForPreTraining with shared embeddings, the same
sizes, dropout rates, batch, masking (15%, [CLS]/[SEP] never), loss weights, AdamW with global-norm clipping, and
the same work as the JAX step: the generator's MLM head (its parameters, called as HF's forward calls them) only at
the selected positions, samples by Gumbel-max (the JAX step's objective.sampling draws from the same distribution
by its inverse CDF: the same [batch, selected, vocab] work), and no attention mask where the batch has no padding
(HF's SDPA path would check it on the host every forward). On a GPU: bf16 autocast where the JAX step computes in
bfloat16 there, the fused AdamW and SDPA attention, and the attention dropout the JAX step has there (none where
model.attention=auto fuses it, as configs/small.py on a GPU). Only the `electra` objective, one micro-batch a step,
embeddings tied as the paper ties them (refused otherwise). Prints one line `torch: step ... ms, ... tokens/s,
...`, then the same numbers as `RESULT {json}` for the programs that read them (bench/step_throughput.py).
"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The config is read with electra_jax, which asks jax for its platform: on the CPU, so that jax takes no GPU memory.
os.environ['JAX_PLATFORMS'] = 'cpu'

from absl import app, flags
from ml_collections import config_flags

from electra_jax import config as config_lib
import synthetic

_CONFIG = config_flags.DEFINE_config_file('config', 'configs/small.py', 'Model config.')
_BATCH = flags.DEFINE_integer('batch', 32, 'Global batch size.')
_LENGTH = flags.DEFINE_integer('length', 0, 'Sequence length (0: the config\'s data.max_seq_length).')
_VOCAB = flags.DEFINE_integer('vocab', 30522, 'Vocabulary size.')
_STEPS = flags.DEFINE_integer('steps', 10, 'Timed steps (after 3 warm-up steps).')
_COMPILE = flags.DEFINE_bool('compile', False, 'torch.compile the two models.')


def time_torch(c, batch_size: int, length: int, steps: int, compile_models: bool = False) -> dict:
  """Seconds per step and peak GPU memory of the PyTorch step for TrainConfig `c`."""
  import torch  # noqa: PLC0415  (imported only here: the JAX side of the bench never needs it)
  import transformers  # noqa: PLC0415
  dev = 'cuda' if torch.cuda.is_available() else 'cpu'
  bf16 = dev == 'cuda' and c.model.dtype == 'bfloat16'
  m = c.model
  gen, disc = m.tower(True), m.tower(False)
  common = dict(vocab_size=m.vocab_size, embedding_size=m.embedding_size, max_position_embeddings=
                m.max_position_embeddings, type_vocab_size=m.type_vocab_size, hidden_act='gelu',
                hidden_dropout_prob=m.dropout_rate, attention_probs_dropout_prob=m.attention_dropout_rate,
                attn_implementation='sdpa')
  generator = transformers.ElectraForMaskedLM(transformers.ElectraConfig(
      hidden_size=gen.hidden_size, num_hidden_layers=gen.num_layers, num_attention_heads=gen.num_heads,
      intermediate_size=gen.intermediate_size, **common)).to(dev)
  discriminator = transformers.ElectraForPreTraining(transformers.ElectraConfig(
      hidden_size=disc.hidden_size, num_hidden_layers=disc.num_layers, num_attention_heads=disc.num_heads,
      intermediate_size=disc.intermediate_size, **common)).to(dev)
  discriminator.electra.embeddings = generator.electra.embeddings  # shared embeddings, as in ELECTRA
  params = list({id(p): p for p in list(generator.parameters()) + list(discriminator.parameters())}.values())
  o = c.optimizer
  optimizer = torch.optim.AdamW(params, lr=o.learning_rate, weight_decay=o.weight_decay, eps=o.eps,
                                betas=(o.b1, o.b2), fused=dev == 'cuda')
  batch = synthetic.random_batch(batch_size, length, m.vocab_size)  # the JAX step's
  ids, segments, mask = (torch.from_numpy(batch[key]).long().to(dev) for key in ('input_ids', 'segment_ids',
                                                                               'input_mask'))
  mask = None if batch['input_mask'].all() else mask
  special = synthetic.SPECIAL
  num_predictions = c.objective.num_predictions(length)
  gen_f, disc_f = ((torch.compile(generator.electra), torch.compile(discriminator)) if compile_models
                   else (generator.electra, discriminator))

  def step():
    with torch.autocast(dev, dtype=torch.bfloat16, enabled=bf16):
      scores = torch.rand(ids.shape, device=dev).masked_fill((ids == special.cls) | (ids == special.sep), -1.0)
      positions = scores.topk(num_predictions, dim=1).indices
      masked = ids.scatter(1, positions, special.mask)
      hidden = gen_f(input_ids=masked, attention_mask=mask, token_type_ids=segments).last_hidden_state
      hidden = hidden.gather(1, positions[..., None].expand(-1, -1, hidden.shape[-1]))
      selected = generator.generator_lm_head(generator.generator_predictions(hidden)).float()
      targets = ids.gather(1, positions)
      gen_loss = torch.nn.functional.cross_entropy(selected.flatten(0, 1), targets.flatten())
      with torch.no_grad():
        gumbel = -torch.log(-torch.log(torch.rand_like(selected).clamp_min(1e-9)))
        samples = (selected / c.objective.temperature + gumbel).argmax(-1)
      corrupted = ids.scatter(1, positions, samples)
      labels = (corrupted != ids).float()
      disc_logits = disc_f(input_ids=corrupted, attention_mask=mask, token_type_ids=segments).logits.float()
      disc_loss = torch.nn.functional.binary_cross_entropy_with_logits(disc_logits, labels)
      loss = c.objective.gen_weight * gen_loss + c.objective.disc_weight * disc_loss
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, o.clip_norm)
    optimizer.step()
    return loss

  sync = torch.cuda.synchronize if dev == 'cuda' else (lambda: None)
  start = time.perf_counter()
  for _ in range(3):
    step()
  sync()
  warm = time.perf_counter() - start
  start = time.perf_counter()
  for _ in range(steps):
    loss = step()
  sync()
  seconds = (time.perf_counter() - start) / steps
  return {'seconds': seconds, 'warm_up': warm, 'device': torch.cuda.get_device_name() if dev == 'cuda' else 'cpu',
          'peak_gib': torch.cuda.max_memory_allocated() / 2**30 if dev == 'cuda' else 0.0,
          'loss': float(loss.detach()),
          'versions': f'torch {torch.__version__}, transformers {transformers.__version__}'}


def main(argv):
  del argv
  cfg = _CONFIG.value
  cfg.batch_size = _BATCH.value
  if _LENGTH.value:
    cfg.data.max_seq_length = _LENGTH.value
  import torch  # noqa: PLC0415
  if torch.cuda.is_available():  # the config is loaded for jax's CPU (above): take what the JAX step does on a GPU
    gpu = config_lib.for_platform(cfg.model, 'gpu')
    cfg.model.attention_dropout_rate, cfg.model.dtype = gpu['attention_dropout_rate'], gpu['dtype']
  c = config_lib.load(cfg, vocab_size=_VOCAB.value)
  if (c.objective.name, c.grad_accum_steps, c.model.tying) != ('electra', 1, 'embeddings'):
    sys.exit(f'torch_step models the electra objective, one micro-batch a step and tied embeddings; this config has '
             f'{c.objective.name}, grad_accum_steps={c.grad_accum_steps}, model.tying={c.model.tying}')
  length = c.data.max_seq_length
  r = time_torch(c, c.batch_size, length, _STEPS.value, _COMPILE.value)
  print(f'torch{"+compile" if _COMPILE.value else ""}: step {r["seconds"] * 1e3:.1f} ms, '
        f'{c.batch_size * length / r["seconds"]:,.0f} tokens/s on {r["device"]}, peak {r["peak_gib"]:.2f} GiB, '
        f'warm-up {r["warm_up"]:.1f} s, loss {r["loss"]:.3f}, {r["versions"]}', flush=True)
  print('RESULT ' + json.dumps(r), flush=True)


if __name__ == '__main__':
  app.run(main)
