"""Test hooks for a process of the real entry point, loaded by Python at start-up when tests/hooks is on its
PYTHONPATH (tests/test_multihost_main.py, test_multihost_finetune.py): a checkpoint write that is held or fails on
one process, at a step the test chooses, or an error raised late, with nothing changed in electra_jax. Inert unless
one of these is set:

- ELECTRA_JAX_TEST_HOLD_WRITE=STEP:DIR holds the write of checkpoint STEP in orbax's background commit (its files
  started, the step not yet renamed complete) until DIR/release exists; DIR/held.<process index> says it holds.
- ELECTRA_JAX_TEST_FAIL_WRITE=STEP:PROCESS makes process PROCESS's part of the write of checkpoint STEP fail as on a
  full disk of its own (OSError ENOSPC in its background commit).
- ELECTRA_JAX_TEST_LATE_ERROR=PROCESS:SECONDS makes process PROCESS raise each TrainingError SECONDS later than it
  would (a host a moment behind the others on its way to the same error).
- ELECTRA_JAX_TEST_HOLD_BETWEEN_SEEDS=DIR holds every process after its first fine-tuning seed's steps, before that
  seed's dev set is scored, until DIR/release exists; DIR/between.<process index> says it holds.
- ELECTRA_JAX_TEST_HOLD_DATA=DIR holds every process before pre-training loads its examples (after jax.distributed
  started, before any step) until DIR/release exists; DIR/data.<process index> says it holds.
- ELECTRA_JAX_TEST_DEAF_WATCH=PROCESS keeps process PROCESS's watcher (hosts.Watch) from ever reading its key, as
  if the line of another process that stopped reached it only after this process's own collective failed.
- ELECTRA_JAX_TEST_INTERLEAVE_DEVICES=1 lays every mesh's devices out round-robin over the processes (process 0's
  first device, process 1's first, ..., process 0's second, ...), as jax lays out a TPU slice's in its physical
  order, where the hosts' devices interleave.

The first two act through orbax's JSON item handler, whose commit futures every process's background commit waits
for before the processes agree the step is complete.

Always: SIGUSR1 prints every thread's Python stack (faulthandler), which tests.helpers.LocalProcesses asks of the
processes still running when a test gives up on them, so that a hang says where it was.
"""

import faulthandler
import os
import signal

faulthandler.register(signal.SIGUSR1, all_threads=True)

_HOLD, _FAIL = os.environ.get('ELECTRA_JAX_TEST_HOLD_WRITE'), os.environ.get('ELECTRA_JAX_TEST_FAIL_WRITE')
_LATE = os.environ.get('ELECTRA_JAX_TEST_LATE_ERROR')
_BETWEEN = os.environ.get('ELECTRA_JAX_TEST_HOLD_BETWEEN_SEEDS')
_DATA = os.environ.get('ELECTRA_JAX_TEST_HOLD_DATA')
_DEAF = os.environ.get('ELECTRA_JAX_TEST_DEAF_WATCH')


def _hold(directory: str, name: str):
  """Writes DIR/<name>.<process index>, then waits (at most 10 minutes) until DIR/release exists."""
  import time  # noqa: PLC0415

  import jax  # noqa: PLC0415
  with open(os.path.join(directory, f'{name}.{jax.process_index()}'), 'w', encoding='utf-8'):
    pass
  deadline = time.time() + 600
  while not os.path.exists(os.path.join(directory, 'release')) and time.time() < deadline:
    time.sleep(0.02)


def _electra_jax():
  """Puts the repository's electra_jax first on sys.path (the entry point's, `python -m` from there)."""
  import sys  # noqa: PLC0415
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _install():
  import errno  # noqa: PLC0415
  import threading  # noqa: PLC0415

  import jax  # noqa: PLC0415
  import orbax.checkpoint as ocp  # noqa: PLC0415

  class _ThreadFuture:
    """An orbax commit future (duck-typed: `result`) running `fn` in a thread of its own."""

    def __init__(self, fn):
      self.error = None
      self.thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
      self.thread.start()

    def _run(self, fn):
      try:
        fn()
      except Exception as e:  # pylint: disable=broad-except
        self.error = e

    def result(self, timeout=None):
      self.thread.join(timeout)
      if self.error is not None:
        raise self.error

  def fail(path):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)

  real = ocp.JsonCheckpointHandler.async_save

  async def async_save(self, directory, *args, **kwargs):
    futures = list(await real(self, directory, *args, **kwargs) or [])
    step = os.path.basename(os.path.dirname(str(directory))).split('.')[0]  # .../checkpoints/<step>.orbax-...-tmp/data
    if _HOLD and step == _HOLD.split(':', 1)[0]:
      futures.append(_ThreadFuture(lambda: _hold(_HOLD.split(':', 1)[1], 'held')))
    if _FAIL and [step, str(jax.process_index())] == _FAIL.split(':'):
      futures.append(_ThreadFuture(lambda: fail(str(directory))))
    return futures

  ocp.JsonCheckpointHandler.async_save = async_save


if _HOLD or _FAIL:
  _install()


def _install_late_error():
  import time  # noqa: PLC0415

  import jax  # noqa: PLC0415
  _electra_jax()
  from electra_jax import errors  # noqa: PLC0415

  process, seconds = _LATE.split(':')
  real = errors.TrainingError.__init__

  def late_init(self, *args, **kwargs):
    if jax.process_index() == int(process):
      time.sleep(float(seconds))
    real(self, *args, **kwargs)

  errors.TrainingError.__init__ = late_init


if _LATE:
  _install_late_error()


def _install_hold_between_seeds():
  _electra_jax()
  from electra_jax.finetune import train  # noqa: PLC0415

  real, held = train.evaluate, []

  def evaluate(*args, dev_only=False, **kwargs):
    if not dev_only and not held:  # the end of the first seed trained (dev_only: a scoring during the steps)
      held.append(True)
      _hold(_BETWEEN, 'between')
    return real(*args, dev_only=dev_only, **kwargs)

  train.evaluate = evaluate


if _BETWEEN:
  _install_hold_between_seeds()


def _install_hold_data():
  _electra_jax()
  from electra_jax import data  # noqa: PLC0415

  real = data.load_examples

  def load_examples(*args, **kwargs):
    _hold(_DATA, 'data')
    return real(*args, **kwargs)

  data.load_examples = load_examples


if _DATA:
  _install_hold_data()


def _install_deaf_watch():
  import threading  # noqa: PLC0415

  _electra_jax()
  from electra_jax import hosts  # noqa: PLC0415
  from jax._src import distributed  # noqa: PLC0415

  real = hosts.Watch._wait  # pylint: disable=protected-access

  def wait(self):
    if distributed.global_state.process_id == int(_DEAF):
      threading.Event().wait()
    real(self)

  hosts.Watch._wait = wait  # pylint: disable=protected-access


if _DEAF:
  _install_deaf_watch()


def _install_interleaved_devices():
  import jax  # noqa: PLC0415

  real = jax.make_mesh

  def make_mesh(*args, devices=None, **kwargs):
    if devices is not None:  # in (n-th of its process, process) order
      rank, taken = [], {}
      for device in devices:
        rank.append((taken.get(device.process_index, 0), device.process_index))
        taken[device.process_index] = rank[-1][0] + 1
      devices = [device for _, device in sorted(zip(rank, devices), key=lambda pair: pair[0])]
    return real(*args, devices=devices, **kwargs)

  jax.make_mesh = make_mesh


if os.environ.get('ELECTRA_JAX_TEST_INTERLEAVE_DEVICES') == '1':
  _install_interleaved_devices()
