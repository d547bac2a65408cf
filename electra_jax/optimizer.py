"""The ELECTRA optimiser: Adam(W) with decoupled weight decay, global-norm clipping and warmup x linear decay."""

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from electra_jax.config import AdamConfig, OptimizerConfig


def warmup_linear_decay(learning_rate: float, warmup_steps: float, total_steps: int) -> optax.Schedule:
  """lr * min(1, t / warmup) * (1 - t / T): warm-up and linear decay overlap, as in the official code
  (model/optimization.py); `warmup_steps` may be fractional (fine-tuning's 10% of T), 0 means none."""
  decay = optax.linear_schedule(learning_rate, 0.0, total_steps)

  def schedule(step):
    if not warmup_steps:
      return decay(step)
    return decay(step) * jnp.minimum(1.0, step / warmup_steps)
  return schedule


def learning_rate_schedule(config: OptimizerConfig, train_steps: int) -> optax.Schedule:
  """Pre-training's schedule: `warmup_linear_decay` over config.warmup_steps."""
  return warmup_linear_decay(config.learning_rate, config.warmup_steps, train_steps)


class ScaleByAdamState(NamedTuple):
  mu: optax.Updates
  nu: optax.Updates


def scale_by_adam_without_bias_correction(b1: float, b2: float, eps: float) -> optax.GradientTransformation:
  """Adam's update m / (sqrt(v) + eps) without bias correction, as ELECTRA's AdamWeightDecayOptimizer does.

  optax.scale_by_adam always corrects the moments; this is the same transform with the correction removed.
  """

  def init(params):
    zeros = lambda p: jnp.zeros_like(p, dtype=jnp.float32)
    return ScaleByAdamState(jax.tree.map(zeros, params), jax.tree.map(zeros, params))

  def update(updates, state, params=None):
    del params
    mu = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state.mu, updates)
    nu = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * jnp.square(g), state.nu, updates)
    updates = jax.tree.map(lambda m, v: m / (jnp.sqrt(v) + eps), mu, nu)
    return updates, ScaleByAdamState(mu, nu)
  return optax.GradientTransformation(init, update)


def decay_mask(params):
  """True for parameters that get weight decay: everything but LayerNorm parameters and biases (and FlatParams'
  vectors of them)."""
  def decays(path, _):
    # Only dict keys name parameters (a boxed nn.Partitioned adds an attribute key after them).
    names = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
    return not ('LayerNorm' in names or names[-1] in ('bias', NO_DECAY))
  return jax.tree_util.tree_map_with_path(decays, params)


DECAY, NO_DECAY = 'decay', 'no_decay'  # FlatParams' two groups of vectors
# The most elements of a NO_DECAY vector. XLA:GPU fuses a slice of a vector into the kernels that read it only while
# the vector is small: for an H100 (jax 0.10.2, compiled without a GPU), a LayerNorm's scale and bias sliced from a
# vector of 65,540 float32 fused into the LayerNorm's kernels, from one of 70,000 each stayed a kernel of its own.
# ELECTRA-Small's ~82k biases and LayerNorm parameters: in one vector 102 slices were kernels of their own a step, in
# two none since the biases are added in float32 and kept out of jax.checkpoint (model.add_bias, model.biased_gelu).
NO_DECAY_CHUNK = 65536


class FlatParams:
  """Parameters stored as a few float32 vectors, {DECAY: (the weights with weight decay,), NO_DECAY: (the biases and
  LayerNorm parameters, in vectors of at most `chunk` elements but for a larger leaf alone)}, each the concatenation
  of its leaves in tree order: what the pre-training step keeps in its state on GPUs (optimizer.flat_params). The
  optimiser then updates a few arrays, not one per leaf: on a GPU, one kernel each rather than ~390 small ones a
  step for ELECTRA-Small (XLA:GPU fuses no independent updates together). The update of every element is the same
  arithmetic: the same values. `unravel` gives the tree back as slices, which XLA fuses into their readers (the
  weights' casts to bfloat16 become a few kernels, each casting the slices of one size); `ravel` concatenates a tree
  of that structure (the gradients: one copy, read by the norm and the update). For replicated parameters only:
  concatenating sharded leaves would gather them. (jax.flatten_util.ravel_pytree makes one vector, and its unravel
  from values; this layout is a few, made from shapes.)"""

  def __init__(self, params, chunk: int | None = None):
    """`params`: the parameter tree (arrays or ShapeDtypeStructs) whose layout this is; `chunk`: the most elements
    of a NO_DECAY vector (None: NO_DECAY_CHUNK)."""
    chunk = chunk or NO_DECAY_CHUNK
    leaves, self.treedef = jax.tree.flatten(params)
    if any(x.dtype != jnp.float32 for x in leaves):
      raise ValueError('FlatParams stores float32 parameters only')
    self.shapes = [x.shape for x in leaves]
    decays = jax.tree.leaves(decay_mask(params))
    chunks, filled = [[]], 0
    for i in (i for i, d in enumerate(decays) if not d):
      size = math.prod(self.shapes[i])
      if chunks[-1] and filled + size > chunk:
        chunks, filled = [*chunks, []], 0
      chunks[-1].append(i)
      filled += size
    # {group: [the leaves' indices of each vector]}
    self.groups = {DECAY: [[i for i, d in enumerate(decays) if d]], NO_DECAY: chunks}
    self.flat_treedef = jax.tree.structure({group: (0,) * len(vectors) for group, vectors in self.groups.items()})
    self._where = [None] * len(leaves)  # leaf i: (its group, its vector's index there, its first element)
    for group, vectors in self.groups.items():
      for k, indices in enumerate(vectors):
        start = 0
        for i in indices:
          self._where[i] = (group, k, start)
          start += math.prod(self.shapes[i])

  def ravel(self, tree) -> dict[str, tuple[jax.Array, ...]]:
    """{DECAY, NO_DECAY: vectors} of `tree`'s leaves (in float32)."""
    leaves = self.treedef.flatten_up_to(tree)
    return {group: tuple(jnp.concatenate([jnp.ravel(leaves[i]).astype(jnp.float32) for i in indices] or
                                         [jnp.zeros((0,), jnp.float32)]) for indices in vectors)
            for group, vectors in self.groups.items()}

  def unravel(self, flat: dict[str, tuple[jax.Array, ...]]):
    """The tree that `ravel` made `flat` of."""
    leaves = [flat[group][k][start:start + math.prod(shape)].reshape(shape)
              for (group, k, start), shape in zip(self._where, self.shapes)]
    return jax.tree.unflatten(self.treedef, leaves)

  def ravel_state(self, tree):
    """`tree` (a TrainState, an optimiser state) with every subtree shaped like the parameters raveled."""
    return _map_subtrees(self.ravel, tree, self.treedef)

  def unravel_state(self, tree):
    """The inverse of `ravel_state`."""
    return _map_subtrees(self.unravel, tree, self.flat_treedef)


def _map_subtrees(fn, tree, treedef):
  """`tree` with `fn` applied to each of its subtrees of structure `treedef`, the rest as it is."""
  matches = lambda x: jax.tree.structure(x) == treedef
  return jax.tree.map(lambda x: fn(x) if matches(x) else x, tree, is_leaf=matches)


def global_norm(tree, flat: bool = False) -> jax.Array:
  """The L2 norm of all of `tree`'s leaves (optax.tree.norm). `flat`: the norm of their concatenation in float32,
  which XLA reduces in a few kernels where the sum over leaves takes one per leaf (~420 of a Small step's ~2,600 on
  a GPU), for a float32 copy of the leaves while it runs. Only for replicated leaves: concatenating sharded ones
  would gather them."""
  if not flat:
    return optax.tree.norm(tree)
  every = jnp.concatenate([jnp.ravel(x).astype(jnp.float32) for x in jax.tree.leaves(tree)])
  return jnp.sqrt(jnp.sum(every * every))


def clip_by_global_norm(max_norm: float, flat: bool = False) -> optax.GradientTransformation:
  """optax.clip_by_global_norm; `flat`: the same clip (and empty state) with `global_norm(updates, flat=True)`."""
  if not flat:
    return optax.clip_by_global_norm(max_norm)

  def update(updates, state, params=None):
    del params
    norm = global_norm(updates, flat=True)
    clip = lambda u: jax.lax.select(norm < max_norm, u, (u / norm.astype(u.dtype)) * max_norm)
    return jax.tree.map(clip, updates), state
  return optax.GradientTransformation(optax.init_empty_state, update)


def adamw(config: AdamConfig, schedule: optax.Schedule, flat_norm: bool = False) -> optax.GradientTransformation:
  """Clip by global norm (`global_norm(grads, flat_norm)`), Adam (bias-corrected or not), decoupled weight decay off
  LayerNorm/biases, -lr."""
  if config.bias_correction:
    adam = optax.scale_by_adam(config.b1, config.b2, config.eps)
  else:
    adam = scale_by_adam_without_bias_correction(config.b1, config.b2, config.eps)
  return optax.chain(
      clip_by_global_norm(config.clip_norm, flat_norm),
      adam,
      optax.add_decayed_weights(config.weight_decay, mask=decay_mask),
      optax.scale_by_learning_rate(schedule),
  )


def make_optimizer(config: OptimizerConfig, train_steps: int, flat_norm: bool = False):
  """Returns (optax transformation, learning-rate schedule); `flat_norm`: see `adamw`."""
  schedule = learning_rate_schedule(config, train_steps)
  return adamw(config, schedule, flat_norm), schedule
