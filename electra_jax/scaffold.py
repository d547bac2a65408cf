"""What pre-training (electra_jax.train_step, electra_jax.trainer) and fine-tuning (electra_jax.finetune.train)
build alike around their step: the state's shardings and shapes, its sharded initialisation, the step jitted over
the mesh, and the loop's progress bar, "is it time?" for its periodic actions (`itstime`) and the timer of its
throughput (`Chrono`).

The batch is split as `sharding.batch_sharding` says and checked by `sharding.check_batch`; the loops stop on a
signal, every host at the same step, through `preemption.StopSignal`.
"""

import concurrent.futures
import contextlib
import os
import sys
import time
from typing import Any, Callable

import flax.linen as nn
import jax
import numpy as np
import tqdm

from electra_jax import report, sharding

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


# Where a fresh state is computed: ELECTRA_JAX_INIT=device jits the initialiser for the accelerators and writes each
# shard where it belongs; =host computes the whole state on this host's CPU, then copies each device its shards;
# =auto (the default) is host on GPUs for a state of at most HOST_INIT_MAX_BYTES, device otherwise (CPUs, TPUs, a
# state too big for one host). On one H200 XLA:GPU compiled ELECTRA-Small's jitted initialiser in 66 s, where
# XLA:CPU compiles it in about 2 s (../shared/gpu, 2026-11-26). Both draw the same random bits (threefry); the
# truncated-normal transform may round differently in the last bit.
HOST_INIT_MAX_BYTES = 8 * 2**30


class Initialiser:
  """`init_boxed` unboxed, computed where ELECTRA_JAX_INIT says, into the shardings of `abstract` (the abstract
  state `state_layout` gives); `device` is the jitted initialiser for the accelerators (what compile-only checks
  lower)."""

  def __init__(self, init_boxed: InitBoxed, abstract):
    self.unboxed = lambda rng: nn.meta.unbox(init_boxed(rng))
    self.shardings = jax.tree.map(lambda x: x.sharding, abstract)
    self.state_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(abstract))
    self.device = jax.jit(self.unboxed, out_shardings=self.shardings)
    self.host = jax.jit(self.unboxed)  # run where its input is: on the CPU

  def on_host(self) -> bool:
    """Whether to compute the state on the host (ELECTRA_JAX_INIT)."""
    where = os.environ.get('ELECTRA_JAX_INIT', 'auto')
    if where not in ('auto', 'host', 'device'):
      raise ValueError(f'ELECTRA_JAX_INIT={where!r}: expected auto, host or device')
    if where == 'auto':
      return jax.default_backend() == 'gpu' and _has_cpu() and self.state_bytes <= HOST_INIT_MAX_BYTES
    return where == 'host'

  def __call__(self, rng):
    if not self.on_host():
      with threefry_kernels():
        return self.device(rng)
    state = self.host(jax.device_put(rng, jax.local_devices(backend='cpu')[0]))
    return jax.tree.map(_place, state, self.shardings)


def _place(x, sharding):
  """Host array `x` laid over `sharding`: each device gets only its shard."""
  x = np.asarray(x)
  return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])


def compile_in_thread(what: str, compile_fn: Callable) -> concurrent.futures.Future:
  """Says `compiling what...` now and runs `compile_fn()` in a thread of its own; the Future's result is (what it
  returned, the line saying it compiled in N s), for the caller to print when it waits for it: a run that fails
  meanwhile ends with its own error line, not with the compile's. XLA compiles without holding the GIL, so the
  compile overlaps what the caller does next (the initial state, another compile)."""
  report.log(f'compiling {what}...')
  pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
  future = pool.submit(report.compiled, what, compile_fn)
  pool.shutdown(wait=False)  # the thread ends with the compile
  return future


def threefry_kernels():
  """A context in which jax lowers threefry on GPUs to its CUDA kernel rather than inline (the same bits; elsewhere
  nothing changes), unless JAX_THREEFRY_GPU_KERNEL_LOWERING says otherwise. XLA:GPU compiles far less code this
  way: ELECTRA-Small's initialiser for an H100 in 180 s instead of 965 s (a loaded 2-core CPU, no GPU:
  bench/gpu_kernels.py), its train step on an H200 in 53 s instead of 121 s (16 compiles at once), for a step
  1.2 ms slower there, within its noise (BENCHMARKS.md). The initialiser and the train step are lowered in it."""
  from jax._src import config as jax_config  # noqa: PLC0415  (no public context for it)
  state = getattr(jax_config, 'threefry_gpu_kernel_lowering', None)
  if state is None or 'JAX_THREEFRY_GPU_KERNEL_LOWERING' in os.environ:
    return contextlib.nullcontext()
  return state(True)


def _has_cpu() -> bool:
  """Whether jax runs its CPU backend beside the accelerators (not under JAX_PLATFORMS=cuda, say)."""
  try:
    return bool(jax.local_devices(backend='cpu'))
  except RuntimeError:
    return False


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


def itstime(step: int, every: int, last: int, steps: tuple[int, ...] = ()) -> bool:
  """Whether a periodic action (log, evaluate, checkpoint) is due after step `step`: every `every` steps, after the
  `last` step, and after each of `steps`."""
  return step % every == 0 or step == last or step in steps


class Chrono:
  """Seconds since `restart`, less those spent inside `paused()`: a throughput's time, with evaluation left out."""

  def __init__(self):
    self.restart()

  def restart(self):
    self._started, self._paused = time.time(), 0.0

  @contextlib.contextmanager
  def paused(self):
    began = time.time()
    try:
      yield
    finally:
      self._paused += time.time() - began

  def seconds(self) -> float:
    return time.time() - self._started - self._paused
