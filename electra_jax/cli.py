"""What the command-line entry points share: a mistake in the user's input is one clear line on stderr, not a
traceback; `--show_config` lists every key of a config file with its value and its comment. `electra_jax.main`
and `electra_jax.experiments.compare` use it.
"""

import ast
import difflib
import functools
import glob
import importlib.util
import os
import re
import runpy
import signal
import sys
import threading
import tokenize

from absl import flags
import jax

from electra_jax import checkpoint, config_files, fileio, hosts
from electra_jax.errors import ConfigError, UserError


def flags_parser(argv):
  """An absl `flags_parser`: a bad flag, config file or config override is one line (with the closest key for a
  typo)."""
  try:
    parsed = flags.FLAGS(config_files.resolve_argv(argv))  # configs/NAME.py from a clone or the installed package
    if 'config' in flags.FLAGS and flags.FLAGS['config'].value is not None:
      flags.FLAGS['config'].value.keys()  # a config file that failed to load raises here, on first use
  except SystemExit as e:
    # absl prints the usage for --help and then exits with status 1, as for an error: asking for help is not one.
    if e.code == 1 and any(a.split('=', 1)[0] in HELP_FLAGS for a in argv[1:]):
      sys.exit(0)
    raise
  except (KeyError, AttributeError, flags.Error) as e:
    _exit_with(_flag_error(e, argv))
  except BrokenPipeError:  # the usage went to a pipe that closed early (`--help | head`): nothing is wrong
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    sys.exit(0)
  except Exception as e:  # loading a config file runs the user's Python: any error is theirs to fix
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    filename = _config_file(argv) or ''
    _exit_with(f'--config={filename} cannot be loaded ({type(e).__name__}: {lines[-1] if lines else ""}); give '
               'a config file such as configs/tiny.py or configs/finetune.py')
  if 'workdir' in flags.FLAGS and not flags.FLAGS.workdir and not flags.FLAGS.get_flag_value('show_config', False):
    _exit_with('--workdir=DIR is required: where checkpoints, metrics and results go')
  return parsed


HELP_FLAGS = ('--help', '-help', '-?', '--helpshort', '--helpfull', '--helpxml')
# How ml_collections reports an override it cannot parse: `flag --config.KEY=VALUE: <Python's exception text>`.
_BAD_VALUE = re.compile(r'flag --config\.([\w.]+)=(.*?): ', re.DOTALL)
_TYPE_NAMES = {bool: 'true or false', int: 'an integer', float: 'a number', str: 'a string',
               tuple: 'a comma-separated list', list: 'a comma-separated list'}


def _exit_with(message: str):
  print(f'error: {message}', file=sys.stderr)
  sys.exit(2)


def _config_file(argv: list[str]) -> str | None:
  """The config file `argv` gives, as typed; None if it gives none."""
  found = config_files.config_arg(argv[1:])
  return found[2] if found else None


def _flag_error(error: Exception, argv: list[str]) -> str:
  overrides = [a[2:].split('=', 1)[0] for a in argv[1:] if a.startswith('--config.')]
  filename = _config_file(argv)
  if overrides and filename is None:
    return (f'--{overrides[0]} sets a key of a config file: give the file too, e.g. '
            '--config=configs/finetune.py (fine-tuning, prediction) or --config=configs/tiny.py (pre-training)')
  keys = [key for key, _ in flat_keys(_load_config(filename))] if overrides else []
  for name in overrides:
    key = name[len('config.'):]
    if keys and key not in keys and not any(k.startswith(key + '.') for k in keys):
      close = difflib.get_close_matches(key, keys, n=1)
      hint = f' (did you mean {close[0]}?)' if close else ''
      return f'{filename} has no key {key}{hint}; --config={filename} --show_config lists every key'
  message = error.args[0] if error.args else str(error)
  bad = _BAD_VALUE.match(str(message))
  if bad and filename is not None:
    key, value = bad.groups()
    current = dict(flat_keys(_load_config(filename))).get(key)
    if type(current) in _TYPE_NAMES:
      return (f'--config.{key}={value}: {key} takes {_TYPE_NAMES[type(current)]} ({filename} sets '
              f'{_show(current)}), not {value!r}')
  if 'Error whilst parsing config file' in str(message):  # get_config raised: the traceback's last line says why
    last = str(message).strip().splitlines()[-1]
    file, _, preset = filename.partition(':')
    if preset and 'get_config() takes 0 positional arguments' in last:  # configs/tiny.py:gpu
      return f'--config={filename}: {file} has no presets; give --config={file}'
    return f'--config={filename}: {last}'
  while isinstance(message, str) and message[:1] in '\'"' and message[-1:] == message[:1]:
    message = ast.literal_eval(message)  # KeyError's message can arrive quoted, even twice
  return ' '.join(str(message).split())


def _show(value) -> str:
  """A config value as it is written on the command line."""
  if isinstance(value, bool):
    return str(value).lower()
  if isinstance(value, (tuple, list)):
    return ','.join(str(v) for v in value)
  return repr(value) if isinstance(value, str) else str(value)


def _load_config(filename: str):
  """The config `--config=filename` names (FILE.py or FILE.py:ARG), or {} if it does not load."""
  try:
    path, _, arg = config_files.resolve(filename).partition(':')  # outside a clone, the packaged configs/
    return runpy.run_path(path)['get_config'](*([arg] if arg else []))
  except Exception:  # pylint: disable=broad-except  (the flag's own error then says why)
    return {}


def setup():
  """What a command sets up for the whole process before it runs: the platform JAX starts on (`_cpu_only_with_libtpu`)
  and the checkpointer's quiet failures (`checkpoint.quiet_failures`). Here, not at import, so that importing
  electra_jax (a notebook, another program) changes nothing global. `run` calls it."""
  if _cpu_only_with_libtpu():
    os.environ['JAX_PLATFORMS'] = 'cpu'  # for the processes this one starts, as for itself
    jax.config.update('jax_platforms', 'cpu')  # read when JAX starts its backends, at the first use of a device
  checkpoint.quiet_failures()


def _cpu_only_with_libtpu() -> bool:
  """True on a machine where only the CPU can run JAX although libtpu is installed (the test extra brings it for
  the compile-only TPU test). JAX would then probe for TPU chips when it starts and print libtpu's errors."""
  if 'JAX_PLATFORMS' in os.environ or importlib.util.find_spec('libtpu') is None:
    return False
  if importlib.util.find_spec('jax_plugins') is not None:  # a GPU (or other) PJRT plugin: let JAX choose
    return False
  for vendor in glob.glob('/sys/bus/pci/devices/*/vendor'):  # TPU chips are Google (0x1ae0) PCI devices
    with open(vendor, encoding='ascii') as f:
      if f.read().strip() == '0x1ae0':
        return False
  return True


class _Terminated(KeyboardInterrupt):
  """SIGTERM outside the training steps (a preemption while a tokenizer trains, text is packed or a step compiles),
  which then stops the command as Ctrl-C does rather than killing it without a word."""


def _terminated(signum, frame):
  del signum, frame
  raise _Terminated()


def run(fn, *args, errors: tuple[type[Exception], ...] = ()):
  """fn(*args), with a UserError (or one of the command's own `errors`) or a file-system error printed as
  `error: ...`, exit status 1. Every command's entry point goes through it (and so through `setup`). In a multi-host
  run (jax.distributed started), the processes stop together, each with one line (hosts.Watch)."""
  setup()
  # One process: SIGTERM is Ctrl-C's one line until the training steps take it over (preemption.StopSignal, which
  # checkpoints). Several: it is jax's preemption notifier's, which jax.distributed's start (`fn` may be
  # sharding.initialize_distributed) installs over this one, and which must then stay.
  alone = hosts.processes() == 1 and threading.current_thread() is threading.main_thread()
  previous = signal.signal(signal.SIGTERM, _terminated) if alone else None
  try:
    with hosts.Watch():
      return fn(*args)
  except (UserError,) + errors as e:
    line, everyone = f'error: {e}', getattr(e, 'every_process', False)
  except fileio.storage_errors() as e:  # a missing input, a full disk, a read-only directory, no access to a bucket
    line, everyone = f'error: {fileio.describe(e)}', False
  except KeyboardInterrupt as e:  # Ctrl-C outside the training steps (which stop at a checkpoint): e.g. a tokenizer
    how, status = ('SIGTERM', 143) if isinstance(e, _Terminated) else ('Ctrl-C (SIGINT)', 130)  # the shell's
    hosts.exit_with(f'stopped by {how}; nothing half-written was kept: run the same command again to go on',
                    status=status)  # in a multi-host run the others stop too
  finally:
    if previous is not None and hosts.processes() == 1:
      signal.signal(signal.SIGTERM, previous)
  # Exit status 1; in a multi-host run every other process stops too (told unless it raises the same error itself:
  # then each prints its own line, and which one a process prints is no race).
  hosts.exit_with(line, tell_others=not everyone)


def mode_for(values, mode: str | None, filename: str) -> str:
  """What --mode runs config `values` (read from `filename`): `mode` if given, else what the config is for."""
  finetuning = 'task' in values  # configs/finetune.py and its kin name a task; pre-training configs do not
  if mode is None:
    return ('predict' if values.get('predict_input') else 'finetune') if finetuning else 'pretrain'
  if mode == 'pretrain' and finetuning:
    raise ConfigError(f'{filename} is a fine-tuning config: leave --mode out to fine-tune with it, or give '
                      'a pre-training config such as configs/tiny.py')
  if mode != 'pretrain' and not finetuning:
    raise ConfigError(f'--mode={mode} needs a fine-tuning config such as configs/finetune.py; {filename} '
                      'is a pre-training config')
  return mode


def flat_keys(values, prefix: str = ''):
  """Yields (dotted key, value) of every leaf of a ConfigDict or nested dict."""
  for key, value in values.items():
    if hasattr(value, 'items'):
      yield from flat_keys(value, f'{prefix}{key}.')
    else:
      yield f'{prefix}{key}', value


# ----------------------------------------------------------------------------------------------------------------
# --show_config: the keys' comments are read from the config files themselves (configs/default.py documents
# every pre-training key on its line), so they cannot drift from the code.


def show_config(values, filename: str) -> str:
  """Every key of config `values` (loaded from `filename`): `key = value  # comment`, one line each."""
  comments = _Comments(filename.split(':', 1)[0])  # configs/large.py:gpu is configs/large.py with a preset
  lines = [f'# {filename}: every key, its value, and what it does. Override any with --config.KEY=VALUE.']
  for key, value in flat_keys(values):
    comment = comments.lookup(key)
    lines.append(f'{key} = {value!r}' + (f'  # {comment}' if comment else ''))
  return '\n'.join(lines)


class _Comments:
  """One-line comments of the keys a config file (and the config modules it imports) assigns.

  A key's comment is the comment at the end of the line assigning it, or the comment lines just above it.
  `config.pretrain = tiny.get_config()` binds the keys under `pretrain.` to configs/tiny.py's; `adam()` returning
  `optimizer` documents `optimizer.*`.
  """

  def __init__(self, filename: str):
    self.own, self.bound, self.imports = _file_comments(filename)

  def lookup(self, key: str) -> str:
    for prefix, module_file in self.bound.items():
      if key.startswith(prefix + '.'):
        found = _Comments(module_file).lookup(key[len(prefix) + 1:])
        if found:
          return found
    # The key itself, then shorter and shorter tails of it ('overrides.mlm.objective.mask_prob' ->
    # 'objective.mask_prob'), in this file and then in the configs it imports.
    parts = key.split('.')
    for start in range(len(parts)):
      tail = '.'.join(parts[start:])
      if tail in self.own:
        return self.own[tail]
      for module_file in self.imports:
        found = _Comments(module_file).own.get(tail)
        if found:
          return found
    return ''


@functools.cache
def _file_comments(filename: str) -> tuple[dict[str, str], dict[str, str], list[str]]:
  """({key: comment}, {key prefix: config file its keys come from}, [config files imported]) of one file."""
  with open(filename, encoding='utf-8') as f:
    source = f.read()
  tree = ast.parse(source)
  lines = source.splitlines()
  trailing = {}
  with open(filename, 'rb') as f:
    for token in tokenize.tokenize(f.readline):
      if token.type == tokenize.COMMENT:
        trailing[token.start[0]] = token.string.lstrip('#').strip()
  directory = os.path.dirname(os.path.abspath(filename))
  modules = {}  # local name -> file, for `from configs import default`
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and node.module == 'configs':
      for alias in node.names:
        path = os.path.join(_configs_dir(directory), f'{alias.name}.py')
        if os.path.isfile(path):
          modules[alias.asname or alias.name] = path
  own, bound = {}, {}
  for function in (n for n in tree.body if isinstance(n, ast.FunctionDef)):
    returned = [n.value.id for n in ast.walk(function) if isinstance(n, ast.Return) and isinstance(n.value, ast.Name)]
    root = returned[0] if returned else 'config'
    for node in ast.walk(function):
      if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Attribute)):
        continue
      dotted = ast.unparse(node.targets[0]).split('.')
      if dotted[0] != root:
        continue
      key = '.'.join(dotted[1:] if root == 'config' else dotted)
      comment = trailing.get(node.end_lineno)
      above, line = [], node.lineno - 1
      while line >= 1 and lines[line - 1].lstrip().startswith('#'):
        above.insert(0, trailing.get(line, ''))
        line -= 1
      if comment or above:
        own.setdefault(key, comment or ' '.join(above))
      value = node.value
      if (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and
          isinstance(value.func.value, ast.Name) and value.func.value.id in modules and
          value.func.attr == 'get_config'):
        bound['.'.join(dotted[1:])] = modules[value.func.value.id]
  return own, bound, _import_closure(tuple(modules.values()))


def _import_closure(files: tuple[str, ...]) -> list[str]:
  """`files` and the config files they import, breadth first."""
  seen, queue = [], list(files)
  while queue:
    path = queue.pop(0)
    if path not in seen:
      seen.append(path)
      queue.extend(_file_comments(path)[2])
  return seen


def _configs_dir(directory: str) -> str:
  """The `configs` package directory, from a file inside it or in one of its subpackages."""
  while os.path.basename(directory) != 'configs' and os.path.dirname(directory) != directory:
    directory = os.path.dirname(directory)
  return directory
