"""Checkpointer: what opening a workdir's checkpoints does to the directory, for the run that writes them and for
whoever only reads them."""

import errno
import fcntl
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from electra_jax.checkpoint import Checkpointer
from electra_jax.errors import CheckpointError


def test_a_read_only_open_leaves_a_step_being_written_in_place(tmp_path):
  """A reader (fine-tuning, detect, a continued run) restores the complete step and leaves the temporary directory
  of the step a live run is writing; only a writer's open removes it (left by a crash). A reader of a directory
  without checkpoints creates none."""
  params = {'w': jnp.arange(3, dtype=jnp.float32)}
  writer = Checkpointer(tmp_path / 'run')
  writer.save(4, {'params': params}, {'batch': 4})
  writer.close()
  being_written = tmp_path / 'run' / 'checkpoints' / '8.orbax-checkpoint-tmp'
  (being_written / 'state').mkdir(parents=True)

  reader = Checkpointer(tmp_path / 'run', read_only=True)
  abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), params)
  np.testing.assert_array_equal(reader.restore_params(reader.latest_step(), abstract)['w'], [0, 1, 2])
  reader.close()
  assert (being_written / 'state').is_dir()

  writer = Checkpointer(tmp_path / 'run')  # the next run: its open removes it, in a thread its first save waits for
  writer.save(5, {'params': params}, {'batch': 5})
  writer.close()
  assert not being_written.exists()

  reader = Checkpointer(tmp_path / 'empty', read_only=True)
  assert reader.latest_step() is None
  reader.close()
  assert not os.path.exists(tmp_path / 'empty')


def test_a_lock_file_removed_before_it_was_locked_is_opened_again_and_no_flock_is_no_lock(tmp_path, monkeypatch,
                                                                                          capsys):
  """A writer that opens the lock file just before the last holder's close removes it then locks a file with no name,
  which the next writer would not see: it opens the path again. A file system without flock (Lustre without
  -o flock: ENOSYS) leaves the workdir unlocked with a warning, not refused as if another run held it."""
  run = tmp_path / 'run'
  flock = fcntl.flock
  calls = []
  def removed_first(file, operation):
    if not calls:
      os.remove(run / '.checkpoints.lock')  # the last holder's close, between this open and this flock
    calls.append(file.fileno())
    return flock(file, operation)
  monkeypatch.setattr(fcntl, 'flock', removed_first)
  writer = Checkpointer(run)
  assert len(calls) == 2 and os.path.exists(run / '.checkpoints.lock')
  monkeypatch.setattr(fcntl, 'flock', flock)
  with pytest.raises(CheckpointError, match='in use by another run'):
    Checkpointer(run)  # sees the lock of the file at the path
  writer.close()

  def unsupported(file, operation):
    raise OSError(errno.ENOSYS, 'Function not implemented')
  monkeypatch.setattr(fcntl, 'flock', unsupported)
  Checkpointer(run).close()
  assert 'cannot be locked' in capsys.readouterr().err


def test_a_workdir_has_one_writer_at_a_time_and_a_killed_one_leaves_no_lock(tmp_path):
  """A second writer of a workdir (the same command started twice) is refused in one line naming the first, before
  it touches anything; readers are not. The lock goes with the process: a killed writer leaves none."""
  first = Checkpointer(tmp_path / 'run')
  first.save(1, {'w': jnp.ones(2)}, {})
  first.wait()
  with pytest.raises(CheckpointError, match=rf'in use by another run \(process {os.getpid()} on .*; '
                                            r'\.checkpoints\.lock\): wait for it to end, or give another --workdir'):
    Checkpointer(tmp_path / 'run')
  reader = Checkpointer(tmp_path / 'run', read_only=True)
  assert reader.latest_step() == 1
  reader.close()
  first.close()
  assert not os.path.exists(tmp_path / 'run' / '.checkpoints.lock')  # a run that ended leaves no file
  Checkpointer(tmp_path / 'run').close()

  holder = subprocess.Popen(
      [sys.executable, '-c', 'import sys, time; from electra_jax.checkpoint import Checkpointer; '
       'held = Checkpointer(sys.argv[1]); print("held", flush=True); time.sleep(600)', str(tmp_path / 'run')],
      stdout=subprocess.PIPE, text=True)
  try:
    assert holder.stdout.readline() == 'held\n'
    with pytest.raises(CheckpointError, match=rf'process {holder.pid} on'):
      Checkpointer(tmp_path / 'run')
  finally:
    holder.kill()
    holder.wait()
  assert os.path.exists(tmp_path / 'run' / '.checkpoints.lock')  # its file stays, locking nothing
  Checkpointer(tmp_path / 'run').close()
