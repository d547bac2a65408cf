"""Where the test suite's time goes: JAX's tracing, lowering and XLA compiles, per test and per program.

As a pytest plugin (each xdist worker writes OUT/<worker>.json), then a summary:

  JAX_TIMES_DIR=OUT PYTHONPATH=bench python -m pytest -q -n 2 tests -p pytest_jax_times
  python bench/pytest_jax_times.py OUT

It records jax.monitoring's duration events of the test processes only: runs a test starts as subprocesses
(the entry point, several hosts) are not in it.
"""

import collections
import glob
import json
import os
import sys

import jax

_EVENTS = {'/jax/core/compile/jaxpr_trace_duration': 'trace',
           '/jax/core/compile/jaxpr_to_mlir_module_duration': 'lower',
           '/jax/core/compile/backend_compile_duration': 'compile'}
_CURRENT = ['(collection)']
_ROWS = []  # (test, kind, program, seconds)


def _record(event, duration, **kwargs):
  if event in _EVENTS:
    _ROWS.append((_CURRENT[0], _EVENTS[event], kwargs.get('fun_name', ''), duration))


def pytest_configure(config):
  del config
  jax.monitoring.register_event_duration_secs_listener(_record)


def pytest_runtest_logstart(nodeid, location):
  del location
  _CURRENT[0] = nodeid


def pytest_sessionfinish(session):
  del session
  out = os.environ.get('JAX_TIMES_DIR')
  if out:
    os.makedirs(out, exist_ok=True)
    worker = os.environ.get('PYTEST_XDIST_WORKER', 'main')
    with open(os.path.join(out, worker + '.json'), 'w', encoding='utf-8') as f:
      json.dump(_ROWS, f)


def summarize(directory: str, top: int = 25):
  rows = []
  for path in glob.glob(os.path.join(directory, '*.json')):
    with open(path, encoding='utf-8') as f:
      rows += json.load(f)
  by_kind, by_program, by_test = collections.Counter(), collections.Counter(), collections.Counter()
  count = collections.Counter()
  for test, kind, program, seconds in rows:
    by_kind[kind] += seconds
    by_program[kind, program] += seconds
    count[kind, program] += 1
    by_test[test] += seconds
  print('seconds in all: ' + ', '.join(f'{kind} {s:.0f}' for kind, s in by_kind.most_common()))
  print('\nprograms (seconds, times, what, program):')
  for (kind, program), s in by_program.most_common(top):
    print(f'  {s:7.1f} {count[kind, program]:5d}  {kind:8s} {program}')
  print('\ntests (seconds of trace + lower + compile):')
  for test, s in by_test.most_common(top):
    print(f'  {s:7.1f}  {test}')


if __name__ == '__main__':
  summarize(sys.argv[1])
