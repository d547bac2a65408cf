"""The config files a command reads: `--config=configs/NAME.py`, and a run's saved WORKDIR/config.json.

`--config=configs/NAME.py` is read from the working directory when it has that file (a clone of the repository),
else from the copy of the repository's configs/ that an installed electra_jax carries as the package
`electra_jax.configs` (setup.py), so the documented commands work from anywhere after `pip install`. The config
files import each other as `from configs import default`; for a packaged file that name is made to mean
`electra_jax.configs`, so nothing named `configs` is installed at the top level of site-packages.

`load_config(workdir)` reads what a pre-training run saved (`electra_jax.pretrained.load_params` its weights).
"""

import importlib
import importlib.util
import os
import sys

from electra_jax import config as config_lib
from electra_jax import fileio
from electra_jax.data import tokenizer
from electra_jax.errors import CheckpointError

PREFIX = 'configs' + os.sep


def packaged_dir() -> str | None:
  """The directory of the installed `electra_jax.configs` package, or None (a clone run from its root)."""
  try:
    spec = importlib.util.find_spec('electra_jax.configs')
  except ImportError:
    return None
  return list(spec.submodule_search_locations)[0] if spec and spec.submodule_search_locations else None


def resolve(path: str) -> str:
  """`path` if it exists; else, for a relative `configs/...` path, the packaged copy of that file if there is one
  (and `configs` then imports as `electra_jax.configs`), with its `:ARG` (configs/small.py:quickstart) kept.
  Anything else is left for the loader to report."""
  file, colon, arg = path.partition(':')  # the argument is get_config's, not part of the file name
  if os.path.exists(path) or os.path.exists(file) or not os.path.normpath(file).startswith(PREFIX):
    if importlib.util.find_spec('configs') is None and (directory := packaged_dir()):
      _import_as_configs(directory)  # a config file run from elsewhere imports `configs` too: the packaged one
    return path
  directory = packaged_dir()
  packaged = directory and os.path.join(directory, os.path.normpath(file)[len(PREFIX):])
  if not packaged or not os.path.isfile(packaged):
    return path
  _import_as_configs(directory)
  return packaged + colon + arg


def _import_as_configs(directory: str):
  """Makes `configs`, the name the config files import each other by, the package in `directory`."""
  current = getattr(sys.modules.get('configs'), '__path__', None)
  if current is None or [os.path.realpath(p) for p in current] != [os.path.realpath(directory)]:
    sys.modules['configs'] = importlib.import_module('electra_jax.configs')


def config_arg(argv: list[str]) -> tuple[int, str, str] | None:
  """(index, prefix, file) of the config file `argv` names as typed, `argv[index] == prefix + file`: `--config=FILE`
  or `--config FILE`; None if it names none. Overrides `--config.KEY=` are not it."""
  for i, arg in enumerate(argv):
    if arg.startswith('--config='):
      return i, '--config=', arg[len('--config='):]
    if arg == '--config' and i + 1 < len(argv):
      return i + 1, '', argv[i + 1]
  return None


def resolve_argv(argv: list[str]) -> list[str]:
  """`argv` with the file of `--config=PATH` (or `--config PATH`) resolved; overrides `--config.KEY=` untouched."""
  argv = list(argv)
  if found := config_arg(argv):
    i, prefix, file = found
    argv[i] = prefix + resolve(file)
  return argv


def load_config(workdir) -> config_lib.TrainConfig:
  """The run's WORKDIR/config.json as a TrainConfig; model.vocab_size 0 is read from WORKDIR/tokenizer.model."""
  path = fileio.path(workdir) / 'config.json'
  if not path.is_file():
    raise CheckpointError(f'{workdir} has no config.json: give the --workdir of a pre-training run or the output '
                          'of `python -m electra_jax.convert`')
  values = fileio.read_json(path, 'restore it from a copy (the run\'s settings are in it)', CheckpointError)
  if values.get('model_type') == 'electra':  # transformers' config.json: its keys are none of ours
    raise CheckpointError(f'{workdir} is a Hugging Face model directory, not an electra_jax workdir: import it first '
                          f'with python -m electra_jax.convert --from-hf {workdir} --out WORKDIR')
  vocab_size = None
  if not values.get('model', {}).get('vocab_size'):  # taken from the tokenizer when the run started
    vocab_size = tokenizer.load(workdir).vocab_size
  return config_lib.load(values, vocab_size=vocab_size)
