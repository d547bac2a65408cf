r"""Pre-training objectives compared at equal compute, on downstream tasks, against training from scratch.

  python -m electra_jax.experiments.compare --config=configs/experiments/compare_cpu.py --workdir=WORKDIR \
      [--config.flops_budgets=1e13,3e13 --config.tasks="'DIR1','DIR2'" --config.seeds=5]

For each run in `objectives`: its FLOPs per step (`objective.train_flops_per_step`, what the trainer logs as
`train_flops`) give each budget a step count, round(budget / FLOPs per step) (the nearest multiple of
pretrain.steps_per_call). ONE pre-training run goes to the largest budget's step and keeps a checkpoint at every
budget's step (`save_steps`), so the smaller budgets are intermediate checkpoints of that run: their learning-rate
schedule is the largest budget's (not yet decayed to 0).
Every checkpoint, and the same model from random initialisation, is fine-tuned on every task with `seeds` seeds.

Outputs under WORKDIR:
  pretrain/<run>/                     a pre-training workdir (config.json, metrics.jsonl, checkpoints/<step>/)
  finetune/<run>/<budget>/<task>/     a fine-tuning workdir of that checkpoint (results.json, results.md)
  scratch/<task>/                     the from-scratch baseline
  results.json, results.md            every seed's dev score and the median, per run, budget and task; per run
                                      its median tokens/s and held-out evaluation (`pretraining_summary`)
  compare.png                         score against pre-training FLOPs (log x), one panel per task
Running the same command again skips every finished run and resumes an interrupted pre-training: a long CPU
experiment survives interruptions. A finished run whose settings changed is an error, not a silent reuse.

`precompile` (compare_gpu sets it) compiles the train and evaluation steps of every run still to pre-train and of
every task's fine-tuning at once, before the first run trains: on a GPU host one XLA compile keeps few of its cores
busy.

`task_overrides` changes the fine-tuning settings of one task (by its name, e.g. 'polarity'), for every
initialisation and the from-scratch baseline alike.

`finetune_budgets` (a subset of flops_budgets; empty: all) fine-tunes only those budgets, and each pre-training
stops at the largest of them: its schedule is still the largest flops_budget's, so a later command with more
budgets resumes the same run where it stopped. A run whose objective.generator_checkpoint (electra_frozen) starts
with 'WORKDIR/' reads the generator from this experiment's WORKDIR (e.g. 'WORKDIR/pretrain/mlm', a run listed
before it, whose smallest budget's checkpoint it takes unless objective.generator_step says otherwise); its table
row states what the generator cost to train, which its budget does not include.

  python -m electra_jax.experiments.compare merge WORKDIR1 WORKDIR2 ... --output=DIR

merges the results.json of several experiments (same seeds; their runs, budgets and tasks united) into one
DIR/results.json, results.md and compare.png.
"""

import dataclasses
import json
import os
import re
import sys

import ml_collections
from absl import app, flags, logging
from ml_collections import config_flags

from electra_jax import checkpoint, cli, compile_cache, data, fileio, finetune, frozen, objective, trainer
from electra_jax import metrics as metrics_lib
from electra_jax import config as config_lib
from electra_jax.checkpoint import Checkpointer
from electra_jax.config import ConfigError
from electra_jax.finetune import tasks as tasks_lib


@dataclasses.dataclass(frozen=True)
class Plan:
  """One run of `objectives`: its pre-training config (to the largest budget) and its step for every budget."""
  name: str
  config: ml_collections.ConfigDict
  flops_per_step: float
  steps: tuple[int, ...]  # one per budget, in the order of flops_budgets
  generator_train_flops: float = 0.0  # electra_frozen: what its generator cost to train (not in its budget)


def steps_for_budget(budget: float, flops_per_step: float, name: str = '', multiple: int = 1) -> int:
  """The step count, a multiple of `multiple` (the run's steps_per_call: its loop checkpoints between calls), whose
  training FLOPs are nearest `budget`: multiple * round(budget / (multiple * flops_per_step)), at least `multiple`."""
  steps = multiple * round(budget / (multiple * flops_per_step))
  if steps < 1:
    half = 'half a step' if multiple == 1 else f'half of {multiple} steps (steps_per_call)'
    raise ConfigError(f'a budget of {budget:.3g} FLOPs is less than {half} of {name or "the run"} '
                      f'({flops_per_step:.3g} FLOPs per step); raise flops_budgets')
  return steps


def budget_name(budget: float) -> str:
  """A directory name for a budget: 1.5e13 -> '1.5e13'."""
  return f'{budget:.3g}'.replace('+', '')


def _override(config: ml_collections.ConfigDict, overrides, where: str, kind: str = 'pre-training',
              defaults: str = 'configs/default.py'):
  """Sets `overrides` (nested) into `config` (a `kind` config, its keys in `defaults`), refusing keys it lacks."""
  for key, value in overrides.items():
    if key not in config:
      raise ConfigError(f'{where}.{key}: the {kind} config has no key {key!r} (see {defaults})')
    if isinstance(value, (dict, ml_collections.ConfigDict)):
      if not isinstance(config[key], ml_collections.ConfigDict):
        raise ConfigError(f'{where}.{key} is a section, but {key!r} is a single value in the {kind} config')
      _override(config[key], value, f'{where}.{key}', kind, defaults)
    else:
      try:
        config[key] = value
      except TypeError as e:
        raise ConfigError(f'{where}.{key}: {e}') from None


def _names(values) -> tuple[str, ...]:
  """A tuple of names; an element 'a,b' (how `--config.tasks=a,b` arrives) counts as two."""
  return tuple(name.strip() for value in values for name in str(value).split(',') if name.strip())


def _check(config):
  config.objectives, config.tasks = _names(config.objectives), _names(config.tasks)
  budgets, objectives = tuple(config.flops_budgets), config.objectives
  if not budgets or not all(isinstance(b, (int, float)) and b > 0 for b in budgets):
    raise ConfigError(f'flops_budgets must be positive FLOPs counts, got {budgets}')
  if len({budget_name(b) for b in budgets}) < len(budgets):
    raise ConfigError(f'flops_budgets must differ in their first 3 digits, got {budgets}')
  if not objectives or len(set(objectives)) < len(objectives):
    raise ConfigError(f'objectives must be distinct run names, got {objectives}')
  if not config.tasks or config.seeds < 1:
    raise ConfigError('tasks must name at least one task and seeds be at least 1')
  names = {budget_name(b) for b in budgets}
  unknown = [b for b in config.finetune_budgets if budget_name(b) not in names]
  if unknown:
    raise ConfigError(f'finetune_budgets {tuple(unknown)} are not among flops_budgets {budgets}: fine-tune a subset '
                      'of the budgets the runs are planned for')


def finetuned(config, budget: float) -> bool:
  """Whether `budget` is fine-tuned (and pre-trained to): every budget unless finetune_budgets names some."""
  return not config.finetune_budgets or budget_name(budget) in {budget_name(b) for b in config.finetune_budgets}


WORKDIR_PREFIX = 'WORKDIR/'


def _frozen_generator(run, c, plans: dict, workdir) -> tuple[frozen.Source, float]:
  """(the run it samples from, FLOPs it cost to train) of the frozen generator of `run` (its config `c`), setting
  `run`'s objective.generator_checkpoint (and step) when it names a run of this experiment ('WORKDIR/...')."""
  path = run.objective.generator_checkpoint
  if path.startswith(WORKDIR_PREFIX):
    parts = path[len(WORKDIR_PREFIX):].split('/')
    if len(parts) != 2 or parts[0] != 'pretrain' or parts[1] not in plans:
      raise ConfigError(f'objective.generator_checkpoint {path!r}: a run of this experiment is '
                        f"'WORKDIR/pretrain/NAME' with NAME a run listed before it, one of {sorted(plans)}")
    source_plan = plans[parts[1]]
    if workdir is None:
      raise ConfigError(f'objective.generator_checkpoint {path!r} needs the experiment\'s --workdir')
    run.objective.generator_checkpoint = os.fspath(fileio.path(workdir) / 'pretrain' / parts[1])
    run.objective.generator_step = run.objective.generator_step or min(source_plan.steps)
    if run.objective.generator_step not in source_plan.steps:
      raise ConfigError(f'objective.generator_step {run.objective.generator_step} is not a checkpoint of run '
                        f'{parts[1]} (its steps: {source_plan.steps})')
    source = objective.generator_source(c, config_lib.load(source_plan.config, vocab_size=c.model.vocab_size))
  else:
    source = objective.generator_source(c)
  c = config_lib.load(run, vocab_size=c.model.vocab_size)
  step = c.objective.generator_step or frozen.latest_step(c.objective.generator_checkpoint)
  return source, frozen.generator_train_flops(source, step)


def plan(config, workdir=None) -> list[Plan]:
  """Each run's pre-training config, FLOPs per step and steps per budget (trains a tokenizer if none is cached).
  `workdir`: the experiment's, which 'WORKDIR/...' generator checkpoints name."""
  _check(config)
  plans = {}
  for name in config.objectives:
    run = ml_collections.ConfigDict(config.pretrain.to_dict())  # an unlocked copy
    run.objective.name = name
    _override(run, config.overrides.get(name, {}), f'overrides.{name}')
    data_config = config_lib.from_dict(config_lib.DataConfig, run.data.to_dict(), where='pretrain.data')
    try:
      vocab_size = data.load_tokenizer(data_config).vocab_size
    except data.DataError as e:  # its message names a pre-training config's keys (data.source): here pretrain.*
      raise data.DataError(re.sub(r'(?<![\w./])data\.(?=\w)', 'pretrain.data.', str(e))) from None
    c = config_lib.load(run, vocab_size=vocab_size)
    c.check_steps_per_call()  # its save_steps below are multiples of steps_per_call; the periods must be too
    spec, source, generator_train_flops = objective.get(c.objective.name), None, 0.0
    if spec.frozen_generator:  # its generator's forward pass, from the generator run's config
      source, generator_train_flops = _frozen_generator(run, c, plans, workdir)
    per_step = spec.train_flops_per_step(c, source)
    steps = tuple(steps_for_budget(b, per_step, name, c.steps_per_call) for b in config.flops_budgets)
    run.train_steps = max(steps)
    run.save_steps = tuple(sorted(set(steps)))
    plans[name] = Plan(name, run, per_step, steps, generator_train_flops)
  return list(plans.values())


def stop_step(config, p: Plan) -> int:
  """The step run `p`'s pre-training goes to: its largest fine-tuned budget's."""
  return max(s for b, s in zip(config.flops_budgets, p.steps) if finetuned(config, b))


def describe(config, plans: list[Plan]) -> str:
  """What `run` will run: steps per budget, each run's pre-training (to `stop_step`) and its FLOPs, and the
  fine-tuning count (the `finetuned` budgets')."""
  tuned = [b for b in config.flops_budgets if finetuned(config, b)]
  subset = '' if len(tuned) == len(config.flops_budgets) else f' (fine-tuned: {", ".join(f"{b:.3g}" for b in tuned)})'
  lines = [f'compare: {len(plans)} runs x {len(config.flops_budgets)} FLOPs budgets{subset}; fine-tuning on '
           f'{len(config.tasks)} tasks x {config.seeds} seeds']
  for p in plans:
    budgets = ', '.join(f'{b:.3g} -> {s} steps' for b, s in zip(config.flops_budgets, p.steps))
    until = stop_step(config, p)
    schedule = '' if until == max(p.steps) else f' (of its {max(p.steps)}-step schedule)'
    lines.append(f'  {p.name} ({p.config.objective.name}): {p.flops_per_step:.4g} FLOPs per step; {budgets}; '
                 f'one run of {until} steps{schedule} = {until * p.flops_per_step:.4g} FLOPs')
  total = sum(stop_step(config, p) * p.flops_per_step for p in plans)
  inits = len(plans) * len(tuned) + 1
  lines.append(f'  pre-training in all: {total:.4g} FLOPs; fine-tuning: {inits} initialisations (from scratch '
               f'included) x {len(config.tasks)} tasks = {inits * len(config.tasks)} runs of {config.seeds} seeds')
  return '\n'.join(lines)


def _flat(values: dict, prefix: str = '') -> dict:
  out = {}
  for key, value in values.items():
    if isinstance(value, dict):
      out.update(_flat(value, f'{prefix}{key}.'))
    else:
      out[prefix + key] = value
  return out


def _check_unchanged(saved: dict, new: dict, workdir: str, ignore: tuple[str, ...] = ()):
  """Refuses to reuse `workdir` when its saved config differs from `new` (compared as JSON)."""
  old, now = _flat(saved), _flat(json.loads(json.dumps(new)))
  changed = sorted(k for k in set(old) | set(now) if old.get(k) != now.get(k) and k not in ignore)
  if changed:
    raise ConfigError(f'{workdir} holds a run with other settings ({", ".join(changed[:8])}); run the experiment '
                      'with the settings it started with, or use a new --workdir')


def pretrained(p: Plan, workdir: str, until: int) -> bool:
  """Whether run `p` in `workdir` holds every budget's checkpoint up to step `until`; refuses a workdir whose run
  had other settings."""
  return {s for s in p.steps if s <= until} <= _checked_steps(p, workdir)


def _checked_steps(p: Plan, workdir: str) -> set[int]:
  """The steps of the checkpoints in `workdir`, once its run is found to have run `p`'s settings (else refused)."""
  saved = fileio.path(workdir) / 'config.json'
  if saved.is_file():
    _check_unchanged(fileio.read_json(saved, 'remove the run\'s directory to pre-train it again'), p.config.to_dict(),
                     workdir)
  return _saved_steps(workdir)


def pretrain(p: Plan, workdir: str, until: int | None = None):
  """Pre-trains run `p` in `workdir` to step `until` (default: its last) unless every budget's checkpoint up to it
  is there; resumes an interrupted (or earlier stopped) run. The schedule is always the last step's."""
  until = until or max(p.steps)
  wanted = {s for s in p.steps if s <= until}
  done = _checked_steps(p, workdir)
  if wanted <= done:
    print(f'{p.name}: pre-trained (checkpoints {sorted(wanted)} in {workdir})', file=sys.stderr)
    return
  print(f'{p.name}: pre-training to step {until} of {max(p.steps)} in {workdir}', file=sys.stderr)
  trainer.train(p.config, workdir, stop_after=until - max(done, default=0))
  if not wanted <= _saved_steps(workdir):  # stopped by a signal, after writing a checkpoint
    raise trainer.TrainingError(f'the pre-training of {p.name} stopped before step {until}; run the same '
                                'command again to resume it')


def _precompile(config, plans: list[Plan], task_names: dict[str, str], workdir):
  """While a run is still to pre-train, compiles at once, before the first trains, the train and evaluation steps
  of every such run (`trainer.precompile`) and of every task's fine-tuning (`finetune.precompile`, from the
  from-scratch config: every initialisation of the same model runs the same programs): one XLA compile keeps few
  of a GPU host's cores busy, and these compiles would otherwise come one after another. Each is prepared in turn
  (the first run trains the shared tokenizer, the rest find it cached); the corpus is packed while they compile
  (the first run's wait)."""
  pending = [p for p in plans if not pretrained(p, os.fspath(workdir / 'pretrain' / p.name), stop_step(config, p))]
  pending = [p for p in pending if _generator_ready(p.config.objective)]
  if not pending:
    return
  waits = [(p.name, trainer.precompile(p.config, os.fspath(workdir / 'pretrain' / p.name))) for p in pending]
  waits += [(f'fine-tuning {name}', finetune.precompile(finetune_config(config, name, task),
                                                        os.fspath(workdir / 'scratch' / name)))
            for name, task in task_names.items()]
  for name, wait in waits:
    print(f'{name}: ' + '; '.join(wait()), file=sys.stderr)


def _generator_ready(objective_config) -> bool:
  """Whether a run's frozen generator (electra_frozen: its generator_checkpoint at generator_step, 0 the latest)
  has its checkpoint: the run is prepared from it. True for every other objective."""
  source = objective_config.get('generator_checkpoint')
  if not source:
    return True
  steps = _saved_steps(source)
  return bool(steps) and (not objective_config.get('generator_step') or objective_config.generator_step in steps)


def _saved_steps(workdir: str) -> set[int]:
  if not checkpoint.started(workdir):
    return set()
  checkpointer = Checkpointer(workdir, read_only=True)
  steps = set(checkpointer.all_steps())
  checkpointer.close()
  return steps


def _task_overrides(config) -> dict:
  return config.get('task_overrides') or {}  # a config file written before task_overrides has none


def finetune_config(config, name: str, task: str, init_checkpoint: str = '', init_step: int = 0):
  """The fine-tuning config of one (checkpoint, task named `name`): `finetune` with the task's
  `task_overrides[name]`; no checkpoint: `pretrain`'s model from scratch."""
  c = ml_collections.ConfigDict(config.finetune.to_dict())
  _override(c, _task_overrides(config).get(name, {}), f'task_overrides.{name}', 'fine-tuning', 'configs/finetune.py')
  c.task, c.seeds = task, config.seeds
  c.init_checkpoint, c.init_step = init_checkpoint, init_step
  if not init_checkpoint:
    c.model = config.pretrain.model.to_dict()
    c.data = config.pretrain.data.to_dict()  # the same tokenizer as pre-training (cached after the first)
  return c


def finetune_once(c, workdir: str) -> dict:
  """Fine-tunes (all seeds) unless `workdir` holds results; returns {metric, seeds, scores, median}."""
  path = fileio.path(workdir) / 'results.json'
  if path.is_file():
    again = f'remove {workdir} to fine-tune it again'
    _check_unchanged(fileio.read_json(fileio.path(workdir) / 'finetune.json', again)['config'], c.to_dict(),
                     workdir, ignore=('init_checkpoint',))
    results = fileio.read_json(path, again)
  else:
    results = finetune.run(c, workdir)
  if results is None:  # stopped by a signal, after writing a checkpoint
    raise trainer.TrainingError(f'the fine-tuning in {workdir} stopped; run the same command again to resume it')
  metric = results['main_metric']
  return {'metric': metric, 'seeds': [row['seed'] for row in results['seeds']],
          'scores': [row[metric] for row in results['seeds']], 'median': results['median'][metric]}


def _check_own(directory, flag: str):
  """Raises ConfigError if `directory` holds another command's run, whose results.json (or more) a compare
  would write over: a fine-tuning or pre-training run, or a results.json that is not a compare's."""
  directory = fileio.path(directory)
  held = [name for name in ('finetune.json', 'config.json', checkpoint.DIRECTORY) if (directory / name).exists()]
  if not held and (directory / 'results.json').is_file():
    saved = fileio.read_json(directory / 'results.json', f'give another {flag}')
    held = [] if {'objectives', 'scratch'} <= saved.keys() else ['results.json']
  if held:
    raise ConfigError(f'{flag}={directory} holds another run ({", ".join(held)}), whose results a compare would write '
                      f'over: give another {flag}')


def run(config, workdir: str) -> dict:
  """The whole experiment (see the module docstring); returns what WORKDIR/results.json holds."""
  _check_own(workdir, '--workdir')
  workdir = fileio.path(workdir)
  plans = plan(config, workdir)
  print(describe(config, plans), file=sys.stderr, flush=True)
  task_names = {}
  for task in config.tasks:
    name = tasks_lib.get_task(task).name
    if name in task_names:
      raise ConfigError(f'tasks {task_names[name]!r} and {task!r} have the same name {name!r}')
    task_names[name] = task
  for name in sorted(set(_task_overrides(config)) - set(task_names)):  # e.g. polarity's, with other --config.tasks
    print(f'task_overrides.{name}: no task is named {name!r} ({", ".join(task_names)}); not used', file=sys.stderr)
  for name, task in task_names.items():  # a wrong key fails now, not after hours of pre-training
    finetune_config(config, name, task)
  if config.get('precompile'):
    _precompile(config, plans, task_names, workdir)
  # results.json and results.md are written after each fine-tuning, the baseline first and each run's as soon as it
  # is pre-trained: a command cut short (a time limit) leaves the table of everything finished before.
  results = {'flops_budgets': list(config.flops_budgets), 'seeds': config.seeds, 'tasks': task_names,
             'objectives': {}, 'scratch': {}}
  for name, task in task_names.items():
    results['scratch'][name] = finetune_once(finetune_config(config, name, task),
                                             os.fspath(workdir / 'scratch' / name))
    write_results(results, workdir)
  for p in plans:
    pretrain(p, os.fspath(workdir / 'pretrain' / p.name), stop_step(config, p))
    run_results = results['objectives'][p.name] = {
        'objective': p.config.objective.name, 'flops_per_step': p.flops_per_step,
        'budgets': [{'budget': b, 'steps': s, 'train_flops': s * p.flops_per_step, 'tasks': {}}
                    for b, s in zip(config.flops_budgets, p.steps) if finetuned(config, b)]}
    if p.generator_train_flops:
      run_results['generator_train_flops'] = p.generator_train_flops
    run_results['pretraining'] = pretraining_summary(os.fspath(workdir / 'pretrain' / p.name))
    for entry in run_results['budgets']:
      for name, task in task_names.items():
        c = finetune_config(config, name, task, os.fspath(workdir / 'pretrain' / p.name), entry['steps'])
        entry['tasks'][name] = finetune_once(
            c, os.fspath(workdir / 'finetune' / p.name / budget_name(entry['budget']) / name))
        write_results(results, workdir)
  print(results_table(results), file=sys.stderr)
  plot(results, workdir / 'compare.png')
  return results


# A discriminator has left its prior at the first held-out evaluation where it flags (P(replaced) > 0.5) at least
# LEFT_PRIOR_RECALL of the replaced tokens, with a precision at least LEFT_PRIOR_LIFT times the share of replaced
# tokens: at its prior it calls every token original (recall 0), and a fresh one, its logits near 0, flags tokens at
# chance (a tiny run's first evaluation: recall 0.21, precision 0.16 where 0.13 were replaced). Not a threshold on
# eval_disc_auc: a discriminator ranks replaced tokens above original ones by their identity long before it flags
# any (the tiny config's run: AUC 0.81 at recall 0.000, BENCHMARKS.md "Held-out evaluation").
LEFT_PRIOR_RECALL = 0.02
LEFT_PRIOR_LIFT = 2.0
LAST_EVAL = ('eval_disc_recall', 'eval_disc_auc', 'eval_gen_accuracy', 'eval_mlm_accuracy')


def pretraining_summary(workdir: str) -> dict:
  """From a pre-training workdir's metrics.jsonl: the median logged tokens_per_second; with held-out evaluations,
  the last one's step and LAST_EVAL metrics and, for a run with a discriminator, `left_prior_step` (the first
  evaluation's step that `_left_prior`; None: not by the last)."""
  path = fileio.path(workdir) / metrics_lib.FILE
  if not path.is_file():
    return {}
  rows = metrics_lib.read(path)
  speeds = sorted(row['tokens_per_second'] for row in rows if 'tokens_per_second' in row)
  summary = {'tokens_per_second': speeds[len(speeds) // 2]} if speeds else {}
  evaluations = [row for row in rows if any(key.startswith('eval_') for key in row)]
  if evaluations:
    summary['last_eval'] = {key: value for key, value in evaluations[-1].items() if key in ('step',) + LAST_EVAL}
    if 'eval_disc_recall' in evaluations[-1]:
      summary['left_prior_step'] = next((row['step'] for row in evaluations if _left_prior(row)), None)
  return summary


def _left_prior(evaluation: dict) -> bool:
  """Whether a held-out evaluation's discriminator flags replaced tokens, better than chance (see LEFT_PRIOR_RECALL;
  an evaluation written before eval_replaced_fraction existed: by its recall alone)."""
  better = evaluation.get('eval_disc_precision', 1.0) >= LEFT_PRIOR_LIFT * evaluation.get('eval_replaced_fraction', 0.0)
  return evaluation['eval_disc_recall'] >= LEFT_PRIOR_RECALL and better


def write_results(results: dict, workdir: str):
  """WORKDIR/results.json and results.md, rewritten after every fine-tuning (missing entries: '-')."""
  fileio.write_json(fileio.path(workdir) / 'results.json', results)
  fileio.write_text(fileio.path(workdir) / 'results.md', results_table(results))


def _cell(summary: dict | None) -> str:
  if not summary:
    return '-'
  scores = [100 * s for s in summary['scores']]
  return f'{100 * summary["median"]:.2f} [{min(scores):.2f}-{max(scores):.2f}]'


def results_table(results: dict) -> str:
  """Markdown: a row per run and budget, then from scratch; a column per task; median [min-max] x 100."""
  names = list(results['tasks'])
  metrics = {n: (results['scratch'].get(n) or {}).get('metric', '') for n in names}
  lines = [f'### Dev scores x100 at equal pre-training compute: median of {results["seeds"]} seeds [min-max]', '',
           '| run | budget (FLOPs) | steps | ' + ' | '.join(f'{n} ({metrics[n]})' if metrics[n] else n
                                                            for n in names) + ' |',
           '|---|---:|---:|' + '---:|' * len(names)]
  for run_name, run in results['objectives'].items():
    for entry in run['budgets']:
      lines.append(f'| {run_name} | {entry["budget"]:.3g} | {entry["steps"]} | '
                   + ' | '.join(_cell(entry['tasks'].get(n)) for n in names) + ' |')
  lines.append('| from scratch | 0 | 0 | ' + ' | '.join(_cell(results['scratch'].get(n)) for n in names) + ' |')
  lines += _pretraining_table(results)
  lines += [f'\n{run_name}: its frozen generator cost {run["generator_train_flops"]:.3g} FLOPs to train, not counted '
            'in its budgets (its forward passes are)' for run_name, run in results['objectives'].items()
            if run.get('generator_train_flops')]
  return '\n'.join(lines) + '\n'


def _pretraining_table(results: dict) -> list[str]:
  """Markdown lines: per run with a `pretraining` summary, its speed and held-out evaluation; [] if none has one."""
  rows = []
  for name, run in results['objectives'].items():
    summary = run.get('pretraining')
    if not summary:
      continue
    last = summary.get('last_eval', {})
    if 'left_prior_step' not in summary:
      left = '- (no discriminator)' if last else '- (no evaluation)'
    elif summary['left_prior_step'] is None:
      left = f'not by step {last["step"]}'
    else:
      left = f'step {summary["left_prior_step"]} ({summary["left_prior_step"] * run["flops_per_step"]:.3g} FLOPs)'
    cells = [f'{summary["tokens_per_second"]:,.0f}' if 'tokens_per_second' in summary else '-', left,
             str(last.get('step', '-'))]
    cells += [f'{last[key]:.3f}' if key in last else '-' for key in ('eval_disc_recall', 'eval_disc_auc')]
    if 'eval_mlm_accuracy' in last:
      cells.append(f'{last["eval_mlm_accuracy"]:.3f}')
    else:
      cells.append(f'{last["eval_gen_accuracy"]:.3f} (generator)' if 'eval_gen_accuracy' in last else '-')
    rows.append(f'| {name} | ' + ' | '.join(cells) + ' |')
  if not rows:
    return []
  return ['', '### Pre-training: tokens/s (median of the logged steps) and held-out evaluation; a discriminator left '
              f'its prior at the first evaluation with eval_disc_recall >= {LEFT_PRIOR_RECALL} and eval_disc_precision '
              f'>= {LEFT_PRIOR_LIFT:g} x eval_replaced_fraction', '',
          '| run | tokens/s | left its prior at | last evaluation (step) | eval_disc_recall | eval_disc_auc | '
          'eval MLM accuracy |', '|---|---:|---|---:|---:|---:|---:|'] + rows


def merge(workdirs: list[str], output: str) -> dict:
  """One results.json, results.md and compare.png in `output` from the results.json of several experiments.

  Their runs, budgets and tasks are united; a run in several workdirs keeps each budget's fine-tunings, and a
  (run, budget, task) cell in two must agree. The from-scratch baseline of a task is the first workdir's that has
  one. The seeds must be the same everywhere (each cell is a median over them).
  """
  if not workdirs:
    raise ConfigError('merge needs at least one WORKDIR')
  _check_own(output, '--output')
  merged = {'flops_budgets': [], 'seeds': None, 'tasks': {}, 'objectives': {}, 'scratch': {}, 'merged_from': []}
  for workdir in workdirs:
    path = fileio.path(workdir) / 'results.json'
    if not path.is_file():
      raise ConfigError(f'{workdir} has no results.json: give the --workdir of compare runs')
    results = fileio.read_json(path, 'run its compare command again to rewrite it')
    if merged['seeds'] not in (None, results['seeds']):
      raise ConfigError(f'{workdir} has medians of {results["seeds"]} seeds, {merged["merged_from"][0]} of '
                        f'{merged["seeds"]}: merge experiments run with the same seeds')
    merged['seeds'] = results['seeds']
    merged['merged_from'].append(os.fspath(workdir))
    merged['flops_budgets'] = sorted(set(merged['flops_budgets']) | set(results['flops_budgets']))
    for name, task in results['tasks'].items():
      merged['tasks'].setdefault(name, task)
    for name, summary in results['scratch'].items():
      merged['scratch'].setdefault(name, summary)
    for run_name, run in results['objectives'].items():
      into = merged['objectives'].setdefault(run_name, {**run, 'budgets': []})
      if (into['objective'], into['flops_per_step']) != (run['objective'], run['flops_per_step']):
        raise ConfigError(f'{workdir} and an earlier workdir both hold a run {run_name}, of other settings '
                          f'({run["objective"]} at {run["flops_per_step"]:.4g} FLOPs a step against '
                          f'{into["objective"]} at {into["flops_per_step"]:.4g}): merge runs of one experiment')
      budgets = {budget_name(e['budget']): e for e in into['budgets']}
      for entry in run['budgets']:
        have = budgets.setdefault(budget_name(entry['budget']), {**entry, 'tasks': {}})
        for task, summary in entry['tasks'].items():
          if have['tasks'].setdefault(task, summary) != summary:
            raise ConfigError(f'{workdir} and an earlier workdir both hold {run_name} at '
                              f'{budget_name(entry["budget"])} on {task}, with other scores: merge each cell from '
                              'one experiment')
      into['budgets'] = sorted(budgets.values(), key=lambda e: e['budget'])
  write_results(merged, output)
  plot(merged, fileio.path(output) / 'compare.png')
  return merged


def merge_main(argv: list[str]):
  """`compare merge WORKDIR... --output=DIR`: one line on stderr and exit status 1 for bad input."""
  import argparse  # noqa: PLC0415
  parser = argparse.ArgumentParser(prog='python -m electra_jax.experiments.compare merge',
                                   description='One table and plot from the results of several compare workdirs.')
  parser.add_argument('workdirs', nargs='+', metavar='WORKDIR')
  parser.add_argument('--output', required=True, metavar='DIR')
  args = parser.parse_args(argv)
  try:
    print(results_table(merge(args.workdirs, args.output)), file=sys.stderr)
  except (ConfigError, OSError, KeyError) as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(1)


def plot(results: dict, path: str):
  """`figure(results)` as a PNG at `path`."""
  try:
    drawn = figure(results)
  except ImportError:  # a bare GPU machine may lack matplotlib: the tables are written already
    print(f'{path} not drawn: matplotlib is not installed (pip install matplotlib, then run the same command)',
          file=sys.stderr)
    return
  with fileio.atomic_writer(path) as f:
    drawn.savefig(f, dpi=120, format='png')


def figure(results: dict):
  """A panel per task: median score (min-max bars) against the pre-training FLOPs budget, a line per run, each
  run's points nudged sideways so that runs at one budget do not hide each other, the from-scratch median as a
  dashed line."""
  from matplotlib.figure import Figure  # noqa: PLC0415  (only this needs matplotlib)
  names = list(results['tasks'])
  drawn = Figure(figsize=(4.8 * len(names), 4.0), layout='constrained')
  axes = drawn.subplots(1, len(names), squeeze=False)[0]
  runs = results['objectives']
  for axis, name in zip(axes, names):
    metric = ''
    for index, (run_name, run) in enumerate(runs.items()):
      # The budget, not the run's train_flops: those differ by a fraction of a step, which on a log axis of one
      # budget (the GPU preset's) spread the runs to its two edges.
      points = [(e['budget'], e['tasks'][name]) for e in run['budgets'] if name in e['tasks']]
      if not points:
        continue
      x = [budget * 1.05 ** (index - (len(runs) - 1) / 2) for budget, _ in points]
      median = [100 * s['median'] for _, s in points]
      axis.errorbar(x, median, yerr=[[m - 100 * min(s['scores']) for m, (_, s) in zip(median, points)],
                                     [100 * max(s['scores']) - m for m, (_, s) in zip(median, points)]],
                    marker='o', capsize=3, label=run_name)
      metric = points[0][1]['metric']
    scratch = results['scratch'].get(name)
    if scratch:
      axis.axhline(100 * scratch['median'], color='gray', linestyle='--', label='from scratch')
      metric = scratch['metric']
    axis.set_xscale('log')
    budgets = sorted({e['budget'] for run in runs.values() for e in run['budgets']})
    if budgets:  # a decade at least, so that one budget reads as one point, not an axis of its rounding
      axis.set_xlim(min(budgets) / 3, max(budgets) * 3)
    axis.set_xlabel('pre-training FLOPs budget')
    axis.set_ylabel(f'{metric} x100 (median of {results["seeds"]} seeds)')
    axis.set_title(name)
    axis.grid(True, which='both', alpha=0.3)
    axis.legend(fontsize='small')
  return drawn


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  logging.set_verbosity(logging.WARNING)
  if flags.FLAGS.show_config:
    print(cli.show_config(flags.FLAGS.config, config_flags.get_config_filename(flags.FLAGS['config'])))
    return
  # As electra_jax.main: a resumed experiment, and fine-tunings of the same shapes (every initialisation and seed
  # of a task), load their compiled programs from disk instead of compiling them again.
  compile_cache.enable(flags.FLAGS.config.pretrain.data.get('cache_dir', ''))
  cli.run(run, flags.FLAGS.config, flags.FLAGS.workdir)


if __name__ == '__main__' and sys.argv[1:2] == ['merge']:
  merge_main(sys.argv[2:])
elif __name__ == '__main__':
  # Defined here, not on import: electra_jax.main defines flags of the same names, and tests import both.
  config_flags.DEFINE_config_file('config', None, 'An experiment config, e.g. configs/experiments/compare_cpu.py.',
                                  lock_config=True)
  flags.DEFINE_string('workdir', None, 'Where the runs, results.json, results.md and compare.png go.')
  flags.DEFINE_bool('show_config', False, 'Print every key of --config, its value and its comment, then exit.')
  flags.mark_flags_as_required(['config'])
  app.run(main, flags_parser=cli.flags_parser)
