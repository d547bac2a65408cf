r"""Pre-train an ELECTRA text encoder, fine-tune it on a task, or predict with the fine-tuned model.

  python -m electra_jax.main --config=configs/tiny.py --workdir=WORKDIR [--config.train_steps=100]
  python -m electra_jax.main --config=configs/finetune.py --config.task=rte --config.init_checkpoint=WORKDIR \
      --workdir=RTE_WORKDIR
  python -m electra_jax.main --config=configs/finetune.py --config.predict_input=FILE --workdir=RTE_WORKDIR
  python -m electra_jax.main --config=configs/small.py --show_config   # every key, its value and its comment

The configs (override any key with --config.KEY=VALUE):
  configs/tiny.py       4 layers, H=128: a CPU, minutes, on the built-in corpus (the quickstart)
  configs/small.py      ELECTRA-Small (paper): 12 layers, H=256 (small.py:quickstart: on one GPU, built-in corpus)
  configs/base.py       ELECTRA-Base (paper): 12 layers, H=768
  configs/large.py      ELECTRA-Large (paper): 24 layers, H=1024
                        (each scale also as NAME.py:gpu for a node of 8 GPUs, NAME.py:gpu:N for N GPUs)
  configs/finetune.py   fine-tuning and prediction: a GLUE task, SQuAD or a task directory
  configs/default.py    every pre-training key with its default
Everything a run writes goes to --workdir; running the same command again resumes it.
"""

from absl import app, flags, logging
from ml_collections import config_flags

from electra_jax import cli, compile_cache, continued, finetune, sharding, trainer

_CONFIG = config_flags.DEFINE_config_file(
    'config', None, 'A config file under configs/, e.g. configs/tiny.py; override any key with '
    '--config.KEY=VALUE, list them with --show_config.', lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Directory for checkpoints, metrics and TensorBoard events.')
_MODE = flags.DEFINE_enum('mode', None, ['pretrain', 'finetune', 'predict'],
                          'What to run. Default: what the config is for: pretrain for a pre-training config, '
                          'finetune for configs/finetune.py, predict if it sets predict_input (a fine-tuned '
                          'WORKDIR).')
_SHOW_CONFIG = flags.DEFINE_bool('show_config', False, 'Print every key of --config (after overrides), its value '
                                 'and its one-line comment, then exit.')
RUNS = {'pretrain': trainer.train, 'finetune': finetune.run, 'predict': finetune.predict_main}


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  logging.set_verbosity(logging.WARNING)
  if _SHOW_CONFIG.value:
    print(cli.show_config(_CONFIG.value, config_flags.get_config_filename(flags.FLAGS['config'])))
    return
  mode = cli.run(cli.mode_for, _CONFIG.value, _MODE.value, config_flags.get_config_filename(flags.FLAGS['config']))
  if mode == 'pretrain':  # the model of an init_checkpoint is its own: refuse overrides that contradict it
    cli.run(continued.check_overrides, _CONFIG.value, config_flags.get_override_values(flags.FLAGS['config']),
            _WORKDIR.value)
  cli.run(sharding.initialize_distributed)
  compile_cache.enable(_CONFIG.value.get('data', {}).get('cache_dir', ''))
  cli.run(RUNS[mode], _CONFIG.value, _WORKDIR.value)


if __name__ == '__main__':
  flags.mark_flags_as_required(['config'])
  app.run(main, flags_parser=cli.flags_parser)
