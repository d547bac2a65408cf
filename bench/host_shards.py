"""Bytes each host copies and its peak RSS when N localhost processes pre-train on a gs:// built dataset.

Starts the local Cloud Storage emulator (tests/gcs_emulator.py), builds the quickstart corpus into SHARDS
ArrayRecord shards, uploads them, then for each N runs N processes of the real entry point
(`python -m electra_jax.main`, jax.distributed over CPU collectives, one CPU device each), each with its own
data cache (ELECTRA_JAX_CACHE), and reports per process the bytes in its cache (what it copied from the bucket:
shards, metadata, tokenizer) and its peak RSS (os.wait4). It last checks that the N=2 run's checkpoint is refused,
in one line, by one process.

  python bench/host_shards.py [--processes=1,2,4] [--steps=20] [--shards=8]
"""

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, 'tests'))

BUCKET = 'bench'


def free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def start_emulator(log_path: str):
  port = free_port()
  with open(log_path, 'wb') as log:
    server = subprocess.Popen([sys.executable, os.path.join(REPO, 'tests', 'gcs_emulator.py'), 'start',
                               '--host=127.0.0.1', f'--port={port}', '--in-memory', f'--default-bucket={BUCKET}'],
                              stdout=log, stderr=subprocess.STDOUT)
  url = f'http://127.0.0.1:{port}'
  for _ in range(300):
    try:
      with urllib.request.urlopen(f'{url}/storage/v1/b/{BUCKET}', timeout=5):
        return server, url
    except OSError:
      time.sleep(0.2)
  raise RuntimeError('the emulator did not start')


def directory_bytes(path: str) -> int:
  return sum(os.path.getsize(os.path.join(root, name)) for root, _, names in os.walk(path) for name in names)


def run(n: int, env: dict, workdir: str, scratch: str, steps: int):
  """Runs n processes to `steps`; returns [(returncode, peak RSS bytes, cache bytes, last output line)]."""
  port = free_port()
  procs, logs = [], []
  for i in range(n):
    cache = os.path.join(scratch, f'cache-n{n}-p{i}')
    shutil.rmtree(cache, ignore_errors=True)
    proc_env = dict(env, JAX_PLATFORMS='cpu', JAX_COORDINATOR_ADDRESS=f'127.0.0.1:{port}',
                    JAX_NUM_PROCESSES=str(n), JAX_PROCESS_ID=str(i), ELECTRA_JAX_CACHE=cache,
                    XLA_FLAGS='--xla_force_host_platform_device_count=1')
    log = open(os.path.join(scratch, f'log-n{n}-p{i}.txt'), 'w+', encoding='utf-8')
    logs.append((log, cache))
    procs.append(subprocess.Popen(
        [sys.executable, '-m', 'electra_jax.main', '--config=configs/tiny.py', f'--workdir={workdir}',
         f'--config.data.source=gs://{BUCKET}/data', f'--config.train_steps={steps}', '--config.eval_every=0',
         '--config.data.eval_fraction=0.0', f'--config.checkpoint_every={steps}', f'--config.log_every={steps}'],
        cwd=REPO, env=proc_env, stdout=log, stderr=subprocess.STDOUT))
  results = {}
  for _ in procs:
    pid, status, usage = os.wait4(-1, 0)
    results[pid] = (os.waitstatus_to_exitcode(status), usage.ru_maxrss * 1024)
  rows = []
  for proc, (log, cache) in zip(procs, logs):
    log.seek(0)
    lines = [line for line in log.read().replace('\r', '\n').splitlines() if line.strip()]
    log.close()
    code, rss = results[proc.pid]
    rows.append((code, rss, directory_bytes(cache), lines[-1] if lines else ''))
  return rows


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument('--processes', default='1,2,4')
  parser.add_argument('--steps', type=int, default=20)
  parser.add_argument('--shards', type=int, default=8)
  args = parser.parse_args()
  scratch = tempfile.mkdtemp(prefix='host_shards_')
  server, url = start_emulator(os.path.join(scratch, 'emulator.log'))
  import conftest  # noqa: PLC0415  (its 8 faked devices are overridden per process below)
  env = dict(os.environ, PYTHONPATH=REPO, **conftest.emulator_environment(url))
  os.environ.update(conftest.emulator_environment(url))
  try:
    from electra_jax import data, fileio  # noqa: PLC0415
    from electra_jax.data import build, corpus  # noqa: PLC0415
    config = data.DataConfig(vocab_size=4000, max_seq_length=64, cache_dir=os.path.join(scratch, 'build-cache'))
    tokenizer = data.load_tokenizer(config)
    source = corpus.TextFiles('')
    local = os.path.join(scratch, 'built')
    packed = build.pack_in_memory(source, tokenizer, build.Packing(64))
    per_shard = -(-len(packed) // args.shards)  # examples; a record is 64 uint16 ids and 64 uint8 segment ids
    metadata = build.build(source, tokenizer, local, build.Packing(64), processes=1, shard_bytes=per_shard * 64 * 3)
    for name in sorted(os.listdir(local)):
      (fileio.path(f'gs://{BUCKET}/data') / name).write_bytes(open(os.path.join(local, name), 'rb').read())
    print(f'built {len(packed)} examples, {directory_bytes(local)} bytes in {len(os.listdir(local))} files '
          f'({len(metadata["shards"])} shards) at gs://{BUCKET}/data', flush=True)
    print('| processes | per host: bytes copied from the bucket | per host: peak RSS (MiB) | wall (s) |')
    print('|---|---|---|---|')
    for n in [int(x) for x in args.processes.split(',')]:
      workdir = os.path.join(scratch, f'run-{n}')
      started = time.time()
      rows = run(n, env, workdir, scratch, args.steps)
      wall = time.time() - started
      if any(code for code, *_ in rows):
        print(f'N={n} failed: {[(code, line) for code, _, _, line in rows]}; logs in {scratch}', flush=True)
        continue
      print(f'| {n} | {", ".join(f"{b / 2**20:.2f} MiB" for _, _, b, _ in rows)} | '
            f'{", ".join(f"{r / 2**20:.0f}" for _, r, _, _ in rows)} | {wall:.0f} |', flush=True)
    if '2' in args.processes.split(','):
      rows = run(1, env, os.path.join(scratch, 'run-2'), scratch, args.steps + 10)
      print(f'resuming the N=2 run on 1 process: exit {rows[0][0]}: {rows[0][3]}', flush=True)
  finally:
    server.terminate()
    server.wait(timeout=30)
  print(f'logs: {scratch}')


if __name__ == '__main__':
  main()
