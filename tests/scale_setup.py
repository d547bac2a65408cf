"""The tiny pre-training run the scale tests share (test_sharding, test_precision, test_multihost and its worker).

One config, one batch built directly (no tokenizer), one initial state (initialised once, placed onto each mesh),
and a cache of runs keyed by mesh shape and config overrides, so every distinct program is compiled only once per
pytest process.
"""

import functools

import jax
import numpy as np

from configs import default
from electra_jax import config as config_lib, sharding
from electra_jax.train_step import Pretraining
from helpers import SPECIAL, override  # pylint: disable=g-bad-import-order

# V = 100 splits over 2 and 4 devices but not 8: the (1, 1, 8) mesh exercises the replicated-vocabulary fallback.
V, B, L = 100, 8, 16
LENGTHS = (16, 16, 12, 10, 16, 7, 16, 13)  # real tokens per row
STEPS = 10


def config(mesh_shape=(1, 1, 1), **overrides) -> config_lib.TrainConfig:
  """H = E = 32 (4 heads), 1 layer (a second one adds ~70% to every compile); generator H 16, 1 layer.
  `overrides`: dotted keys, e.g. {'model.dtype': ...}."""
  cfg = default.get_config()
  cfg.model.update(embedding_size=32, hidden_size=32, num_layers=1, num_heads=4, intermediate_size=64,
                   generator_hidden_fraction=0.5, max_position_embeddings=L)
  cfg.data.max_seq_length = L
  cfg.batch_size = B
  cfg.train_steps = 100
  cfg.optimizer.update(learning_rate=2e-3, warmup_steps=2)
  cfg.mesh.shape = mesh_shape
  return config_lib.load(override(cfg, overrides), vocab_size=V)


def numpy_batch() -> dict[str, np.ndarray]:
  """A fixed batch with a learnable pattern (each word is followed by one of a few words) and some padding."""
  r = np.random.RandomState(0)
  ids = np.zeros((B, L), np.int32)
  for i, n in enumerate(LENGTHS):
    ids[i, :n] = (np.arange(n) * 7 + 3 * i) % 20 + 10 + r.randint(0, 3, n)
    ids[i, 0], ids[i, n - 1] = SPECIAL.cls, SPECIAL.sep
  segments = np.zeros_like(ids)
  segments[:, L // 2:] = 1
  return {'input_ids': ids, 'segment_ids': segments * (ids > 0), 'input_mask': (ids > 0).astype(np.int32)}


def rng():
  return jax.random.key_data(jax.random.PRNGKey(1))


@functools.lru_cache(maxsize=None)
def pretraining(mesh_shape=(1, 1, 1), overrides=()) -> Pretraining:
  """A Pretraining on the first prod(mesh_shape) devices; `overrides` is a tuple of (dotted key, value)."""
  c = config(mesh_shape, **dict(overrides))
  return Pretraining(c, SPECIAL, sharding.make_mesh(c.mesh))


@functools.lru_cache(maxsize=None)
def initial_state():
  """The initial TrainState on the host (initialised once, on one device)."""
  return jax.tree.map(np.asarray, pretraining().init_state(jax.random.PRNGKey(0)))


def place(run: Pretraining, host_state):
  return jax.device_put(host_state, run.state_shardings)


# XLA:CPU compiles these tiny steps twice as fast with its older loop-fusion emitters (and -O0 LLVM); the program
# and its semantics are the same. Options an XLA version does not know fall back to the defaults.
FAST_CPU_COMPILE = {'xla_cpu_use_fusion_emitters': False, 'xla_backend_optimization_level': 0}


@functools.lru_cache(maxsize=None)
def compiled_step(mesh_shape=(1, 1, 1), overrides=()):
  """`pretraining(...).step_fn` compiled ahead of time: the same program (`Pretraining.lower` traces it with the
  mesh and rules active), called as step(state, batch, rng)."""
  lowered = pretraining(mesh_shape, overrides).lower()
  if jax.default_backend() == 'cpu':
    try:
      return lowered.compile(compiler_options=FAST_CPU_COMPILE)
    except Exception:  # pylint: disable=broad-except  (an option this XLA does not know)
      pass
  return lowered.compile()


def replicated_rng(run: Pretraining):
  return jax.device_put(rng(), sharding.replicated(run.mesh))


def host(tree):
  return jax.tree.map(np.asarray, tree)


@functools.lru_cache(maxsize=None)
def trained(mesh_shape=(1, 1, 1), overrides=(), steps=STEPS):
  """Runs `steps` steps from the initial state on the fixed batch; returns (per-step metrics as floats
  {name: (numerator, denominator)}, final state on the host)."""
  run, step = pretraining(mesh_shape, overrides), compiled_step(mesh_shape, overrides)
  state = place(run, initial_state())
  batch, key = sharding.global_batch(numpy_batch(), run.batch_sharding), replicated_rng(run)
  history = []
  for _ in range(steps):
    state, metrics = step(state, batch, key)
    history.append(metrics)
  history = [{k: (float(n), float(d)) for k, (n, d) in m.items()} for m in jax.device_get(history)]
  return history, host(state)


def losses(history) -> np.ndarray:
  return np.array([m['loss'][0] for m in history])


# Every mesh computes the same float32 math with different reduction orders (per-device partial sums combined by
# all-reduce / reduce-scatter, split matmuls): each sum may differ by a few ulps (float32 eps 1.2e-7), and 10 Adam
# steps carry that along (Adam divides by sqrt(v): it rescales rather than amplifies a relative error). Measured on
# XLA:CPU: at most 3e-7 relative on losses and gradient norms, 1.5e-7 absolute on parameters. RTOL = 1e-5 leaves
# headroom for other backends and is still far below what a real bug does (a wrong mask, a missing all-reduce or a
# mis-sharded update moves the loss by > 1e-2).
RTOL = 1e-5
ATOL_PARAMS = 1e-6


def assert_same_run(history, state, reference, reference_state):
  """Same losses and gradient norms (RTOL), identical counts, parameters equal to float32 rounding."""
  np.testing.assert_allclose(losses(history), losses(reference), rtol=RTOL)
  np.testing.assert_allclose([m['grad_norm'][0] for m in history], [m['grad_norm'][0] for m in reference],
                             rtol=RTOL)
  # Counts are exact: the same positions are masked and the same tokens sampled on every mesh.
  for name in ('gen_accuracy', 'disc_accuracy', 'replaced_fraction', 'sampled_original'):
    assert [m[name] for m in history] == [m[name] for m in reference], name
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL_PARAMS), state.params,
               reference_state.params)
