"""The pre-training loop: data, state (fresh or restored), the compiled step, logging, checkpoints, signals.

Outputs under WORKDIR: config.json, the tokenizer (tokenizer.model or vocab.txt, electra_tokenizer.json),
metrics.jsonl, tensorboard/, checkpoints/<step>/.
"""

import contextlib
import dataclasses
import functools
import json
import math
import os
import sys
import time

import jax

from electra_jax import config as config_lib
from electra_jax import (checkpoint, continued, data, evaluation, fileio, metrics as metrics_lib, objective, preemption,
                         profiling, report, scaffold, sharding, train_step)
from electra_jax.checkpoint import Checkpointer
from electra_jax.data import tokenizer as tokenizer_lib
from electra_jax.errors import TrainingError

# Config sections that must not change when a run is resumed (they define the parameters and their meaning), with
# the dataclass of each.
FROZEN_ON_RESUME = {'model': config_lib.ModelConfig, 'data': config_lib.DataConfig}
# Keys a resumed run must keep too, each refused with its saved value: the order of the examples depends on
# the seed and on the batch size (a checkpoint's data position counts batches), and the optimizer keys that shape
# its state decide whether the checkpoints read back.
KEPT_ON_RESUME = ('seed', 'batch_size', *(f'optimizer.{k}' for k in continued.OPTIMIZER_STATE_KEYS))
WATCHED = ('loss', 'gen_loss', 'disc_loss', 'grad_norm')


def _check_resume_config(workdir, config_dict: dict) -> dict:
  """Refuses to resume the checkpoints of `workdir` with other model or data settings than they were made with, or
  another value of a key in KEPT_ON_RESUME; returns its config.json ({} if none)."""
  saved = _read_config(workdir)
  if not saved:
    return {}
  for key in KEPT_ON_RESUME:
    section, _, name = key.rpartition('.')
    old, new = (saved.get(section) or {}, config_dict[section]) if section else (saved, config_dict)
    if name in old and old[name] != new[name]:  # absent: saved before the key existed
      raise config_lib.ConfigError(f'{workdir} holds a run with {key}={old[name]}; resume with --config.{key}='
                                   f'{old[name]}, or start a new --workdir')
  for section, cls in FROZEN_ON_RESUME.items():
    old, new = dict(saved.get(section) or {}), json.loads(json.dumps(config_dict.get(section)))  # saved unchanged
    old.update(config_lib.added_keys(cls, old, new))  # keys absent from an older config.json
    old = {k: config_lib.current_value(k, v) for k, v in old.items()}  # a key's values before its type changed
    for values in (old, new):  # one tokenizer path spelled two ways (a relative init_checkpoint, saved as typed)
      if values.get('tokenizer'):
        values['tokenizer'] = os.fspath(fileio.path(values['tokenizer']))
    if old != new:
      changed = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
      raise config_lib.ConfigError(
          f'{workdir} holds a run with different {section} settings ({", ".join(section + "." + k for k in changed)}'
          f'); resume with the same settings, or start a new --workdir')
  return saved


def _read_config(workdir) -> dict:
  """The config.json of the run in `workdir` ({} if none)."""
  path = workdir / 'config.json'
  return fileio.read_json(path, 'restore it, or start a new --workdir') if path.exists() else {}


def _run_tokenizer(data_config: config_lib.DataConfig, workdir) -> data.Tokenizer:
  """The tokenizer of the run in `workdir`. A resumed run keeps the one saved in its workdir: its embeddings were
  trained on those ids, and where the tokenizer cache does not hold it (another machine, a cleared cache) one
  trained again from the source may differ (another version of its trainer)."""
  if not checkpoint.started(workdir):
    return data.load_tokenizer(data_config)
  try:
    saved = tokenizer_lib.load(workdir, data_config.lowercase)
  except data.DataError:  # stopped before it saved one: nothing trained with another
    return data.load_tokenizer(data_config)
  # data.tokenizer as config.json recorded it is what the run trained with (it may have moved since: a continued
  # run's source); another one must be the saved one.
  recorded = (_read_config(workdir).get('data') or {}).get('tokenizer')
  if (data_config.tokenizer and not (recorded and fileio.resolved(recorded) == fileio.resolved(data_config.tokenizer))
      and data.load_tokenizer(data_config).fingerprint != saved.fingerprint):
    raise config_lib.ConfigError(
        f'{workdir} was trained with the tokenizer saved in it, not data.tokenizer={data_config.tokenizer}; '
        'resume without data.tokenizer (the saved one is used), or start a new --workdir')
  return saved


def train(config, workdir: str, *, stop_after: int | None = None) -> dict[str, float]:
  """Pre-trains (or resumes) to `config.train_steps`; returns the last logged metrics.

  Everything the command line says is checked before anything is written to `workdir`: a refused or corrected
  command finds the workdir as it was. config.json is written only when steps are about to run, so it always
  describes the run that trained. `stop_after` ends this invocation after that many steps, as a preemption
  would (tests use it).
  """
  started = time.time()
  c, run, tokenizer, workdir, config_dict = _prepare(config, workdir)
  # The train step's compile, in a thread while the examples are packed (a new run) and the state is made; a run
  # with checkpoints starts it once they say steps are left (a finished run needs none).
  compile_step = functools.partial(scaffold.compile_in_thread, 'the train step', run.compile)
  compiled = None if checkpoint.started(workdir) else compile_step()
  batches = _batches(c, tokenizer, sharding.local_rows(run.batch_sharding, c.batch_size))
  eval_examples = _eval_examples(c, tokenizer)  # checked to fill a batch before checkpoints/ is made
  checkpointer = Checkpointer(workdir, keep=c.keep_checkpoints, preserve=c.save_steps)  # locks the workdir
  try:
    if compiled is None and (checkpointer.latest_step() or 0) < c.train_steps:
      compiled = compile_step()
    state = _initial_state(c, run, checkpointer, batches, tokenizer)
    step = start = int(state.step)
    if start >= c.train_steps:
      print(f'{workdir} is already trained to step {start} >= train_steps={c.train_steps}; '
            f'raise --config.train_steps to train further.', file=sys.stderr)
      checkpointer.close()
      return {}
    state = run.step_layout(state)  # checkpoints hold the tree, the step may take it otherwise (flat_params)
    rng, evaluator, log = _start(c, run, tokenizer, workdir, config_dict, start, compiled, eval_examples)
  except BaseException:
    checkpointer.close()  # and its lock: the same process may run the corrected command
    raise
  end = c.train_steps if stop_after is None else min(c.train_steps, start + stop_after)
  profiler = profiling.Profiler(c.profile_range(), workdir, first_step=start, end=end)
  try:
    with preemption.StopSignal() as stop:  # every host stops after the same step, whichever got the signal
      while step < end:
        state, step_metrics, n = _call(run, state, batches, rng, step, end)
        step += n
        log.add(step, step_metrics, n)
        profiler.after_step(step, state)
        evaluated = evaluator(step, state)  # its time paused out of the throughput's timer
        stopping = stop.should_stop()
        checkpointing = scaffold.itstime(step, c.checkpoint_every, end, c.save_steps) or stopping
        if scaffold.itstime(step, c.log_every, end) or checkpointing:  # a resume then loses no step's metrics
          log.write(step, evaluated)
        elif evaluated:
          log.write_evaluation(step, evaluated)
        if checkpointing:
          log.check_finite()
          with log.timer.paused():  # as evaluation: out of the next window's tokens/s
            checkpointer.save(step, run.tree_layout(state), batches.get_state())
            log.writer.sync()  # gs://: the metrics of the steps a resume will not train again
        if stopping:
          checkpointer.wait()
          left = '; run the same command again to resume' if step < c.train_steps else ''
          log.progress.write(f'{stop.reason()}: checkpoint saved at step {step} in {checkpointer.directory}{left}.')
          break
      checkpointer.wait()  # within the hosts' watch: the last write failing on one host ends every host at once
    log.writer.close()
  except OSError as e:  # metrics.jsonl or the TensorBoard events: the checkpoints are written apart from them
    raise TrainingError(f'step {step}: {fileio.describe(e)}. The checkpoints are not affected; the same command '
                        'resumes from the newest one') from None
  finally:
    log.close()
    checkpointer.close()
    profiler.close()  # last: a failed upload of the trace (gs://) must not leave a checkpoint unwritten
  report.print_pretraining_summary(workdir, log.last, start_step=start, step=step, train_steps=c.train_steps,
                                   seconds=time.time() - started, checkpoint=checkpointer.directory / str(step),
                                   detects=objective.get(c.objective.name).detects_replaced)
  return log.last


def _call(run: train_step.Pretraining, state, batches, rng, step: int, end: int):
  """One call of the train step from step `step`: (state, metrics, steps taken). config.steps_per_call = k steps
  when the call starts at a multiple of k and ends by `end`, else one (a run resumed or ending between multiples)."""
  k = run.config.steps_per_call
  if k > 1 and step % k == 0 and step + k <= end:
    return *run.steps_fn(state, run.put_batches([next(batches) for _ in range(k)]), rng), k
  return *run.step_fn(state, run.put_batch(next(batches)), rng), 1


def _prepare(config, workdir):
  """(TrainConfig, Pretraining, tokenizer, workdir as a path, the config to save) of the run `config` in `workdir`,
  with everything the command line says checked but the data (`_batches`) and nothing written yet."""
  continued.check_workdir(config, workdir)
  config = continued.adopt(config, workdir)  # with init_checkpoint: its model and tokenizer
  config_dict = config.to_dict()
  workdir = fileio.path(workdir)
  fileio.check_writable_directory(workdir, '--workdir')
  if (workdir / 'finetune.json').exists():  # finetune.train's record of its run
    raise config_lib.ConfigError(f'{workdir} holds a fine-tuning run (finetune.json); pre-training would write over '
                                 'its tokenizer. Give another --workdir')
  if not checkpoint.started(workdir) and not _is_run_config(workdir / 'config.json'):
    raise config_lib.ConfigError(f'{workdir} holds a config.json that is not an electra_jax run\'s (a Hugging Face '
                                 'model directory?), which pre-training would replace: give another --workdir')
  if not checkpoint.started(workdir):
    fileio.check_fresh(workdir, (*tokenizer_lib.FILES, metrics_lib.FILE), 'pre-training run',
                       lambda: checkpoint.started(workdir))
  data_config = config_lib.from_dict(config_lib.DataConfig, config_dict['data'], where='data')
  tokenizer = _run_tokenizer(data_config, workdir)
  c = config_lib.load(config, vocab_size=tokenizer.vocab_size)
  c.check_steps_per_call()
  if c.model.vocab_size != tokenizer.vocab_size:
    raise config_lib.ConfigError(f'model.vocab_size={c.model.vocab_size} but the tokenizer has '
                                 f'{tokenizer.vocab_size} tokens; set model.vocab_size=0 to take it from the tokenizer')
  run = train_step.cached(c, tokenizer.special, sharding.make_mesh(c.mesh))
  run.check_batch()  # before anything is written; the compile and the step do not check again
  if checkpoint.started(workdir):
    saved = _check_resume_config(workdir, config_dict)
    c, config_dict = _keeping_saved_steps(workdir, saved.get('save_steps') or [], c, config_dict)
  return c, run, tokenizer, workdir, config_dict


def _keeping_saved_steps(workdir, saved: list[int], c: config_lib.TrainConfig, config_dict: dict):
  """(c, config_dict) with the `saved` save_steps (the run's config.json) that have a checkpoint added to this
  command's: those are kept whatever keep_checkpoints says, and a resume that does not repeat them must not delete
  them. (One not reached yet is this command's to ask for again: the loop checkpoints only those it can reach.)"""
  made = [s for s in saved if (workdir / checkpoint.DIRECTORY / str(s)).is_dir()]
  steps = tuple(sorted({*c.save_steps, *made}))
  if steps == c.save_steps:
    return c, config_dict
  return dataclasses.replace(c, save_steps=steps), {**config_dict, 'save_steps': list(steps)}


def _is_run_config(path) -> bool:
  """Whether `path` is absent or the config.json a pre-training run writes (its model, data and objective)."""
  if not path.exists():
    return True
  try:
    saved = json.loads(path.read_text())
  except (ValueError, OSError):
    return False
  return isinstance(saved, dict) and {'model', 'data', 'objective'} <= saved.keys()


def _examples(c: config_lib.TrainConfig, tokenizer):
  """The run's training examples for this process (packed once, then read from the data cache)."""
  return data.load_examples(c.data, tokenizer, seed=c.seed, process_index=jax.process_index(),
                            process_count=jax.process_count())


def _batches(c: config_lib.TrainConfig, tokenizer, rows) -> data.BatchIterator:
  """This process's batches of the run's training examples: `rows` of each global batch."""
  return data.BatchIterator(_examples(c, tokenizer), tokenizer.special, batch_size=c.batch_size, seed=c.seed,
                            process_index=jax.process_index(), process_count=jax.process_count(), rows=rows)


def precompile(config, workdir: str):
  """Starts compiling the train and evaluation steps of the run `config` in `workdir` as `train` compiles them, in
  threads, and returns a function that packs the run's training examples into the data cache meanwhile (where
  `train` then finds them), waits for the compiles and returns the lines saying so. Nothing is trained or written
  to `workdir`. The train step stays compiled in this process (`train_step.cached`), the evaluation step in JAX's
  compile cache: a later `train` of the same config in this process does not compile its train step. Runs prepared
  one after another and compiled at once (experiments.compare) share the host's cores."""
  c, run, tokenizer, _, _ = _prepare(config, workdir)
  train = scaffold.compile_in_thread('the train step', run.compile)
  evaluator = _evaluator(c, run, _eval_examples(c, tokenizer))

  def wait() -> list[str]:
    _examples(c, tokenizer)  # packed into the data cache, where `train` finds them
    return [train.result()[1], *evaluator.compiled()]
  return wait


def _eval_examples(c: config_lib.TrainConfig, tokenizer):
  """The run's held-out examples (None if it does not evaluate). Raises ConfigError if they fill no batch."""
  if not c.eval_every:
    return None
  examples = data.load_eval_examples(c.data, tokenizer, seed=c.seed)
  if examples is not None:
    evaluation.batch_count(examples, num_batches=c.eval_batches, batch_size=c.batch_size)
  return examples


def _evaluator(c: config_lib.TrainConfig, run: train_step.Pretraining, examples, timer=None) -> evaluation.Evaluator:
  """The run's held-out Evaluator of `examples` (`_eval_examples`), its evaluation step compiling in a thread from
  now on."""
  return evaluation.Evaluator(run, examples, every=c.eval_every, num_batches=c.eval_batches, last_step=c.train_steps,
                              timer=timer)


def _initial_state(c: config_lib.TrainConfig, run: train_step.Pretraining, checkpointer: Checkpointer, batches,
                   tokenizer):
  """The state of the newest checkpoint that reads back (and `batches` set to its position), else a fresh one:
  initialised, from init_checkpoint, as the objective needs it."""
  restored = checkpointer.restore_latest(run.abstract_state())
  if restored is None:
    state = run.init_state(jax.random.PRNGKey(c.seed))
    if c.init_checkpoint:
      state = continued.initial_state(c.init_checkpoint, c.init_optimizer, run, state)
    return objective.get(c.objective.name).initial_state(c, run, state, tokenizer)
  latest, state, data_state = restored
  batches.set_state(data_state)
  if jax.process_index() == 0:
    print(f'resuming from checkpoint {latest} in {checkpointer.directory}', file=sys.stderr)
  return state


def _start(c: config_lib.TrainConfig, run: train_step.Pretraining, tokenizer, workdir, config_dict: dict,
           start: int, compiled, eval_examples):
  """What comes once steps are about to run from step `start`: config.json and the tokenizer written to `workdir`,
  the devices announced, the evaluation step compiling (on `eval_examples`, checked before anything was written),
  the train step compiled (`compiled`: its compile, in a thread), the metrics files and the progress bar opened.
  Returns (the run's base key, the Evaluator, the _Log)."""
  if jax.process_index() == 0:
    fileio.write_json(workdir / 'config.json', config_dict)
    tokenizer.save(workdir)
  report.log(report.devices_line())
  report.log(config_lib.platform_line(c.model))
  log = _Log(c, workdir, start)
  rng = jax.device_put(jax.random.key_data(jax.random.fold_in(jax.random.PRNGKey(c.seed), 1)),
                       sharding.replicated(run.mesh))
  evaluator = _evaluator(c, run, eval_examples, log.timer)
  # Both compiles end before the progress bar: its rate and ETA exclude them.
  compiled = compiled or scaffold.compile_in_thread('the train step', run.compile)
  for line in [compiled.result()[1], *evaluator.compiled()]:
    report.log(line)
  log.start()
  return rng, evaluator, log


class _Log:
  """What the loop reports: the metrics summed on device since the last log, checked finite a step late (reading
  a step's loss while the next runs does not stall the device), written with the training throughput (`timer`,
  which evaluation pauses) and the FLOPs so far to metrics.jsonl and TensorBoard, and the progress bar."""

  def __init__(self, c: config_lib.TrainConfig, workdir, start: int):
    self.c, self.workdir, self.logged_step, self.last = c, workdir, start, {}
    self.step_flops = objective.train_flops_per_step(c)
    if jax.process_index() == 0:
      print(f'{c.objective.name} pre-training: {self.step_flops:.3e} FLOPs per step (3 x forward matmuls), '
            f'{self.step_flops * c.train_steps:.3e} for {c.train_steps} steps', file=sys.stderr)
    self.total = self.previous = self.previous_steps = self.writer = self.progress = None  # previous: unchecked
    self.timer = scaffold.Chrono()
    self._accumulate = jax.jit(metrics_lib.accumulate)

  def start(self):
    """Opens the metrics files and the progress bar (after the compiles: its rate and ETA exclude them), and starts
    the timer."""
    self.writer = metrics_lib.MetricsWriter(self.workdir, resumed_at=self.logged_step)
    self.progress = scaffold.progress_bar(self.c.train_steps, self.logged_step, 'pre-training')
    self.timer.restart()

  def add(self, step: int, step_metrics, steps: int = 1):
    """Adds the metrics of the `steps` steps up to step `step` (summed, from one call) to the sums, and checks the
    previous call's loss."""
    self.total = self._accumulate(self.total, step_metrics)
    self.check_finite()
    self.previous, self.previous_steps = step_metrics, (step - steps + 1, step)
    self.progress.update(steps)

  def check_finite(self):
    """Raises TrainingError if the loss of the last call added is NaN or infinite; reads it from the device once
    (a step that is logged and checkpointed is checked once, not again by the next `add`)."""
    if self.previous is not None:
      _check_finite(self.previous, *self.previous_steps)
      self.previous = None

  def write(self, step: int, evaluated: dict[str, float]):
    """Writes the metrics of the steps since the last write, their throughput and `evaluated`, as of step `step`."""
    self.check_finite()
    c, last = self.c, metrics_lib.summarize(self.total)
    last['tokens_per_second'] = ((step - self.logged_step) * c.batch_size * c.data.max_seq_length
                                 / self.timer.seconds())
    last['train_flops'] = step * self.step_flops
    last.update(evaluated)
    self.writer.write(step, last)
    self.progress.set_postfix({k: f'{last[k]:.3f}' for k in ('loss', 'gen_accuracy', 'disc_recall', 'mlm_accuracy')
                               if k in last}, refresh=False)
    self.total, self.logged_step, self.last = None, step, last
    self.timer.restart()

  def write_evaluation(self, step: int, evaluated: dict[str, float]):
    """Writes held-out metrics `evaluated` of step `step`, between two writes of the training metrics."""
    self.writer.write(step, {**evaluated, 'train_flops': step * self.step_flops})

  def close(self):
    self.progress.close()
    with contextlib.suppress(OSError):  # already reported, if it failed
      self.writer.close()


def _check_finite(step_metrics, first: int, last: int):
  """Raises TrainingError naming the steps `first` to `last` (one call's: their metrics summed) and the quantities
  that are NaN or infinite."""
  values = jax.device_get({k: step_metrics[k][0] for k in WATCHED if k in step_metrics})
  bad = [f'{k}={float(v)}' for k, v in values.items() if not math.isfinite(float(v))]
  if bad:
    steps = f'step {last}' if first == last else f'steps {first}-{last}'
    raise TrainingError(f'{steps}: {", ".join(bad)}. Training stopped; the last good checkpoint is kept. '
                        'Lower optimizer.learning_rate, raise optimizer.warmup_steps, or use model.dtype=float32.',
                        every_process=True)  # the global batch's metrics: every host stops here
