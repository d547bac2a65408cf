"""Checkpoints of a run: the TrainState (sharded, via orbax) and the data iterator's position, under
WORKDIR/checkpoints/<step>/{state,data}. Restoring takes the target shardings, so a checkpoint written on one
mesh can be read onto another.

Storage only: what the arrays mean (a run's config and model, `electra_jax.pretrained.load_params`) is read above
this module.
"""

import contextlib
import fcntl
import json
import logging
import os
import re
import socket
import sys
import time
import traceback
import warnings

import jax
import orbax.checkpoint as ocp

from electra_jax import fileio
from electra_jax.errors import CheckpointError


CHECKSUMS = 'electra_checksums.json'  # in each step directory: {file: [size, sha256]}
# Where unreadable checkpoints are moved (WORKDIR/UNREADABLE/<step>): out of orbax's sight, never deleted.
UNREADABLE = 'unreadable_checkpoints'
LOCK = '.checkpoints.lock'  # WORKDIR/LOCK: locked while a run writes its checkpoints (`_lock`)
DIRECTORY = 'checkpoints'  # WORKDIR/DIRECTORY/<step>


def started(workdir) -> bool:
  """Whether a run started in `workdir`: it has the checkpoints/ directory a writing Checkpointer makes (maybe
  empty)."""
  return (fileio.path(workdir) / DIRECTORY).is_dir()


class Checkpointer:
  """A thin wrapper over an orbax CheckpointManager with the two items of a pre-training run.

  The `keep` latest checkpoints are kept, and those of the steps in `preserve`, whatever their age. Orbax writes
  each step under a temporary name and renames it when complete (on Cloud Storage, where nothing can be renamed,
  it marks it complete with a commit_success.txt written last), so a step is always whole; temporary ones left by
  a crash are removed when the next writer opens the directory. Once a step is complete, the size and sha256 of
  each of its files (on Cloud Storage the CRC32C the service keeps) go to <step>/electra_checksums.json, checked
  before the step is read: orbax itself reads damaged array bytes back as numbers.

  A writer locks WORKDIR first (`_lock`): the same command started twice on one workdir is refused in one line
  rather than the two runs removing each other's writes. `read_only` is for whoever only reads another run's
  checkpoints (fine-tuning, convert, detect, a continued run's init_checkpoint): it takes no lock, creates no
  directory and removes no temporary one, since that may be the step a live run is writing.
  """

  def __init__(self, workdir, keep: int = 3, preserve: tuple[int, ...] = (), *, read_only: bool = False):
    self.workdir = fileio.path(workdir)
    self.directory = self.workdir / DIRECTORY
    self._lock = None if read_only else _lock(self.workdir)
    policy = ocp.checkpoint_managers.AnyPreservationPolicy([
        ocp.checkpoint_managers.LatestN(keep), ocp.checkpoint_managers.CustomSteps(preserve)])
    # Not orbax's own read_only option: it logs a warning each time it opens a directory.
    self.manager = _Manager(
        self.directory, item_names=('state', 'data'),
        options=ocp.CheckpointManagerOptions(preservation_policy=policy, create=not read_only,
                                             cleanup_tmp_directories=not read_only))
    self._failed = False
    self._unrecorded = None  # the step being written: its checksums are recorded once it is complete

  def all_steps(self) -> list[int]:
    return sorted(self.manager.all_steps())

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def save(self, step: int, state, data_state: dict):
    """Starts writing checkpoint `step` (asynchronously; `wait` or `close` finishes it).

    Raises CheckpointError if this or the previous write failed (a full disk, say).
    """
    def start():
      self._finish()
      self.manager.save(step, args=ocp.args.Composite(
          state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data_state)), force=True)
      self._unrecorded = step
    self._writing(start)

  def _finish(self):
    """Waits for the checkpoint being written, then records its files' checksums.

    With several processes, a write that fails on this one leaves orbax's threads waiting for the others at a
    barrier (20 minutes), holding the error: it is taken from orbax's log record instead (`_OrbaxTracebacks`) and
    raised at once, and cli.run stops every process (hosts.exit_with).
    """
    while jax.process_count() > 1 and self.manager.is_saving_in_progress():
      if _background_errors:
        raise _background_errors.pop()
      time.sleep(0.02)
    _background_errors.clear()  # none is this write's now (orbax raises its own below); none stays for the next
    self.manager.wait_until_finished()
    step, self._unrecorded = self._unrecorded, None
    directory = self.directory / str(step)
    if step is not None and jax.process_index() == 0 and directory.is_dir():
      recorded = fileio.file_digests(directory)
      recorded.pop(CHECKSUMS, None)
      fileio.write_json(directory / CHECKSUMS, recorded)

  def _writing(self, operation):
    if self._failed:
      return
    try:
      operation()
    except Exception as e:  # orbax and tensorstore raise many types for a failed write
      self._failed = True
      complete = sorted(int(p.name) for p in self.directory.iterdir() if p.name.isdigit())
      kept = (f'the newest complete checkpoint is step {complete[-1]}, and the same command resumes from it'
              if complete else 'no checkpoint was completed yet')
      raise CheckpointError(f'writing a checkpoint to {self.directory} failed ({_reason(e)}): {kept}') from None

  def restore(self, step: int, abstract_state):
    """Returns (state, data_state) of checkpoint `step`, laid out as `abstract_state`'s shardings say."""
    try:
      self._verify(step)
      restored = self.manager.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore()))
    except Exception as e:  # orbax raises many types for truncated or foreign files
      raise CheckpointError(f'checkpoint {step} in {self.directory} cannot be read ({_reason(e)})') from None
    return restored['state'], restored['data']

  def restore_latest(self, abstract_state) -> tuple[int, object, dict] | None:
    """(step, state, data_state) of the newest checkpoint that reads back; None if there is none.

    Unreadable newer ones (truncated, emptied, damaged files) are each reported in one line and moved to
    WORKDIR/unreadable_checkpoints/; if none reads back, nothing is moved and CheckpointError says so.
    """
    bad = []
    for step in reversed(self.all_steps()):
      try:
        state, data_state = self.restore(step, abstract_state)
      except CheckpointError as e:
        bad.append((step, str(e)))
        continue
      for bad_step, message in bad:
        moved = self._move_aside(bad_step)
        print(f'warning: {message}; moved it to {moved}, resuming from checkpoint {step}', file=sys.stderr)
      self.manager.reload()
      return step, state, data_state
    if bad:
      raise CheckpointError(
          f'no checkpoint in {self.directory} can be read (steps {", ".join(str(s) for s, _ in bad)}; the newest: '
          f'{bad[0][1]}). Move them aside to train from step 0, or start a new --workdir')
    return None

  def _move_aside(self, step: int) -> str:
    target = self.workdir / UNREADABLE / str(step)
    suffix = 0
    while target.exists():  # the same step may go bad twice
      suffix += 1
      target = self.workdir / UNREADABLE / f'{step}.{suffix}'
    if jax.process_index() == 0:
      fileio.move(self.directory / str(step), target)
    return str(target)

  def restore_params(self, step: int, abstract_params):
    """Only TrainState.params of checkpoint `step`, laid out as `abstract_params`' shardings say."""
    steps = self.all_steps()
    if step not in steps:
      raise CheckpointError(f'{self.directory} has no checkpoint {step}; its steps are '
                            f'{", ".join(map(str, steps)) or "none"}')
    try:
      self._verify(step)
      restored = self.manager.restore(step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
          {'params': abstract_params}, restore_args=ocp.checkpoint_utils.construct_restore_args(
              {'params': abstract_params}), partial_restore=True)))
    except Exception as e:  # orbax raises many types for truncated or foreign files
      others = [s for s in steps if s != step]
      raise CheckpointError(
          f'checkpoint {step} in {self.directory} cannot be read ({_reason(e)}); it may be incomplete or damaged, '
          f'or not match {self.workdir / "config.json"}' +
          (f'. Other steps: {", ".join(map(str, others))}' if others else '')) from None
    return restored['state']['params']

  def _verify(self, step: int):
    """Raises _Damaged if a file of checkpoint `step` differs from when it was written."""
    directory = self.directory / str(step)
    if not (directory / CHECKSUMS).exists():  # written before checksums were recorded, or killed just before
      return
    recorded = json.loads((directory / CHECKSUMS).read_text())
    for name, (size, digest) in sorted(recorded.items()):
      found = fileio.file_digest(directory / name, like=digest)
      problem = ('is missing' if found is None else
                 f'has {found[0]} bytes, not {size}' if found[0] != size else
                 'has other bytes than were written' if found[1] != digest else None)
      if problem:
        raise _Damaged(f'{name} {problem}')

  def wait(self):
    self._writing(self._finish)

  def close(self):
    try:
      self.wait()
    finally:
      try:
        if not self._failed:
          self.manager.close()
        elif jax.process_count() == 1:  # orbax would raise the failed write's error again
          with contextlib.suppress(Exception):
            self.manager.close()
      finally:
        if self._lock:  # removed while held, then released: a run that ended leaves no file behind (`_lock`)
          with contextlib.suppress(OSError):
            os.remove(self._lock.name)
          self._lock.close()
          self._lock = None
      # (After a failed write with several processes, orbax's threads may wait for the others until its timeout:
      # the process exits without them.)


def _lock(workdir):
  """WORKDIR/LOCK, open and locked by this process; refuses a workdir whose checkpoints another live run writes.

  An flock goes with its process: a run that was killed leaves its file, which locks nothing. Taken by process 0
  only (the others of its run share a workdir); none on gs://, which has no locks, nor on a file system that
  offers no flock (Lustre without -o flock, NFS without its lock daemon). None then.
  """
  if fileio.is_remote(workdir) or jax.process_index() != 0:
    return None
  os.makedirs(workdir, exist_ok=True)
  path = os.path.join(workdir, LOCK)
  while True:
    file = open(path, 'a+', encoding='utf-8')  # pylint: disable=consider-using-with
    try:
      fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      file.seek(0)
      holder = file.read().strip() or 'another process'
      file.close()
      raise CheckpointError(f'{workdir} is in use by another run ({holder}; {LOCK}): wait for it to end, or give '
                            'another --workdir') from None
    except OSError as e:  # ENOLCK, ENOSYS, EOPNOTSUPP: no locks here
      file.close()
      print(f'warning: {workdir} cannot be locked ({fileio.describe(e)}): nothing stops a second run of it',
            file=sys.stderr)
      return None
    try:  # the file this process locked may have been removed by its last holder's close since it was opened
      if os.stat(path).st_ino == os.fstat(file.fileno()).st_ino:
        break
    except FileNotFoundError:
      pass
    file.close()
  file.truncate(0)
  file.write(f'process {os.getpid()} on {socket.gethostname()} since {time.strftime("%Y-%m-%d %H:%M:%S")}\n')
  file.flush()
  return file


class _Manager(ocp.CheckpointManager):
  """orbax's CheckpointManager, leaving jax's preemption sync point to the training loop (preemption.StopSignal).

  orbax asks `reached_preemption(step)` only for its logs and statistics here (saves are forced), but the question
  is not free: jax's sync manager records the step of every call, and the stop step it agrees on is the largest
  step recorded on any host, plus one. orbax asks with the step a finished write was started at, from its
  background thread, which would record a step some hosts have already passed: they would never stop.
  """

  def reached_preemption(self, step: int) -> bool:
    del step
    return False


class _Damaged(Exception):
  """A checkpoint file that is not as it was written (`Checkpointer._verify`)."""


def _reason(error: Exception) -> str:
  """An orbax/tensorstore error in a few words: its type, and the start and end of its first line.

  Their messages run to hundreds of characters of nested driver names; the end names the file that failed.
  """
  first = str(error).strip().splitlines()[0] if str(error).strip() else ''
  if isinstance(error, _Damaged):
    return first
  # tensorstore's errors carry the OS error only in their text (no errno attribute, no public accessor), e.g.
  # "... No space left on device [os_error_code='28']"; test_faults' full-tmpfs test pins that text.
  code = re.search(r"os_error_code='(\d+)'", first)
  number = int(code.group(1)) if code else getattr(error, 'errno', None)
  advice = fileio.advice(number) if number else ''
  if len(first) > 160:
    first = f'{first[:80]} ... {first[-70:]}'
  return f'{type(error).__name__}: {first}' + (f'; {advice}' if advice else '')


def _ignore_late_callbacks_of_failed_reads():
  """A failed restore returns while tensorstore still completes its other reads; their callbacks then find
  orbax's event loop closed, and Python prints each as an unraisable "RuntimeError: Event loop is closed" with
  a traceback (dozens of them). They carry no information: drop exactly those, pass anything else on."""
  previous = sys.unraisablehook
  if getattr(previous, 'electra_jax', False):
    return

  def hook(unraisable):
    if not (unraisable.exc_type is RuntimeError and str(unraisable.exc_value) == 'Event loop is closed'):
      previous(unraisable)

  hook.electra_jax = True
  sys.unraisablehook = hook


def quiet_failures():
  """Keeps a failed checkpoint read or write to the one error line Checkpointer raises: drops the reports orbax,
  tensorstore and asyncio print about it afterwards (see below). Process-wide, so a command's entry point calls it
  (cli.run does), not the import of this module; calling it again changes nothing."""
  _ignore_late_callbacks_of_failed_reads()
  # A write that fails (a full disk) leaves some of orbax's fragment-writing coroutines never awaited; Python reports
  # each when it collects them, at exit, after the run's one error line, which already says what failed and what to
  # do.
  warnings.filterwarnings('ignore', message=r"coroutine '.*write_fragment' was never awaited",
                          category=RuntimeWarning)
  for name in ('absl', 'asyncio'):  # orbax logs through absl.logging; asyncio reports its unretrieved futures
    logger = logging.getLogger(name)
    if not any(isinstance(f, _OrbaxTracebacks) for f in logger.filters):
      logger.addFilter(_OrbaxTracebacks())


# The errors of writes that failed in orbax's background threads, as orbax logs them (`_OrbaxTracebacks`).
_background_errors: list[BaseException] = []


class _OrbaxTracebacks(logging.Filter):
  """Drops error logs whose traceback runs through orbax, and asyncio's reports of unretrieved futures: the exception
  is raised to Checkpointer, which reports it in one line (a full disk otherwise prints six tracebacks from orbax's
  writer threads and asyncio)."""

  def filter(self, record: logging.LogRecord) -> bool:
    if record.name == 'absl' and record.exc_info and 'background save thread' in record.getMessage():
      _background_errors.append(record.exc_info[1])  # a failed write (Checkpointer._finish raises it)
    if record.name == 'asyncio' and 'exception was never retrieved' in record.getMessage():
      # electra_jax runs no event loop of its own: these are tensorstore's write futures that failed with the error
      # orbax already raised (a full disk), collected at exit with no traceback to recognise them by.
      return False
    if not (record.exc_info and record.exc_info[2] and record.levelno >= logging.ERROR):
      return True
    return not any(f'{os.sep}orbax{os.sep}' in frame.filename for frame in traceback.extract_tb(record.exc_info[2]))
