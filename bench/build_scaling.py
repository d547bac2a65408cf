"""`data build` on one machine: the local pool against Beam's DirectRunner, 1 and 2 workers, on a corpus of realistic
text made big by repetition.

  python bench/build_scaling.py --work=WORK [--source='../shared/data/corpus/*.txt.gz'] [--copies=15]
      [--workers=1,2] [--runners=pool,DirectRunner] [--vocab_size=30522]

Writes --copies copies of --source into --work/corpus (plain text, one file per source file and copy, each copy's
documents in an order of its own, so the tokenizer and packing see real text and not the same chunk over and over),
trains a SentencePiece unigram tokenizer on --source once, then runs `python -m electra_jax.data build` for each
runner and worker count as a child process and records its wall time, CPU time (user + system of it and its
children), peak memory (the sum of the resident memory of its process tree, sampled every 0.2 s) and tokens/s.
The start-up cost is the wall time of the same command on one small file. Prints markdown table rows.
"""

import argparse
import glob
import json
import os
import random
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from electra_jax.data import build as build_lib
from electra_jax.data import corpus


def make_corpus(source: str, directory: str, copies: int) -> int:
  """--copies shuffled copies of the text files of `source` under `directory`; returns their size in bytes."""
  os.makedirs(directory, exist_ok=True)
  for path in corpus.resolve_files(source):
    documents = None
    name = os.path.basename(path).split('.')[0]
    for copy in range(copies):
      target = os.path.join(directory, f'{name}-{copy:03d}.txt')
      if os.path.exists(target):
        continue
      documents = documents or list(corpus.read_documents([path]))
      order = list(range(len(documents)))
      random.Random(copy).shuffle(order)
      with open(target + '.tmp', 'w', encoding='utf-8') as f:
        for i in order:
          f.write('\n'.join(documents[i]) + '\n\n')
      os.replace(target + '.tmp', target)
  return sum(os.path.getsize(f) for f in glob.glob(os.path.join(directory, '*.txt')))


def tree_rss(root: int) -> int:
  """Resident bytes of process `root` and all its descendants."""
  children, rss = {}, {}
  for pid in os.listdir('/proc'):
    if not pid.isdigit():
      continue
    try:
      with open(f'/proc/{pid}/stat') as f:
        fields = f.read().rsplit(')', 1)[1].split()
      children.setdefault(int(fields[1]), []).append(int(pid))
      rss[int(pid)] = int(fields[21]) * os.sysconf('SC_PAGE_SIZE')
    except (OSError, IndexError):
      continue
  total, stack = 0, [root]
  while stack:
    pid = stack.pop()
    total += rss.get(pid, 0)
    stack.extend(children.get(pid, []))
  return total


def run(argv: list[str]) -> dict:
  """Runs `argv`; its wall and CPU seconds and the peak resident memory of its process tree."""
  started = time.time()
  process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
  peak, done = [0], threading.Event()

  def sample():
    while not done.wait(0.2):
      peak[0] = max(peak[0], tree_rss(process.pid))

  sampler = threading.Thread(target=sample, daemon=True)
  sampler.start()
  output = process.stdout.read().decode(errors='replace')
  _, status, usage = os.wait4(process.pid, 0)
  done.set()
  sampler.join()
  if status:
    raise SystemExit(f'{" ".join(argv)} failed:\n{output[-3000:]}')
  return {'wall': time.time() - started, 'cpu': usage.ru_utime + usage.ru_stime, 'peak_gib': peak[0] / 2**30}


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--work', required=True)
  parser.add_argument('--source', default='../shared/data/corpus/*.txt.gz')
  parser.add_argument('--copies', type=int, default=15)
  parser.add_argument('--workers', default='1,2')
  parser.add_argument('--runners', default='pool,DirectRunner')
  parser.add_argument('--vocab_size', type=int, default=30522)
  args = parser.parse_args()
  text = os.path.join(args.work, 'corpus')
  size = make_corpus(args.source, text, args.copies)
  tokenizer = os.path.join(args.work, f'tokenizer-{args.vocab_size}')
  if not os.path.exists(os.path.join(tokenizer, 'electra_tokenizer.json')):
    subprocess.run([sys.executable, '-m', 'electra_jax.data', 'tokenizer', f'--source={args.source}',
                    f'--output={tokenizer}', f'--vocab_size={args.vocab_size}', '--overwrite'], check=True)
  started, cpu, chunks = time.time(), time.process_time(), 0
  for _ in build_lib.source_chunks(corpus.TextFiles(text)):
    chunks += 1
  print(f'reading and chunking alone (what the pool\'s parent process does besides pickling): {chunks} chunks, '
        f'{size / 1e6 / (time.time() - started):.0f} MB/s wall, {size / 1e6 / (time.process_time() - cpu):.0f} MB/s '
        'per CPU-s', flush=True)
  small = sorted(glob.glob(os.path.join(text, 'debian_handbook-000.txt')))[0]
  print(f'corpus: {size / 1e6:.0f} MB in {len(glob.glob(os.path.join(text, "*.txt")))} files; load average '
        f'{os.getloadavg()}', flush=True)
  print('| runner | workers | text | tokens | wall s | start-up s | tokens/s | CPU s | tokens/CPU-s | peak memory | '
        'load (1 min) before, after |')
  print('|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|')
  for runner in args.runners.split(','):
    for workers in [int(w) for w in args.workers.split(',')]:
      output = os.path.join(args.work, f'built-{runner}-{workers}')

      def command(source, output=output, runner=runner, workers=workers):
        argv = [sys.executable, '-m', 'electra_jax.data', 'build', f'--source={source}', f'--tokenizer={tokenizer}',
                f'--output={output}', '--max_seq_length=128', f'--processes={workers}', '--overwrite']
        return argv + ([f'--runner={runner}'] if runner != 'pool' else [])

      startup = run(command(small, output + '-small'))
      load = os.getloadavg()[0]
      measured = run(command(text))
      with open(os.path.join(output, 'electra_data.json'), encoding='utf-8') as f:
        tokens = json.load(f)['statistics']['source_tokens']
      print(f'| {runner} | {workers} | {size / 1e6:.0f} MB | {tokens / 1e6:.1f} M | {measured["wall"]:.0f} | '
            f'{startup["wall"]:.1f} | {tokens / measured["wall"] / 1e3:.0f}k | {measured["cpu"]:.0f} | '
            f'{tokens / measured["cpu"] / 1e3:.0f}k | {measured["peak_gib"]:.2f} GiB | {load:.1f}, '
            f'{os.getloadavg()[0]:.1f} |', flush=True)


if __name__ == '__main__':
  main()
