"""The training state, its sharded initialisation, and the one jitted `train_step`.

`train_step(state, batch, rng) -> (state, metrics)` is a pure function of its arguments; `Pretraining` closes
it over the static pieces (model, optimiser, objective config) and compiles it once with explicit in/out
shardings over the mesh and a donated state, tracing it with the mesh and the logical axis rules active so the
model's activation constraints apply.
"""

import dataclasses
import functools
import os
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import traverse_util

from electra_jax import masking, objective, optimizer, scaffold, sharding
from electra_jax.config import ConfigError, ModelConfig, ObjectiveConfig, TrainConfig
from electra_jax.model import Electra, dropout_rngs
from electra_jax.scaffold import ABSTRACT_KEY


@flax.struct.dataclass
class TrainState:
  step: jax.Array  # int32 scalar: optimiser steps taken so far
  params: Any
  opt_state: Any


def train_step(state: TrainState, batch, rng, *, model: Electra, tx: optax.GradientTransformation,
               schedule: optax.Schedule, config: ObjectiveConfig, special: masking.SpecialIds, train_steps: int,
               grad_accum_steps: int = 1, flat_norm: bool = False, flat: optimizer.FlatParams | None = None):
  """One optimiser step on a batch {input_ids, segment_ids, input_mask} of [batch, length] int32 arrays.

  `rng` is the run's base key; this step's randomness (masking, sampling, dropout) is `fold_in(rng, step)`, and
  the objective's schedules (temperature, lambda) read step / `train_steps`, so a resumed run draws and weighs
  exactly what an uninterrupted one would. With `grad_accum_steps` k > 1 the gradient is summed over k
  micro-batches of batch/k rows, equal (up to float rounding) to the one-batch gradient. With `flat`, the state's
  parameters and moments are stored as `flat` lays them out (`flat.ravel_state`); the same step.
  """
  rng = jax.random.fold_in(rng, state.step)
  progress = state.step / train_steps
  def apply_fn(params, *args, rngs=None, **kwargs):
    return model.apply({'params': params}, *args, rngs=dropout_rngs(rngs, model.config.dropout_draw), **kwargs)
  two_stage = config.two_stage_generator_steps > 0
  spec = objective.get(config.name)
  params, loss, metrics_fn = at_step(state, config, model.config, flat)
  if grad_accum_steps == 1:
    loss_fn = functools.partial(loss, apply_fn, batch=batch, rng=rng, config=config, special=special,
                                vocab_size=model.config.vocab_size, progress=progress)
    (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
  else:  # every objective's loss is a ratio of sums that micro-batches can share
    grads, metrics = accumulate_gradients(apply_fn, params, batch, rng, config=config, special=special,
                                          vocab_size=model.config.vocab_size, steps=grad_accum_steps,
                                          progress=progress, sums_fn=spec.sums, metrics_fn=metrics_fn,
                                          selected_only=spec.selected_only)
  with jax.named_scope('optimizer'):  # names its operations in profiles (electra_jax.kernels)
    if flat:  # the optimiser updates the vectors the state stores
      grads, params = flat.ravel(grads), state.params
    updates, opt_state = tx.update(grads, state.opt_state, params)
    if two_stage:
      updates = two_stage_updates(updates, state.step, config.two_stage_generator_steps, model.config)
    params = optax.apply_updates(params, updates)
    one = jnp.ones((), jnp.float32)
    metrics['grad_norm'] = (optimizer.global_norm(grads, flat_norm), one)
  metrics['learning_rate'] = (jnp.asarray(schedule(state.step), jnp.float32), one)
  return TrainState(state.step + 1, params, opt_state), metrics


def at_step(state: TrainState, config: ObjectiveConfig, model_config: ModelConfig,
            flat: optimizer.FlatParams | None = None):
  """(params, loss, metrics_fn) of the objective at `state`'s step, as the train step and held-out evaluation both
  take them: the parameters unraveled from `flat`'s vectors, and under two-stage training those of the stage the
  step is in (`two_stage_params`) with that stage's loss and metrics."""
  spec = objective.get(config.name)
  params = flat.unravel(state.params) if flat else state.params
  if not config.two_stage_generator_steps:
    return params, spec.loss, spec.metrics
  # Checked in config.load: the electra objective, a same-size generator.
  return (two_stage_params(params, state.step, config.two_stage_generator_steps, model_config),
          functools.partial(objective.two_stage_loss, step=state.step),
          functools.partial(objective.two_stage_metrics, step=state.step))


def two_stage_params(params, step, n: int, model_config: ModelConfig):
  """At step n of two-stage training, the discriminator initialised from the trained generator; else `params`.

  Every generator weight with a discriminator counterpart of the same shape is copied: the encoder, the
  embeddings_project (when the discriminator has one and so does the generator) and, with tying='none', the
  generator's own embeddings into the discriminator's when they are as wide (E = H). The heads differ and stay.
  With tying='embeddings' the shared embeddings already are the generator's. Chosen by `step` (traced) with
  jnp.where, so the same compiled step runs before, at and after n and a resumed run does the same.
  """
  pairs = [(('generator', 'encoder'), ('discriminator', 'encoder')),
           (('generator', 'embeddings_project'), ('discriminator', 'embeddings_project'))]
  if model_config.tying == 'none':
    pairs.append((('generator', 'embeddings'), ('embeddings',)))
  flat = traverse_util.flatten_dict(params)
  at_n = step == n
  for source, target in pairs:
    for path, value in list(flat.items()):
      copy = target + path[len(source):]
      if path[:len(source)] == source and copy in flat and flat[copy].shape == value.shape:
        flat[copy] = jnp.where(at_n, value, flat[copy])
  return traverse_util.unflatten_dict(flat)


def two_stage_updates(updates, step, n: int, model_config: ModelConfig):
  """Optimiser updates with the tower that does not train zeroed: before step n the discriminator's (and, with
  tying='none', the embeddings, which are then the discriminator's alone), from step n on the generator's.

  Zeroing the gradient would not do: Adam's momentum and the weight decay would still move the frozen weights.
  """
  generator_stage = step < n
  frozen = {'generator': ~generator_stage, 'discriminator': generator_stage}
  if model_config.tying == 'none':
    frozen['embeddings'] = generator_stage
  return {part: jax.tree.map(lambda u, f=frozen[part]: jnp.where(f, jnp.zeros_like(u), u), tree)
          if part in frozen else tree for part, tree in updates.items()}


def accumulate_gradients(apply_fn, params, batch, rng, *, config: ObjectiveConfig, special: masking.SpecialIds,
                         vocab_size: int, steps: int, progress=1.0, sums_fn=objective.electra_sums,
                         metrics_fn=objective.loss_and_metrics, selected_only: bool = False):
  """(gradient, Metrics) of an objective's loss on `batch`, summed over `steps` micro-batches in a `lax.scan`.

  `sums_fn` and `metrics_fn` are the objective's halves (`objective.Objective.sums`, `.metrics`). Masks, sampling
  keys and dropout are drawn per row (see electra_jax.objective), the masking for the whole batch up front: each
  micro-batch's loss is its share of the whole batch's (divided by the whole batch's `objective.counts`), so the
  shares and their gradients add up to the one-batch values. Micro-batch m takes rows m, m + k, m + 2k, ...: with
  the batch split over n devices in contiguous blocks of batch/n rows (k divides them), every micro-batch stays
  spread evenly over all devices.
  """
  draws, rngs = objective.draw(rng, batch, config=config, special=special, vocab_size=vocab_size)
  denominators = objective.counts(batch, draws.masked, selected_only)
  split = lambda x: jnp.swapaxes(x.reshape((x.shape[0] // steps, steps) + x.shape[1:]), 0, 1)

  def sums(p, micro_batch, micro_draws):
    sample = objective.sampler(micro_draws.sample_keys, micro_draws.masked, config, progress)
    return sums_fn(apply_fn, p, micro_batch, micro_draws.masked, sample, config=config, rngs=rngs,
                   rows=micro_draws.rows, progress=progress)

  def micro_step(carry, micro):
    def share(p):
      micro_sums = sums(p, *micro)
      return metrics_fn(micro_sums, config, denominators, progress)[0], micro_sums

    (_, micro_sums), grads = jax.value_and_grad(share, has_aux=True)(params)
    return jax.tree.map(jnp.add, carry, (grads, micro_sums)), None

  micros = jax.tree.map(split, (batch, draws))
  shapes = jax.eval_shape(sums, params, *jax.tree.map(lambda x: x[0], micros))
  zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), (params, shapes))
  (grads, total), _ = jax.lax.scan(micro_step, zeros, micros)
  return grads, metrics_fn(total, config, progress=progress)[1]


@dataclasses.dataclass
class Pretraining:
  """Everything static about a run: model, optimiser, mesh, shardings and the compiled step.

  A pure function of (config, special, mesh) (and, for electra_frozen, of the generator run's config.json, fixed
  once that run has written it): `cached` shares one per process between runs of the same config."""
  config: TrainConfig
  special: masking.SpecialIds
  mesh: jax.sharding.Mesh
  model: Electra = dataclasses.field(init=False)
  tx: optax.GradientTransformation = dataclasses.field(init=False)
  schedule: optax.Schedule = dataclasses.field(init=False)
  state_shardings: Any = dataclasses.field(init=False)
  _abstract_state: Any = dataclasses.field(init=False)
  batch_sharding: jax.sharding.NamedSharding = dataclasses.field(init=False)
  # `steps_fn`'s batches: the batch's sharding under a leading axis of steps, not split
  steps_batch_sharding: jax.sharding.NamedSharding = dataclasses.field(init=False)
  _init: Any = dataclasses.field(init=False)  # the initialiser, jitted once
  _batch_checked: bool = dataclasses.field(init=False, default=False)
  _compiled: dict = dataclasses.field(init=False, default_factory=dict)  # {steps a call: executable} (`compile`)
  _staged: dict = dataclasses.field(init=False, default_factory=dict)  # by sharding: the last batch(es) staged

  def __post_init__(self):
    c = self.config
    spec = objective.get(c.objective.name)
    self.model = spec.training_model(c)
    # On GPUs, whose steps are bound by their launches, replicated parameters (no fsdp or tensor axis) are stored
    # as a few vectors (optimizer.flat_params), or else take their gradients' global norm in a few kernels
    # (optimizer.global_norm); elsewhere one array each, the norm leaf by leaf, as optax does.
    on_gpu = self.mesh.devices.flat[0].platform == 'gpu'
    replicated = sharding.axis_size(self.mesh, ('fsdp', 'tensor')) == 1
    flat = _flat_params(c, spec, on_gpu, replicated)
    flat_norm = on_gpu and replicated and not flat
    tx, self.schedule = optimizer.make_optimizer(c.optimizer, c.train_steps, flat_norm)
    self.tx = spec.optimizer(tx)
    self.state_shardings, self._abstract_state = scaffold.state_layout(self.mesh, c.mesh.rules, self._init_boxed)
    # optimizer.FlatParams: how the step stores the state's parameters, if not one array each
    self.flat = optimizer.FlatParams(self._abstract_state.params) if flat else None
    self.step_shardings, self._abstract_step_state = self.state_shardings, self._abstract_state
    if self.flat:  # replicated, as the parameters are
      everywhere = sharding.replicated(self.mesh)
      shapes = jax.eval_shape(self.flat.ravel_state, self._abstract_state)
      self.step_shardings = jax.tree.map(lambda _: everywhere, shapes)
      self._abstract_step_state = jax.tree.map(
          lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=everywhere), shapes)
    self.batch_sharding = sharding.batch_sharding(self.mesh, c.mesh.rules)
    self.steps_batch_sharding = jax.sharding.NamedSharding(
        self.mesh, jax.sharding.PartitionSpec(None, *self.batch_sharding.spec))
    step = functools.partial(train_step, model=self.model, tx=self.tx, schedule=self.schedule,
                             config=c.objective, special=self.special, train_steps=c.train_steps,
                             grad_accum_steps=c.grad_accum_steps, flat_norm=flat_norm, flat=self.flat)
    self._train_step = step  # not jitted: `jitted` scans it for several steps a call
    self._step = scaffold.jit_step(step, self.step_shardings, self.batch_sharding)
    self._init = scaffold.Initialiser(self._init_boxed, self._abstract_state)
    self._stage = {s: jax.jit(_copy_into, donate_argnums=0, out_shardings=s)  # put_batch's, put_batches'
                   for s in (self.batch_sharding, self.steps_batch_sharding)}

  def check_batch(self):
    """Raises ConfigError unless the batch splits over the mesh (`sharding.check_batch`); checks once per run.

    Not when the run is built: what only reads its shapes (restoring a checkpoint, converting) needs no batch."""
    if not self._batch_checked:
      sharding.check_batch(self.mesh, self.config.mesh.rules, self.config.batch_size, self.config.grad_accum_steps)
      self._batch_checked = True

  def put_batch(self, local_batch: dict) -> dict[str, jax.Array]:
    """This process's rows of a batch (numpy) as the global arrays the step takes: new arrays, or with
    ELECTRA_JAX_STAGE_BATCHES=1 the arrays of the batch before (donated), overwritten, so that the step's inputs
    keep their device addresses from step to step. On a GPU XLA updates a step's CUDA graph (command buffers) whose
    inputs moved; the GPU check's levers `fresh batches` measure what that costs."""
    return self._put(local_batch, self.batch_sharding)

  def put_batches(self, local_batches: list[dict]) -> dict[str, jax.Array]:
    """This process's rows of config.steps_per_call batches (numpy) as the stacked global arrays `steps_fn` takes;
    staged as `put_batch` stages with ELECTRA_JAX_STAGE_BATCHES=1."""
    return self._put({k: np.stack([b[k] for b in local_batches]) for k in local_batches[0]}, self.steps_batch_sharding)

  def _put(self, local: dict, where: jax.sharding.NamedSharding) -> dict[str, jax.Array]:
    arrays = sharding.global_batch(local, where)
    if os.environ.get('ELECTRA_JAX_STAGE_BATCHES', '0') != '1':
      return arrays
    self._staged[where] = arrays if where not in self._staged else self._stage[where](self._staged[where], arrays)
    return self._staged[where]

  def steps_fn(self, state: TrainState, batches, rng):
    """config.steps_per_call (> 1) train steps in one call of one program (`jitted`; `compile` compiles it, once):
    (state, `put_batches`'s arrays, rng) -> (state, the metrics summed over the steps)."""
    return self.compile()(state, batches, rng)

  def step_fn(self, state: TrainState, batch, rng):
    """The compiled train step (traced on first call with the mesh and logical axis rules active)."""
    if 1 in self._compiled:  # the training loop's path: nothing to trace, so no context to enter
      return self._compiled[1](state, batch, rng)
    self.check_batch()
    with sharding.activate(self.mesh, self.config.mesh.rules), scaffold.threefry_kernels():
      return self._step(state, batch, rng)

  def compile(self):
    """Compiles the train step for the configured shapes now, before any batch (ahead of time): a loop that calls
    this first times its steps without the compile. `step_fn` then runs this executable, which takes its inputs
    where it was compiled for: the rng replicated (`jax.device_put(rng, sharding.replicated(mesh))`). Returns the
    executable (its `as_text()`, `memory_analysis()`); compiled once, a second call returns the same. With
    config.steps_per_call > 1 the program compiled is `steps_fn`'s (the loop's single steps, at a resume or an end
    between calls, are compiled when first called)."""
    steps = self.config.steps_per_call
    if steps not in self._compiled:
      self._compiled[steps] = self.lower(steps).compile()
    return self._compiled[steps]

  def _init_boxed(self, rng):
    """A fresh TrainState whose leaves are still boxed with their logical axis names."""
    length = self.config.data.max_seq_length
    ids = jnp.zeros((1, length), jnp.int32)
    positions = jnp.zeros((1, self.config.objective.num_predictions(length)), jnp.int32)
    params = self.model.init(jax.random.wrap_key_data(rng), ids, ids, ids, positions)['params']
    return TrainState(jnp.zeros((), jnp.int32), params, self.tx.init(params))

  def init_state(self, rng) -> TrainState:
    """Initialises the state directly into its shardings (no full copy on one host)."""
    return self._init(jax.random.key_data(rng))

  def abstract_state(self) -> TrainState:
    """Shapes, dtypes and shardings of the state, without allocating it (for restoring checkpoints)."""
    return self._abstract_state

  def abstract_step_state(self) -> TrainState:
    """`abstract_state` as the step takes it: its parameters stored as `self.flat` says (`step_layout`)."""
    return self._abstract_step_state

  def step_layout(self, state: TrainState) -> TrainState:
    """`state` (a TrainState of `abstract_state`'s layout) as the step takes it: with `self.flat`, its parameters
    and moments raveled into vectors (new arrays); else `state` itself."""
    return self._layouts[0](state) if self.flat else state

  def tree_layout(self, state: TrainState) -> TrainState:
    """The inverse of `step_layout`, into new arrays: what checkpoints store."""
    return self._layouts[1](state) if self.flat else state

  @functools.cached_property
  def _layouts(self):
    """(`step_layout`'s and `tree_layout`'s conversions, jitted)."""
    return (jax.jit(self.flat.ravel_state, out_shardings=self.step_shardings),
            jax.jit(self.flat.unravel_state, out_shardings=self.state_shardings))

  def abstract_batch(self) -> dict[str, jax.ShapeDtypeStruct]:
    shape = (self.config.batch_size, self.config.data.max_seq_length)
    return {k: jax.ShapeDtypeStruct(shape, jnp.int32, sharding=self.batch_sharding)
            for k in ('input_ids', 'segment_ids', 'input_mask')}

  def abstract_key(self) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(ABSTRACT_KEY.shape, ABSTRACT_KEY.dtype, sharding=sharding.replicated(self.mesh))

  def jitted(self, steps: int = 1):
    """(the jitted train step, or `steps` of them in one program, and the abstract arguments it compiles for).
    Several steps a call: (state, batches, rng) -> (state, metrics), `batches` the steps' batches stacked [steps,
    batch, length] in `steps_batch_sharding`, the metrics summed over the steps (a sum and a count each, as the loop
    sums steps). The same steps as that many calls of `step_fn` (a scan over them: one step's body compiled),
    launched by one call: on a GPU the host's launching of a call sets the pace of a small model's step
    (BENCHMARKS.md). Trace and lower it as `lower` does."""
    if steps == 1:
      return self._step, (self.abstract_step_state(), self.abstract_batch(), self.abstract_key())

    def scanned(state, batches, rng):
      state, metrics = jax.lax.scan(lambda s, batch: self._train_step(s, batch, rng), state, batches)
      return state, jax.tree.map(lambda m: m.sum(axis=0), metrics)
    batches = {name: jax.ShapeDtypeStruct((steps, *a.shape), a.dtype, sharding=self.steps_batch_sharding)
               for name, a in self.abstract_batch().items()}
    jitted = scaffold.jit_step(scanned, self.step_shardings, self.steps_batch_sharding)
    return jitted, (self.abstract_step_state(), batches, self.abstract_key())

  def lower(self, steps: int = 1):
    """Lowers the train step (`steps` of them a call: `jitted`) for the configured shapes without allocating
    anything (compile-only checks). On GPUs, threefry (dropout, the generator's samples) is lowered to its CUDA
    kernel (scaffold.threefry_kernels)."""
    self.check_batch()
    jitted, args = self.jitted(steps)
    with sharding.activate(self.mesh, self.config.mesh.rules), scaffold.threefry_kernels():
      return jitted.lower(*args)


def _flat_params(c: TrainConfig, spec: objective.Objective, on_gpu: bool, replicated: bool) -> bool:
  """Whether run `c` stores its parameters as optimizer.FlatParams (optimizer.flat_params); raises ConfigError
  where 'true' cannot be."""
  why_not = ''
  if not replicated:
    why_not = 'the parameters are sharded (an fsdp or tensor axis): concatenating them would gather them'
  elif spec.frozen_generator:
    why_not = f'objective {c.objective.name} does not train every parameter alike'
  elif c.objective.two_stage_generator_steps:
    why_not = 'objective.two_stage_generator_steps trains the generator and the discriminator apart'
  if c.optimizer.flat_params == 'true' and why_not:
    raise ConfigError(f'optimizer.flat_params=true: {why_not}; use optimizer.flat_params=auto')
  return not why_not and (c.optimizer.flat_params == 'true' or (c.optimizer.flat_params == 'auto' and on_gpu))


def _copy_into(old: dict, new: dict) -> dict:
  """`new`, written over `old` (donated: the result lives where `old` did)."""
  return jax.tree.map(lambda o, n: jax.lax.dynamic_update_slice(o, n, (0,) * o.ndim), old, new)


@functools.lru_cache(maxsize=8)
def cached(config: TrainConfig, special: masking.SpecialIds, mesh: jax.sharding.Mesh) -> Pretraining:
  """The Pretraining of (config, special, mesh), built once per process: a second `trainer.train` of the same
  config in one process (a run resumed there, as the tests do; a notebook) reuses its traced and compiled train
  step and initialiser instead of tracing, lowering and loading them again (seconds each on a CPU)."""
  return Pretraining(config, special, mesh)
