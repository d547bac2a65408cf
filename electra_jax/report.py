"""What a run tells its user: the stages of its start with their seconds (stderr), and a summary at its end (stdout).

Only process 0 speaks: every host of a multi-host run does the same work, and one report is enough.
"""

import contextlib
import os
import shlex
import shutil
import sys
import threading
import time

import jax

clock = time.perf_counter  # what stages are timed with (a test replaces it)
# The metrics a summary shows, in this order, when the run logged them.
SUMMARY_METRICS = ('loss', 'gen_loss', 'disc_loss', 'gen_accuracy', 'mlm_accuracy', 'disc_accuracy',
                   'disc_precision', 'disc_recall', 'disc_prob_replaced', 'disc_prob_original', 'replaced_fraction')


def is_chief() -> bool:
  """Whether this is process 0 (or the only process). Read from jax.distributed's state rather than
  jax.process_index(), which would start JAX's backend and claim the accelerators: the data command line, which
  needs none, announces its stages too. jax has no public way to ask that does not start the backend, hence the
  private global_state; tests/test_report.py pins it (test_is_chief_reads_jax_without_starting_a_backend)."""
  try:
    from jax._src import distributed  # noqa: PLC0415
    return distributed.global_state.process_id == 0
  except (ImportError, AttributeError):  # another jax: ask it
    return jax.process_index() == 0


def nvidia_gpu_visible(proc: str = '/proc/driver/nvidia') -> bool:
  """Whether this machine shows an NVIDIA GPU: the driver's /proc entry, or `nvidia-smi` on the PATH."""
  return os.path.isdir(proc) or shutil.which('nvidia-smi') is not None


def devices_line() -> str:
  """What this run computes on, e.g. 'devices: 8 x NVIDIA H100 80GB HBM3 (gpu), 1 process', followed by a warning
  line when an NVIDIA GPU is visible but JAX runs on the CPU (jax installed without its CUDA plugin)."""
  devices = jax.devices()
  kinds = sorted({d.device_kind for d in devices})
  line = (f'devices: {len(devices)} x {", ".join(kinds)} ({jax.default_backend()}), {jax.process_count()} '
          f'process{"es" if jax.process_count() > 1 else ""}, jax {jax.__version__}')
  if jax.default_backend() == 'cpu' and nvidia_gpu_visible():
    line += ('\nwarning: an NVIDIA GPU is visible but JAX runs on the CPU: install its CUDA plugin, '
             'pip install "jax[cuda12]==' + jax.__version__ + '" (README: "On a GPU")')
  return line


def log(message: str):
  """`message` on stderr, from process 0 only."""
  if is_chief():
    print(message, file=sys.stderr, flush=True)


@contextlib.contextmanager
def stage(doing: str, done: str = 'done'):
  """Prints `doing...` before the block and `done in N s` after it (process 0), so a slow start says why."""
  log(f'{doing}...')
  start = clock()
  yield
  log(f'{done} in {clock() - start:.1f} s')


CACHE_HIT = '/jax/compilation_cache/cache_hits'  # the event JAX records when the persistent cache has a program
# The durations JAX records of a compile's stages, and what `compiled` calls them. A jit traced inside another
# records its own trace, within the outer one's: each stage's longest is the whole program's.
STAGES = {'/jax/core/compile/jaxpr_trace_duration': 'tracing',
          '/jax/core/compile/jaxpr_to_mlir_module_duration': 'lowering',
          '/jax/core/compile/backend_compile_duration': 'XLA',
          '/jax/compilation_cache/cache_retrieval_time_sec': 'loading'}


def compiled(what: str, compile_fn):
  """(compile_fn(), the line saying `compiled what in N s`, with `(from the compilation cache)` when the program
  came from the persistent compilation cache (electra_jax.compile_cache) rather than the compiler, and the seconds
  of its stages: tracing, lowering, then XLA's compile or the loading from the cache). Prints nothing: compiles run
  in threads (scaffold.compile_in_thread) whose callers print the line when they wait for it. Counts only the
  events of its own thread, so that compiles side by side do not see each other's."""
  hits, seconds, thread = [], {}, threading.get_ident()
  hit = lambda event, **kwargs: hits.append(event) if (
      event == CACHE_HIT and threading.get_ident() == thread) else None

  def took(event, duration, **kwargs):
    del kwargs
    if event in STAGES and threading.get_ident() == thread:
      seconds[STAGES[event]] = max(duration, seconds.get(STAGES[event], 0.0))
  jax.monitoring.register_event_listener(hit)
  jax.monitoring.register_event_duration_secs_listener(took)
  start = clock()
  try:
    result = compile_fn()
  finally:
    jax.monitoring.unregister_event_listener(hit)
    jax.monitoring.unregister_event_duration_listener(took)
  if hits:
    seconds.pop('XLA', None)  # the loading is XLA's part then
  stages = ', '.join(f'{stage} {seconds[stage]:.1f} s' for stage in STAGES.values() if stage in seconds)
  note = ': '.join(filter(None, ('from the compilation cache' if hits else '', stages)))
  return result, f'compiled {what} in {clock() - start:.1f} s' + (f' ({note})' if note else '')


def _duration(seconds: float) -> str:
  minutes, seconds = divmod(round(seconds), 60)
  hours, minutes = divmod(minutes, 60)
  return f'{hours} h {minutes:02d} min {seconds:02d} s' if hours else f'{minutes} min {seconds:02d} s'


def pretraining_summary(workdir: str, metrics: dict[str, float], *, start_step: int, step: int, train_steps: int,
                        seconds: float, checkpoint: str | None, detects: bool = True) -> str:
  """The lines a pre-training run ends with: its final metrics, steps and wall time, the newest checkpoint, and the
  commands to run next with `workdir` filled in (plot, fine-tune, and detect and convert if the run `detects`
  replaced tokens: an MLM-headed run has no such head; resume if it stopped early)."""
  w = shlex.quote(str(workdir))
  shown = '  '.join(f'{k} {metrics[k]:.4g}' for k in SUMMARY_METRICS if k in metrics)
  finished = step >= train_steps
  lines = [f'pre-training {"finished" if finished else "stopped"} at step {step} of {train_steps} '
           f'({step - start_step} steps in {_duration(seconds)} with start-up)']
  if shown:
    lines.append(f'  final metrics: {shown}')
  lines.append(f'  newest checkpoint: {checkpoint or "none written"}')
  lines.append(f'  metrics: {workdir}/metrics.jsonl')
  if not finished:
    lines.append('resume: run the same command again')
  lines += ['next:', f'  python -m electra_jax.plot {w} --output=curves.png   # plot the training curves']
  if detects:
    lines.append(f'  python -m electra_jax.detect --checkpoint {w} "the chef ate the meal"   # replaced-token '
                 'probabilities')
  lines.append(f'  python -m electra_jax.main --config=configs/finetune.py --config.task=TASK '
               f'--config.init_checkpoint={w} --workdir={shlex.quote(str(workdir).rstrip("/") + "_TASK")}   # TASK: '
               'a GLUE name or a directory of train/dev .tsv files')
  if detects:
    lines.append(f'  python -m electra_jax.convert --checkpoint {w} --to-hf '
                 f'{shlex.quote(str(workdir).rstrip("/") + "_hf")}   # a Hugging Face model')
  return '\n'.join(lines)


def print_pretraining_summary(*args, **kwargs):
  """`pretraining_summary` on stdout, from process 0 only."""
  if is_chief():
    print(pretraining_summary(*args, **kwargs), flush=True)
