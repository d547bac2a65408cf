"""The fine-tuning loop: load a pre-trained discriminator (or start from scratch), train a head per seed,
evaluate on the dev split(s), write predictions, the models and a results table.

Outputs under WORKDIR: finetune.json (config, model config, task), the tokenizer (Tokenizer.save), results.json,
results.md (with the dev set's majority baseline, see `report`), and per seed seeds/<seed>/: result.json (its dev
metrics: the seed is finished), metrics.jsonl and tensorboard/ (loss, learning rate, dev scores), params (orbax),
predictions/ (dev predictions and test submission files), checkpoints/ (while it trains).

Rerunning the same command skips finished seeds and resumes an unfinished one from its latest checkpoint (every
`checkpoint_every` steps, and on SIGTERM/SIGINT), exactly as an uninterrupted run. A WORKDIR holding a pre-training
run, another task's run or a run with other settings is refused.
"""

import dataclasses
import functools
import json
import os
import random
import sys
from typing import Any, Callable

import flax.traverse_util
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp

from electra_jax import checkpoint, data, fileio, pretrained, scaffold, sharding
from electra_jax import config as config_lib
from electra_jax import metrics as metrics_lib
from electra_jax import report as run_report
from electra_jax.checkpoint import Checkpointer
from electra_jax.config import ModelConfig, platform_line
from electra_jax.errors import CheckpointError, ConfigError, TrainingError
from electra_jax.finetune import features as features_lib
from electra_jax.finetune import heads, metrics, predict, report, tasks
from electra_jax.finetune import optimizer as optimizer_lib
from electra_jax.finetune.config import FinetuneConfig, load as load_config
from electra_jax.model import dropout_rngs, fold_embeddings_delta
from electra_jax.preemption import StopSignal
from electra_jax.train_step import ABSTRACT_KEY, TrainState

PRETRAINED = ('embeddings', 'discriminator')  # the parameter subtrees fine-tuning takes from pre-training
# Config keys a rerun may change and still reuse the finished seeds: they change neither what a seed trains nor its
# scores (`task`, `glue_dir` and `squad_dir` are compared by the task they declare, TASK_IDENTITY: a directory may
# be given by another path).
RERUN_FREE = ('task', 'seed', 'seeds', 'log_every', 'eval_every', 'checkpoint_every', 'eval_batch_size', 'save_model',
              'write_predictions', 'predict_input', 'predict_output', 'predict_format', 'glue_dir', 'squad_dir',
              'tfds_data_dir', 'mesh')
# FinetuneConfig keys that change no compiled step: RERUN_FREE's but the mesh (its shardings are in the program), the
# task's kind (the Finetuner's head holds it), the initialisation (the parameters' values, not their shapes), and
# `model` and `data`, the from-scratch model's and tokenizer's, which the Finetuner holds. The batches' shapes are
# part of a step's key (`inputs_key`).
PROGRAM_FREE = (*(k for k in RERUN_FREE if k != 'mesh'), 'task_kind', 'init_checkpoint', 'init_step', 'model', 'data')
# The fields of a task's declaration that a rerun must keep: with another one the finished seeds' scores are another
# task's. The name alone is not enough: a task directory's name is its basename, and another directory of that name
# (or another glue_dir/squad_dir) holds other data; its location is compared resolved (symlinks too).
TASK_IDENTITY = ('name', 'kind', 'source', 'location', 'labels', 'metrics')
# Steps compiled ahead by `precompile` (experiments.compare, before it pre-trains): {what a Finetuning's steps depend
# on but their inputs (`Finetuning.precompiled`): {('step' or 'eval', the inputs' shapes): the executable}}. A
# fine-tuning of the same program later in this process runs them rather than compiling its own.
_PRECOMPILED: dict[tuple, dict] = {}


def train_step(state: TrainState, batch, rng, *, model: heads.Finetuner, tx: optax.GradientTransformation,
               schedule: optax.Schedule, squad_config):
  """One optimiser step; dropout uses fold_in(rng, step). Returns (state, {name: (sum, count)}).

  The gradient is that of the loss SUMMED over the batch (per example; over labelled tokens for tagging), not of
  its mean: the official code differentiates the [batch] vector of per-example losses, which is their sum. With
  global-norm clipping at 1.0 this decides how often clipping acts.
  """
  rng = jax.random.fold_in(rng, state.step)

  def loss_fn(params):
    outputs = model.apply({'params': params}, batch, train=True,
                          rngs=dropout_rngs({'dropout': rng}, model.config.dropout_draw))
    return heads.loss(model.kind, outputs, batch, squad_config)

  (total, count), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  one = jnp.ones((), jnp.float32)
  step_metrics = {'loss': (total, count), 'learning_rate': (jnp.asarray(schedule(state.step), jnp.float32), one)}
  return TrainState(state.step + 1, optax.apply_updates(state.params, updates), opt_state), step_metrics


@dataclasses.dataclass
class Finetuning:
  """Everything static about a fine-tuning run: model, optimiser, mesh, shardings, compiled steps."""
  model: heads.Finetuner
  config: FinetuneConfig  # with the optimizer resolved for this model
  total_steps: int
  mesh: jax.sharding.Mesh
  tx: optax.GradientTransformation = dataclasses.field(init=False)
  schedule: optax.Schedule = dataclasses.field(init=False)
  state_shardings: Any = dataclasses.field(init=False)
  _abstract_state: Any = dataclasses.field(init=False)
  batch_sharding: jax.sharding.NamedSharding = dataclasses.field(init=False)
  step_fn: Callable[..., Any] = dataclasses.field(init=False)
  eval_fn: Callable[..., Any] = dataclasses.field(init=False)
  init_fn: Callable[..., Any] = dataclasses.field(init=False)
  jitted: dict[str, Any] = dataclasses.field(init=False)  # {'step', 'eval'}: the jitted functions
  precompiled: dict = dataclasses.field(init=False)  # this program's in _PRECOMPILED

  def __post_init__(self):
    c = self.config
    self.tx, self.schedule = optimizer_lib.make_optimizer(c.optimizer, self.model.config.num_layers,
                                                          self.total_steps)
    self.state_shardings, self._abstract_state = scaffold.state_layout(self.mesh, c.mesh.rules, self._init_boxed)
    # Every input array is split along its first (batch) dimension only: labels are [batch].
    self.batch_sharding = sharding.batch_sharding(self.mesh, c.mesh.rules, axes=sharding.BATCH[:1])
    step = functools.partial(train_step, model=self.model, tx=self.tx, schedule=self.schedule,
                             squad_config=c.squad)
    self.jitted = {'step': scaffold.jit_step(step, self.state_shardings, self.batch_sharding),
                   'eval': jax.jit(functools.partial(predict.eval_step, model=self.model),
                                   in_shardings=(self.state_shardings.params, self.batch_sharding),
                                   out_shardings=sharding.replicated(self.mesh))}
    # What the steps' programs depend on but their inputs: the model, the config but for PROGRAM_FREE, the step
    # count (the schedule) and the mesh.
    defaults, m = FinetuneConfig(), self.model
    self.precompiled = _PRECOMPILED.setdefault(
        (m.config, m.kind, m.num_outputs, m.head_dropout, m.squad, self.total_steps, self.mesh,
         dataclasses.replace(c, **{k: getattr(defaults, k) for k in PROGRAM_FREE})), {})
    self.step_fn, self.eval_fn = self._precompiled_or_jitted('step'), self._precompiled_or_jitted('eval')
    # Compiled once, for every seed.
    self.init_fn = scaffold.Initialiser(self._init_boxed, self._abstract_state)

  def _precompiled_or_jitted(self, what: str) -> Callable:
    """Step `what` ('step' or 'eval'): the executable `precompile` compiled for these inputs if there is one, else
    the jitted function."""
    def call(first, *inputs):
      return self.precompiled.get(inputs_key(what, inputs), self.jitted[what])(first, *inputs)
    return call

  def _init_boxed(self, rng):
    ids = jnp.zeros((1, 16), jnp.int32)
    batch = {'input_ids': ids, 'segment_ids': ids, 'input_mask': ids}
    params = self.model.init(jax.random.wrap_key_data(rng), batch)['params']
    return TrainState(jnp.zeros((), jnp.int32), params, self.tx.init(params))

  def abstract_state(self) -> TrainState:
    """Shapes, dtypes and shardings of the state, without allocating it (for restoring checkpoints)."""
    return self._abstract_state

  def init_state(self, rng, pretrained=None) -> TrainState:
    """A fresh sharded state; `pretrained` {'embeddings', 'discriminator'} params replace the initial ones."""
    state = self.init_fn(jax.random.key_data(rng))
    if pretrained is None:
      return state
    params = dict(state.params)
    for name in PRETRAINED:
      params[name] = _take_pretrained(params[name], pretrained[name], name)
    # Adam's moments start at zero whatever the parameters are, so opt_state stays valid.
    return TrainState(state.step, params, state.opt_state)

  def check_batch_size(self, batch_size: int, name: str):
    sharding.check_batch(self.mesh, self.config.mesh.rules, batch_size, name=name)


def inputs_key(what: str, inputs) -> tuple:
  """The key in Finetuning.precompiled of step `what` for `inputs`, its arguments after the first (arrays or their
  shapes)."""
  return what, tuple((x.shape, str(x.dtype)) for x in jax.tree.leaves(inputs))


def _take_pretrained(target, source, where: str):
  """`source`'s values (on one device of this process) for every parameter of `target` (same paths and shapes), on
  `target`'s shardings (which may span several processes: each builds its own shards)."""
  flat_target = flax.traverse_util.flatten_dict(target)
  flat_source = flax.traverse_util.flatten_dict(source)
  out = {}
  for path, leaf in flat_target.items():
    value = flat_source.get(path)
    if value is None or value.shape != leaf.shape:
      raise CheckpointError(f'the pre-trained checkpoint has no parameter {where}/{"/".join(path)} of shape '
                            f'{leaf.shape}: it does not match the model config saved with it')
    # Copies (copy=True): the train step donates the state, and the next seed starts from `source` again.
    out[path] = jax.make_array_from_callback(leaf.shape, leaf.sharding,
                                             lambda index, v=value, t=leaf.dtype: jnp.array(v[index], t, copy=True))
  return flax.traverse_util.unflatten_dict(out)


def _load_pretrained(workdir: str, step: int = 0) -> tuple[ModelConfig, dict, data.Tokenizer]:
  """(model config, {'embeddings', 'discriminator'} params, tokenizer) of a pre-training or imported WORKDIR, from
  its checkpoint `step` (0: the latest)."""
  config, params = pretrained.load_params(os.fspath(fileio.path(workdir)), step=step or None)
  if config.model.tying == 'gdes':  # the discriminator's embeddings are the shared ones plus its delta: one table
    params = fold_embeddings_delta(params)
  return scratch_model_config(config.model), {name: params[name] for name in PRETRAINED}, data.tokenizer.load(workdir)


def scratch_model_config(model: ModelConfig) -> ModelConfig:
  """`model` as fine-tuning from scratch builds it: as `_load_pretrained` gives a pre-trained one, layers unrolled
  (layer-wise decay finds each layer by its name layer_N; stacked under `layers`, all would get the head's rate)
  and tying 'gdes' as 'embeddings' (without a generator the delta would be a second embedding table, at the head's
  rate; a pre-trained delta is folded into the embeddings)."""
  return dataclasses.replace(model, scan_layers=False, tying='embeddings' if model.tying == 'gdes' else model.tying)


def _scratch_model(c: FinetuneConfig) -> tuple[ModelConfig, data.Tokenizer]:
  tokenizer = data.load_tokenizer(c.data)
  model = scratch_model_config(c.model)
  if not model.vocab_size:
    model = dataclasses.replace(model, vocab_size=tokenizer.vocab_size)
  if model.vocab_size != tokenizer.vocab_size:
    raise ConfigError(f'model.vocab_size={model.vocab_size} but the tokenizer has {tokenizer.vocab_size} tokens; '
                      'set model.vocab_size=0')
  return model, tokenizer


def score(task: tasks.Task, examples: list, predicted: list) -> dict[str, float]:
  """The task's metrics of `predicted` against the labelled examples."""
  if task.kind == tasks.SQUAD:
    result = metrics.squad({e.guid: p['answer'] for e, p in zip(examples, predicted)},
                           {e.guid: e.answers for e in examples})
  elif task.kind == tasks.TAGGING:
    pairs = [(e.tags, p) for e, p in zip(examples, predicted) if e.tags]
    gold, guess = [g for g, _ in pairs], [p for _, p in pairs]
    result = {'token_accuracy': metrics.token_accuracy(gold, guess)}
    if 'span_f1' in task.metrics:
      result.update(metrics.span_f1(gold, guess))
  elif task.kind == tasks.REGRESSION:
    pairs = np.array([(e.label, p) for e, p in zip(examples, predicted) if e.label is not None]).reshape(-1, 2)
    result = {'pearson': metrics.pearson(pairs[:, 0], pairs[:, 1]),
              'spearman': metrics.spearman(pairs[:, 0], pairs[:, 1])}
  else:
    ids = {name: i for i, name in enumerate(task.labels)}
    pairs = np.array([(ids[e.label], ids[p]) for e, p in zip(examples, predicted) if e.label is not None])
    gold, guess = pairs.reshape(-1, 2).T
    functions = {'accuracy': metrics.accuracy, 'f1': metrics.f1, 'macro_f1': metrics.macro_f1,
                 'mcc': metrics.matthews_corrcoef}
    result = {name: functions[name](gold, guess) for name in task.metrics}
  return {name: result[name] for name in task.metrics}


def majority_baseline(task: tasks.Task, train: list, dev: list) -> dict[str, float]:
  """Metrics on `dev` of always predicting the most frequent label of `train` (tag per word for tagging); give the
  dev examples as `train` for the dev set's majority-class baseline."""
  top = report.majority_label(task, train)
  if top is None:
    raise ValueError(f'no majority baseline for {task.kind}')
  if task.kind == tasks.CLASSIFICATION:
    return score(task, dev, [top] * len(dev))
  return score(task, dev, [[top] * len(e.words) for e in dev])


def dev_baseline(task: tasks.Task, evals: list) -> tuple[dict[str, float], dict[str, Any]]:
  """({split/metric: value}, {split: label}) of always answering each dev split's most frequent label; empty for
  regression and SQuAD."""
  values, labels = {}, {}
  for split, examples, _ in evals:
    label = report.majority_label(task, examples) if split in task.dev_splits else None
    if label is not None:
      labels[split.name] = label
      values.update({f'{split.name}/{k}': v for k, v in majority_baseline(task, examples, examples).items()})
  return values, labels


def evaluate(run: Finetuning, params, task: tasks.Task, evals: list, c: FinetuneConfig, tokenizer: data.Tokenizer,
             *, dev_only: bool = False) -> list[tuple[tasks.Split, list, list, dict]]:
  """(split, examples, predictions, head outputs) of each dev split (and test split unless `dev_only`); `tokenizer`
  spells SQuAD's answers."""
  out = []
  for split, examples, feats in evals:
    if dev_only and split not in task.dev_splits:
      continue
    outputs = predict.infer(run.eval_fn, params, feats, c.eval_batch_size, run.batch_sharding)
    out.append((split, examples, predict.decode(task, feats, outputs, c.squad, tokenizer), outputs))
  return out


def dev_scores(task: tasks.Task, evaluated: list) -> dict[str, float]:
  return {f'{split.name}/{k}': v for split, examples, predicted, _ in evaluated if split in task.dev_splits
          for k, v in score(task, examples, predicted).items()}


def log_interval(log_every: int, total_steps: int) -> int:
  """Steps between metrics lines: `log_every`, but at most a 20th of the run, so that a short run logs (and shows
  its loss) about 20 times."""
  return max(1, min(log_every, total_steps // 20))


def _train_one(run: Finetuning, state: TrainState, feats: features_lib.Features, c: FinetuneConfig, seed: int,
               tag: str, checkpointer: Checkpointer, writer: metrics_lib.MetricsWriter,
               stop_after: int | None = None, evaluate_dev: Callable[[Any], dict] | None = None):
  """(the trained state or None, what stopped the command or None) of one seed trained from `state` (step 0, or a
  restored checkpoint's step) to run.total_steps, with a progress bar; checkpoints every c.checkpoint_every steps.
  SIGTERM/SIGINT on any host (or `stop_after` steps, as tests preempt) checkpoint at one step on every host and
  give no state: the same command resumes. One that comes at the last step gives the state: the seed finishes.

  The loss and learning rate go to `writer` (the seed's metrics.jsonl and TensorBoard events) every `log_interval`
  steps, and with c.eval_every `evaluate_dev(params)`'s dev metrics every c.eval_every steps before the last (the
  caller scores the final model)."""
  # Replicated over the mesh, where a step compiled ahead (`precompile`) takes it.
  rng = jax.device_put(jax.random.key_data(jax.random.fold_in(jax.random.PRNGKey(seed), 1)),
                       sharding.replicated(run.mesh))
  start = int(state.step)
  log_every = log_interval(c.log_every, run.total_steps)
  batches = features_lib.train_batches(feats.arrays, c.batch_size, run.total_steps, seed,
                                       sharding.local_rows(run.batch_sharding, c.batch_size), start=start)
  end = run.total_steps if stop_after is None else min(run.total_steps, start + stop_after)
  progress = scaffold.progress_bar(run.total_steps, start, tag)
  accumulate = jax.jit(metrics_lib.accumulate)
  total = None
  try:
    with StopSignal() as stop:  # every host stops after the same step, whichever got the signal
      for step in range(start + 1, end + 1):
        state, step_metrics = run.step_fn(state, sharding.global_batch(next(batches), run.batch_sharding), rng)
        total = accumulate(total, step_metrics)
        progress.update(1)
        if step % log_every == 0 or step == end:
          scalars = metrics_lib.summarize(total)
          if not np.isfinite(scalars['loss']):
            raise TrainingError(f'{tag}: loss is {scalars["loss"]} at step {step}; lower optimizer.learning_rate',
                                every_process=True)  # the global batch's loss: every host stops here
          writer.write(step, scalars)
          progress.set_postfix(loss=f'{scalars["loss"]:.4f}', refresh=False)
          total = None
        if c.eval_every and evaluate_dev and step % c.eval_every == 0 and step < run.total_steps:
          writer.write(step, evaluate_dev(state.params))
        interrupted = ((stop.should_stop() and stop.reason())
                       or (step == end < run.total_steps and 'stopped'))
        if interrupted and step == run.total_steps:  # trained: the seed is finished, the command stops after it
          return state, interrupted
        if step < run.total_steps and (step % c.checkpoint_every == 0 or interrupted):
          checkpointer.save(step, state, {'step': step})
        if interrupted:
          checkpointer.wait()  # within the hosts' watch: the write failing on one host ends every host at once
          progress.write(f'{tag} {interrupted}: checkpoint saved at step {step}/{run.total_steps} in '
                         f'{checkpointer.directory}; run the same command again to resume.', file=sys.stderr)
          return None, interrupted
  finally:
    progress.close()
  return state, None


def _load_splits(task: tasks.Task, tokenizer, c: FinetuneConfig):
  """(training examples, training Features, [(split, examples, Features)] of the dev and test splits).

  Checks what per-file reading cannot: two classes among the training examples kept, and (tagging) dev/test tags
  the training file lacks, reported in the log (those words count as errors: the model cannot predict them).
  """
  train_examples = tasks.read(task, task.train_split, data_dir=c.tfds_data_dir)
  if 0 < c.max_train_examples < len(train_examples):
    # One subset for every seed and initialisation (seeded by 0, not by the run's seed), in file order.
    keep = sorted(random.Random(0).sample(range(len(train_examples)), c.max_train_examples))
    train_examples = [train_examples[i] for i in keep]
  where = f'task {task.name} ({task.location})' + (f', {len(train_examples)} kept by max_train_examples'
                                                    if c.max_train_examples else '')
  if task.kind == tasks.CLASSIFICATION:
    tasks.check_classes([e.label for e in train_examples], where)
  train_feats = predict.encode(task, train_examples, tokenizer, c.max_seq_length, c.squad, training=True)
  if not len(train_feats):
    raise data.DataError(f'task {task.name} has no usable training examples')
  if task.kind == tasks.SQUAD:
    skipped = len(train_examples) - len(set(train_feats.example_index.tolist()))
    if skipped:
      print(f'{task.name}: {skipped} of {len(train_examples)} training questions skipped: their answer text is not '
            'at its offset in the context (as the official reader skips them)', file=sys.stderr)
  evals = []
  # Test splits (unlabelled for GLUE) are only predicted, so only read when predictions are written.
  for split in task.dev_splits + (task.test_splits if c.write_predictions else ()):
    examples = tasks.read(task, split.source, data_dir=c.tfds_data_dir)
    if task.kind == tasks.TAGGING:
      _report_unseen_tags(task, split, examples)
    evals.append((split, examples, predict.encode(task, examples, tokenizer, c.max_seq_length, c.squad,
                                                  training=False)))
  return train_examples, train_feats, evals


def _report_unseen_tags(task: tasks.Task, split: tasks.Split, examples: list):
  known = set(task.labels)
  unseen = [(e.guid, t) for e in examples for t in (e.tags or ()) if t not in known]
  if unseen:
    names = sorted({t for _, t in unseen})
    effect = 'so they count as errors' if split in task.dev_splits else 'it predicts other tags for them'
    print(f'{task.name} {split.name}: {len(unseen)} words have tags the training file lacks ({", ".join(names[:10])}'
          f'; the first in the sentence at {unseen[0][0]}): the model cannot predict them, {effect}', file=sys.stderr)


def check_workdir(workdir: str, config_dict: dict, task: tasks.Task):
  """Refuses a WORKDIR that holds a pre-training run, another task's fine-tuning run, or this task's run with
  other settings (the finished seeds there would not be this command's)."""
  workdir = fileio.path(workdir)
  if task.source != 'tfds' and task.location and fileio.resolved(workdir) == fileio.resolved(task.location):
    raise ConfigError(f'--workdir={workdir} is the task\'s own directory, where fine-tuning would write its results, '
                      'tokenizer and seeds beside the data: give another --workdir')
  if (workdir / 'config.json').exists() or checkpoint.started(workdir):
    raise ConfigError(f'{workdir} holds a pre-training run (config.json, checkpoints/); fine-tuning would write over '
                      'its tokenizer. Give another --workdir (that one is --config.init_checkpoint)')
  if not (workdir / 'finetune.json').exists():
    fileio.check_fresh(workdir, (*data.tokenizer.FILES, 'results.json', 'results.md'), 'fine-tuning run',
                       (workdir / 'finetune.json').exists)
    return
  saved = json.loads((workdir / 'finetune.json').read_text())
  old, new = _task_identity(saved['task']), _task_identity(json.loads(json.dumps(dataclasses.asdict(task))))
  if old != new:
    key = next(k for k in TASK_IDENTITY if old[k] != new[k])
    raise ConfigError(f'{workdir} holds a fine-tuning run of task {old["name"]!r} ({key}: {old[key]!r}, now '
                      f'{new[key]!r}; finetune.json), whose finished seeds are not this task\'s: give a new --workdir')
  old = flax.traverse_util.flatten_dict(saved['config'], sep='.')
  new = flax.traverse_util.flatten_dict(json.loads(json.dumps(config_dict)), sep='.')
  old.update(config_lib.added_keys(FinetuneConfig, old, new))  # keys absent from an older finetune.json
  changed = sorted(k for k in set(old) | set(new) if k.split('.')[0] not in RERUN_FREE and old.get(k) != new.get(k))
  if changed:
    raise ConfigError(f'{workdir} holds a {task.name} run with other settings ('
                      f'{", ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in changed[:5])}); rerun it with '
                      'its settings to resume it, or give another --workdir')


def _task_identity(declaration: dict) -> dict:
  """The TASK_IDENTITY fields of a task declaration as JSON gives it, a local location resolved."""
  identity = {k: declaration.get(k) for k in TASK_IDENTITY}
  if identity['source'] != 'tfds' and identity['location']:
    identity['location'] = fileio.resolved(identity['location'])
  return identity


def _setup(config, workdir: str):
  """(FinetuneConfig resolved for the model and task, task, workdir as a path, the config to save, the pre-trained
  parameters or None, the model config, tokenizer, (training examples, training Features, evaluation splits), the
  Finetuning) of `config` in `workdir`, everything checked and nothing written."""
  c = load_config(config)
  task = tasks.get_task(c.task, c.task_kind, glue_dir=c.glue_dir, squad_dir=c.squad_dir)
  workdir = fileio.path(workdir)
  config_dict = config.to_dict() if hasattr(config, 'to_dict') else dict(config)
  check_workdir(workdir, config_dict, task)  # also refuses --workdir=init_checkpoint: a pre-training run
  pretrained = None
  if c.init_checkpoint:
    model_config, pretrained, tokenizer = _load_pretrained(c.init_checkpoint, c.init_step)
  else:
    model_config, tokenizer = _scratch_model(c)
  max_seq_length = c.max_seq_length or task.max_seq_length
  if max_seq_length > model_config.max_position_embeddings:
    raise ConfigError(f'max_seq_length={max_seq_length} exceeds the model\'s max_position_embeddings='
                      f'{model_config.max_position_embeddings}; lower --config.max_seq_length')
  c = dataclasses.replace(c, optimizer=c.optimizer.for_model(model_config.hidden_size),
                          epochs=c.epochs or task.epochs, max_seq_length=max_seq_length)
  splits = _load_splits(task, tokenizer, c)
  model = heads.make_model(task, model_config, c.head_dropout, c.squad)
  ft = Finetuning(model, c, features_lib.num_train_steps(len(splits[1]), c.batch_size, c.epochs),
                  sharding.make_mesh(c.mesh))
  ft.check_batch_size(c.batch_size, 'batch_size')
  ft.check_batch_size(c.eval_batch_size, 'eval_batch_size')
  return c, task, workdir, config_dict, pretrained, model_config, tokenizer, splits, ft


def precompile(config, workdir: str) -> Callable[[], list[str]]:
  """Starts compiling the train and evaluation steps of the fine-tuning `config` in `workdir`, in threads, for the
  batches `run` will give them, and returns a function that waits for them and returns the lines saying so. A
  `run` of the same program later in this process runs these executables (`Finetuning.precompiled`). Nothing is
  written to `workdir`. The programs depend on the shapes of the model and the batches and on the step count, not
  on the parameters: a config from scratch compiles those of every initialisation of the same model
  (experiments.compare, before it pre-trains)."""
  c, task, _, _, _, _, _, (_, train_feats, evals), ft = _setup(config, workdir)

  def abstract(arrays: dict, rows: int) -> dict:
    return {k: jax.ShapeDtypeStruct((rows, *v.shape[1:]), v.dtype, sharding=ft.batch_sharding)
            for k, v in arrays.items()}

  def compile(what: str, first, *inputs):
    ft.precompiled[inputs_key(what, inputs)] = ft.jitted[what].lower(first, *inputs).compile()

  batch = next(features_lib.train_batches(train_feats.arrays, c.batch_size, ft.total_steps, c.seed))
  key = jax.ShapeDtypeStruct(ABSTRACT_KEY.shape, ABSTRACT_KEY.dtype, sharding=sharding.replicated(ft.mesh))
  compiles = [scaffold.compile_in_thread(f'the {task.name} fine-tuning step', functools.partial(
      compile, 'step', ft.abstract_state(), abstract(batch, c.batch_size), key))]
  feats = next((feats for split, _, feats in evals if split in task.dev_splits and len(feats)), None)
  if feats is not None:
    compiles.append(scaffold.compile_in_thread(f'the {task.name} evaluation step', functools.partial(
        compile, 'eval', ft.abstract_state().params,
        abstract({k: feats.arrays[k] for k in predict.INPUTS}, c.eval_batch_size))))
  return lambda: [compiled.result()[1] for compiled in compiles]


def run(config, workdir: str, *, stop_after: int | None = None) -> dict | None:
  """Fine-tunes `config.seeds` seeds on `config.task`; returns (and writes) the results, or None when a stop signal
  ended the run at a checkpoint.

  Seeds finished by an earlier run of the same command are read back, an unfinished one resumes from its latest
  checkpoint. `stop_after` stops after that many steps, as a preemption would (tests use it).
  """
  c, task, workdir, config_dict, pretrained, model_config, tokenizer, splits, ft = _setup(config, workdir)
  train_examples, train_feats, evals = splits
  _write_run_files(workdir, config_dict, c, model_config, task, tokenizer)
  run_report.log(run_report.devices_line())
  run_report.log(platform_line(model_config))
  print(f'{task.name}: {len(train_examples)} training examples ({len(train_feats)} rows), {ft.total_steps} steps of '
        f'{c.batch_size}, lr {c.optimizer.learning_rate:g}, layer-wise decay {c.optimizer.layerwise_lr_decay:g}, '
        f'{_origin(c) if pretrained else "from scratch"}', file=sys.stderr)

  per_seed = []
  for seed in range(c.seed, c.seed + c.seeds):
    tag = f'[{task.name} seed {seed}]'
    seed_dir = workdir / 'seeds' / str(seed)
    done = seed_dir / 'result.json'
    if done.exists():
      per_seed.append(json.loads(done.read_text()))
      print(f'{tag} finished by an earlier run: skipped', file=sys.stderr)
      continue
    checkpointer = Checkpointer(os.fspath(seed_dir), keep=1)
    writer = None
    try:
      latest = checkpointer.latest_step()
      if latest is None:
        state = ft.init_state(jax.random.PRNGKey(seed), pretrained)
      else:
        state, _ = checkpointer.restore(latest, ft.abstract_state())
        print(f'{tag} resumed from {checkpointer.directory}/{latest}', file=sys.stderr)
      writer = metrics_lib.MetricsWriter(seed_dir, resumed_at=latest or 0)
      score_dev = lambda params: dev_scores(task, evaluate(ft, params, task, evals, c, tokenizer, dev_only=True))
      state, stopped = _train_one(ft, state, train_feats, c, seed, tag, checkpointer, writer, stop_after, score_dev)
      if state is None:  # stopped at a checkpoint
        return None
      evaluated = evaluate(ft, state.params, task, evals, c, tokenizer)
      row = {'seed': seed, **dev_scores(task, evaluated)}
      writer.write(ft.total_steps, {k: v for k, v in row.items() if k != 'seed'})
    finally:
      checkpointer.close()
      if writer:
        writer.close()
    row['top_prediction'] = {split.name: report.top_prediction(task, predicted)
                             for split, _, predicted, _ in evaluated if split in task.dev_splits}
    if not any(row['top_prediction'].values()):
      del row['top_prediction']  # regression, SQuAD
    for split, examples, predicted, outputs in evaluated:
      if c.write_predictions and jax.process_index() == 0:
        predict.write_predictions(seed_dir / 'predictions', task, split, examples, predicted,
                                  predict.probabilities(task, outputs))
    if c.save_model:
      _save_params(seed_dir / 'params', state.params)
    if jax.process_index() == 0:
      fileio.write_json(done, row)  # the seed is finished: a rerun skips it
      fileio.rmtree(checkpointer.directory)
    print(f'{tag} ' + ', '.join(f'{k} {row[k]:.4f}' for k in report.metric_names(row)), file=sys.stderr, flush=True)
    for split, top in report.one_class_splits(row):
      print(report.one_class_warning(tag, split, top), file=sys.stderr, flush=True)
    per_seed.append(row)
    if stopped and seed < c.seed + c.seeds - 1:
      print(f'{tag} {stopped} at its last step: the seed is finished; run the same command again for the others',
            file=sys.stderr, flush=True)
      return None
  return write_results(workdir, task, c, per_seed, *dev_baseline(task, evals))


def _origin(c: FinetuneConfig) -> str:
  return f'from {c.init_checkpoint}' + (f' step {c.init_step}' if c.init_step else '')


def _write_run_files(workdir, config_dict: dict, c: FinetuneConfig, model_config: ModelConfig, task: tasks.Task,
                     tokenizer):
  if jax.process_index() != 0:
    return
  fileio.write_json(workdir / 'finetune.json', {
      'config': config_dict, 'model': dataclasses.asdict(model_config), 'task': dataclasses.asdict(task),
      'max_seq_length': c.max_seq_length, 'lowercase': tokenizer.lowercase})
  tokenizer.save(os.fspath(workdir))


def _save_params(path, params):
  fileio.rmtree(path)
  with ocp.StandardCheckpointer() as checkpointer:
    checkpointer.save(path, params)


def write_results(workdir: str, task: tasks.Task, c: FinetuneConfig, per_seed: list[dict],
                  baseline: dict[str, float] | None = None, baseline_labels: dict | None = None) -> dict:
  """results.json (each seed's dev metrics and most frequent prediction, their median, the best seed, the dev
  set's majority baseline) and results.md (a table); prints the table and the run's summary."""
  names = report.metric_names(per_seed[0])
  median = report.median(per_seed)
  main = names[0]
  best = max(per_seed, key=lambda row: row[main])['seed']
  results = {'task': task.name, 'init_checkpoint': c.init_checkpoint, 'init_step': c.init_step, 'epochs': c.epochs,
             'learning_rate': c.optimizer.learning_rate, 'layerwise_lr_decay': c.optimizer.layerwise_lr_decay,
             'main_metric': main, 'seeds': per_seed, 'median': median, 'best_seed': best,
             'majority_baseline': baseline or {}, 'majority_label': baseline_labels or {},
             'one_class_seeds': [row['seed'] for row in per_seed if report.one_class_splits(row)],
             'save_model': c.save_model}
  table = report.results_table(task.name, per_seed, median, baseline, baseline_labels)
  if jax.process_index() == 0:
    fileio.write_json(fileio.path(workdir) / 'results.json', results)
    fileio.write_text(fileio.path(workdir) / 'results.md', table)
    print(table)
    print(report.summary(results, os.fspath(workdir)), end='', flush=True)
  return results
