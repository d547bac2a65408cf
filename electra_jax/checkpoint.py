"""Checkpoints of a run: the TrainState (sharded, via orbax) and the data iterator's position, under
WORKDIR/checkpoints/<step>/{state,data}. Restoring takes the target shardings, so a checkpoint written on one
mesh can be read onto another.

`load_params(workdir)` is the inference/fine-tuning entry: it reads WORKDIR/config.json and restores only the
parameters of a checkpoint (not the optimiser state, which is twice their size).
"""

import dataclasses
import json
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp

from electra_jax import config as config_lib
from electra_jax import objective
from electra_jax.model import Electra, unstack_layers


class CheckpointError(RuntimeError):
  """A checkpoint that cannot be used; the message says what to do."""


class Checkpointer:
  """A thin wrapper over an orbax CheckpointManager with the two items of a pre-training run.

  The `keep` latest checkpoints are kept, and those of the steps in `preserve`, whatever their age.
  """

  def __init__(self, workdir: str, keep: int = 3, preserve: tuple[int, ...] = ()):
    self.directory = os.path.join(os.path.abspath(workdir), 'checkpoints')
    policy = ocp.checkpoint_managers.AnyPreservationPolicy([
        ocp.checkpoint_managers.LatestN(keep), ocp.checkpoint_managers.CustomSteps(preserve)])
    self.manager = ocp.CheckpointManager(
        self.directory, item_names=('state', 'data'),
        options=ocp.CheckpointManagerOptions(preservation_policy=policy, create=True))

  def all_steps(self) -> list[int]:
    return list(self.manager.all_steps())

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

  def restore_params(self, step: int, abstract_params):
    """Only TrainState.params of checkpoint `step`, laid out as `abstract_params`' shardings say."""
    try:
      restored = self.manager.restore(step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
          {'params': abstract_params}, restore_args=ocp.checkpoint_utils.construct_restore_args(
              {'params': abstract_params}), partial_restore=True)))
    except Exception as e:  # orbax raises many types for truncated or foreign files
      raise CheckpointError(
          f'cannot read the parameters of checkpoint {self.directory}/{step} ({type(e).__name__}: '
          f'{str(e)[:300]}). It may be incomplete or corrupt, or not match {self.directory}/../config.json.'
      ) from None
    return restored['state']['params']

  def wait(self):
    self.manager.wait_until_finished()

  def close(self):
    self.manager.wait_until_finished()
    self.manager.close()


def load_config(workdir: str) -> config_lib.TrainConfig:
  """The run's WORKDIR/config.json as a TrainConfig; model.vocab_size 0 is read from WORKDIR/tokenizer.model."""
  path = os.path.join(workdir, 'config.json')
  if not os.path.isfile(path):
    raise CheckpointError(f'{workdir} has no config.json: give the --workdir of a pre-training run or the output '
                          'of `python -m electra_jax.convert`')
  with open(path, encoding='utf-8') as f:
    values = json.load(f)
  vocab_size = None
  if not values.get('model', {}).get('vocab_size'):
    from electra_jax.data import tokenizer  # pylint: disable=g-import-not-at-top  (only runs' configs need it)
    vocab_size = tokenizer.load(workdir).vocab_size
  return config_lib.load(values, vocab_size=vocab_size)


def abstract_params(model: Electra, sharding=None):
  """Shapes and dtypes of `model`'s parameters (nothing allocated), each placed by `sharding` if given."""
  ids = jnp.zeros((1, 1), jnp.int32)
  shapes = jax.eval_shape(lambda: nn.meta.unbox(model.init(jax.random.PRNGKey(0), ids, ids, ids, ids)['params']))
  return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding), shapes)


def load_params(workdir: str, step: int | None = None) -> tuple[config_lib.TrainConfig, dict]:
  """(config, params) of checkpoint `step` (default: the latest) of WORKDIR, params on the first device.

  The params follow `electra_jax.model.Electra`'s tree, one subtree per encoder layer (a run with
  model.scan_layers comes back unstacked, with scan_layers off in its config); use them as
  `model.apply({'params': params}, ...)`.
  """
  config = load_config(workdir)
  if not os.path.isdir(os.path.join(workdir, 'checkpoints')):
    raise CheckpointError(f'{workdir} has no checkpoints/ directory: nothing to load')
  checkpointer = Checkpointer(workdir)
  try:
    step = checkpointer.latest_step() if step is None else step
    if step is None:
      raise CheckpointError(f'{checkpointer.directory} holds no checkpoint yet')
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    model = objective.get(config.objective.name).model(config.model)
    params = checkpointer.restore_params(step, abstract_params(model, device))
  finally:
    checkpointer.close()
  if config.model.scan_layers:  # what reads these params expects one parameter tree per layer
    config = dataclasses.replace(config, model=dataclasses.replace(config.model, scan_layers=False))
    params = unstack_layers(params)
  return config, params
