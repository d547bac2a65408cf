"""Throughput of the ELECTRA pre-training step: tokens/s, step time, model FLOPs utilisation (MFU), and what the
first step costs (the train step's compile, the initialiser's compile and run).

  python bench/step_throughput.py --config=configs/small.py --batch=128 --steps=20 [--vs_torch] [--profile=5]

Any config key can be set as in training (`--config.model.attention=cudnn`); the levers of the GPU check that
are not config keys are environment variables read when jax starts (JAX_DEFAULT_PRNG_IMPL=rbg,
JAX_THREEFRY_GPU_KERNEL_LOWERING=false, XLA_FLAGS), see bench/gpu_check.py.
--vs_torch runs the same step written with Hugging Face's PyTorch models (bench/torch_step.py: bf16 autocast, fused
AdamW and SDPA attention on a GPU) in a process of its own, before this one starts JAX (whose preallocation would
take 75% of the GPU's memory), and prints both and the ratio.
--config.steps_per_call=K runs K steps in each call of one compiled program (Pretraining.steps_fn, K batches
stacked): a step's time is then a call's over K.
--compile_only compiles the step, runs the initialiser (its compile) and stops: its RESULT holds those seconds only;
with --compile_cache=DIR the compiled programs are kept in (and read from) JAX's persistent cache under DIR.
--profile=N traces N more steps with jax.profiler and prints the time per part of the step (masking, sampling,
model, dropout, loss, optimizer: electra_jax.kernels) and the costliest operations; on a GPU those are its kernels,
on a CPU XLA:CPU's operations (run with XLA_FLAGS=--xla_cpu_enable_xprof_traceme=true so that it records them).
Then each kind of kernel (GEMMs, cuDNN, fusions) against the least time its bytes and FLOPs allow at the device's
memory bandwidth and peak (kernels.roofline), and the operations farthest from theirs.
The last line, `RESULT {...}`, holds the numbers as JSON (bench/gpu_check.py reads it).
Peak FLOP/s for MFU: --peak_tflops, or the datasheet's of an accelerator electra_jax.gpu_targets or tpu_targets
names exactly (another one, e.g. an H100 PCIe, reports no MFU without --peak_tflops); on a CPU it is measured with a
large matmul.
"""

import glob
import json
import os
import subprocess
import sys
import tempfile
import time


sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags
import jax
import jax.numpy as jnp
import numpy as np
from ml_collections import config_flags

from electra_jax import (compile_cache, config as config_lib, gpu_targets, kernels, objective, report, sharding,
                         tpu_targets)
from electra_jax.train_step import Pretraining
import synthetic

_CONFIG = config_flags.DEFINE_config_file('config', 'configs/small.py', 'Model config.')
_BATCH = flags.DEFINE_integer('batch', 32, 'Global batch size.')
_LENGTH = flags.DEFINE_integer('length', 0, 'Sequence length (0: the config\'s data.max_seq_length).')
_VOCAB = flags.DEFINE_integer('vocab', 30522, 'Vocabulary size.')
_STEPS = flags.DEFINE_integer('steps', 10, 'Timed steps (after 2 warm-up steps).')
_PEAK = flags.DEFINE_float('peak_tflops', 0.0, 'Peak dense TFLOP/s of one device for MFU (0: a known '
                            'accelerator\'s datasheet, a CPU\'s measured matmul rate, else no MFU).')
_VS_TORCH = flags.DEFINE_bool('vs_torch', False, 'Also time the PyTorch/transformers step (its own process).')
TORCH_SECONDS = 180  # the PyTorch step's process at most (Small's: ~20 s on an H200)
_TORCH_COMPILE = flags.DEFINE_bool('torch_compile', False, 'With --vs_torch: torch.compile the PyTorch models.')
_FRESH_BATCHES = flags.DEFINE_bool('fresh_batches', False, 'Put the batch on the devices again before each timed '
                                   'step, as training does, rather than reuse one device array.')
_PROFILE = flags.DEFINE_integer('profile', 0, 'Trace this many more steps and print where their time goes.')
_TRACE_DIR = flags.DEFINE_string('trace_dir', '', 'With --profile: keep the trace and the compiled step\'s HLO '
                                 'here (default: a temporary directory).')
_COMPILE_CACHE = flags.DEFINE_string('compile_cache', '', 'Keep the compiled programs in JAX\'s persistent cache '
                                     'under this directory (electra_jax.compile_cache); default: no cache.')
_COMPILE_ONLY = flags.DEFINE_bool('compile_only', False, 'Compile the step, run the initialiser and stop (with '
                                  '--compile_cache: fill that cache for a later run, as the GPU check does for its '
                                  'levers).')

def _per_second(fn, x, work: float) -> float:
  """`work` done per second by jitted `fn` on `x` (the mean of 5 calls after a first)."""
  fn(x).block_until_ready()
  start = time.perf_counter()
  for _ in range(5):
    fn(x).block_until_ready()
  return 5 * work / (time.perf_counter() - start)


def peak_flops_per_device(dtype: str) -> float | None:
  """--peak_tflops, or this device's dense bf16 peak as gpu_targets or tpu_targets know it (halved for float32),
  or on a CPU what XLA reaches on a large float32 matmul; None for another accelerator: an MFU against a guessed
  peak (a variant's, or a matmul's) would mislead."""
  if _PEAK.value:
    return _PEAK.value * 1e12
  device = jax.devices()[0]
  if known := gpu_targets.named(device.device_kind) or tpu_targets.named(device.device_kind):
    return known.peak_flops * (1.0 if dtype == 'bfloat16' else 0.5)
  if device.platform == 'cpu':
    return _per_second(jax.jit(lambda a: a @ a), jnp.ones((2048, 2048), jnp.float32), 2 * 2048 ** 3)
  return None


def memory_bandwidth() -> float:
  """Bytes/s of one device's memory: the datasheet's for a GPU electra_jax.gpu_targets describes, else what adding
  1 to 64 MiB reaches."""
  if gpu := gpu_targets.named(jax.devices()[0].device_kind):
    return gpu.memory_bandwidth
  return _per_second(jax.jit(lambda a: a + 1), jnp.ones((2**24,), jnp.float32), 2 * 4 * 2**24)


def time_jax(c, batch, t0: float) -> dict:
  """Seconds of the train step's compile, of the initialiser (its compile and run), to the end of the first step
  (from `t0`), and per step (a call's time over its config.steps_per_call; 'call_seconds' too); with --profile,
  prints where the time of a step goes."""
  run = Pretraining(c, synthetic.SPECIAL, sharding.make_mesh(c.mesh))
  k = c.steps_per_call
  start = time.perf_counter()
  executable = run.compile()  # what step_fn (steps_fn: k steps a call, each on a copy of the batch) runs from now on
  step_fn, put = (run.step_fn, run.put_batch) if k == 1 else (run.steps_fn, lambda b: run.put_batches([b] * k))
  compiled = time.perf_counter()
  state = jax.block_until_ready(run.step_layout(run.init_state(jax.random.PRNGKey(0))))
  initialised = time.perf_counter()
  if _COMPILE_ONLY.value:
    return {'compile_seconds': compiled - start, 'init_seconds': initialised - compiled}
  rng = jax.device_put(jax.random.key_data(jax.random.PRNGKey(1)), sharding.replicated(run.mesh))
  device_batch = put(batch)
  state, metrics = step_fn(state, device_batch, rng)
  jax.block_until_ready((state, metrics))
  first = time.perf_counter()
  state, metrics = step_fn(state, device_batch, rng)
  jax.block_until_ready((state, metrics))
  start_steps = time.perf_counter()
  calls = []  # seconds each call of the step takes to return: dispatch, unless something makes it wait for the GPU
  for _ in range(_STEPS.value):
    if _FRESH_BATCHES.value:  # as training puts each batch (ELECTRA_JAX_STAGE_BATCHES: where the last one was)
      device_batch = put(batch)
    called = time.perf_counter()
    state, metrics = step_fn(state, device_batch, rng)
    calls.append(time.perf_counter() - called)
  jax.block_until_ready((state, metrics))
  seconds = (time.perf_counter() - start_steps) / _STEPS.value / k
  profile = {}
  if _PROFILE.value:
    try:  # a profiler that cannot start (no CUPTI, say) must not cost the numbers above
      with tempfile.TemporaryDirectory() as temporary:
        trace = _TRACE_DIR.value or temporary
        with jax.profiler.trace(trace):
          for _ in range(_PROFILE.value):
            state, metrics = step_fn(state, device_batch, rng)
          jax.block_until_ready((state, metrics))
        text = executable.as_text()
        if _TRACE_DIR.value:
          with open(os.path.join(trace, 'train_step.hlo.txt'), 'w', encoding='utf-8') as f:
            f.write(text)
        module = kernels.read(text)
        newest = max(glob.glob(os.path.join(trace, '**', '*.xplane.pb'), recursive=True), key=os.path.getmtime)
        ops = kernels.timed_ops(newest, module, _PROFILE.value * k)
        print(kernels.format_timed(ops), flush=True)
        rows = []
        if peak := peak_flops_per_device(c.model.dtype):
          rows = kernels.against_roofline(ops, module, memory_bandwidth(), peak)
          print(kernels.format_roofline(rows), flush=True)
        else:
          print('no roofline: this device\'s peak is not known; give --peak_tflops', flush=True)
        profile = {'profile_ms': {g: round(t, 4) for g, (t, _) in kernels.by_group(ops).items()},
                   'profile_top': [{'ms': round(op.ms, 4), 'launches': op.launches, 'group': op.group,
                                    'name': op.name, 'op_name': op.op_name} for op in ops[:15]],
                   'profile_least_ms': {kind: [round(ms, 4), round(least, 4)]
                                        for kind, (ms, least) in kernels.by_kind(rows).items()}}
    except Exception as e:  # pylint: disable=broad-except
      profile = {'profile_error': f'{type(e).__name__}: {str(e)[:300]}'}
      print(f'profile failed: {profile["profile_error"]}', flush=True)
  memory = jax.devices()[0].memory_stats() or {}
  return {'step_seconds': seconds, 'compile_seconds': compiled - start, 'init_seconds': initialised - compiled,
          'first_step_seconds': first - t0, 'call_seconds': float(np.median(calls)) / k, 'steps_per_call': k,
          'peak_gib': memory.get('peak_bytes_in_use', 0) / 2**30,
          'loss': float(metrics['loss'][0] / metrics['loss'][1]), **cuda_graphs(executable), **profile}


def cuda_graphs(executable) -> dict:
  """On a GPU with XLA's command buffers on: {'graphs': N, 'alone': M}, the CUDA graphs the step would run in
  and the kernels launched alone between them (kernels.graphs: an estimate from the compiled text); else {}."""
  settings = kernels.graph_settings(os.environ.get('XLA_FLAGS', ''))
  if jax.devices()[0].platform != 'gpu' or settings is None:
    return {}
  try:
    graphs = kernels.graphs(executable.as_text(), **settings)
  except Exception as e:  # pylint: disable=broad-except  (an executable read from the cache without its text)
    print(f'CUDA graphs: not estimated: {type(e).__name__}: {str(e)[:200]}', flush=True)
    return {}
  print(f'CUDA graphs (an estimate from the compiled text): {graphs}', flush=True)
  return {'graphs': len(graphs.sizes), 'alone': graphs.alone}


def time_torch(steps: int) -> tuple[str, dict | None]:
  """bench/torch_step.py's line for the same config, batch and length, run in a process of its own, and its numbers
  (None when it failed)."""
  here = os.path.dirname(os.path.abspath(__file__))
  overrides = [a for a in sys.argv[1:] if a.startswith(('--config', '--batch', '--length', '--vocab'))]
  command = [sys.executable, os.path.join(here, 'torch_step.py'), *overrides, f'--steps={steps}']
  if _TORCH_COMPILE.value:
    command.append('--compile')
  try:
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=TORCH_SECONDS)
  except subprocess.TimeoutExpired:  # a CPU-only torch on a GPU machine, say: the JAX numbers still come
    return f'torch: FAILED: no result within {TORCH_SECONDS} s', None
  lines = [line for line in done.stdout.splitlines() if line.startswith('torch')]
  results = [json.loads(line[len('RESULT '):]) for line in done.stdout.splitlines() if line.startswith('RESULT ')]
  if done.returncode or not lines or not results:
    return 'torch: FAILED: ' + (done.stderr.strip().splitlines() or ['no output'])[-1][:300], None
  return lines[-1], results[-1]


def main(argv):
  del argv
  # The PyTorch step first, before this process starts JAX's backend: on a GPU that preallocates 75% of its memory.
  torch_line, torch_result = time_torch(_STEPS.value) if _VS_TORCH.value and not _COMPILE_ONLY.value else ('', None)
  t0 = time.perf_counter()  # the first step's seconds count from here: the backend's start, compile, initialiser
  if _COMPILE_CACHE.value:
    compile_cache.enable(_COMPILE_CACHE.value)
  cfg = _CONFIG.value
  cfg.batch_size = _BATCH.value
  if _LENGTH.value:
    cfg.data.max_seq_length = _LENGTH.value
  c = config_lib.load(cfg, vocab_size=_VOCAB.value)
  print(report.devices_line(), flush=True)
  length = c.data.max_seq_length
  batch = synthetic.random_batch(c.batch_size, length, c.model.vocab_size)
  step_flops = objective.train_flops_per_step(c)  # what the trainer counts for this objective
  m = c.model
  print(f'model: {m.num_layers} layers, H={m.hidden_size}, E={m.embedding_size}, vocab={m.vocab_size}, '
        f'dtype={m.dtype}, attention={m.attention}, dropout {m.dropout_rate}/{m.attention_dropout_rate} '
        f'({m.dropout_draw}), scan_layers={m.scan_layers}, remat={m.remat}; batch {c.batch_size} x {length}; '
        f'prng {jax.config.jax_default_prng_impl}', flush=True)
  r = time_jax(c, batch, t0)
  if _COMPILE_ONLY.value:
    print(f'jax:   compile {r["compile_seconds"]:.1f} s\nRESULT {json.dumps(r)}', flush=True)
    return
  peak = peak_flops_per_device(c.model.dtype)  # after the timing: on a CPU it times matmuls
  seconds, tokens = r['step_seconds'], c.batch_size * length
  mfu = step_flops / seconds / (peak * jax.device_count()) if peak else None
  r.update(tokens_per_second=tokens / seconds, mfu=mfu, device=jax.devices()[0].device_kind)
  k = r['steps_per_call']
  call = f'a call of {k} steps returns in {r["call_seconds"] * k * 1e3:.2f} ms' if k > 1 else (
      f'a call returns in {r["call_seconds"] * 1e3:.2f} ms')
  print(f'jax:   step {seconds * 1e3:.2f} ms ({call}), '
        f'{tokens / seconds:,.0f} tokens/s, '
        f'{step_flops / seconds / 1e12:.3f} TFLOP/s model, '
        f'{f"MFU {mfu:.1%} (peak {peak / 1e12:.2f} TFLOP/s a device)" if peak else "MFU unknown (--peak_tflops)"}; '
        f'compile {r["compile_seconds"]:.1f} s, initialiser {r["init_seconds"]:.1f} s, first step at '
        f'{r["first_step_seconds"]:.1f} s, peak memory {r["peak_gib"]:.2f} GiB', flush=True)
  if torch_line:
    print(torch_line, flush=True)
    # Both on this machine's CPU (its cores, however many devices XLA fakes on them), or each on one GPU.
    on_cpu, on_gpu = (jax.default_backend() == platform for platform in ('cpu', 'gpu'))
    if torch_result and not (on_cpu if torch_result['device'] == 'cpu' else on_gpu and jax.device_count() == 1):
      print(f'no jax/torch ratio: torch ran on {torch_result["device"]}, jax on '
            f'{jax.device_count()} x {jax.devices()[0].device_kind}', flush=True)
    elif torch_result:
      r['torch_step_seconds'] = torch_result['seconds']
      print(f'jax/torch speed ratio {r["torch_step_seconds"] / seconds:.2f}x (above 1: jax is faster)', flush=True)
  print('RESULT ' + json.dumps(r), flush=True)


if __name__ == '__main__':
  app.run(main)
