"""The package's layers point one way: each module imports only modules of its own layer or below, and no import
circle exists, imports inside functions included. Read from the source (ast), nothing is imported.

A new module must be placed in LAYERS; an import that points up fails here with the module, the line and the two
layers. Config, errors and storage are at the bottom; the commands at the top.
"""

import ast
import functools
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / 'electra_jax'

# Bottom to top. A name covers a module and, for a package, everything in it (the longest name wins).
LAYERS = (
    # What every layer uses; none imports electra_jax.
    ('errors', 'fileio', 'report', 'hosts', 'preemption', 'masking', 'attention', 'kernels'),
    ('config',),
    # Storage, data and the building blocks of a step.
    ('checkpoint', 'metrics', 'profiling', 'plot', 'data', 'compile_cache', 'hf_tokenizer', 'model', 'optimizer',
     'sharding', 'scaffold', 'gpu_targets', 'tpu_targets', 'flops'),
    # A run's saved config; what every command's entry point shares.
    ('config_files', 'cli'),
    # What a run starts from besides its own init: another run's weights.
    ('frozen', 'continued'),
    ('objective',),
    ('pretrained', 'train_step', 'evaluation'),
    ('trainer', 'finetune', 'convert', 'detect'),
    # Entry points.
    ('main', 'aot', 'experiments', 'data.__main__'),
)


def module_name(path: pathlib.Path) -> str:
  parts = ('electra_jax',) + path.relative_to(PACKAGE).with_suffix('').parts
  return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


@functools.cache
def sources() -> dict[str, str]:
  return {module_name(p): p.read_text(encoding='utf-8') for p in sorted(PACKAGE.rglob('*.py'))
          if 'configs' not in p.relative_to(PACKAGE).parts}  # the config files, copied in by setup.py


@functools.cache
def parse(source: str) -> ast.Module:
  return ast.parse(source)


def imports(module: str, source: str, known) -> list[tuple[str, int]]:
  """(electra_jax module, line) of every import in `source`, at the top or inside a function, with the packages
  Python runs first (`from electra_jax.data import corpus` runs electra_jax/data/__init__.py), but not those that
  hold `module` itself."""
  found = []
  package = module.split('.') if known(module + '.__init__') else module.split('.')[:-1]
  for node in ast.walk(parse(source)):
    if isinstance(node, ast.Import):
      names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ''
      if node.level:
        base = '.'.join(package[:len(package) - node.level + 1] + ([base] if base else []))
      names = [f'{base}.{alias.name}' if known(f'{base}.{alias.name}') else base for alias in node.names]
    else:
      continue
    for name in names:
      parts = name.split('.')
      for end in range(2, len(parts) + 1):  # the packages on the way, then the module
        target = '.'.join(parts[:end])
        if parts[0] == 'electra_jax' and known(target) and not module.startswith(target + '.') and target != module:
          found.append((target, node.lineno))
  return found


def layer_of(module: str) -> int:
  best, layer = '', None
  for index, names in enumerate(LAYERS):
    for name in names:
      full = f'electra_jax.{name}'
      if (module == full or module.startswith(full + '.')) and len(full) > len(best):
        best, layer = full, index
  if layer is None:
    raise AssertionError(f'{module} is in no layer: add it to tests/test_layers.py LAYERS')
  return layer


def problems(modules: dict[str, str]) -> list[str]:
  """What breaks the layering in `modules` ({name: source}): upward imports, then import circles."""
  known = lambda name: name in modules or f'{name}.__init__' in modules
  graph = {m: imports(m, s, known) for m, s in modules.items() if m != 'electra_jax'}
  found = []
  for module, targets in graph.items():
    for target, line in targets:
      if layer_of(target) > layer_of(module):
        found.append(f'{module}:{line} imports {target}, a layer above it ({layer_of(module)} < {layer_of(target)})')
  # Circles: a depth-first search for a path back to a module on the current path.
  done, path = set(), []

  def visit(module):
    if module in path:
      found.append('import circle: ' + ' -> '.join(path[path.index(module):] + [module]))
      return
    if module in done:
      return
    path.append(module)
    for target, _ in graph.get(module, ()):
      visit(target)
    path.pop()
    done.add(module)

  for module in sorted(graph):
    visit(module)
  return found


def test_layers_point_one_way():
  assert problems(sources()) == []


def test_every_module_has_a_layer():
  for module in sources():
    if module != 'electra_jax':
      layer_of(module)


@pytest.mark.parametrize('change, expected', [
    # An upward import, even one inside a function, and a circle.
    ({'electra_jax.config': 'def f():\n  from electra_jax import trainer\n'},
     ['electra_jax.config:2 imports electra_jax.trainer, a layer above it (1 < 7)']),
    ({'electra_jax.errors': 'import electra_jax.fileio\n',
      'electra_jax.fileio': 'from electra_jax import errors\n'},
     ['import circle: electra_jax.fileio -> electra_jax.errors -> electra_jax.fileio']),
    # Importing a submodule runs its package first: electra_jax.data is above config.
    ({'electra_jax.config': 'from electra_jax.data import tokenizer\n'},
     ['electra_jax.config:1 imports electra_jax.data, a layer above it (1 < 2)',
      'electra_jax.config:1 imports electra_jax.data.tokenizer, a layer above it (1 < 2)']),
])
def test_the_check_finds_what_breaks_the_layers(change, expected):
  modules = {**sources(), **change}
  assert [p for p in problems(modules) if 'circle' not in p or 'circle' in expected[0]] == expected
