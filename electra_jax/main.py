"""The one entry point: flags and dispatch only.

  python -m electra_jax.main --config=configs/tiny.py --workdir=/tmp/electra [--config.train_steps=100]
  python -m electra_jax.main --mode=finetune --config=configs/finetune.py --config.task=rte \
      --config.init_checkpoint=/tmp/electra --workdir=/tmp/rte
  python -m electra_jax.main --mode=predict --config=configs/finetune.py --config.predict_input=FILE --workdir=/tmp/rte
"""

from absl import app, flags, logging
from ml_collections import config_flags

from electra_jax import cli, finetune, sharding, trainer

_CONFIG = config_flags.DEFINE_config_file('config', None, 'A config file under configs/, e.g. configs/tiny.py.',
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Directory for checkpoints, metrics and TensorBoard events.')
_MODE = flags.DEFINE_enum('mode', 'pretrain', ['pretrain', 'finetune', 'predict'],
                          'What to run: pre-train, fine-tune (configs/finetune.py), or predict with a fine-tuned '
                          'WORKDIR.')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  logging.set_verbosity(logging.WARNING)
  sharding.initialize_distributed()
  run = {'pretrain': trainer.train, 'finetune': finetune.run, 'predict': finetune.predict_main}[_MODE.value]
  cli.run(run, _CONFIG.value, _WORKDIR.value)


if __name__ == '__main__':
  flags.mark_flags_as_required(['config', 'workdir'])
  app.run(main, flags_parser=cli.flags_parser('configs/default.py'))
