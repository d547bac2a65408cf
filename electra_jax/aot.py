"""Compile-only checks for a TPU slice or GPU nodes, on any machine: does a config fit, and how fast would it run?

  python -m electra_jax.aot --config=configs/large.py --topology=v3:4x8 [--config.mesh.shape=8,8,1]

The TPU compiler (libtpu: `pip install -e ".[tpu]"`) compiles the pre-training step and a fine-tuning step (GLUE
classification at the paper's batch of 32 x 128) for the devices of a TPU slice described by
`jax.experimental.topologies`. Nothing is allocated or run, so no TPU is needed: the compiler reports per-device
HBM (arguments, temporaries, peak) and its cost model's FLOPs and step time ('optimal_seconds'). That time is the
compiler's estimate, not a measurement; so are the tokens/s and MFU derived from it. A step that loops
(`scan_layers`, `grad_accum_steps` > 1) is counted once per loop body; its estimate then comes from a layer fit:
the unrolled step compiled at two smaller depths, extrapolated linearly to the config's (`layer_fit`).

Topologies are `VERSION:SHAPE` as Cloud TPU names them: v3:2x2 (v3-8, 8 cores), v3:4x4 (v3-32), v3:4x8 (v3-64),
v4:2x2x1 (v4-8, 4 chips), v4:4x4x4 (v4-128), v5e:4x4, v5p:2x2x2, v6e:4x4. A JAX device is a v3 core, a v4/v5p
chip (megacore) or a v5e/v6e chip, and the mesh is laid over those devices (`mesh.shape`, as in training).

NVIDIA GPUs (electra_jax.gpu_targets; the CUDA plugin: `pip install "jax[cuda12]==0.10.2"`, no GPU or driver):
h100:8 is one node of 8 H100 80 GB, h100:2x8 two such nodes, h200:8 and a100:8 one node of 8 H200 or A100.
XLA:GPU reports memory but no cost analysis, so there is no compiled FLOP count and no step-time estimate for GPUs;
the report says whether attention compiled to cuDNN's fused kernel (`__cudnn$fmha` custom calls).
"""

# The environment must be set before jax is imported.

import dataclasses
import importlib.util
import os
import re
import time

# Only the compiler is needed: without this, JAX would also try to start the TPU runtime on a machine with none.
os.environ.setdefault('JAX_PLATFORMS', 'cpu')
# libtpu looks these up (from the metadata server of a Cloud TPU VM) when it loads, and prints errors without them.
# They describe this host only; the slice compiled for is --topology.
os.environ.setdefault('TPU_WORKER_HOSTNAMES', 'localhost')
os.environ.setdefault('TPU_ACCELERATOR_TYPE', 'v4-8')
# libtpu lets one process at a time hold the TPU (/tmp/libtpu_lockfile); compiling holds none.
os.environ.setdefault('ALLOW_MULTIPLE_LIBTPU_LOAD', '1')

from absl import app, flags, logging
import jax
import jax.numpy as jnp
from jax.experimental import topologies
import ml_collections
from ml_collections import config_flags

from electra_jax import (cli, config as config_lib, data, flops, gpu_targets, kernels, objective, sharding,
                         tpu_targets)
from electra_jax.finetune import config as ft_config_lib, heads, tasks
from electra_jax.finetune.train import Finetuning
from electra_jax.config import ConfigError
from electra_jax.masking import TRAINED_TOKENIZER_IDS
from electra_jax.tpu_targets import GIB
from electra_jax.train_step import ABSTRACT_KEY, Pretraining


def chip(topology: str) -> tpu_targets.Chip | gpu_targets.Gpu:
  if gpu := gpu_targets.parse(topology):
    return gpu[0]
  version = topology.split(':')[0]
  if version not in tpu_targets.CHIPS or not re.fullmatch(r'[a-z0-9]+:\d+(x\d+)+', topology):
    raise ConfigError(f'--topology={topology!r}: expected VERSION:SHAPE with VERSION one of '
                      f'{", ".join(tpu_targets.CHIPS)}, '
                      'e.g. v3:4x4 (a v3-32 slice) or v4:2x2x2 (a v4-16), or GPU:N / GPU:NODESxN with GPU one of '
                      f'{", ".join(gpu_targets.GPUS)}, e.g. h100:8 or h100:2x8')
  return tpu_targets.CHIPS[version]


def topology_devices(topology: str) -> list:
  """The devices of TPU slice (or GPU nodes) `topology`, described for compilation only."""
  if gpu_targets.parse(topology):
    return gpu_targets.devices(topology)
  if importlib.util.find_spec('libtpu') is None:
    raise ConfigError('the TPU compiler is not installed: pip install -e ".[tpu]" (libtpu; no TPU needed)')
  kwargs = {'chip_config_name': 'megacore'} if chip(topology).megacore else {}
  try:
    return list(topologies.get_topology_desc(platform='tpu', topology_name=topology, **kwargs).devices)
  except Exception as e:  # pylint: disable=broad-except  (JaxRuntimeError: INVALID_ARGUMENT)
    raise ConfigError(f'the TPU compiler cannot describe --topology={topology!r}: {str(e).splitlines()[0]}') from e


@dataclasses.dataclass(frozen=True)
class Report:
  """What the compiler says about one step; byte and FLOP figures are per device, `model_flops` for all."""
  name: str
  devices: int
  tokens: int  # per step
  model_flops: float
  compile_seconds: float
  argument_bytes: int = 0
  temp_bytes: int = 0
  peak_bytes: int = 0
  compiled_flops: float = 0.0
  estimated_seconds: float = 0.0
  error: str = ''  # the compiler refused: e.g. out of memory
  loop: str = ''  # what the step loops over, if anything (the cost analysis then covers one iteration)
  fused_attention: int = 0  # cuDNN fused-attention custom calls in the compiled program (GPU)
  collectives: str = ''  # the cross-device ops in the compiled program, e.g. 'all-reduce x12'
  kernels: str = ''  # what the compiled program launches per call (electra_jax.kernels.summary)
  graphs: str = ''  # on a GPU, the CUDA graphs it would run in (electra_jax.kernels.graphs: an estimate)


def compile_report(name: str, lower, *, devices: int, tokens: int, model_flops: float, loop: str = '') -> Report:
  """Compiles `lower()` and reads the compiler's memory and cost analyses.

  Running out of HBM is an answer, not a failure: the compiler's message goes into `error`. `loop` names a loop
  in the step: XLA's cost analysis counts a loop body once, whatever its trip count.
  """
  start = time.perf_counter()
  try:
    compiled = lower().compile()
  except Exception as e:  # pylint: disable=broad-except  (jax raises XlaRuntimeError/JaxRuntimeError by version)
    if 'RESOURCE_EXHAUSTED' not in str(e):
      raise
    message = next((line.strip() for line in str(e).splitlines() if 'exceeds' in line or 'HBM' in line),
                   str(e).splitlines()[0])
    return Report(name, devices, tokens, model_flops, time.perf_counter() - start, error=message, loop=loop)
  seconds = time.perf_counter() - start
  memory = compiled.memory_analysis()
  cost = compiled.cost_analysis()  # None on GPU
  cost = (cost[0] if isinstance(cost, (list, tuple)) else cost) or {}
  text = compiled.as_text()
  module = kernels.read(text)  # read once: the kernels and the CUDA graphs are counted from it
  # The new state is written over the donated one (aliased), so it takes no extra space.
  peak = (memory.argument_size_in_bytes + memory.output_size_in_bytes - memory.alias_size_in_bytes
          + memory.temp_size_in_bytes)
  return Report(name, devices, tokens, model_flops, seconds, argument_bytes=memory.argument_size_in_bytes,
                temp_bytes=memory.temp_size_in_bytes, peak_bytes=peak,
                compiled_flops=float(cost.get('flops', 0.0)), estimated_seconds=float(cost.get('optimal_seconds', 0.0)),
                loop=loop, fused_attention=text.count('"__cudnn$fmha'), collectives=collectives(text),
                kernels=kernels.summary(kernels.parse(module)), graphs=str(kernels.graphs(module)))


def collectives(hlo: str) -> str:
  """The cross-device ops of a compiled HLO text and how many of each (async pairs counted once)."""
  # The op name follows the (possibly tuple) result shape: ` all-reduce(` or ` all-reduce-start(`, not `-done(`.
  ops = re.findall(r' (all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)(?:-start)?\(', hlo)
  return ', '.join(f'{op} x{ops.count(op)}' for op in sorted(set(ops))) or 'none'


def pretraining_report(c: config_lib.TrainConfig, mesh) -> Report:
  """The program the trainer runs: config.steps_per_call steps a call (tokens and FLOPs are a step's)."""
  length, k = c.data.max_seq_length, c.steps_per_call
  loops = ([f'{k} steps a call'] if k > 1 else []) + (
      [f'{c.grad_accum_steps} micro-batches'] if c.grad_accum_steps > 1 else []) + (
      ['the layers'] if c.model.scan_layers else [])
  run = Pretraining(c, TRAINED_TOKENIZER_IDS, mesh)
  return compile_report('pre-training' + (f' ({k} steps a call)' if k > 1 else ''), lambda: run.lower(k),
                        devices=mesh.size, tokens=c.batch_size * length,
                        model_flops=objective.train_flops_per_step(c), loop=' and '.join(loops))


@dataclasses.dataclass(frozen=True)
class LayerFit:
  """The unrolled, unaccumulated step of a config's full depth, extrapolated from two shallower compiles."""
  depths: tuple[int, int]
  estimated_seconds: float
  compiled_flops: float  # per device


def layer_fit(c: config_lib.TrainConfig, mesh) -> LayerFit | None:
  """The compiler's step time and FLOPs for `c` as if unrolled and unaccumulated, from compiles of the same step
  at two smaller depths (the cost is linear in the layers); None when the config is not deeper than those.

  A looped step (`grad_accum_steps` > 1, `scan_layers`) gets no estimate of its own: XLA's cost analysis counts a
  loop body once. The shallow compiles are unrolled and take the whole batch at once, which costs the same FLOPs.
  Depths are chosen so that the generator's rounded layer count is linear in them as well.
  """
  def generator_layers(depth):
    return dataclasses.replace(c.model, num_layers=depth).tower(True).num_layers

  target = c.model.num_layers
  for a, b in ((2, 4), (4, 8)):
    if b >= target:
      return None
    ga, gb, gt = (generator_layers(d) for d in (a, b, target))
    if (gb - ga) * (target - a) == (gt - ga) * (b - a):  # the three on one line
      break
  else:
    return None
  ra, rb = (pretraining_report(dataclasses.replace(
      c, grad_accum_steps=1, model=dataclasses.replace(c.model, num_layers=d, scan_layers=False)), mesh)
            for d in (a, b))
  if any(r.error or r.estimated_seconds <= 0 for r in (ra, rb)):
    return None
  at_target = lambda x, y: x + (y - x) * (target - a) / (b - a)
  return LayerFit((a, b), at_target(ra.estimated_seconds, rb.estimated_seconds),
                  at_target(ra.compiled_flops, rb.compiled_flops))


def format_fit(fit: LayerFit, r: Report, hw: tpu_targets.Chip) -> str:
  return (f'  layer fit (compiled unrolled at {fit.depths[0]} and {fit.depths[1]} layers, extrapolated linearly): '
          f'{estimate(r, fit.estimated_seconds, hw)}; compiled FLOPs {fit.compiled_flops * r.devices:.3e} (all '
          f'devices), ratio {fit.compiled_flops * r.devices / r.model_flops:.2f} to the model\'s')


def estimate(r: Report, seconds: float, hw: tpu_targets.Chip) -> str:
  """The compiler's step time `seconds` for the step of `r`, with the tokens/s and MFU it implies."""
  mfu = r.model_flops / (seconds * r.devices * hw.peak_flops)
  return (f'compiler\'s ESTIMATE (not a measurement): {seconds * 1e3:.1f} ms per step, {r.tokens / seconds:,.0f} '
          f'tokens/s, MFU {mfu:.0%} of {hw.peak_flops / 1e12:.1f} TFLOP/s (bf16 peak) per device')


def finetuning_report(c: config_lib.TrainConfig, mesh_config, mesh, *, batch_size: int, length: int) -> Report:
  """The fine-tuning step (`electra_jax.finetune.train.Finetuning`) of a two-class GLUE task."""
  cfg = ml_collections.ConfigDict(config_lib.defaults(ft_config_lib.FinetuneConfig))  # configs/finetune.py's
  cfg.batch_size, cfg.max_seq_length = batch_size, length
  cfg.mesh = mesh_config
  ft = ft_config_lib.load(cfg)
  ft = dataclasses.replace(ft, optimizer=ft.optimizer.for_model(c.model.hidden_size))
  # Fine-tuning runs the unrolled layers whatever pre-training did (pretrained.load_params unstacks them).
  model = heads.Finetuner(dataclasses.replace(c.model, scan_layers=False), kind=tasks.CLASSIFICATION,
                          num_outputs=2, head_dropout=ft.head_dropout)
  run = Finetuning(model, ft, 10_000, mesh)
  # Each device takes whole rows: on a slice of more devices than that, the batch grows to one row per device.
  shards = sharding.axis_size(mesh, run.batch_sharding.spec[0])
  batch_size = -(-batch_size // shards) * shards

  def lower():
    state = run.abstract_state()
    batch = {k: jax.ShapeDtypeStruct((batch_size, length), jnp.int32, sharding=run.batch_sharding)
             for k in ('input_ids', 'segment_ids', 'input_mask')}
    batch['labels'] = jax.ShapeDtypeStruct((batch_size,), jnp.int32, sharding=run.batch_sharding)
    key = jax.ShapeDtypeStruct(ABSTRACT_KEY.shape, ABSTRACT_KEY.dtype, sharding=sharding.replicated(mesh))
    with sharding.activate(mesh, ft.mesh.rules):
      return run.jitted['step'].lower(state, batch, key)

  return compile_report(f'fine-tuning ({batch_size} x {length})', lower, devices=mesh.size,
                        tokens=batch_size * length,
                        model_flops=flops.finetuning_flops_per_step(c.model, batch_size, length, num_outputs=2))


def advice(c: config_lib.TrainConfig, mesh) -> str:
  """What to change when the pre-training step does not fit, cheapest first."""
  steps = []
  if c.model.dtype == 'float32':
    steps.append('--config.model.dtype=bfloat16 (halves activations; parameters stay float32)')
  if c.model.remat == 'none':
    steps.append('--config.model.remat=full (recompute each layer in the backward pass: ~1/3 more compute, '
                 'activations no longer grow with depth)')
  per_device = c.batch_size // sharding.axis_size(mesh, ('data', 'fsdp'))
  if per_device % (2 * c.grad_accum_steps) == 0:
    steps.append(f'--config.grad_accum_steps={2 * c.grad_accum_steps} (half the rows per micro-batch)')
  if mesh.shape['fsdp'] == 1:
    steps.append(f'--config.mesh.shape=1,{mesh.size},1 (FSDP: parameters and Adam moments split over the devices)')
  return '; '.join(steps) or 'a bigger slice (more devices for the same batch)'


def usable_bytes(hw: tpu_targets.Chip | gpu_targets.Gpu) -> float:
  """What a step may use: a TPU's HBM, or on a GPU the share of it JAX's allocator preallocates."""
  return hw.hbm_bytes * (gpu_targets.memory_fraction() if isinstance(hw, gpu_targets.Gpu) else 1.0)


def format_report(r: Report, hw: tpu_targets.Chip) -> str:
  if r.error:
    return f'{r.name}: DOES NOT FIT ({r.compile_seconds:.0f} s to find out). The compiler: {r.error}'
  fits = 'fits' if r.peak_bytes <= usable_bytes(hw) else 'DOES NOT FIT'
  lines = [f'{r.name}: compiled in {r.compile_seconds:.0f} s',
           f'  HBM per device: arguments {r.argument_bytes / GIB:.2f} GiB, temporaries {r.temp_bytes / GIB:.2f} GiB, '
           f'peak {r.peak_bytes / GIB:.2f} GiB of {hw.hbm_bytes / GIB:.0f} GiB ({r.peak_bytes / hw.hbm_bytes:.0%}): '
           f'{fits}', f'  collectives: {r.collectives}']
  if isinstance(hw, gpu_targets.Gpu):
    return '\n'.join(lines + [
        f'  attention: {f"cuDNN fused attention ({r.fused_attention} calls)" if r.fused_attention else "not fused"}',
        f'  kernels: {r.kernels} (bench/gpu_kernels.py: the table)',
        f'  CUDA graphs: {r.graphs} (an estimate by XLA\'s default command-buffer rules: electra_jax.kernels.graphs)',
        f'  FLOPs per step: model {r.model_flops:.3e} (electra_jax.flops, matmuls x 3); XLA:GPU has no cost '
        'analysis, so no compiled FLOPs and NO step-time estimate (measure on a GPU: bench/step_throughput.py)',
        f'  fits means within the {usable_bytes(hw) / GIB:.1f} GiB JAX\'s allocator takes '
        f'(XLA_PYTHON_CLIENT_MEM_FRACTION={gpu_targets.memory_fraction()}; 0.75 unless set, e.g. .95 for more)'])
  lines += [f'  FLOPs per step: compiled {r.compiled_flops * r.devices:.3e} (all devices), model {r.model_flops:.3e} '
            f'(electra_jax.flops, matmuls x 3), ratio {r.compiled_flops * r.devices / r.model_flops:.2f}']
  if r.loop:
    lines.append(f'  the step loops over {r.loop}: the compiler\'s cost analysis counts a loop body once, so the '
                 'compiled FLOPs above undercount and the step has no estimate of its own (the layer fit below '
                 'gives one)')
  elif r.estimated_seconds <= 0:  # seen for v4 (megacore): the cost model has no figure for it
    lines.append(f'  no usable step-time estimate from the compiler (optimal_seconds = {r.estimated_seconds:.3g})')
  else:
    lines.append(f'  {estimate(r, r.estimated_seconds, hw)}')
  return '\n'.join(lines)


def load_config(cfg, platform: str = 'tpu') -> config_lib.TrainConfig:
  """The TrainConfig as a TPU (or GPU) run of `cfg` would see it: the vocabulary of its data.tokenizer or built
  data.source, else of the tokenizer it would train (data.vocab_size), and the model's platform-dependent keys
  (dtype, attention, dropout_draw) resolved for that platform."""
  cfg = cfg.copy_and_resolve_references()
  cfg.model.update(config_lib.for_platform(cfg.model, platform))
  c = config_lib.load(cfg, vocab_size=cfg.model.vocab_size or cfg.data.vocab_size)
  if not cfg.model.vocab_size and (c.data.tokenizer or data.examples.is_built(c.data.source)):
    c = config_lib.load(cfg, vocab_size=data.load_tokenizer(c.data).vocab_size)  # the one a run would read
  return c


def run(cfg, topology: str, finetune: bool = True, finetune_batch: int = 32, finetune_length: int = 128):
  """Compiles and prints; returns the reports (pre-training first)."""
  if 'task' in cfg:  # as cli.mode_for tells them apart
    raise ConfigError('aot compiles a pre-training config (e.g. configs/small.py) and the fine-tuning step of its '
                      'model: give a pre-training config, and --finetune_batch/--finetune_length for fine-tuning')
  if finetune and min(finetune_batch, finetune_length) < 1:
    raise ConfigError(f'--finetune_batch={finetune_batch} and --finetune_length={finetune_length} must be at least '
                      '1 (or --nofinetune)')
  hw = chip(topology)
  devices = topology_devices(topology)
  c = load_config(cfg, 'gpu' if isinstance(hw, gpu_targets.Gpu) else 'tpu')
  c.check_steps_per_call()  # as the trainer: its periods must be multiples of the steps a call
  if finetune and finetune_length > c.model.max_position_embeddings:
    raise ConfigError(f'--finetune_length={finetune_length} is more than the model\'s '
                      f'{c.model.max_position_embeddings} positions: give at most that')
  mesh = sharding.make_mesh(c.mesh, devices)
  m = c.model
  print(f'{topology}: {len(devices)} x {devices[0].device_kind}, mesh {dict(mesh.shape)}; jax {jax.__version__}; '
        f'model {m.num_layers} layers H={m.hidden_size} E={m.embedding_size} vocab={m.vocab_size} dtype={m.dtype} '
        f'remat={m.remat} attention={m.attention}; batch {c.batch_size} x {c.data.max_seq_length}, '
        f'grad_accum_steps {c.grad_accum_steps}, steps_per_call {c.steps_per_call}',
        flush=True)
  reports = [pretraining_report(c, mesh)]
  print(format_report(reports[0], hw), flush=True)
  if reports[0].error or reports[0].peak_bytes > usable_bytes(hw):
    print(f'  to make it fit, try: {advice(c, mesh)}', flush=True)
  if reports[0].loop and not isinstance(hw, gpu_targets.Gpu):
    fit = layer_fit(c, mesh)
    print(format_fit(fit, reports[0], hw) if fit else '  no layer fit (the model is too shallow to extrapolate, '
          'or a shallow compile gave no estimate): compile with grad_accum_steps=1 and scan_layers=false',
          flush=True)
  if finetune:
    reports.append(finetuning_report(c, cfg.mesh, mesh, batch_size=finetune_batch, length=finetune_length))
    print(format_report(reports[1], hw), flush=True)
  return reports


def define_flags() -> dict:
  """The command's flags, defined only by a program that runs it (electra_jax.main has its own --config)."""
  return {
      'config': config_flags.DEFINE_config_file('config', None, 'A pre-training config, e.g. configs/large.py.'),
      'topology': flags.DEFINE_string('topology', None, 'A TPU slice, e.g. v3:4x4 (v3-32) or v4:2x2x2 '
                                      '(v4-16), or GPU nodes: h100:8 (one node of 8), h100:2x8 (two nodes), h200:8, '
                                      'a100:8.'),
      'finetune': flags.DEFINE_bool('finetune', True, 'Also compile the fine-tuning step.'),
      'finetune_batch': flags.DEFINE_integer('finetune_batch', 32, 'Fine-tuning batch (the paper: 32); rounded up '
                                             'to a multiple of the devices the batch is split over.'),
      'finetune_length': flags.DEFINE_integer('finetune_length', 128,
                                              'Fine-tuning sequence length (GLUE: 128, SQuAD: 512).'),
  }


def main(argv, options: dict):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  logging.set_verbosity(logging.WARNING)
  cli.run(run, *(options[k].value for k in ('config', 'topology', 'finetune', 'finetune_batch', 'finetune_length')))


if __name__ == '__main__':
  _OPTIONS = define_flags()
  flags.mark_flags_as_required(['config', 'topology'])
  app.run(lambda argv: main(argv, _OPTIONS), flags_parser=cli.flags_parser)
