"""The processes of a multi-host run stop together, each with one line, when one of them cannot go on.

The steps connect the processes through collectives, so a process that stops with an error (a checkpoint write
that failed on its disk) leaves the others waiting for it, and orbax's background writes wait for it at their
barriers: without help they hang until a timeout (jax's shutdown timeout, orbax's write timeout, minutes). From
jax.distributed's start to the command's end (`Watch`, entered by cli.run: reading data, compiling, the steps,
fine-tuning's seeds and reports), every process keeps one request open on JAX's coordination service (process 0):
a blocking read of its own key in the service's key-value store.

- A process that stops with an error (`exit_with`, from cli.run) prints its line, writes it to every process's key
  and exits; each other process's watcher wakes at once, prints that line with the process it came from, and
  exits (a collective that fails on the departure before the watcher wakes leads to the same line). All exit with
  status 1 and without jax's shutdown (which would wait for the stuck ones); process 0, which serves the keys,
  exits last, half a second after the others said they exit.
- An error every process raises itself at the same point (a NaN loss, a tokenizer process 0 could not train:
  errors.UserError's `every_process`) is written to no key: each process prints its own line, the same on all,
  and exits as above. Told, a process whose own identical error was a moment away would print the line of
  whichever process came first, naming it (as for a bad config value, which every process finds by itself).
- A process that stops before jax.distributed's start cannot be told about: the others say so in one line when
  the start takes too long (`joined_within`, ELECTRA_JAX_START_TIMEOUT).
- Process 0 gone (kill -9, a crash, its machine lost) takes the coordination service with it: the open requests
  fail at once and every other process prints one line and exits. (jax's own agent notices at the same moment and
  aborts the process with its `Terminating process because the JAX distributed service detected fatal errors`
  log line; jax 0.10 offers no way to replace it, so that line may come first.)

Nothing here waits for a checkpoint: a complete one is already on disk (orbax renames a step complete only once
every process has written its part), and one being written cannot complete without the process that stopped;
the next run removes its temporary directory.
"""

import contextlib
import faulthandler
import os
import signal
import sys
import threading
import time

import tqdm
from jax._src import distributed  # jax.distributed's client: the coordination service's key-value store


_KEY = 'electra_jax/stop/'  # + process index: what stopped the run ('' when this process ends normally)
_EXITED = 'electra_jax/exited/'  # + process index: set by each process before it exits (process 0 waits for them)
_WAIT_MS = 3_600_000  # one open request per hour and process
_LAST_WORDS_MS = 30_000  # process 0 waits at most this long for the others to read the line before it exits
_LAST_GRACE_S = 0.5  # then this long for them to exit: a process between its exited key and its exit, when process
#                      0's service goes, is aborted by jax's agent (status 134, jax's lines after its own)
_exiting = threading.Lock()  # held by the one thread that prints this process's last line


class Watch:
  """While entered, another process's error or the loss of process 0 ends this process with one line."""

  def __init__(self):
    self.active = processes() > 1
    self.thread = None
    self.dumped_aborts = False  # faulthandler dumped on SIGABRT before this Watch: restored at its end

  def __enter__(self):
    global _current  # pylint: disable=global-statement
    if self.active:
      _current = self
      # jax's agent aborts this process on purpose when process 0's service goes, after its own line; absl's
      # faulthandler would then print every thread's stack, burying that line and racing this module's exit (CI,
      # 2026-11-27: status 1 after a dump). Segfaults still dump.
      self.dumped_aborts = faulthandler.is_enabled() and threading.current_thread() is threading.main_thread()
      if self.dumped_aborts:
        signal.signal(signal.SIGABRT, signal.SIG_DFL)
      self.thread = threading.Thread(target=self._wait, name='electra_jax hosts', daemon=True)
      self.thread.start()
    return self

  def _wait(self):
    client, key = distributed.global_state.client, _own_key()
    while True:
      try:
        value = client.blocking_key_value_get(key, _WAIT_MS)
      except Exception as e:  # pylint: disable=broad-except  (jax raises JaxRuntimeError with the gRPC status)
        if str(e).startswith('DEADLINE_EXCEEDED'):
          continue
        exit_with(_lost_coordinator(e), coordinator=False)
        return
      if value:
        exit_with(value, tell_others=False)
      return  # '': this process ends normally

  def __exit__(self, exc_type, exc, tb):
    global _current  # pylint: disable=global-statement
    if not self.active:
      return
    if exc is not None:
      told = _told()
      if told is None:  # a collective failed because process 0 is gone
        exit_with(_lost_coordinator(exc), coordinator=False)
      if told:  # another process stopped, and this one's collective failed on its departure before the watcher woke
        exit_with(told, tell_others=False)
    if exc is None:  # the run ends normally on every process: release this process's request before jax shuts down
      client, key = distributed.global_state.client, _own_key()
      client.key_value_set(key, '')
      self.thread.join()
      client.key_value_delete(key)  # a later Watch in this process waits afresh
      _current = None
      if self.dumped_aborts:
        faulthandler.enable()
    # With an error, the watcher stays: cli.run's exit_with tells the others, or their line ends this process.


_current: Watch | None = None


def exit_with(line: str, tell_others: bool = True, coordinator: bool = True, status: int = 1):
  """Prints `line` on stderr and exits with `status` (1: an error; 130: Ctrl-C). In a multi-host run (a `Watch`),
  it exits without jax's shutdown, after giving `line` to every other process (`tell_others`; not when every
  process stops with this line itself, or was told it), which print it and exit too (status 1); without the
  `coordinator` (process 0 gone) at once, before jax's agent aborts the process."""
  if not _exiting.acquire(blocking=False):  # another thread of this process is already saying why
    threading.Event().wait()
  if _current is None:
    print(line, file=sys.stderr, flush=True)
    _exiting.release()
    sys.exit(status)
  # From the watcher, process 0's progress bar (tqdm) may hold the current line, without its newline. One write()
  # call: jax's C++ logging writes to the same stderr from its own threads (its agent logs the loss of process 0
  # as this line is printed), and print's separate writes of the line and its newline let a log line in between.
  bar_open = any(not bar.disable for bar in getattr(tqdm.tqdm, '_instances', ()))
  _write(('\n' if bar_open else '') + line)
  if not coordinator:
    os._exit(status)  # pylint: disable=protected-access
  client, me, count = distributed.global_state.client, distributed.global_state.process_id, processes()
  try:
    if tell_others:
      why = ' with this error' if status == 1 else ''
      told = f'{line} (process {me} of {count} stopped{why}; the other processes stop too)'
      for process in range(count):
        if process != me:
          client.key_value_set(f'{_KEY}{process}', told, allow_overwrite=True)
    client.key_value_set(f'{_EXITED}{me}', '')
    if me == 0:  # the others read their line from this process's coordination service: let them first
      for process in range(1, count):
        client.blocking_key_value_get(f'{_EXITED}{process}', _LAST_WORDS_MS)
      time.sleep(_LAST_GRACE_S)  # ... and to be gone: the service's end would make jax's agent abort them
  except Exception:  # pylint: disable=broad-except  (process 0 gone, or a process that will never read it)
    pass
  sys.stdout.flush()
  os._exit(status)  # pylint: disable=protected-access


def _write(line: str):
  """`line` and its newline on stderr in one write() (see exit_with)."""
  sys.stderr.flush()
  os.write(sys.stderr.fileno(), (line + '\n').encode())


@contextlib.contextmanager
def joined_within(seconds: int):
  """Ends this process with one line when jax.distributed's start, which waits for every process to join (and
  releases the GIL meanwhile), takes more than `seconds`. A host that stopped before joining cannot be told about
  through the coordination service; jax itself would abort later, with a C++ stack trace."""
  def give_up():
    _write(f'error: waited {seconds} s for every process of this run to join jax.distributed (coordinator '
           f'{os.environ.get("JAX_COORDINATOR_ADDRESS", "found by jax")}) and gave up: start the same command on '
           'every host; a host that stopped before joining printed its own error line. ELECTRA_JAX_START_TIMEOUT sets '
           'the wait')
    os._exit(1)  # pylint: disable=protected-access  (the main thread is inside jax's start: no exception reaches it)

  timer = threading.Timer(seconds, give_up)
  timer.daemon = True
  timer.start()
  try:
    yield
  finally:
    timer.cancel()


def processes() -> int:
  """The processes of this run: 1 until jax.distributed has started. Unlike jax.process_count(), it starts no
  backend (which on a TPU host takes its chips, e.g. for a data-building command)."""
  return distributed.global_state.num_processes if distributed.global_state.client is not None else 1


def _own_key() -> str:
  return f'{_KEY}{distributed.global_state.process_id}'


def _lost_coordinator(error: Exception) -> str:
  first = (str(error).strip().splitlines() or [''])[0][:160]
  return (f'error: lost contact with process 0, which runs the JAX coordination service of this run ({first}): '
          'it was killed or crashed, or its machine is gone. The complete checkpoints are kept: run the same '
          'command on every host to resume from the newest one')


def _told() -> str | None:
  """The line another process gave this one ('' if none), or None if process 0's coordination service is gone."""
  try:
    return distributed.global_state.client.key_value_try_get(_own_key())
  except Exception as e:  # pylint: disable=broad-except
    return '' if str(e).startswith('NOT_FOUND') else None

