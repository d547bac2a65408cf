"""Fine-tuning through the real entry point, `python -m electra_jax.main --config=configs/finetune.py`, in 1 and 2
localhost processes (jax.distributed with CPU collectives, one faked device per process), two seeds on a tiny
generated task from a tiny pre-training WORKDIR: a stop signal to one process during the second seed and the same
command resuming it, to the losses, dev predictions and scores of one process, with one writer of the reports; an
error every process hits (a NaN loss) ending each with the same one line; and an error on process 0 alone between
two seeds ending both at once (docs/faults.md, "On a pod").

Slow (processes started and signalled): the multihost tier, `python -m pytest -q -n 2 -m multihost tests`. Runs are
shared between tests (module fixtures); every process of the module loads its programs from one persistent
compilation cache.
"""

import itertools
import json
import os
import re
import signal
import time

import numpy as np
import pytest

from helpers import LocalProcesses, make_tsv_task, one_error_line, pretraining_workdir

pytestmark = [pytest.mark.multihost, pytest.mark.usefixtures('compile_once')]

ROWS = 64  # training examples: 4 steps of 16 per epoch
EPOCHS = 16
STEPS = ROWS // 16 * EPOCHS  # per seed
SEEDS = 2
_LOGS = itertools.count()
STOP_WITHIN = 60  # seconds from a SIGTERM to every process gone (as for pre-training)
SAVED = re.compile(r'\[keyword seed (\d)\] (?:SIGTERM received|a stop signal \(SIGTERM or SIGINT\) reached this or '
                   rf'another process): checkpoint saved at step (\d+)/{STEPS} in \S+; run the same command again to '
                   r'resume\.')


@pytest.fixture(scope='module')
def task(tmp_path_factory):
  return make_tsv_task(tmp_path_factory.mktemp('task') / 'keyword', sizes=(ROWS, 32))


@pytest.fixture(scope='module')
def pretrained(tmp_path_factory, corpus_file, cache_dir):
  path = tmp_path_factory.mktemp('pretrained') / 'run'
  pretraining_workdir(str(path), corpus_file, cache_dir)
  return str(path)


class Run(LocalProcesses):
  """The fine-tuning command on the tiny task in `processes` local processes, with config `overrides` (dotted keys);
  notes when an `error:` line first appears while `finish` waits."""

  def __init__(self, workdir, processes: int, task: str, pretrained: str, env: dict[str, str] | None = None,
               **overrides):
    self.workdir, self.first_error = str(workdir), None
    config = {'task': task, 'init_checkpoint': pretrained, 'mesh.shape': '-1,1,1', 'batch_size': 16,
              'eval_batch_size': 32, 'max_seq_length': 32, 'epochs': EPOCHS, 'log_every': 1, 'seeds': SEEDS,
              'optimizer.learning_rate': 2e-3, **overrides}
    super().__init__(['--config=configs/finetune.py', f'--workdir={workdir}',
                      *(f'--config.{key}={value}' for key, value in config.items())],
                     processes, f'{workdir}.{next(_LOGS)}', env)

  def poll(self):
    if self.first_error is None and any('\nerror: ' in self.output(i) for i in range(len(self.procs))):
      self.first_error = time.time()

  def losses(self, seed: int) -> list[tuple[int, float]]:
    """(step, loss) of each line of seed `seed`'s metrics.jsonl that has a loss."""
    path = os.path.join(self.workdir, 'seeds', str(seed), 'metrics.jsonl')
    if not os.path.exists(path):
      return []
    with open(path, encoding='utf-8') as f:
      return [(m['step'], m['loss']) for m in map(json.loads, f) if 'loss' in m]

  def results(self) -> dict:
    with open(os.path.join(self.workdir, 'results.json'), encoding='utf-8') as f:
      return json.load(f)


@pytest.fixture(scope='module')
def one_process(tmp_path_factory, task, pretrained):
  run = Run(tmp_path_factory.mktemp('one') / 'run', 1, task, pretrained)
  assert run.finish() == [0], run.tails()
  return run


def dev_predictions(run: Run, seed: int) -> list[str]:
  """The predicted label of each dev example (seeds/<seed>/predictions/dev.tsv)."""
  with open(os.path.join(run.workdir, 'seeds', str(seed), 'predictions', 'dev.tsv'), encoding='utf-8') as f:
    return [line.split('\t')[2] for line in f.read().splitlines()[1:]]


def test_two_processes_stopped_by_sigterm_and_resumed_fine_tune_as_one(tmp_path, task, pretrained, one_process):
  """Two processes, SIGTERM to process 1 once the second seed has run 2 steps: both stop at one step, each with one
  line and exit status 0. The same command skips the finished seed and resumes the other; both seeds then have the
  losses, dev predictions and scores of one process, and only process 0 wrote the reports. (One run stopped and
  resumed, not also an uninterrupted one: it walks the same paths, and the multihost tier stays short.)"""
  run = Run(tmp_path / 'run', 2, task, pretrained)
  run.wait_for(lambda: len(run.losses(1)) >= 2)
  run.procs[1].send_signal(signal.SIGTERM)
  sent = time.time()
  assert run.finish(STOP_WITHIN) == [0, 0], run.tails()
  assert time.time() - sent < STOP_WITHIN
  saved = [SAVED.findall(run.output(i)) for i in range(2)]
  assert len(saved[0]) == len(saved[1]) == 1 and saved[0] == saved[1], run.tails()
  seed, step = int(saved[0][0][0]), int(saved[0][0][1])
  assert seed == 1 and step < STEPS, run.tails()
  assert '\nerror: ' not in run.output(0) + run.output(1)
  seeds = os.path.join(run.workdir, 'seeds')
  assert [os.path.exists(os.path.join(seeds, str(s), 'result.json')) for s in range(SEEDS)] == [True, False]
  assert os.listdir(os.path.join(seeds, '1', 'checkpoints')) == [str(step)]
  assert not os.path.exists(os.path.join(run.workdir, 'results.json'))

  resumed = Run(tmp_path / 'run', 2, task, pretrained)
  assert resumed.finish() == [0, 0], resumed.tails()
  assert '[keyword seed 0] finished by an earlier run: skipped' in resumed.output(0)
  assert f'[keyword seed 1] resumed from {seeds}/1/checkpoints/{step}' in resumed.output(0)
  # Each process feeds its rows of every global batch and of the dev set: the losses and scores of one process, up to
  # float rounding (the gradient is summed in another order), which grows over the 64 steps: at most 7e-5 seen.
  for s in range(SEEDS):
    ours, theirs = run.losses(s), one_process.losses(s)  # metrics.jsonl drops the lines of steps trained again
    assert [n for n, _ in ours] == [n for n, _ in theirs] == list(range(1, STEPS + 1))  # once each: one writer
    np.testing.assert_allclose([loss for _, loss in ours], [loss for _, loss in theirs], rtol=2e-4)
    predicted = [dev_predictions(r, s) for r in (run, one_process)]
    assert len(predicted[0]) == 32 and predicted[0] == predicted[1]
    assert os.path.isdir(os.path.join(seeds, str(s), 'params'))
  # An events file per run that trained the seed: process 0's.
  assert [len(os.listdir(os.path.join(seeds, str(s), 'tensorboard'))) for s in range(SEEDS)] == [1, 2]
  assert not os.path.exists(os.path.join(seeds, '1', 'checkpoints'))
  results = run.results()
  assert results['seeds'] == one_process.results()['seeds']  # each seed's dev scores and top prediction
  assert all(row['top_prediction']['dev']['share'] < 1 for row in results['seeds'])  # not one answer: a real test
  # The results table and the summary: process 0's.
  assert '| **median** |' in resumed.output(0) and '| **median** |' not in resumed.output(1)


def test_a_sigterm_between_seeds_stops_both_processes_at_the_next_seeds_first_step(tmp_path, task, pretrained,
                                                                                  one_process):
  """SIGTERM to process 1 while both processes are between seed 0's steps and its scoring (held there by
  tests/hooks): both stop after seed 1's first step, each with its line, and exit with status 0. jax's sync point
  is the largest count of steps run plus one; when the count restarted for each seed, the next seed never reached
  it and the run went on to its end."""
  del one_process  # after it (compiled)
  hold = tmp_path / 'hold'
  hold.mkdir()
  run = Run(tmp_path / 'run', 2, task, pretrained, env={'ELECTRA_JAX_TEST_HOLD_BETWEEN_SEEDS': str(hold)})
  run.wait_for(lambda: all((hold / f'between.{i}').exists() for i in range(2)))
  run.procs[1].send_signal(signal.SIGTERM)
  time.sleep(5)  # jax's notifier looks once a second; the hosts then agree on the stop step in milliseconds
  (hold / 'release').touch()
  assert run.finish(STOP_WITHIN) == [0, 0], run.tails()
  saved = [SAVED.findall(run.output(i)) for i in range(2)]
  assert saved == [[('1', '1')], [('1', '1')]], run.tails()
  seeds = os.path.join(run.workdir, 'seeds')
  assert os.path.exists(os.path.join(seeds, '0', 'result.json'))
  assert os.listdir(os.path.join(seeds, '1', 'checkpoints')) == ['1']


def test_a_nan_loss_on_every_process_ends_each_with_the_same_line_at_once(tmp_path, task, pretrained, one_process):
  """A learning rate that overflows the parameters: every process reads the same NaN loss at the same step, and
  process 1 raises its error 2 s after process 0 (tests/hooks). Each stops with its own line, the same on each: told
  by process 0, process 1 would print process 0's line naming it. Both exit at once after process 1's line (process 0
  waits up to 30 s, hosts._LAST_WORDS_MS, for a process that does not say it exited)."""
  del one_process  # after it (compiled)
  run = Run(tmp_path / 'run', 2, task, pretrained, env={'ELECTRA_JAX_TEST_LATE_ERROR': '1:2'}, seeds=1,
            **{'optimizer.learning_rate': 1e30})
  assert run.finish() == [1, 1], run.tails()
  assert time.time() - run.first_error < 15, run.tails()
  lines = [one_error_line(run.output(i)) for i in range(2)]
  assert re.fullmatch(r'error: \[keyword seed 0\]: loss is (nan|inf) at step \d+; lower optimizer.learning_rate',
                      lines[0]), run.tails()
  assert lines[1] == lines[0], run.tails()
  assert not os.path.exists(os.path.join(run.workdir, 'seeds', '0', 'result.json'))


def test_an_error_on_process_0_between_seeds_stops_every_process_at_once(tmp_path, task, pretrained, one_process):
  """Process 0 alone writes seed 0's dev predictions, and a file stands where their directory goes: process 0 stops
  with that line after seed 0's steps, process 1 prints it too, naming process 0, and both exit (status 1) at once,
  where process 1 used to wait for process 0 in seed 1's first step until jax's shutdown timeout (300 s)."""
  del one_process  # after it (compiled)
  blocker = tmp_path / 'run' / 'seeds' / '0' / 'predictions'
  blocker.parent.mkdir(parents=True)
  blocker.write_text('')
  run = Run(tmp_path / 'run', 2, task, pretrained, epochs=1)
  assert run.finish() == [1, 1], run.tails()
  assert time.time() - run.first_error < 15, run.tails()
  ours = one_error_line(run.output(0))
  assert ours == (f'error: {blocker}: File exists (a file stands where the path needs a directory: move it away, or '
                  'choose another directory)')
  assert one_error_line(run.output(1)) == f'{ours} (process 0 of 2 stopped with this error; the other processes ' \
                                          'stop too)'


def test_devices_interleaved_over_the_processes_fine_tune_as_one_process(tmp_path, task, pretrained, one_process):
  """Devices laid out as on a TPU slice, the hosts' interleaved along the batch (tests/hooks): each process feeds
  the rows its devices hold, of the training batches and of the dev set, so that the losses, predictions and scores
  are one process's (before, a dev row's prediction was scored against another row's label)."""
  env = {'XLA_FLAGS': '--xla_force_host_platform_device_count=2 --xla_backend_optimization_level=0',
         'ELECTRA_JAX_TEST_INTERLEAVE_DEVICES': '1'}
  run = Run(tmp_path / 'run', 2, task, pretrained, env=env, seeds=1)
  assert run.finish() == [0, 0], run.tails()
  ours, theirs = run.losses(0), one_process.losses(0)
  np.testing.assert_allclose([loss for _, loss in ours], [loss for _, loss in theirs], rtol=2e-4)
  assert dev_predictions(run, 0) == dev_predictions(one_process, 0)
  assert run.results()['seeds'] == one_process.results()['seeds'][:1]
