"""How fast this machine compiles right now: the median of 7 XLA:CPU compiles of one fixed program, in seconds.

The test suite is compile-bound, and on shared virtual machines its time drifts with the host's load: the same
code's README suite took 6 min 11 s and 3 min 54 s on 2-core machines of one kind on one day, and 4:51 to 6:18
on one machine within half an hour (docs/history.md, "The test suite's time"). Run this before and after
a timing and report it beside the figure; compare timings only at similar speeds. One run takes ~10 s; its median
varies ~15% from run to run on an idle machine. The program is a step of a stack of 24 dense blocks (RMS norm,
GELU MLP), its gradient and an Adam update, compiled with the test suite's XLA flags (tests/xla_flags.py).

  python bench/machine_speed.py
"""

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'tests'))
import xla_flags  # the test suite's flags (tests/xla_flags.py), set before jax loads

os.environ.setdefault('XLA_FLAGS', xla_flags.fast_compile())
os.environ.setdefault('JAX_PLATFORMS', 'cpu')

import jax
import jax.numpy as jnp
import optax

H, F, B, LAYERS = 64, 256, 16, 24
OPTIMIZER = optax.adam(1e-3)


def loss(params, x):
  for w1, w2, scale in params:
    h = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * scale
    x = x + jax.nn.gelu(h @ w1) @ w2
  return jnp.mean(jax.nn.log_softmax(x) ** 2)


def step(params, opt_state, x):
  grads = jax.grad(loss)(params, x)
  updates, opt_state = OPTIMIZER.update(grads, opt_state, params)
  return optax.apply_updates(params, updates), opt_state


def main(repeats: int = 7):
  params = [(jnp.ones((H, F)), jnp.ones((F, H)), jnp.ones((H,))) for _ in range(LAYERS)]
  args = params, OPTIMIZER.init(params), jnp.ones((B, H))
  seconds = []
  for _ in range(repeats):
    jax.clear_caches()  # or the second compile is a lookup
    lowered = jax.jit(step).lower(*args)
    start = time.perf_counter()
    lowered.compile()
    seconds.append(time.perf_counter() - start)
  print(f'compile seconds: median {statistics.median(seconds):.3f} (min {min(seconds):.3f}, max {max(seconds):.3f})')


if __name__ == '__main__':
  main()
