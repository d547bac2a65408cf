"""GPU presets of the scale configs: `--config=configs/large.py:gpu` (one node of 8 GPUs of 80 GB, H100 or A100)
or `--config=configs/large.py:gpu:N` (N such GPUs, e.g. gpu:16 for two nodes, gpu:1 for one).

A preset keeps the paper's recipe (global batch, learning rate, steps) and data-parallel mesh, and sets how many
micro-batches a step is summed over (`grad_accum_steps`, same result, less memory) so that each GPU holds at most
`max_rows` sequences at a time. Each config's `max_rows` is the largest micro-batch per GPU that compiled for H100s
with at least 20% headroom in the share of memory JAX preallocates (75% of 80 GB: 59.3 GiB), see BENCHMARKS.md
("Does it fit on GPUs?"); check another choice before renting GPUs with
`python -m electra_jax.aot --config=configs/large.py:gpu:16 --topology=h100:2x8`.
`model.dtype` stays 'auto': bfloat16 on a GPU.
"""


def apply(config, preset: str, max_rows: int, remat: str = '', others: str = ''):
  """`config` with the GPU preset `preset` ('' leaves it as it is) for GPUs holding `max_rows` sequences each, and
  `model.remat` set to `remat` when one is given (the policy the GPU compiles chose). `others`: the config file's
  other presets, for the message naming them."""
  if not preset:
    return config
  name, _, count = preset.partition(':')
  if name != 'gpu' or not (count or '8').isdigit() or int(count or '8') < 1:
    raise ValueError(f'unknown preset {preset!r}: use {others}gpu (one node of 8 GPUs) or gpu:N (N GPUs), e.g. '
                     'configs/large.py:gpu:16')
  gpus = int(count or '8')
  if config.batch_size % gpus:
    raise ValueError(f'the batch of {config.batch_size} sequences does not split over {gpus} GPUs: use a number '
                     'of GPUs that divides it')
  if remat:
    config.model.remat = remat
  rows = config.batch_size // gpus
  # The fewest micro-batches (the least per-step overhead) whose rows fit; each micro-batch splits evenly.
  config.grad_accum_steps = next(k for k in range(1, rows + 1) if rows % k == 0 and rows // k <= max_rows)
  return config
