"""Seconds from a SIGTERM to every host's checkpoint being committed, and where they go, for N localhost processes of
the real entry point (`python -m electra_jax.main`, jax.distributed over CPU collectives, one CPU device each) on the
tiny config of tests/faults_config.py.

  python bench/stop_latency.py [--processes=2,4] [--signal=one,all] [--repeats=3] [--work=DIR]

Each run trains until --after steps are logged, sends SIGTERM to process 1 (one) or to every process (all), and times,
from jax's own log lines (TF_CPP_MIN_LOG_LEVEL=0) and the files of the workdir (polled every 10 ms):
- notice: the signal until jax's notifier has it ("SIGTERM caught"; it polls a flag once a second);
- agree: until every process has the stop step ("Preemption sync counter is set", after a barrier);
- steps: until the stop step's checkpoint starts (the steps the processes still run, at the measured step time);
- write: until that checkpoint is committed (orbax renames checkpoints/<step> complete);
- exit: until every process has exited.
Prints one markdown table row per run, and the step time measured just before the signal.
"""

import argparse
import datetime
import os
import re
import signal
import statistics
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, 'tests'))

from helpers import FAULTS_CONFIG_FILE, LocalProcesses, make_corpus  # noqa: E402

_LOG_TIME = re.compile(r'^[IWEF]\d{4} (\d\d):(\d\d):(\d\d\.\d+)')


def log_times(path: str, text: str) -> list[float]:
  """Seconds of the day (UTC, as jax logs on this machine) of the lines of `path` that contain `text`."""
  found = []
  with open(path, encoding='utf-8', errors='replace') as f:
    for line in f:
      match = _LOG_TIME.match(line)
      if match and text in line:
        found.append(int(match[1]) * 3600 + int(match[2]) * 60 + float(match[3]))
  return found


def day_seconds(moment: float) -> float:
  t = datetime.datetime.fromtimestamp(moment, datetime.timezone.utc)
  return t.hour * 3600 + t.minute * 60 + t.second + t.microsecond / 1e6


def one_run(work: str, corpus: str, processes: int, everyone: bool, steps: int, after: int) -> dict:
  workdir = tempfile.mkdtemp(dir=work)
  args = [f'--config={FAULTS_CONFIG_FILE}', f'--workdir={workdir}', f'--config.data.source={corpus}',
          f'--config.train_steps={steps}', '--config.mesh.shape=-1,1,1', '--config.checkpoint_every=1000']
  run = LocalProcesses(args, processes, os.path.join(work, os.path.basename(workdir)),
                       env={'TF_CPP_MIN_LOG_LEVEL': '0'})  # jax's INFO lines: the times below are read from them
  procs, logs = run.procs, run.logs
  metrics = os.path.join(workdir, 'metrics.jsonl')

  def logged() -> int:
    try:
      with open(metrics, encoding='utf-8') as f:
        return sum(1 for _ in f)
    except FileNotFoundError:
      return 0

  seen = []  # (time, steps logged)
  while logged() < after:
    if any(p.poll() is not None for p in procs):
      raise RuntimeError(f'a process ended before step {after}: see {logs}')
    if not seen or seen[-1][1] != logged():
      seen.append((time.time(), logged()))
    time.sleep(0.01)
  sent, at_signal = time.time(), logged()
  for i in range(processes) if everyone else [1]:
    procs[i].send_signal(signal.SIGTERM)
  events, checkpoints = {}, os.path.join(workdir, 'checkpoints')
  while any(p.poll() is None for p in procs):
    if os.path.isdir(checkpoints):
      for name in os.listdir(checkpoints):
        events.setdefault(name.split('.')[0] + ('' if name.isdigit() else '.tmp'), time.time())
    time.sleep(0.01)
  exited = time.time()
  if any(p.returncode for p in procs):
    raise RuntimeError(f'a process failed: see {logs}')
  stop = int(re.search(r'checkpoint saved at step (\d+)', open(logs[0], encoding='utf-8').read())[1])
  base = day_seconds(sent)
  caught = min(t for log in logs for t in log_times(log, 'SIGTERM caught'))
  agreed = max(max(log_times(log, 'Preemption sync counter is set')) for log in logs)
  rel = lambda day: (day - base) % 86400  # pylint: disable=unnecessary-lambda-assignment
  step_times = [b[0] - a[0] for a, b in zip(seen, seen[1:]) if b[1] == a[1] + 1][-5:]
  return dict(processes=processes, signal='all' if everyone else 'process 1', at=at_signal, stop=stop,
              step=statistics.median(step_times) if step_times else float('nan'), notice=rel(caught),
              agree=rel(agreed), started=events[f'{stop}.tmp'] - sent, committed=events[str(stop)] - sent,
              exit=exited - sent)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--processes', default='2,4')
  parser.add_argument('--signal', default='one,all')
  parser.add_argument('--repeats', type=int, default=3)
  parser.add_argument('--steps', type=int, default=60)
  parser.add_argument('--after', type=int, default=5, help='steps logged before the signal')
  parser.add_argument('--work', default=None)
  args = parser.parse_args()
  work = args.work or tempfile.mkdtemp(prefix='stop_latency_')
  os.makedirs(work, exist_ok=True)
  os.environ.setdefault('ELECTRA_JAX_CACHE', os.path.join(work, 'cache'))  # one tokenizer and compile cache
  corpus = make_corpus(os.path.join(work, 'corpus.txt'), documents=80)
  print('| processes | signal to | step time (s) | steps logged at the signal | stop step | notice (s) | agree (s) | '
        'stop checkpoint starts (s) | committed (s) | all exited (s) |')
  print('|---|---|---|---|---|---|---|---|---|---|')
  for processes in map(int, args.processes.split(',')):
    for who in args.signal.split(','):
      for _ in range(args.repeats):
        r = one_run(work, corpus, processes, who == 'all', args.steps, args.after)
        print(f"| {r['processes']} | {r['signal']} | {r['step']:.2f} | {r['at']} | {r['stop']} | {r['notice']:.2f} | "
              f"{r['agree']:.2f} | {r['started']:.2f} | {r['committed']:.2f} | {r['exit']:.2f} |", flush=True)


if __name__ == '__main__':
  main()
