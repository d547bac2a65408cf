"""Continued pre-training: a new run that starts from the weights of another run or of an import.

  python -m electra_jax.main --config=configs/small.py --config.init_checkpoint=IMPORT \
      --config.data.source=CORPUS --workdir=WORKDIR [--config.init_optimizer=True]

The model (its sizes, its tying) and the tokenizer come from init_checkpoint's config.json and tokenizer, whatever
the --config file says; the settings that change no parameter (`FREE_MODEL_KEYS`) stay the run's own. The run
starts at step 0 of its own schedule, at the start of its own data, in its own workdir. `init_optimizer` also
takes the Adam moments (the learning-rate schedule still starts again). Once the new run has a checkpoint of its
own, the same command resumes it from that.
"""

import dataclasses
import os
import sys
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import optax

from electra_jax import checkpoint, config_files, fileio
from electra_jax.config import ConfigError
from electra_jax.data import tokenizer as tokenizer_lib

# Model keys that change no parameter's name or shape: the new run's config decides them.
FREE_MODEL_KEYS = ('dtype', 'remat', 'dropout_rate', 'attention_dropout_rate', 'attention', 'dropout_draw',
                   'fused_qkv')
# Optimizer keys that shape its state (the opt_state a checkpoint holds): what reads that state back (a resumed run,
# init_optimizer) must have those it was written with.
OPTIMIZER_STATE_KEYS = ('bias_correction',)


def check_overrides(config, overrides: dict, workdir: str | None = None):
  """Refuses command-line overrides (`--config.KEY=VALUE`, as ml_collections reports them) that contradict
  init_checkpoint: its model's sizes and its tokenizer (`_source`'s, for the run in `workdir`). Nothing else is
  read or written."""
  if not config.get('init_checkpoint'):
    if config.get('init_optimizer'):
      raise ConfigError('config key init_optimizer needs init_checkpoint (a pre-training WORKDIR or an import)')
    return
  model, tokenizer = _source(config, workdir)
  for key, value in sorted(overrides.items()):
    section, _, name = key.partition('.')
    if section == 'model' and name not in FREE_MODEL_KEYS and value != model.get(name, value):
      raise ConfigError(f'--config.{key}={value} conflicts with init_checkpoint {config.init_checkpoint}, whose model '
                        f'has {key}={model[name]}: a continued run takes the model from its checkpoint; drop the '
                        'override')
    if key in ('data.vocab_size', 'data.lowercase') and value != tokenizer[name]:  # were ignored in silence
      raise ConfigError(f'--config.{key}={value} conflicts with init_checkpoint {config.init_checkpoint}, whose '
                        f'tokenizer has {key}={tokenizer[name]}: a continued run uses its tokenizer; drop the override')
    if key == 'data.tokenizer' and value:
      raise ConfigError(f'--config.data.tokenizer conflicts with init_checkpoint {config.init_checkpoint}: its '
                        'embeddings are indexed by its own tokenizer, which a continued run always uses; drop it')


def _source(config, workdir=None) -> tuple[dict, dict]:
  """(model section, data.tokenizer/lowercase/vocab_size) that the continued run `config` in `workdir` takes: from
  the run's own config.json once it has checkpoints (its source may have moved since, or be gone), else from
  init_checkpoint's config.json and tokenizer (the tokenizer then being init_checkpoint, absolute)."""
  if workdir and checkpoint.started(workdir) and (fileio.path(workdir) / 'config.json').exists():
    saved = config_files.load_config(workdir)
    if saved.init_checkpoint:
      return dataclasses.asdict(saved.model), {k: getattr(saved.data, k) for k in ('tokenizer', 'lowercase',
                                                                                    'vocab_size')}
  source_dir = os.fspath(fileio.path(config.init_checkpoint))
  source = config_files.load_config(source_dir)
  tokenizer = tokenizer_lib.load(source_dir)  # raises DataError in one line if it has none
  return dataclasses.asdict(source.model), {'tokenizer': source_dir, 'lowercase': tokenizer.lowercase,
                                            'vocab_size': tokenizer.vocab_size}


def adopt(config, workdir=None) -> ml_collections.ConfigDict:
  """`config` with init_checkpoint's model section (but `FREE_MODEL_KEYS`) and its tokenizer (`_source`'s, for the
  run in `workdir`); `config` itself if it has no init_checkpoint. init_checkpoint and data.tokenizer (the same
  directory) are absolute, spelled alike however the command line spelled it (relative, a trailing slash): a
  resume compares data.tokenizer with the one config.json saved."""
  if not config.get('init_checkpoint'):
    return config
  model, tokenizer = _source(config, workdir)
  values = config.to_dict()
  values['init_checkpoint'] = os.fspath(fileio.path(config.init_checkpoint))
  model.update({k: values['model'][k] for k in FREE_MODEL_KEYS if k in values['model']})
  values['model'] = model
  values['data'].update(tokenizer)
  if values['data']['max_seq_length'] > model['max_position_embeddings']:
    raise ConfigError(f'data.max_seq_length={values["data"]["max_seq_length"]} exceeds init_checkpoint\'s '
                      f'model.max_position_embeddings={model["max_position_embeddings"]}; lower data.max_seq_length')
  return ml_collections.ConfigDict(values)


def check_workdir(config, workdir):
  """Refuses to write the continued run into init_checkpoint itself: its checkpoints are the starting point."""
  if config.get('init_checkpoint') and fileio.path(workdir) == fileio.path(config.init_checkpoint):
    raise ConfigError(f'--workdir is init_checkpoint {config.init_checkpoint}: a continued run writes its own '
                      'checkpoints; give a new --workdir')


def initial_state(init_checkpoint: str, init_optimizer: bool, run, fresh):
  """The continued run's step-0 TrainState: `fresh` (run.init_state's) with init_checkpoint's latest params and,
  with `init_optimizer`, its optimiser state (its learning-rate schedule restarted), each laid out as `run` says."""
  checkpointer = checkpoint.Checkpointer(init_checkpoint, read_only=True)
  try:
    step = checkpointer.latest_step()
    if step is None:
      raise checkpoint.CheckpointError(f'{checkpointer.directory} holds no checkpoint to start from')
    abstract = run.abstract_state()
    if not init_optimizer:
      params, missing = _filled(checkpointer.restore_params(step, abstract.params), fresh.params)
      if missing and jax.process_index() == 0:
        print(f'init_checkpoint has no {", ".join(missing)} (trained with another objective): initialised afresh',
              file=sys.stderr)
      return fresh.replace(params=params)
    try:
      restored, _ = checkpointer.restore(step, abstract)
    except checkpoint.CheckpointError as e:
      keys = ', '.join(f'optimizer.{k}' for k in OPTIMIZER_STATE_KEYS)
      raise checkpoint.CheckpointError(f'{e}; with init_optimizer it must hold every parameter this run trains '
                                       '(a run of another objective may not: continue without init_optimizer) and '
                                       f'the optimizer settings that shape its state ({keys}) must be those it was '
                                       'written with') from None
  finally:
    checkpointer.close()
  return fresh.replace(params=restored.params, opt_state=_restart_schedule(restored.opt_state))


def _filled(restored, fresh) -> tuple[Any, list[str]]:
  """`restored` parameters with those the checkpoint lacked (orbax's partial restore leaves their abstract values:
  an MLM run has no generator) taken from `fresh`, and the modules those were ('generator', the whole of it, or
  'discriminator/discriminator_predictions')."""
  lacking = lambda value: isinstance(value, jax.ShapeDtypeStruct)
  filled = jax.tree.map(lambda value, initial: initial if lacking(value) else value, restored, fresh)
  missing = []
  for name, module in restored.items():
    if all(map(lacking, jax.tree.leaves(module))):
      missing.append(name)
    elif isinstance(module, dict):
      missing += [f'{name}/{part}' for part, sub in module.items() if any(map(lacking, jax.tree.leaves(sub)))]
  return filled, missing


def _restart_schedule(opt_state):
  """The optimiser state with its learning-rate schedule's step count at 0 (Adam's moments and count kept)."""
  def restart(s):
    if isinstance(s, optax.ScaleByScheduleState):
      return s._replace(count=jnp.zeros_like(s.count))
    return tuple(restart(x) for x in s) if isinstance(s, tuple) and not hasattr(s, '_fields') else s
  return restart(opt_state)
