"""A pre-trained run's weights, read back for fine-tuning, conversion and detection: `load_params(workdir)`.

It reads WORKDIR/config.json (`config_files.load_config`) for the model the run's objective trains, and restores
only the parameters of a checkpoint (not the optimiser state, which is twice their size). Above `checkpoint`
(storage) and `objective` (which model a run trains).
"""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from electra_jax import config as config_lib
from electra_jax import checkpoint, config_files, fileio, metrics, objective
from electra_jax.checkpoint import Checkpointer
from electra_jax.errors import CheckpointError
from electra_jax.model import Electra, unstack_layers


def abstract_params(model: Electra, sharding=None):
  """Shapes and dtypes of `model`'s parameters (nothing allocated), each placed by `sharding` if given."""
  ids = jnp.zeros((1, 1), jnp.int32)
  shapes = jax.eval_shape(lambda: nn.meta.unbox(model.init(jax.random.PRNGKey(0), ids, ids, ids, ids)['params']))
  return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding), shapes)


def trained_length(workdir: str, config: config_lib.TrainConfig) -> int:
  """The longest sequence the model of WORKDIR (its config `config`) is known to have been trained on: a run
  trained here from scratch (its metrics.jsonl, no init_checkpoint) trained positions up to data.max_seq_length
  only, those beyond had no gradient; an import (whatever Google trained at) or a run continued from one, all its
  positions."""
  positions = config.model.max_position_embeddings
  if config.init_checkpoint or not (fileio.path(workdir) / metrics.FILE).exists():
    return positions
  return min(positions, config.data.max_seq_length)


def load_params(workdir: str, step: int | None = None) -> tuple[config_lib.TrainConfig, dict]:
  """(config, params) of checkpoint `step` (default: the latest) of WORKDIR, params on this process's first device
  (each process of a multi-host run reads its own copy).

  The params follow `electra_jax.model.Electra`'s tree, one subtree per encoder layer (a run with
  model.scan_layers comes back unstacked, with scan_layers off in its config); use them as
  `model.apply({'params': params}, ...)`.
  """
  config = config_files.load_config(workdir)
  if not checkpoint.started(workdir):
    raise CheckpointError(f'{workdir} has no checkpoints/ directory: nothing to load')
  checkpointer = Checkpointer(workdir, read_only=True)
  try:
    step = checkpointer.latest_step() if step is None else step
    if step is None:
      raise CheckpointError(f'{checkpointer.directory} holds no checkpoint yet')
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    model = objective.get(config.objective.name).model(config.model)
    params = checkpointer.restore_params(step, abstract_params(model, device))
  finally:
    checkpointer.close()
  if config.model.scan_layers:  # what reads these params expects one parameter tree per layer
    config = dataclasses.replace(config, model=dataclasses.replace(config.model, scan_layers=False))
    params = unstack_layers(params)
  return config, params
