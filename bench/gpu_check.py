"""The GPU check: one command, at most 9 minutes on a bare GPU machine, that measures what issue 44 asks of a GPU.

  python3 bench/gpu_check.py OUTDIR [--tiny] [--stages=versions,small,...] [--budget=510]

Stages, most valuable first, each in a process of its own with its own time limit; a stage that would start past
the budget is skipped (a second run with --stages=... takes the rest):
  versions   the GPU, driver, python and package versions, and the devices jax sees;
  small      ELECTRA-Small, batch 128 x 128: the JAX step against the PyTorch step (bench/step_throughput.py
             --vs_torch);
  quickstart the README's GPU quickstart for 600 steps from empty caches: a checkpoint and the summary;
  resume     the same command again, its last checkpoint (600) removed: it resumes at 500 with JAX's compile cache
             warm (the same compiled step): seconds from launch to its first step, and to each of its lines
             (the train step's compile, the restore): where those seconds went;
  loop       the quickstart's training loop again, its parts timed on the host (bench/loop_overhead.py --real: the
             batch, putting it on the GPU, calling the step, waiting for the step before, logging), 5 steps a call
             as configs/small.py runs them; then again with 1 step a call (config.steps_per_call);
  compile    the Small step compiled alone from an empty compile cache (the first step's largest part), with XLA's
             defaults and with each of COMPILE_LEVERS;
  base       ELECTRA-Base, batch 32 x 512, against PyTorch (MFU);
  levers     Small (Base for the levers named `Base: ...`) with one lever changed at a time (LEVERS below, or those
             --levers names), each against the plain GPU defaults (the first, beside the PyTorch step), over 30
             steps; their steps are compiled first, all at once, into a compile cache of their own. The PROFILED
             levers (without command buffers: CUDA graphs) are also profiled: the kernels' time per part of the step
             against the step's time (a gap is the GPU waiting for launches), the costliest kernels and each
             kind of kernel against the least time its bytes and FLOPs allow (electra_jax.kernels); the trace and
             the compiled step's HLO stay in OUTDIR/trace/LEVER.
The timed runs log XLA's command buffers (GRAPH_LOG): each row says how many CUDA graphs were launched and how many
were updated first, and what the updates cost the host. Logs go to OUTDIR/logs/STAGE.log; the table at the end goes
to stdout and OUTDIR/table.md, the numbers to OUTDIR/results.jsonl. `--tiny` runs the same stages on a CPU with
tiny sizes in about two minutes (a test does).

The packages the GPU image may lack (ml_collections, tensorboardX, grain, array_record, portpicker) are
installed from wheels in WHEELS (default .whl/ in the repository) into a folder of their own, when an import
fails; docs/gpu.md says how to download them and carry them to the machine.
"""

import argparse
import concurrent.futures
import contextlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NEEDED = ('ml_collections', 'tensorboardX', 'grain', 'array_record', 'portpicker')
VERSIONS = ('jax', 'jaxlib', 'flax', 'optax', 'orbax.checkpoint', 'numpy', 'torch', 'transformers', 'grain',
            'ml_collections', 'sentencepiece', 'tokenizers', 'matplotlib')  # the last: compare's plot
STAGES = ('versions', 'small', 'quickstart', 'resume', 'loop', 'compile', 'base', 'levers')
# One lever at a time, against the plain command (name: (environment, extra flags)). Config keys are the model's and
# the objective's; the rest are read by jax when it starts.
EINSUM = ['--config.model.attention=einsum']  # on a GPU: the paper's attention dropout (config.ATTENTIONS)
UNIFORM = ['--config.model.dropout_draw=uniform']  # threefry masks, row by row (config.DROPOUT_DRAWS)
BASELINE = 'none (the plain GPU defaults)'
NO_GRAPHS = '--xla_gpu_enable_command_buffer='  # XLA's command buffers (CUDA graphs) off
# XLA's default command buffers and loops (CUDA 12.3+), unrolled into the graph: a scan's body slices the stacked
# layers at the iteration's index, and XLA records such a loop only unrolled (kernels.graphs).
LOOPS_IN_GRAPHS = '--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL --xla_gpu_command_buffer_unroll_loops=true'
SCAN = ['--config.model.scan_layers=true']
# The GPU defaults before 2026-11-28 (config.for_platform): a mask drawn a dropout at a time (not an encoder's in one
# draw); the query, key and value projections as three matmuls (not one).
MASK_EACH = ['--config.model.dropout_draw=rbg']
THREE_QKV = ['--config.model.fused_qkv=false']
ONE_ARRAY_EACH = ['--config.optimizer.flat_params=false']  # GPUs' default: a few vectors (optimizer.FlatParams)
STEPS_PER_CALL = 5  # configs/small.py's steps_per_call (the loop stage's second run)
ONE_STEP = ['--config.steps_per_call=1']  # configs/small.py runs STEPS_PER_CALL
FUSION_AUTOTUNER_OFF = '--xla_gpu_experimental_enable_fusion_autotuner=false'  # GEMMs are autotuned still
ONE_GRAPH = {'XLA_FLAGS': LOOPS_IN_GRAPHS, 'JAX_THREEFRY_GPU_KERNEL_LOWERING': 'false'}  # no custom call ends a graph
LEVERS = {  # most informative first (a run out of budget measures the first ones); all compile at once
    # The `small` stage's step again, compiled beside the others as they are (see levers()), and the PyTorch step
    # beside it: the baseline measured the same way. On a GPU: cuDNN's fused attention without attention dropout,
    # an encoder's dropout masks in one RngBitGenerator draw, the query, key and value projections as one GEMM
    # (config.for_platform).
    BASELINE: ({}, []),
    # jax 0.11's XLA also autotunes each fusion that reduces or transposes between its two emitters (XLA's own and
    # Triton's block-level one), each compiled as a module of its own: for an H200 without a GPU, Small's and Base's
    # steps compile 2.5-3x as long with it as without, to the same kernels (BENCHMARKS.md; jax 0.10's XLA has none).
    # Its compile alone: the compile stage's lever of the same name.
    'fusion autotuner off': ({'XLA_FLAGS': FUSION_AUTOTUNER_OFF}, []),
    # The GPU defaults before 2026-11-28, chosen from a compile for an H100 without a GPU (not yet measured on
    # one): the query, key and value projections as three GEMMs (model.fused_qkv) and a dropout mask drawn at a
    # time (model.dropout_draw), Small's step 1,336 -> 1,628 kernels; each alone.
    'fused_qkv off, dropout_draw=rbg': ({}, [*THREE_QKV, *MASK_EACH]),
    'fused_qkv off': ({}, THREE_QKV),
    # The parameters and Adam's moments one array each again, not a few vectors (optimizer.flat_params, on by
    # default on GPUs since it keeps the math): without a GPU, Small's step 1,674 -> 1,336 kernels with them (the
    # optimizer's 312 -> 16, the weights' casts a few kernels).
    'flat params off': ({}, ONE_ARRAY_EACH),
    # The Small step is ~1,340 kernels; with XLA's command buffers (CUDA graphs) the profiler sees the graphs, not
    # their kernels: PROFILED, for Small and Base.
    'command buffers off': ({'XLA_FLAGS': NO_GRAPHS}, []),
    # jax's threefry CUDA kernel is a custom call XLA records in no command buffer: each one ends a CUDA graph. The
    # step keeps 8 (masking, sampling); inline, it has none.
    'threefry inline': ({'JAX_THREEFRY_GPU_KERNEL_LOWERING': 'false'}, []),
    # A mask drawn a dropout at a time, not an encoder's layer-output masks in one draw (model.Encoder.tower_keep):
    # for an H100 without a GPU, Small's step 2,025 -> 2,171 kernels (dropout's 1 -> 171) and its XLA compile 15.2
    # -> 24.7 s (measured before flat parameters).
    'dropout_draw=rbg': ({}, MASK_EACH),
    # One layer's body compiled for the twelve: XLA:GPU compiles Small's step in a third of the time (for an H100
    # on a CPU: 7.9 s against 24.6 s), and its four loops are recorded in the CUDA graphs with WHILE (as XLA's
    # defaults run them, each iteration's kernels are launched from the host: 3,375 launches a step).
    'scan_layers with loops in CUDA graphs': ({'XLA_FLAGS': LOOPS_IN_GRAPHS}, SCAN),
    # configs/small.py runs 5 steps in each call of one program (Pretraining.steps_fn: a scan over 5 batches), the
    # host's work per call (arguments, launches, the graphs' updates) spread over 5 steps; one a call, as before
    # (H200, 2026-11-28: 13.8 ms a step against 13.5 alone, but the quickstart's loop 2.7x slower).
    '1 step a call': ({}, ONE_STEP),
    # With loops recorded and threefry inline, the 5 steps are one CUDA graph (1 launch a call), which XLA records
    # again before each launch as buffers moved: 63 ms of the call's 86 (H200, 2026-11-28).
    '5 steps a call in one CUDA graph': (ONE_GRAPH, []),
    # `Base` levers time ELECTRA-Base at batch 32 x 512 (lever_shape): its MFU is issue 44's third goal.
    'Base: none': ({}, []),
    'Base: fusion autotuner off': ({'XLA_FLAGS': FUSION_AUTOTUNER_OFF}, []),
    'Base: flat params off': ({}, ONE_ARRAY_EACH),
    'Base: command buffers off': ({'XLA_FLAGS': NO_GRAPHS}, []),
    'Base: fused_qkv off, dropout_draw=rbg': ({}, [*THREE_QKV, *MASK_EACH]),  # no GPU: 1,330 -> 1,653 kernels
    'Base: dropout_draw=rbg': ({}, MASK_EACH),
    # XLA:GPU's compile: autotuning GEMMs (Triton and cuBLAS candidates, each compiled and run) is much of it.
    'autotune off': ({'XLA_FLAGS': '--xla_gpu_autotune_level=0'}, []),
    # Fewer kernels: Triton GEMMs only (a Triton GEMM can read the float32 weight and cast it; a cuBLAS one needs a
    # kernel to cast it first, ~220 per step); bias epilogues in cuBLASLt GEMMs; sibling fusions of one shape (the
    # optimizer's ~400 updates); reductions and their elementwise neighbours (LayerNorm, bias gradients) fused by
    # Triton.
    'cuBLAS fallback off': ({'XLA_FLAGS': '--xla_gpu_cublas_fallback=false'}, []),
    'cuBLASLt': ({'XLA_FLAGS': '--xla_gpu_enable_cublaslt=true'}, []),
    # GEMM fusions that cuDNN may take (XLA's autotuner weighs its kernels beside Triton's and cuBLAS's; level 3:
    # with their fused operations). A compile for an H100 without a GPU cannot autotune: the same kernels either way.
    'cuDNN GEMM fusions': ({'XLA_FLAGS': '--xla_gpu_cudnn_gemm_fusion_level=3'}, []),
    'Base: cuDNN GEMM fusions': ({'XLA_FLAGS': '--xla_gpu_cudnn_gemm_fusion_level=3'}, []),
    'Triton GEMMs off': ({'XLA_FLAGS': '--xla_gpu_enable_triton_gemm=false'}, []),
    # Compiled for an H200 without a GPU (jax 0.11.2, 2026-11-29): the same-shape fusion changes nothing (1,339
    # kernels, bound 4.75 ms); Triton's heroless fusion makes Small's step 2,123 kernels, bound 11.2 ms.
    'same-shape multi-output fusion': ({'XLA_FLAGS': '--xla_gpu_experimental_enable_same_shape_multi_output_fusion='
                                                     'true'}, []),
    'Triton heroless fusion': ({'XLA_FLAGS': '--xla_gpu_experimental_enable_triton_heroless_priority_fusion=true'},
                               []),
    # LayerNorm (forward 3 kernels, backward 4 in XLA's fusions) matched to cuDNN's fused norm kernels: without a GPU
    # the compile matched none (jax 0.10.2 with cuDNN 9.8, 0.11.2 with 9.20; it may need the GPU's cuDNN).
    'cuDNN LayerNorm': ({'XLA_FLAGS': '--xla_gpu_enable_cudnn_layer_norm=true'}, []),
    # Training puts a new batch on the device every step (this check's steps reuse one): on a GPU the quickstart
    # loop trains at ~28 ms a step; a command buffer (CUDA graph) whose inputs move is updated (2026-11-27, H200:
    # 27.5 ms a step, 21.7 staged, 23.6 with one batch)
    'fresh batches': ({}, ['--fresh_batches']),
    'fresh batches, staged': ({'ELECTRA_JAX_STAGE_BATCHES': '1'}, ['--fresh_batches']),  # Pretraining.put_batch
    'fresh batches, command buffers off': ({'XLA_FLAGS': NO_GRAPHS}, ['--fresh_batches']),
    # The masks of the CPU and TPU: threefry, a row at a time (the GPU's default before 2026-11-27).
    'dropout_draw=uniform': ({}, UNIFORM),
    # The paper's attention dropout: scores, softmax, dropout and their gradients in ~10 kernels per layer over
    # [batch, heads, length, length], not one cuDNN kernel.
    'attention=einsum (attention dropout)': ({}, EINSUM),
    'dropout_draw=uniform, attention=einsum (attention dropout)': ({}, [*EINSUM, *UNIFORM]),
    'prng=rbg': ({'JAX_DEFAULT_PRNG_IMPL': 'rbg'}, []),
    'command buffers for every kind': ({'XLA_FLAGS': '--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,'
                                                     'CUSTOM_CALL,CUDNN --xla_gpu_graph_min_graph_size=1'}, []),
    # Compile time (the first step's): one layer's body compiled for all twelve.
    'scan_layers': ({}, SCAN),
    # Four times the tokens per step: a step that takes about as long is bound by its launches, not its work.
    'batch 512 x 128': ({}, ['--batch=512']),
    'Base: dropout_draw=uniform': ({}, UNIFORM),
    'Base: attention=einsum (attention dropout)': ({}, EINSUM),
}
# Levers of the compile alone (stage `compile`; name: (environment, extra flags); `{out}` in XLA_FLAGS is the check's
# directory), most informative first: XLA's defaults (which write their autotuning results); without jax 0.11's
# autotuning of fusion emitters (the lever `fusion autotuner off` above); the autotuning results of the first compile
# read back, so that XLA autotunes nothing: what results shipped for a GPU model would save a cold start; the query, key
# and value projections as three GEMMs and a dropout mask drawn at a time (the GPU defaults before 2026-11-28; a compile
# for an H100 without a GPU, jax 0.10: 34.7 s against 23.0 s); no autotuning at all (`--xla_gpu_autotune_level=0`);
# autotuning without its buffer initialisation and its check of each candidate against a reference (level 1 of XLA's 4,
# the default); one layer's body compiled for all (a third of the compile, but more kernels a step: docs/gpu.md).
AUTOTUNE_RESULTS = '{out}/autotune_results.textproto'
COMPILE_LEVERS = {
    'XLA defaults': ({'XLA_FLAGS': f'--xla_gpu_dump_autotune_results_to={AUTOTUNE_RESULTS}'}, []),
    'fusion autotuner off': ({'XLA_FLAGS': FUSION_AUTOTUNER_OFF}, []),
    'autotune results of the first compile': (
        {'XLA_FLAGS': f'--xla_gpu_load_autotune_results_from={AUTOTUNE_RESULTS}'}, []),
    'fused_qkv off, dropout_draw=rbg': ({}, [*THREE_QKV, *MASK_EACH]),
    'autotune off': ({'XLA_FLAGS': '--xla_gpu_autotune_level=0'}, []),
    'autotune level 1': ({'XLA_FLAGS': '--xla_gpu_autotune_level=1'}, []),
    'scan_layers': ({}, SCAN),
}
PROFILED = ('command buffers off', 'Base: command buffers off')  # levers also profiled: each kernel's time
# XLA's log of its command buffers (CUDA graphs), on for the timed GPU runs: a graph is updated (its commands
# recorded again) before a launch whenever a buffer it uses has moved since the last one, on the host, before the
# launch. The profiler cannot show this: XLA runs a step without command buffers while a profile is taken.
GRAPH_LOG = {'TF_CPP_MIN_LOG_LEVEL': '0', 'TF_CPP_VMODULE': 'command_buffer_thunk=3'}
LEVER_COMPILES_AT_ONCE = 16  # the GPU machines lent have 16 cores; one XLA compile keeps few of them busy
# --tiny: the profile, a lever that changes the program on a CPU too, and the lever of the steps a call
TINY_LEVERS = (PROFILED[0], 'prng=rbg', '1 step a call')
TINY_MODEL = ['--config.model.num_layers=1', '--config.model.hidden_size=32', '--config.model.num_heads=1',
              '--config.model.intermediate_size=64', '--config.model.embedding_size=32']


def chosen(names, wanted: tuple[str, ...]) -> list[str]:
  """`names` (in their order) that `wanted` names: each a whole name, or else the beginning of names; all if none."""
  return [n for n in names if not wanted or any(n == w or (w not in names and n.startswith(w)) for w in wanted)]


class Stopped(Exception):
  """SIGTERM or SIGINT (a time limit around the check): `Check.stop`."""


class Check:
  """Runs the stages, keeps their rows, prints the table."""

  def __init__(self, out: str, tiny: bool, budget: float, python: str, only: tuple[str, ...] = ()):
    self.out, self.tiny, self.budget, self.python, self.only = out, tiny, budget, python, only
    self.logs = os.path.join(out, 'logs')
    os.makedirs(self.logs, exist_ok=True)
    self.start = time.monotonic()
    self.rows = []
    self.children = set()  # the stages' processes running now (several when levers compile at once)
    self.env = dict(os.environ, PYTHONUNBUFFERED='1')
    self.env['PYTHONPATH'] = os.pathsep.join(p for p in (REPO, self.env.get('PYTHONPATH', '')) if p)
    if tiny:
      self.env['JAX_PLATFORMS'] = 'cpu'
    self.cache = os.path.join(out, 'cache')  # ELECTRA_JAX_CACHE of the quickstart: empty at first
    self.graph_log = {} if tiny else GRAPH_LOG  # a CPU records no command buffers

  def elapsed(self) -> float:
    return time.monotonic() - self.start

  def stop(self, signum, frame):
    """A signal handler: kills the running stages' process groups (nothing of the check outlives it, holding the
    GPU's memory for the next command), then ends the check with the table of the stages before."""
    del frame
    for process in list(self.children):
      with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    raise Stopped(f'{signal.Signals(signum).name} at {self.elapsed():.0f} s')

  def room(self, stage: str, needs: float) -> bool:
    if self.elapsed() + needs > self.budget:
      self.row(stage, 'skipped', 0.0, f'past the budget of {self.budget:.0f} s (at {self.elapsed():.0f} s)')
      return False
    return True

  def row(self, stage: str, status: str, seconds: float, result: str, numbers: dict | None = None):
    self.rows.append((stage, status, seconds, result))
    with open(os.path.join(self.out, 'results.jsonl'), 'a', encoding='utf-8') as f:
      f.write(json.dumps({'stage': stage, 'status': status, 'seconds': round(seconds, 1), 'result': result,
                          **(numbers or {})}) + '\n')
    print(f'[{self.elapsed():5.0f} s] {stage}: {status} ({seconds:.0f} s) {result}', flush=True)

  def command(self, name: str, argv: list[str], limit: float, env: dict | None = None,
              poll=None) -> tuple[str, str, float]:
    """(status, output, seconds) of argv run from the repository root, killed after `limit` seconds; `poll()`, if
    given, is called every 20 ms while it runs."""
    log = os.path.join(self.logs, re.sub(r'[^\w.\-]+', '_', name) + '.log')
    limit = max(1.0, min(limit, self.budget + 45 - self.elapsed()))  # the whole check ends within budget + 45 s
    start = time.monotonic()
    with open(log, 'w', encoding='utf-8') as f:
      f.write('$ ' + ' '.join(argv) + '\n')
      f.flush()
      process = subprocess.Popen(argv, cwd=REPO, env={**self.env, **(env or {})}, stdout=f,
                                 stderr=subprocess.STDOUT, start_new_session=True)
      self.children.add(process)
      try:
        while process.poll() is None and time.monotonic() - start < limit:
          if poll:
            poll()
          time.sleep(0.02)
        if process.poll() is None:
          os.killpg(process.pid, signal.SIGKILL)
          process.wait()
          status = f'TIMEOUT ({limit:.0f} s)'
        else:
          status = 'ok' if process.returncode == 0 else f'FAILED (exit {process.returncode})'
      finally:
        self.children.discard(process)
    with open(log, encoding='utf-8', errors='replace') as f:
      return status, f.read(), time.monotonic() - start

  # The stages.

  def versions(self):
    script = ('import importlib, jax\n'
              f'for m in {VERSIONS!r}:\n'
              '  try: print(m, getattr(importlib.import_module(m), "__version__", "?"))\n'
              '  except Exception as e: print(m, "MISSING", type(e).__name__)\n'
              'from electra_jax import report; print(report.devices_line())\n')
    smi = shutil.which('nvidia-smi')
    gpu = subprocess.run([smi, '--query-gpu=name,memory.total,driver_version', '--format=csv,noheader'],
                         capture_output=True, text=True, check=False).stdout.strip() if smi else 'no nvidia-smi'
    status, output, seconds = self.command('versions', [self.python, '-c', script], 120)
    found = dict(line.split(' ', 1) for line in output.splitlines() if re.match(r'^[\w.]+ \S', line)
                 and line.split(' ', 1)[0] in VERSIONS)
    devices = next((line for line in output.splitlines() if line.startswith('devices:')), '')
    self.row('versions', status, seconds, f'{gpu}; python {sys.version.split()[0]}; ' + ', '.join(
        f'{k} {v}' for k, v in found.items()) + f'; {devices}', {'gpu': gpu, 'versions': found})

  def throughput_argv(self, config: str, batch: int, length: int, steps: int, extra: list[str] = (),
                      torch: bool = True, profile: int = 0) -> list[str]:
    argv = [self.python, 'bench/step_throughput.py', f'--config={config}', f'--batch={batch}', f'--length={length}',
            f'--steps={steps}', *extra]
    if self.tiny:
      argv += ['--vocab=500', *TINY_MODEL]
    if torch:
      argv.append('--vs_torch')
    if profile:
      argv.append(f'--profile={profile}')
    return argv

  def throughput(self, name: str, config: str, batch: int, length: int, steps: int, limit: float,
                 extra: list[str] = (), env: dict | None = None, torch: bool = True, profile: int = 0,
                 note: str = ''):
    argv = self.throughput_argv(config, batch, length, steps, extra, torch, profile)
    status, output, seconds = self.command(name, argv, limit, {**self.graph_log, **(env or {})})
    result = _result(output)
    if result is None:
      self.row(name, status, seconds, _last_line(output))
      return None
    graphs, graph_note = graph_updates(output)
    if graphs:
      result['graph_log'] = graphs
    per_call = result.get('steps_per_call', 1)
    call = (f'a call of {per_call} steps returns in {result["call_seconds"] * per_call * 1e3:.2f} ms' if per_call > 1
            else f'a call returns in {result["call_seconds"] * 1e3:.2f} ms')
    text = (f'{result["step_seconds"] * 1e3:.2f} ms/step ({call}), '
            f'{result["tokens_per_second"]:,.0f} tokens/s, MFU '
            f'{"unknown" if result["mfu"] is None else format(result["mfu"], ".1%")}, '
            f'compile {result["compile_seconds"]:.1f} s, initialiser '
            f'{result["init_seconds"]:.1f} s, first step at {result["first_step_seconds"]:.1f} s{note}')
    if 'graphs' in result:
      text += f'; {result["graphs"]} CUDA graphs and {result["alone"]} kernels launched alone (estimated)'
    text += graph_note
    if 'torch_step_seconds' in result:
      text += (f'; torch {result["torch_step_seconds"] * 1e3:.2f} ms/step, jax/torch '
               f'{result["torch_step_seconds"] / result["step_seconds"]:.2f}x')
    if 'profile_error' in result:
      text += f'; profile failed: {result["profile_error"]}'
    if 'profile_ms' in result:  # kernels' time summed per part of the step, against the step's time
      busy = sum(result['profile_ms'].values())
      text += ('; profile: ' + ', '.join(f'{g} {ms:.2f} ms' for g, ms in result['profile_ms'].items())
               + f' (kernels {busy:.1f} ms of the {result["step_seconds"] * 1e3:.1f} ms step)')
      if result['profile_top']:
        top = result['profile_top'][0]
        text += f'; costliest: {top["name"]} {top["ms"]:.2f} ms ({top["op_name"][-60:]})'
      text += '; least time / measured: ' + ', '.join(  # each kind of kernel against its bytes' and FLOPs' bound
          f'{kind} {least / ms:.0%} of {ms:.2f} ms' for kind, (ms, least) in result['profile_least_ms'].items()
          if ms > 0 and ms >= 0.01 * busy)
    self.row(name, status, seconds, text, result)
    return result

  def small(self):
    if self.tiny:  # as configs/small.py: STEPS_PER_CALL steps a call
      return self.throughput('small', 'configs/tiny.py', 8, 32, 2, 240, [f'--config.steps_per_call={STEPS_PER_CALL}'])
    return self.throughput('small', 'configs/small.py', 128, 128, 30, 240)

  def base(self):
    if self.tiny:
      return self.throughput('base', 'configs/tiny.py', 8, 64, 2, 240)
    return self.throughput('base', 'configs/base.py', 32, 512, 20, 200)

  def levers(self):
    """Each lever's step is compiled first, all at once, into one compile cache (the compile was most of a lever's
    cost: 73 s of the Small step on an H200, one XLA compile keeping few of the host's cores busy), then timed one
    lever at a time, its step read back from that cache."""
    names = TINY_LEVERS if self.tiny else chosen(LEVERS, self.only)
    compiled, unknown = {}, {}  # unknown: {lever: the XLA flag this jax's XLA does not have}
    if self.room('lever compiles', 30 if self.tiny else 120):
      start = time.monotonic()
      with concurrent.futures.ThreadPoolExecutor(max_workers=LEVER_COMPILES_AT_ONCE) as pool:
        for name, (seconds, flag) in zip(names, pool.map(self.compile_lever, names)):
          if seconds is not None:
            compiled[name] = seconds
          elif flag:
            unknown[name] = flag
      self.row('lever compiles', 'ok' if len(compiled) == len(names) else f'{len(compiled)} of {len(names)}',
               time.monotonic() - start, f'{len(names)} steps compiled, {LEVER_COMPILES_AT_ONCE} at a time: '
               + ', '.join(f'{name} {seconds:.0f} s' for name, seconds in compiled.items()), {'compile': compiled})
    for name in names:
      if name in unknown:
        self.row(f'lever: {name}', 'skipped', 0.0, f'this jax\'s XLA has no flag {unknown[name]}')
        continue
      if not self.room(f'lever: {name}', 20 if self.tiny or name in compiled else 60):
        continue
      env, extra = self.lever(name)
      note = f' (read from the cache; compiled in {compiled[name]:.1f} s beside the others)' if name in compiled else ''
      if name in PROFILED:
        extra = [*extra, '--trace_dir=' + os.path.join(self.out, 'trace', re.sub(r'\W+', '_', name))]
      self.throughput(f'lever: {name}', *self.lever_shape(name), 120 if self.tiny else 150, extra, env,
                      torch=name == BASELINE, note=note, profile=(1 if self.tiny else 2) if name in PROFILED else 0)

  def lever(self, name: str) -> tuple[dict, list[str]]:
    """The environment and extra flags of lever `name`: its XLA_FLAGS after the check's own, its step kept in the
    levers' compile cache."""
    env, extra = LEVERS[name]
    return self.lever_env(env), [*extra, '--compile_cache=' + os.path.join(self.out, 'lever_cache')]

  def lever_env(self, env: dict) -> dict:
    """A lever's environment, its XLA_FLAGS after the check's own."""
    if 'XLA_FLAGS' in env:
      env = {**env, 'XLA_FLAGS': ' '.join(filter(None, (self.env.get('XLA_FLAGS', ''), env['XLA_FLAGS'])))}
    return env

  def lever_shape(self, name: str) -> tuple[str, int, int, int]:
    """Lever `name`'s config, batch, length and timed steps: ELECTRA-Base's at 32 x 512 for a `Base` lever."""
    if self.tiny:
      return 'configs/tiny.py', 8, 32, 2
    return ('configs/base.py', 32, 512, 30) if name.startswith('Base') else ('configs/small.py', 128, 128, 30)

  def compile_lever(self, name: str) -> tuple[float | None, str]:
    """(seconds to compile lever `name`'s step into the levers' compile cache beside the others or None if that
    failed, the XLA flag it failed on if XLA did not know it). Without preallocation: the processes share the GPU
    while they autotune."""
    env, extra = self.lever(name)
    argv = self.throughput_argv(*self.lever_shape(name), extra, torch=False) + ['--compile_only']
    _, output, _ = self.command(f'lever compile: {name}', argv, 240, {**env, 'XLA_PYTHON_CLIENT_PREALLOCATE': 'false'})
    result = _result(output)
    unknown = re.search(r'Unknown flags? in XLA_FLAGS: (\S+)', output)
    return (result['compile_seconds'] if result else None), (unknown.group(1) if unknown and not result else '')

  def quickstart_argv(self) -> list[str]:
    """The quickstart for 600 steps (tiny: 20) with a checkpoint 100 steps (tiny: 10) before the end."""
    workdir = os.path.join(self.out, 'quickstart')
    argv = [self.python, '-m', 'electra_jax.main', f'--workdir={workdir}']
    if self.tiny:
      return argv + ['--config=configs/tiny.py', '--config.train_steps=20', '--config.eval_every=0',
                     f'--config.steps_per_call={STEPS_PER_CALL}',  # as configs/small.py
                     '--config.data.vocab_size=500', '--config.checkpoint_every=10', *TINY_MODEL]
    return argv + ['--config=configs/small.py:quickstart', '--config.train_steps=600',
                   '--config.checkpoint_every=500']

  def quickstart(self):
    shutil.rmtree(os.path.join(self.out, 'quickstart'), ignore_errors=True)
    shutil.rmtree(self.cache, ignore_errors=True)
    steps = 20 if self.tiny else 600
    status, output, seconds = self.command('quickstart', self.quickstart_argv(), 300,
                                           {'ELECTRA_JAX_CACHE': self.cache})
    summary = _metrics_line(os.path.join(self.out, 'quickstart', 'metrics.jsonl'))
    stages = '; '.join(line.strip() for line in output.replace('\r', '\n').splitlines()
                       if re.search(r' in [0-9.]+ s$|^devices:', line.strip()))
    checkpoint = os.path.isdir(os.path.join(self.out, 'quickstart', 'checkpoints', str(steps)))
    self.row('quickstart', status, seconds, f'{summary}; checkpoint {steps}: {"yes" if checkpoint else "NO"}; '
             f'{stages}', {'checkpoint': checkpoint})

  def resume(self):
    """Seconds from launching the quickstart's command again, its last checkpoint removed, to its first new step:
    the same command, so the same compiled step, read back from JAX's compile cache (metrics.jsonl gets a line
    every call of STEPS_PER_CALL steps: log_every is the host's, not the compiled step's)."""
    last = 20 if self.tiny else 600
    workdir = os.path.join(self.out, 'quickstart')
    metrics = os.path.join(workdir, 'metrics.jsonl')
    if not os.path.isdir(os.path.join(workdir, 'checkpoints', str(last))):
      self.row('resume', 'skipped', 0.0, 'no quickstart run to resume')
      return
    shutil.rmtree(os.path.join(workdir, 'checkpoints', str(last)))
    steps = last - (10 if self.tiny else 100)  # where it resumes from
    start, first, printed = time.monotonic(), [], {}  # printed: {line: seconds after launch it first showed}
    log, read = os.path.join(self.logs, 'resume.log'), {'offset': 0, 'partial': ''}

    def poll():
      if not first and steps < _last_step(metrics) < last:  # its lines past the checkpoint dropped first
        first.append(time.monotonic() - start)
      if os.path.exists(log):  # what the run printed since the last poll; a line not yet ended waits for the next
        with open(log, 'rb') as f:
          f.seek(read['offset'])
          new = f.read()
        read['offset'] += len(new)
        *lines, read['partial'] = (read['partial'] + new.decode(errors='replace')).replace('\r', '\n').split('\n')
        for line in lines:
          printed.setdefault(line.strip(), time.monotonic() - start)

    argv = [*self.quickstart_argv(), f'--config.log_every={STEPS_PER_CALL}']
    status, output, seconds = self.command('resume', argv, 180, {'ELECTRA_JAX_CACHE': self.cache}, poll)
    if status == 'ok' and not first:
      status = 'FAILED (no new step)'
    # Where the seconds before the first step went: when each of the run's lines showed (polled every 20 ms).
    stages = '; '.join(f'{line} (at {t:.1f} s)' for line, t in printed.items()
                       if re.search(r' in [0-9.]+ s\b|^resuming|^compiling|^devices:', line))
    self.row('resume', status, seconds,
             f'first step {first[0]:.1f} s after launch (compile cache warm); {stages}' if first else stages,
             {'first_step_seconds': first[0] if first else None, 'printed_at': printed})

  def loop(self):
    """The quickstart's run again in a new workdir, its loop's parts timed (bench/loop_overhead.py; --tiny: with a
    step that returns at once), its STEPS_PER_CALL steps a call read from the quickstart's compile cache; then with
    one step a call (a program of its own, compiled)."""
    for name, k in (('loop', STEPS_PER_CALL), ('loop, 1 step a call', 1)):
      if k == 1 and not self.room(name, 30 if self.tiny else 90):
        continue
      argv = [self.python, 'bench/loop_overhead.py', os.path.join(self.out, f'loop{k}'), f'--steps_per_call={k}',
              '--steps=20' if self.tiny else '--steps=600']  # the quickstart's train_steps: the same compiled step
      status, output, seconds = self.command(name, argv if self.tiny else [*argv, '--real'], 240,
                                             {'ELECTRA_JAX_CACHE': self.cache, **self.graph_log})
      text = next((line for line in output.splitlines() if line.startswith('the loop')), _last_line(output))
      graphs, graph_note = graph_updates(output)
      self.row(name, status, seconds, text + graph_note, {'graph_log': graphs} if graphs else None)

  def compile(self):
    """The Small step compiled alone, one process after another, without a compile cache (step_throughput
    --compile_only): its XLA compile seconds under each of COMPILE_LEVERS, and the initialiser's."""
    shape = ('configs/tiny.py', 8, 32, 2) if self.tiny else ('configs/small.py', 128, 128, 30)
    for name, (env, extra) in COMPILE_LEVERS.items():
      if not self.room(f'compile: {name}', 20 if self.tiny else 90):
        continue
      argv = self.throughput_argv(*shape, extra, torch=False) + ['--compile_only']
      env = {k: v.format(out=os.path.abspath(self.out)) for k, v in env.items()}
      status, output, seconds = self.command(f'compile: {name}', argv, 240, self.lever_env(env))
      result = _result(output)
      text = (f'step compiled in {result["compile_seconds"]:.1f} s, initialiser {result["init_seconds"]:.1f} s'
              if result else _last_line(output))
      self.row(f'compile: {name}', status, seconds, text, result)

  def table(self) -> str:
    lines = ['| stage | status | seconds | result |', '|---|---|---|---|']
    lines += [f'| {stage} | {status} | {seconds:.0f} | {result} |' for stage, status, seconds, result in self.rows]
    return '\n'.join(lines)


def _result(output: str) -> dict | None:
  """The numbers of step_throughput's `RESULT {...}` line in `output` (None: it printed none); a log line that
  XLA wrote after it on the same line is ignored."""
  return next((json.JSONDecoder().raw_decode(line[len('RESULT '):])[0] for line in output.splitlines()
               if line.startswith('RESULT ')), None)


def graph_updates(output: str) -> tuple[dict | None, str]:
  """What XLA's log of its command buffers (GRAPH_LOG) says in `output`, as numbers ({'launches', 'updates',
  'update_us' (their total), 'moved' (buffers moved, per update), 'commands' (the updated graph's, per update)})
  and as the words a row ends with, which name the graph whose updates took longest; (None, '') if it logged no
  launch."""
  launches = len(re.findall(r'Execute command buffer\b', output))
  if not launches:
    return None, ''
  # jax 0.10's XLA: 'Update command buffer on device #0 by recoding ...'; 0.11's: 'Create/Update command buffer by
  # recoding ...' (both then '; num_commands=N; updated_allocs=M').
  updates = re.findall(r'Update command buffer\b.*?num_commands=(\d+); updated_allocs=(\d+)', output)
  timed = [(int(n), int(us))  # (the graph's commands, microseconds) per update
           for us, n in re.findall(r'Updated command buffer in (\d+)\D*?; num_commands=(\d+)', output)]
  log = {'launches': launches, 'updates': len(updates), 'update_us': sum(us for _, us in timed),
         'commands': [int(n) for n, _ in updates], 'moved': [int(m) for _, m in updates]}
  if not updates:
    return log, f'; CUDA graphs (XLA\'s log): {launches} launches, none updated'
  words = (f'; CUDA graphs (XLA\'s log): {launches} launches, {len(updates)} after an update, '
           f'{log["update_us"] / 1e3:.1f} ms of updates in all')
  if timed:
    costliest = max({n for n, _ in timed}, key=lambda n: sum(us for m, us in timed if m == n))
    times = [us for n, us in timed if n == costliest]
    moved = [m for n, m in zip(log['commands'], log['moved']) if n == costliest] or [0]
    words += (f'; most of it a graph of {costliest} commands, updated {len(times)} time{"s" * (len(times) != 1)}, '
              f'{statistics.median_low(times)} us each, {statistics.median_low(moved)} buffers moved (medians)')
  return log, words


def _last_line(output: str) -> str:
  lines = [line for line in output.strip().splitlines() if line.strip()]
  return lines[-1][-300:] if lines else 'no output'


def _last_step(path: str) -> int:
  """The step of the last complete line of metrics.jsonl `path` (0: none)."""
  try:
    with open(path, encoding='utf-8') as f:
      lines = [line for line in f if line.endswith('\n')]
    return json.loads(lines[-1]).get('step', 0) if lines else 0
  except (OSError, ValueError):
    return 0


def _metrics_line(path: str) -> str:
  """The last metrics.jsonl line's step, losses and tokens/s."""
  try:
    with open(path, encoding='utf-8') as f:
      last = json.loads([line for line in f if line.strip()][-1])
  except (OSError, ValueError, IndexError):
    return 'no metrics'
  keys = ('loss', 'gen_loss', 'disc_loss', 'gen_accuracy', 'disc_recall', 'tokens_per_second')
  return f'step {last.get("step")}: ' + ', '.join(f'{k} {last[k]:.4g}' for k in keys if k in last)


def install_wheels(python: str, env: dict) -> str:
  """Installs the carried wheels into a folder of their own when `python` cannot import NEEDED; says what it did."""
  probe = f'import importlib\nfor m in {NEEDED!r}:\n  importlib.import_module(m)'
  if subprocess.run([python, '-c', probe], env=env, capture_output=True, check=False).returncode == 0:
    return 'all imports found'
  wheels = os.environ.get('WHEELS', os.path.join(REPO, '.whl'))
  found = sorted(os.path.join(wheels, w) for w in os.listdir(wheels) if w.endswith('.whl')) if os.path.isdir(
      wheels) else []
  if not found:
    return f'imports missing and no wheels in {wheels} (docs/gpu.md: how to carry them)'
  site = tempfile.mkdtemp(prefix='gpu_check_site_')
  done = subprocess.run([python, '-m', 'pip', 'install', '-q', '--no-index', '--no-deps', '--no-compile',
                         '--no-cache-dir', '--target', site, *found], capture_output=True, text=True, check=False)
  if done.returncode:
    return f'wheel install FAILED: {_last_line(done.stderr)}'
  env['PYTHONPATH'] = os.pathsep.join(p for p in (env.get('PYTHONPATH', ''), site) if p)
  return f'installed {len(found)} wheels from {wheels}'


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('out', help='Directory for the logs, the table and results.jsonl.')
  parser.add_argument('--tiny', action='store_true', help='The same stages on a CPU with tiny sizes (~1 minute).')
  parser.add_argument('--stages', default=','.join(STAGES), help=f'Comma-separated, from {", ".join(STAGES)}.')
  parser.add_argument('--budget', type=float, default=510.0, help='Seconds after which stages are skipped.')
  parser.add_argument('--python', default=sys.executable, help='The Python that runs the stages.')
  parser.add_argument('--levers', default='', help='Comma-separated names of the levers to measure, or beginnings of '
                      'names (default: all, in the order of LEVERS), e.g. "--levers=none,Base: none,prng".')
  args = parser.parse_args()
  unknown = set(args.stages.split(',')) - set(STAGES)
  if unknown:
    parser.error(f'unknown stage(s) {", ".join(sorted(unknown))}: choose from {", ".join(STAGES)}')
  check = Check(args.out, args.tiny, args.budget, args.python, tuple(filter(None, args.levers.split(','))))
  signal.signal(signal.SIGTERM, check.stop)
  signal.signal(signal.SIGINT, check.stop)
  needs = {'versions': 10, 'small': 60, 'quickstart': 60, 'resume': 20, 'loop': 40, 'compile': 90, 'base': 60,
           'levers': 30}
  try:
    print(f'wheels: {install_wheels(args.python, check.env)}', flush=True)
    for stage in STAGES:
      if stage in args.stages.split(',') and check.room(stage, 5 if args.tiny else needs[stage]):
        getattr(check, stage)()
  except Stopped as e:
    check.row('check', 'STOPPED', 0.0, f'{e}: the stage running then was killed; the rows above are complete')
  table = check.table()
  with open(os.path.join(args.out, 'table.md'), 'w', encoding='utf-8') as f:
    f.write(table + '\n')
  print(f'\nGPU check{" (--tiny, CPU)" if args.tiny else ""}, {check.elapsed():.0f} s:\n{table}', flush=True)
  return 0 if all(status in ('ok', 'skipped') for _, status, _, _ in check.rows) else 1


if __name__ == '__main__':
  sys.exit(main())
