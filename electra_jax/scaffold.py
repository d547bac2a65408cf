"""What pre-training (electra_jax.train_step, electra_jax.trainer) and fine-tuning (electra_jax.finetune.train)
build alike around their step: the state's shardings and shapes, its sharded initialisation, the step jitted over
the mesh, and the loop's progress bar.

The batch is split as `sharding.batch_sharding` says and checked by `sharding.check_batch`; the loops stop on a
signal, every host at the same step, through `preemption.StopSignal`.
"""

import sys
from typing import Any, Callable

import flax.linen as nn
import jax
import tqdm

from electra_jax import sharding

# The shape of a raw (key_data) PRNG key. Shapes are worked out from it rather than from a real key: a real key is
# a concrete array, which cannot be made for a mesh of devices that are only described (electra_jax.aot).
# uint32[2] for jax's default threefry2x32; uint32[4] under JAX_DEFAULT_PRNG_IMPL=rbg or unsafe_rbg.
ABSTRACT_KEY = jax.eval_shape(lambda: jax.random.key_data(jax.random.PRNGKey(0)))

# init_boxed(raw key) -> a fresh training state whose leaves are still boxed with their logical axis names.
InitBoxed = Callable[[Any], Any]


def state_layout(mesh: jax.sharding.Mesh, rules, init_boxed: InitBoxed) -> tuple[Any, Any]:
  """The state `init_boxed` makes, traced once (nothing allocated): (its NamedShardings, from its logical axis
  names; its abstract state: shapes, dtypes and those shardings, for restoring checkpoints and compiling ahead).
  One trace of the initialiser, not one per use: tracing ELECTRA-Large's takes ~2 s on a CPU host."""
  boxed = jax.eval_shape(init_boxed, ABSTRACT_KEY)
  shardings = sharding.logical_shardings(mesh, rules, boxed)
  abstract = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), nn.meta.unbox(boxed),
                          shardings)
  return shardings, abstract


def init_fn(init_boxed: InitBoxed, shardings) -> Callable[[jax.Array], Any]:
  """`init_boxed` unboxed and jitted to write the state straight into `shardings` (no full copy on one host)."""
  return jax.jit(lambda rng: nn.meta.unbox(init_boxed(rng)), out_shardings=shardings)


def jit_step(step: Callable, shardings, batch_sharding: jax.sharding.NamedSharding):
  """`step(state, batch, rng) -> (state, metrics)` jitted over the mesh: the state stays in `shardings` and is
  donated (updated in place), the batch is split as `batch_sharding` says, the key and the metrics replicated."""
  replicated = sharding.replicated(batch_sharding.mesh)
  return jax.jit(step, in_shardings=(shardings, batch_sharding, replicated), out_shardings=(shardings, replicated),
                 donate_argnums=(0,))


def progress_bar(total: int, initial: int, desc: str) -> tqdm.tqdm:
  """Steps done out of `total`, on process 0 only: redrawn every second on a terminal, every 30 s into a log file
  (each redraw there is a line)."""
  return tqdm.tqdm(total=total, initial=initial, desc=desc, unit='step', dynamic_ncols=True,
                   disable=jax.process_index() != 0, mininterval=1.0 if sys.stderr.isatty() else 30.0)
