"""Checkpointer: what opening a workdir's checkpoints does to the directory, for the run that writes them and for
whoever only reads them."""

import os

import jax
import jax.numpy as jnp
import numpy as np

from electra_jax.checkpoint import Checkpointer


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
