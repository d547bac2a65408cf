"""The real entry point, `python -m electra_jax.main`, in 1, 2 and 4 localhost processes (jax.distributed with CPU
collectives, one faked device per process) on the tiny config of tests/faults_config.py: equal losses, the
coordinated stop on SIGTERM (to one process, to all, during the first compile, while a periodic checkpoint is
written) and how soon it comes, resuming on another process count, one writer of the logs, a refused config, an
error or Ctrl-C on one process before the steps, a killed process, process 0 killed and a full disk on one process
(docs/faults.md, "On a pod").

Slow (processes started, signalled and killed): its own marker, `python -m pytest -q -n 2 -m multihost tests`
(.ci/run). Runs are shared between tests (module fixtures); every process of a module loads its programs from one
persistent compilation cache. (jax_share_binary_between_hosts, which would compile once for all processes, left
process 1 waiting, 20 min by default, for a program process 0 never sent, in jax 0.10.2.)
"""

import itertools
import os
import random
import re
import signal
import time

import jax
import numpy as np
import pytest

from helpers import FAULTS_CONFIG_FILE as CONFIG_FILE  # pylint: disable=g-bad-import-order
from helpers import LocalProcesses, final_params, one_error_line, read_metrics, step_dirs

from electra_jax import data
from electra_jax.config import DataConfig, MeshConfig

pytestmark = [pytest.mark.multihost, pytest.mark.usefixtures('compile_once')]

# Steps run at about 2 per second on 2 idle cores; a SIGTERM sent after step 6 or earlier once reached jax's preemption
# sync point only at step 16 of 16 (clean-clone CI, 2026-11-25), so a stopped run keeps 26+ steps of margin.
STEPS = 32
TIMEOUT = LocalProcesses.timeout
STOP_WITHIN = 60  # seconds from a SIGTERM to every process gone (the bound)
HEARTBEAT = 10  # seconds: ELECTRA_JAX_HEARTBEAT_TIMEOUT in the killed run (100 by default)
_LOGS = itertools.count()
SAVED = re.compile(r'checkpoint saved at step (\d+) in .*; run the same command again to resume\.')


class Run(LocalProcesses):
  """The tiny pre-training command in `processes` local processes (helpers.LocalProcesses); records in `steps` when
  each line of metrics.jsonl appeared (to 0.05 s) while `finish` waits."""

  def __init__(self, workdir, processes: int, corpus: str, *flags: str, env: dict[str, str] | None = None,
               each: list[dict[str, str]] | None = None, mesh: str = '-1,1,1'):
    self.workdir = str(workdir)
    self.steps = []  # (time, metrics.jsonl lines) each time `finish` saw the count change
    # mesh: one --config.mesh.shape only (a tuple flag given twice gets both values)
    super().__init__([f'--config={CONFIG_FILE}', f'--workdir={workdir}', f'--config.data.source={corpus}',
                      f'--config.train_steps={STEPS}', f'--config.mesh.shape={mesh}', '--config.checkpoint_every=1000',
                      *flags], processes, f'{workdir}.{next(_LOGS)}', env, each)

  def poll(self):
    if not self.steps or self.steps[-1][1] != self.logged_steps():
      self.steps.append((time.time(), self.logged_steps()))

  def steps_by(self, moment: float) -> int:
    """How many steps metrics.jsonl held at time `moment` (as `finish` saw it)."""
    return max([n for t, n in self.steps if t <= moment], default=0)

  def logged_steps(self) -> int:
    """Lines in WORKDIR/metrics.jsonl (one per step: log_every=1)."""
    try:
      with open(os.path.join(self.workdir, 'metrics.jsonl'), encoding='utf-8') as f:
        return sum(1 for _ in f)
    except FileNotFoundError:
      return 0


def completed(workdir, processes: int, corpus: str, *flags: str) -> Run:
  run = Run(workdir, processes, corpus, *flags)
  assert run.finish() == [0] * processes, run.tails()
  return run


def stop_with_signals(run: Run, signals: dict[int, int], when, within: float = STOP_WITHIN, then=None) -> list[int]:
  """Sends {process: signal} once `when()` holds, then calls `then()` if given; returns the step each process says
  it saved.

  Every process must exit with status 0 within `within` seconds and print the one 'checkpoint saved' line.
  """
  run.wait_for(when)
  for i, sig in signals.items():
    run.procs[i].send_signal(sig)
  run.signalled = sent = time.time()
  if then:
    then()
  codes = run.finish(within)
  assert time.time() - sent < within
  assert codes == [0] * len(run.procs), run.tails()
  saved = []
  for i in range(len(run.procs)):
    lines = SAVED.findall(run.output(i))
    assert len(lines) == 1, run.tails()
    saved.append(int(lines[0]))
  return saved


def assert_same_losses(workdir, reference, rtol=1e-6):
  ours, theirs = read_metrics(workdir), read_metrics(reference)
  assert [m['step'] for m in ours] == [m['step'] for m in theirs] == list(range(1, STEPS + 1))
  np.testing.assert_allclose([m['loss'] for m in ours], [m['loss'] for m in theirs], rtol=rtol)


@pytest.fixture(scope='module')
def corpus(corpus_file, cache_dir):
  del cache_dir  # sets ELECTRA_JAX_CACHE, which the processes inherit: one tokenizer and packing for all runs
  return corpus_file


@pytest.fixture(scope='module')
def one_process(tmp_path_factory, corpus):
  return completed(tmp_path_factory.mktemp('one') / 'run', 1, corpus)


@pytest.fixture(scope='module')
def two_processes(tmp_path_factory, corpus, one_process):
  del one_process  # after it: the tokenizer and packed data are then cached, not built twice at once
  return completed(tmp_path_factory.mktemp('two') / 'run', 2, corpus)


def test_two_processes_train_as_one_and_only_process_0_writes_the_logs(two_processes, one_process):
  # Each process feeds its block of every global batch: the batches, masks and losses of one process.
  assert_same_losses(two_processes.workdir, one_process.workdir, rtol=1e-5)
  workdir = two_processes.workdir
  assert os.path.exists(os.path.join(workdir, 'config.json'))
  assert len(os.listdir(os.path.join(workdir, 'tensorboard'))) == 1  # one events file: process 0's
  assert step_dirs(workdir) == ([STEPS], [])
  assert 'pre-training' not in two_processes.output(1)  # the progress bar and the FLOPs line: process 0's


def test_devices_interleaved_over_the_processes_train_as_one_process(tmp_path, corpus, one_process):
  """jax lays a TPU slice's devices out in its physical order, where the hosts' devices interleave along the batch
  (a v4-32's four hosts: every fourth device). Each process feeds the rows its devices hold, so that the global
  batch is the one-process run's row for row (a process's block of rows landed on every other slot, under other
  rows' masks and dropout: other losses)."""
  xla = '--xla_force_host_platform_device_count=2 --xla_backend_optimization_level=0'
  run = Run(tmp_path / 'run', 2, corpus, env={'XLA_FLAGS': xla, 'ELECTRA_JAX_TEST_INTERLEAVE_DEVICES': '1'})
  assert run.finish() == [0, 0], run.tails()
  assert_same_losses(run.workdir, one_process.workdir, rtol=1e-5)


def test_sigterm_to_one_process_stops_both_at_one_step_and_the_same_command_resumes(tmp_path, corpus, two_processes):
  """The issue's case: SIGTERM to process 1 only, at a random moment of the steps.

  The stop is bounded in time (docs/faults.md): jax's notifier sees the signal within 1 s, the processes agree at
  once, and stop after the step they are in. So the stop step is at most 2 steps past those logged by 2 s after the
  signal (the step a process runs while its last line is written, and the stop step itself), however long the
  steps took on this machine."""
  run = Run(tmp_path / 'run', 2, corpus)
  after = random.randint(2, 6)
  saved = stop_with_signals(run, {1: signal.SIGTERM}, lambda: run.logged_steps() >= after)
  assert saved[0] == saved[1] < STEPS
  assert saved[0] <= run.steps_by(run.signalled + 2.0) + 2, (saved, run.signalled, run.steps)
  assert step_dirs(run.workdir) == ([saved[0]], [])
  completed(tmp_path / 'run', 2, corpus)
  assert_same_losses(run.workdir, two_processes.workdir)
  assert step_dirs(run.workdir) == ([saved[0], STEPS], [])


def test_four_steps_a_call_on_two_processes_stop_together_and_resume_to_the_one_process_run(tmp_path, corpus,
                                                                                            one_process):
  """config.steps_per_call=4 on 2 processes: each feeds its rows of 4 batches a call; SIGTERM to process 1 once
  the step starts compiling (4 steps a call run the 32 steps in ~3 s here, and jax's stop notice has taken seconds
  to reach every process: a signal sent during the steps may come after them) stops both after the same call, and
  the same command trains on to the one-process run's parameters (its steps one a call) and data position. The
  parameters stored as a few vectors (optimizer.flat_params=true, GPUs' default), the one-process run's as arrays:
  the checkpoints both processes write and read are the tree."""
  flags = ('--config.steps_per_call=4', '--config.log_every=4', '--config.optimizer.flat_params=true')
  run = Run(tmp_path / 'run', 2, corpus, *flags)
  saved = stop_with_signals(run, {1: signal.SIGTERM}, lambda: 'compiling the train step' in run.output(0),
                            within=TIMEOUT)
  assert saved[0] == saved[1] < STEPS and saved[0] % 4 == 0, saved
  completed(tmp_path / 'run', 2, corpus, *flags)
  params, data_state = final_params(run.workdir)
  expected_params, expected_data = final_params(one_process.workdir)
  assert data_state == expected_data
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), params, expected_params)
  assert [m['step'] for m in read_metrics(run.workdir)] == list(range(4, STEPS + 1, 4))


def test_signals_to_all_then_resume_on_one_process(tmp_path, corpus, one_process):
  """SIGINT (Ctrl-C) to process 0 and SIGTERM to process 1, then the same command in one process."""
  run = Run(tmp_path / 'run', 2, corpus)
  saved = stop_with_signals(run, {0: signal.SIGINT, 1: signal.SIGTERM}, lambda: run.logged_steps() >= 3)
  assert saved[0] == saved[1] < STEPS
  assert 'SIGINT received: checkpoint saved' in run.output(0)
  assert step_dirs(run.workdir) == ([saved[0]], [])
  # The checkpoint holds the position in the global stream: one process goes on with the same batches.
  resumed = completed(tmp_path / 'run', 1, corpus)
  assert f'resuming from checkpoint {saved[0]}' in resumed.output(0)
  assert_same_losses(run.workdir, one_process.workdir, rtol=1e-5)


def test_four_processes_sigterm_during_the_first_compile_then_resume_on_two(tmp_path, corpus, one_process):
  """SIGTERM to process 2 while the first step compiles: the stop step is the first one (the processes stop once
  it is compiled and run: four compiles at once on two loaded cores take minutes, not STOP_WITHIN)."""
  run = Run(tmp_path / 'run', 4, corpus)
  saved = stop_with_signals(run, {2: signal.SIGTERM}, lambda: 'FLOPs per step' in run.output(0), within=TIMEOUT)
  assert saved == [1] * 4
  assert step_dirs(run.workdir) == ([1], [])
  completed(tmp_path / 'run', 2, corpus)
  assert_same_losses(run.workdir, one_process.workdir, rtol=1e-5)


@pytest.mark.parametrize('flags, mesh, devices, error', [
    (['--config.batch_size=7'], '-1,1,1', 1, 'batch_size 7 must be a multiple of'),
    # Two devices a process: a (2, 1, 1) mesh would be process 0's two alone (it ended in tracebacks on both).
    ([], '2,1,1', 2, 'mesh.shape (2, 1, 1) takes 2 of the 4 devices ([2, 0] of the 2 processes'),
    # The batch over 'fsdp' alone, the axis within each process: both would hold rows 0-3 of 8, and the batch
    # jax assembled from their rows had 4 rows, different on each process (it trained on, silently).
    (['--config.mesh.rules=' + ','.join(repr(rule) for rule in (('activation_batch', 'fsdp'),)
                                        + MeshConfig().rules[1:])],
     '2,2,1', 2, "mesh.rules split the batch over mesh axes fsdp (mesh {'data': 2, 'fsdp': 2, 'tensor': 1}), along "
                 'which the 2 processes hold the same rows'),
], ids=['batch_size', 'mesh_of_one_process', 'rules_sharing_rows'])
def test_a_bad_config_is_refused_by_every_process_with_one_line(tmp_path, corpus, one_process, flags, mesh, devices,
                                                                error):
  del one_process  # after it (the tokenizer is cached)
  xla = f'--xla_force_host_platform_device_count={devices} --xla_backend_optimization_level=0'
  run = Run(tmp_path / 'run', 2, corpus, *flags, env={'XLA_FLAGS': xla}, mesh=mesh)
  codes = run.finish(120)
  assert codes == [1, 1], run.tails()
  for i in range(2):
    errors = [line for line in run.output(i).splitlines() if line.startswith('error: ')]
    assert len(errors) == 1 and errors[0].startswith(f'error: {error}'), run.tails()
    assert 'Traceback' not in run.output(i)
  assert not os.path.exists(os.path.join(run.workdir, 'checkpoints'))
  assert not os.path.exists(os.path.join(run.workdir, 'config.json'))


def test_every_process_takes_process_0s_tokenizer(tmp_path, corpus):
  """Each host's cache is its own. Process 1's holds a tokenizer for this corpus and settings that differs from the
  one process 0 trains (two pieces' ids swapped, as another trainer version could make it): process 1 trains with
  process 0's, which replaces its cached one; only process 0 trains."""
  caches = [tmp_path / 'cache0', tmp_path / 'cache1']
  settings = ['--config.data.tokenizer_type=wordpiece', '--config.data.vocab_size=100', '--config.train_steps=2']
  stale = data.load_tokenizer(DataConfig(source=corpus, tokenizer_type='wordpiece', vocab_size=100,
                                         cache_dir=str(caches[1])))
  pieces = open(stale.model_file, encoding='utf-8').read().splitlines()
  pieces[5], pieces[6] = pieces[6], pieces[5]
  with open(stale.model_file, 'w', encoding='utf-8') as f:
    f.writelines(piece + '\n' for piece in pieces)
  run = Run(tmp_path / 'run', 2, corpus, *settings, each=[{'ELECTRA_JAX_CACHE': str(cache)} for cache in caches])
  assert run.finish() == [0, 0], run.tails()
  trained = (tmp_path / 'run' / 'vocab.txt').read_bytes()
  cached = os.path.relpath(stale.model_file, caches[1])
  assert [(cache / cached).read_bytes() for cache in caches] == [trained, trained]
  assert ['training a wordpiece tokenizer' in run.output(i) for i in range(2)] == [True, False]


def test_a_tokenizer_process_0_cannot_train_stops_every_process_with_its_line(tmp_path, corpus):
  run = Run(tmp_path / 'run', 2, corpus, '--config.data.vocab_size=50000',
            each=[{'ELECTRA_JAX_CACHE': str(tmp_path / f'cache{i}')} for i in range(2)])
  assert run.finish(120) == [1, 1], run.tails()
  lines = [one_error_line(run.output(i)) for i in range(2)]
  assert lines[0] == lines[1] and 'Vocabulary size too high (50000)' in lines[0], run.tails()


def test_an_error_on_one_process_before_the_steps_stops_every_process_at_once(tmp_path, corpus):
  """Process 1 cannot make its cache directory (a file stands in the path) and stops before the first step, while
  process 0 goes on towards it: process 0 prints process 1's line, naming it, and both exit with status 1 at once,
  where process 0 used to wait for process 1 in a collective until jax's shutdown timeout (300 s).

  Process 0's watcher never wakes here (tests/hooks): its collective with process 1 fails first, on process 1's
  exit, and must give the same line, not that failure's traceback (a race CI once lost)."""
  blocker = tmp_path / 'a file'
  blocker.write_text('')
  run = Run(tmp_path / 'run', 2, corpus, '--config.train_steps=2', env={'ELECTRA_JAX_TEST_DEAF_WATCH': '0'},
            each=[{}, {'ELECTRA_JAX_CACHE': str(blocker / 'c')}])
  assert run.finish(120) == [1, 1], run.tails()
  ours = one_error_line(run.output(1))
  assert ours == (f'error: {blocker / "c"}: Not a directory (a file stands where the path needs a directory: move it '
                  'away, or choose another directory)')
  assert one_error_line(run.output(0)) == f'{ours} (process 1 of 2 stopped with this error; the other processes ' \
                                          'stop too)'


def test_a_process_that_stops_before_joining_stops_the_others_after_the_start_timeout(tmp_path, corpus):
  """Process 1 refuses a malformed ELECTRA_JAX_* variable before it joins jax.distributed, so nothing can tell
  process 0, which waits for it in jax's start: after ELECTRA_JAX_START_TIMEOUT it says so in one line (status 1),
  where jax aborted it with a C++ stack trace."""
  run = Run(tmp_path / 'run', 2, corpus, each=[{'ELECTRA_JAX_START_TIMEOUT': '5'},
                                               {'ELECTRA_JAX_HEARTBEAT_TIMEOUT': '1m'}])
  assert run.finish(120) == [1, 1], run.tails()
  assert one_error_line(run.output(1)) == 'error: ELECTRA_JAX_HEARTBEAT_TIMEOUT=1m must be a whole number of ' \
                                          'seconds, at least 1'
  line = one_error_line(run.output(0))
  assert line.startswith('error: waited 5 s for every process of this run to join jax.distributed (coordinator '
                         '127.0.0.1:') and line.endswith('ELECTRA_JAX_START_TIMEOUT sets the wait'), line


def test_ctrl_c_on_one_process_before_the_steps_stops_every_process_at_once(tmp_path, corpus):
  """Ctrl-C (SIGINT) to process 1 while both are about to load their examples (held there by tests/hooks): process 1
  says it stopped (status 130, the shell's for SIGINT), process 0 prints that line naming it and exits (status 1),
  at once, where process 0 used to wait for process 1 in a collective until jax's shutdown timeout (300 s)."""
  hold = tmp_path / 'hold'
  hold.mkdir()
  run = Run(tmp_path / 'run', 2, corpus, env={'ELECTRA_JAX_TEST_HOLD_DATA': str(hold)})
  run.wait_for(lambda: all((hold / f'data.{i}').exists() for i in range(2)))
  run.procs[1].send_signal(signal.SIGINT)
  assert run.finish(60) == [1, 130], run.tails()
  line = 'stopped by Ctrl-C (SIGINT); nothing half-written was kept: run the same command again to go on'
  assert [run.output(i).splitlines()[-1] for i in range(2)] == [
      f'{line} (process 1 of 2 stopped; the other processes stop too)', line], run.tails()
  assert 'Traceback' not in run.output(0) + run.output(1)


def test_a_killed_process_stops_the_others_within_the_heartbeat_timeout(tmp_path, corpus, two_processes):
  del two_processes  # after it (compiled)
  run = Run(tmp_path / 'run', 2, corpus, env={'ELECTRA_JAX_HEARTBEAT_TIMEOUT': str(HEARTBEAT)})
  run.wait_for(lambda: run.logged_steps() >= 2)
  run.procs[1].kill()
  killed = time.time()
  codes = run.finish(HEARTBEAT + 60)
  assert time.time() - killed < HEARTBEAT + 60
  assert codes[0] != 0
  assert 'JAX distributed service detected fatal errors' in run.output(0), run.tails()


# ----------------------------------------------------------------------------------------------------------------
# One workdir through four faults, in order, each ended by the same command (docs/faults.md, "On a pod"): a stop
# signal to one process while a periodic checkpoint is being written, to every process likewise, a full disk on
# one process, process 0 killed; then the same command trains to the end with the losses of the uninterrupted run.
# Each test resumes where the one before stopped (one run of each, not one run and one resume per fault, keeps the
# multihost tier short): run them in this order.

EVERY = 4  # checkpoint_every of the faulty runs
# ... which keep every checkpoint: a stop that reaches jax's preemption sync point late (step 13 for a signal during
# the write of 4, in a clean-clone CI on a fast 2-core machine, 2026-11-28) must not let keep_checkpoints=3 remove
# the checkpoint a test looks for.
FAULTY = (f'--config.checkpoint_every={EVERY}', '--config.keep_checkpoints=1000')


@pytest.fixture(scope='module')
def faulty(tmp_path_factory):
  return tmp_path_factory.mktemp('faulty') / 'run'


def newest(workdir) -> int:
  complete = step_dirs(workdir)[0] if os.path.isdir(os.path.join(workdir, 'checkpoints')) else []
  return max(complete, default=0)


def resumed_from(run: Run) -> int:
  return int(re.search(r'resuming from checkpoint (\d+)', run.output(0)).group(1))


@pytest.mark.parametrize('signalled', [[1], [0, 1]], ids=['one process', 'every process'])
def test_a_stop_signal_while_a_periodic_checkpoint_is_written(tmp_path, corpus, faulty, signalled):
  """The write of the first periodic checkpoint is held (its files started, the step not yet complete) on every
  process; the signal lands then. The held step completes as a whole, every process stops at one step after it,
  and nothing is left half-written."""
  start = newest(faulty)
  held = (start // EVERY + 1) * EVERY
  hold = tmp_path / 'hold'
  hold.mkdir()
  run = Run(faulty, 2, corpus, *FAULTY,
            env={'ELECTRA_JAX_TEST_HOLD_WRITE': f'{held}:{hold}'})
  saved = stop_with_signals(run, dict.fromkeys(signalled, signal.SIGTERM),
                            lambda: all((hold / f'held.{i}').exists() for i in range(2)),
                            then=(hold / 'release').touch)  # the signals landed during the write: release it
  assert saved[0] == saved[1] > held
  complete, partial = step_dirs(faulty)
  assert held in complete and saved[0] == complete[-1] and partial == []
  if start:
    assert resumed_from(run) == start


def test_a_full_disk_on_one_process_stops_every_process_with_one_line(corpus, faulty):
  """Process 1's part of the first periodic checkpoint fails as on a full disk of its own. It says so in one line at
  the next checkpoint, process 0 prints the same line naming process 1, and both exit (status 1) at once, where
  they used to wait for each other at orbax's barriers (20 min). The newest complete checkpoint stays."""
  start = newest(faulty)
  failed = (start // EVERY + 1) * EVERY
  run = Run(faulty, 2, corpus, *FAULTY,
            env={'ELECTRA_JAX_TEST_FAIL_WRITE': f'{failed}:1'})
  assert run.finish() == [1, 1], run.tails()
  ours = one_error_line(run.output(1))
  assert re.fullmatch(rf'error: writing a checkpoint to \S+ failed \(OSError: \[Errno 28\] No space left on device: '
                      rf'.+; the disk is full: free some space and run the same command again\): the newest complete '
                      rf'checkpoint is step {start}, and the same command resumes from it', ours), ours
  assert one_error_line(run.output(0)) == f'{ours} (process 1 of 2 stopped with this error; the other processes ' \
                                          'stop too)'
  assert newest(faulty) == start and resumed_from(run) == start


def test_process_0_killed_stops_the_others_with_one_line_within_the_heartbeat_timeout(corpus, faulty):
  """kill -9 of process 0, which runs JAX's coordination service, once this run has completed a checkpoint of its
  own. Process 1 loses contact at once (the service's socket closes) and exits with one line saying what to run."""
  start = newest(faulty)
  run = Run(faulty, 2, corpus, *FAULTY,
            env={'ELECTRA_JAX_HEARTBEAT_TIMEOUT': str(HEARTBEAT)})
  run.wait_for(lambda: newest(faulty) > start)
  run.procs[0].kill()
  killed = time.time()
  statuses = run.finish(HEARTBEAT + 60)
  assert time.time() - killed < HEARTBEAT, run.tails()
  if statuses == [-signal.SIGKILL, -signal.SIGABRT]:
    # jax's own agent saw the lost service before our watcher did and aborted the process (hosts.py: jax 0.10 lets
    # no Python code replace that handler). Still within the heartbeat timeout, with jax's line saying why, and no
    # thread dump (hosts.Watch turns faulthandler's off for SIGABRT).
    assert 'Fatal Python error' not in run.output(1), run.output(1)[-3000:]
    assert 'Terminating process because the JAX distributed service detected fatal errors' in run.output(1)
    return
  assert statuses == [-signal.SIGKILL, 1], run.tails()
  assert re.fullmatch(r'error: lost contact with process 0, which runs the JAX coordination service of this run '
                      r'\(.+\): it was killed or crashed, or its machine is gone\. The complete checkpoints are kept: '
                      r'run the same command on every host to resume from the newest one',
                      one_error_line(run.output(1)))


def test_the_same_command_then_trains_the_faulty_run_to_the_uninterrupted_losses(corpus, faulty, two_processes):
  """After the four faults: resumes from the newest complete checkpoint, trains to the end, and every step's loss is
  the uninterrupted run's (metrics.jsonl drops the lines of steps trained again)."""
  start = newest(faulty)
  run = completed(faulty, 2, corpus, *FAULTY)
  assert resumed_from(run) == start
  assert step_dirs(faulty)[1] == []  # the failed and the killed writes' temporary directories are gone
  assert_same_losses(faulty, two_processes.workdir)
