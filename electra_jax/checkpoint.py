"""Checkpoints of a run: the TrainState (sharded, via orbax) and the data iterator's position, under
WORKDIR/checkpoints/<step>/{state,data}. Restoring takes the target shardings, so a checkpoint written on one
mesh can be read onto another.
"""

import os

import orbax.checkpoint as ocp


class CheckpointError(RuntimeError):
  """A checkpoint that cannot be used; the message says what to do."""


class Checkpointer:
  """A thin wrapper over an orbax CheckpointManager with the two items of a pre-training run."""

  def __init__(self, workdir: str, keep: int = 3):
    self.directory = os.path.join(os.path.abspath(workdir), 'checkpoints')
    self.manager = ocp.CheckpointManager(
        self.directory, item_names=('state', 'data'),
        options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True))

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def save(self, step: int, state, data_state: dict):
    """Starts writing checkpoint `step` (asynchronously; `wait` or `close` finishes it)."""
    self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                    data=ocp.args.JsonSave(data_state)), force=True)

  def restore(self, step: int, abstract_state):
    """Returns (state, data_state) of checkpoint `step`, laid out as `abstract_state`'s shardings say."""
    try:
      restored = self.manager.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore()))
    except Exception as e:  # orbax raises many types for truncated or foreign files
      raise CheckpointError(
          f'cannot read checkpoint {self.directory}/{step} ({type(e).__name__}: {str(e)[:300]}). It may be '
          f'incomplete or corrupt, or come from a different model config. Move that step directory out of '
          f'{self.directory} to resume from the one before, or start a new --workdir.') from None
    return restored['state'], restored['data']

  def wait(self):
    self.manager.wait_until_finished()

  def close(self):
    self.manager.wait_until_finished()
    self.manager.close()
