"""The fine-tuning optimiser: ELECTRA's AdamW with layer-wise learning-rate decay, and the official schedule
lr * min(1, t / w) * (1 - t / T) with w = warmup_fraction * T: the 10% warm-up overlaps the linear decay (the peak,
at t = w, is 0.9 lr), exactly as pre-training's and as the official run_finetuning.py / model/optimization.py.

Layer-wise decay (ELECTRA paper, appendix): with L encoder layers, the task head has depth L+2, encoder layer i
depth i+1 and the embeddings (with `embeddings_project`) depth 0; a parameter's learning rate is
lr * decay^(L+2-depth). It is an `optax.multi_transform` that scales each depth group's update (weight decay
included, as the official optimiser scales both) by its multiplier.
"""

import re

import jax
import optax

from electra_jax import optimizer as pretrain_optimizer
from electra_jax.finetune.config import OptimizerConfig


def _names(path) -> list[str]:
  # Only dict keys name parameters (a boxed nn.Partitioned adds an attribute key after them).
  return [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]


def depth(names: list[str], num_layers: int) -> int:
  """Depth of the parameter at `names` (its dict keys from the root of the params tree)."""
  if names[0] == 'embeddings' or 'embeddings_project' in names:
    return 0
  for name in names:
    match = re.fullmatch(r'layer_(\d+)', name)
    if match and 'encoder' in names:
      return int(match.group(1)) + 1
  return num_layers + 2


def depths(params, num_layers: int):
  """The tree of `depth`s, shaped like `params` (boxed or not)."""
  return jax.tree_util.tree_map_with_path(lambda path, _: depth(_names(path), num_layers), params)


def layerwise_decay(num_layers: int, decay: float) -> optax.GradientTransformation:
  """Scales each parameter's update by decay^(L+2-depth); stateless."""
  def labels(tree):
    return jax.tree.map(lambda d: f'depth_{d}', depths(tree, num_layers))
  scales = {f'depth_{d}': optax.scale(decay ** (num_layers + 2 - d)) for d in range(num_layers + 3)}
  return optax.multi_transform(scales, labels)


def learning_rate_schedule(learning_rate: float, total_steps: int, warmup_fraction: float) -> optax.Schedule:
  """lr * min(1, t / w) * (1 - t / T), w = warmup_fraction * T (not rounded: the official code divides by it)."""
  return pretrain_optimizer.warmup_linear_decay(learning_rate, warmup_fraction * total_steps, max(total_steps, 1))


def make_optimizer(config: OptimizerConfig, num_layers: int, total_steps: int):
  """(optax transformation, schedule). `config` must be resolved (`OptimizerConfig.for_model`)."""
  schedule = learning_rate_schedule(config.learning_rate, total_steps, config.warmup_fraction)
  tx = optax.chain(pretrain_optimizer.adamw(config, schedule), layerwise_decay(num_layers, config.layerwise_lr_decay))
  return tx, schedule
