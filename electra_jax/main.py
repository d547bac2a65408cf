"""The one entry point: flags and dispatch only.

  python -m electra_jax.main --config=configs/tiny.py --workdir=/tmp/electra [--config.train_steps=100]
  python -m electra_jax.main --mode=finetune --config=configs/finetune.py --config.task=rte \
      --config.init_checkpoint=/tmp/electra --workdir=/tmp/rte
  python -m electra_jax.main --mode=predict --config=configs/finetune.py --config.predict_input=FILE --workdir=/tmp/rte
"""

import sys

from absl import app, flags, logging
from ml_collections import config_flags

from electra_jax import checkpoint, config, data, finetune, sharding, trainer

_CONFIG = config_flags.DEFINE_config_file('config', None, 'A config file under configs/, e.g. configs/tiny.py.',
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Directory for checkpoints, metrics and TensorBoard events.')
_MODE = flags.DEFINE_enum('mode', 'pretrain', ['pretrain', 'finetune', 'predict'],
                          'What to run: pre-train, fine-tune (configs/finetune.py), or predict with a fine-tuned '
                          'WORKDIR.')

# Errors caused by the user's input: print one clear line instead of a traceback.
USER_ERRORS = (config.ConfigError, data.DataError, checkpoint.CheckpointError, trainer.TrainingError)


def parse_flags(argv):
  """absl flag parsing, with a config override naming an unknown key turned into one clear line."""
  try:
    return flags.FLAGS(argv)
  except (KeyError, AttributeError) as e:
    message = e.args[0] if e.args else str(e)
    print(f'error: unknown config key in the command line: {message}. The keys are defined in '
          'configs/default.py.', file=sys.stderr)
    sys.exit(2)
  except flags.Error as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(2)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  logging.set_verbosity(logging.WARNING)
  sharding.initialize_distributed()
  try:
    run = {'pretrain': trainer.train, 'finetune': finetune.run, 'predict': finetune.predict_main}[_MODE.value]
    run(_CONFIG.value, _WORKDIR.value)
  except USER_ERRORS as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(1)


if __name__ == '__main__':
  flags.mark_flags_as_required(['config', 'workdir'])
  app.run(main, flags_parser=parse_flags)
