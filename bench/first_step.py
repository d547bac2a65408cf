"""Time from launching the quickstart command to its first trained step: cold (empty caches), warm (the same
command in a new workdir) and a resume (the warm run's workdir again).

  python bench/first_step.py [--config=configs/tiny.py] --scratch=SCRATCH

Each run is the README's quickstart command with `--config.log_every` at the config's steps_per_call (host-side
only: the compiled step is the same), so metrics.jsonl gets its first line when the first call's steps are done;
the run is then stopped with SIGTERM (it writes a checkpoint: the resume starts from it). A last run, warm, turns
the compilation cache off (ELECTRA_JAX_COMPILATION_CACHE=0) to show what it saves. The cache directory (tokenizer,
packed data, compiled programs) is `--scratch`/cache, emptied first. Prints one line per run with the load average
and the startup stages' lines.
"""

import argparse
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def steps_per_call(config: str) -> int:
  """The steps_per_call of config file[:variant] `config` (configs/small.py runs 5 steps a call)."""
  path, _, variant = config.partition(':')
  sys.path.insert(0, REPO)  # a config file imports `configs`
  spec = importlib.util.spec_from_file_location('bench_config', os.path.join(REPO, path))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return (module.get_config(variant) if variant else module.get_config()).get('steps_per_call', 1)


def first_step(config: str, workdir: str, cache: str, env: dict) -> tuple[float, list[str]]:
  """Seconds from launch to the first new metrics.jsonl line, and the run's stderr lines up to then."""
  metrics = os.path.join(workdir, 'metrics.jsonl')
  before = _last_step(metrics)
  env = dict(os.environ, ELECTRA_JAX_CACHE=cache, PYTHONPATH=REPO, **env)
  log = os.path.join(os.path.dirname(workdir), os.path.basename(workdir) + f'.{time.time():.0f}.log')
  start = time.perf_counter()
  with open(log, 'w', encoding='utf-8') as out:
    process = subprocess.Popen([sys.executable, '-m', 'electra_jax.main', f'--config={config}',
                                f'--workdir={workdir}', f'--config.log_every={steps_per_call(config)}'], cwd=REPO,
                               env=env, stdout=out,
                               stderr=subprocess.STDOUT)
    try:
      while True:
        if _last_step(metrics) > before:  # a resume first drops its lines past the checkpoint, then appends
          seconds = time.perf_counter() - start
          break
        if process.poll() is not None:
          raise SystemExit(f'the run ended before its first step:\n{open(log, encoding="utf-8").read()[-3000:]}')
        time.sleep(0.1)
    finally:
      process.send_signal(signal.SIGTERM)
      process.wait()
  lines = [line.strip() for line in open(log, encoding='utf-8').read().replace('\r', '\n').splitlines()]
  return seconds, [line for line in lines if line.endswith('...') or re.search(r' in [0-9.]+ s\b', line)]


def _last_step(path: str) -> int:
  """The step of metrics.jsonl's last complete line (0: none)."""
  if not os.path.exists(path):
    return 0
  with open(path, encoding='utf-8') as f:
    steps = [json.loads(line)['step'] for line in f if line.endswith('\n')]
  return steps[-1] if steps else 0


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--config', default='configs/tiny.py')
  parser.add_argument('--scratch', required=True)
  args = parser.parse_args()
  shutil.rmtree(args.scratch, ignore_errors=True)
  cache = os.path.join(args.scratch, 'cache')
  os.makedirs(cache)
  no_compilation_cache = {'ELECTRA_JAX_COMPILATION_CACHE': '0'}
  for name, workdir, env in (('cold', 'cold', {}), ('warm', 'warm', {}), ('resume', 'warm', {}),
                             ('warm, compilation cache off', 'warm_off', no_compilation_cache)):
    workdir = os.path.join(args.scratch, workdir)
    load = os.getloadavg()
    seconds, stages = first_step(args.config, workdir, cache, env)
    print(f'{name}: first step after {seconds:.1f} s (load average before: {load[0]:.2f} {load[1]:.2f} '
          f'{load[2]:.2f}, after: {os.getloadavg()[0]:.2f})', flush=True)
    for line in stages:
      print(f'    {line}', flush=True)


if __name__ == '__main__':
  main()
