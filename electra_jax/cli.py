"""What the command-line entry points share: a mistake in the user's input is one clear line on stderr, not a
traceback. `electra_jax.main` and `electra_jax.experiments.compare` use it.
"""

import sys

from absl import flags

from electra_jax import checkpoint, config, data, trainer

# Errors caused by the user's input (config, data, checkpoints, a diverging run): their message says what to do.
USER_ERRORS = (config.ConfigError, data.DataError, checkpoint.CheckpointError, trainer.TrainingError)


def flags_parser(keys_defined_in: str):
  """An absl `flags_parser` turning a config override that names an unknown key into one clear line."""

  def parse(argv):
    try:
      return flags.FLAGS(argv)
    except (KeyError, AttributeError) as e:
      message = e.args[0] if e.args else str(e)
      print(f'error: unknown config key in the command line: {message}. The keys are defined in '
            f'{keys_defined_in}.', file=sys.stderr)
      sys.exit(2)
    except flags.Error as e:
      print(f'error: {e}', file=sys.stderr)
      sys.exit(2)

  return parse


def run(fn, *args):
  """fn(*args), with a USER_ERRORS exception printed as `error: ...` and exit status 1."""
  try:
    return fn(*args)
  except USER_ERRORS as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(1)
