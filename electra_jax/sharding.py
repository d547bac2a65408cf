"""The device mesh and how parameters, optimiser state and batches are laid out on it.

Parameters carry logical axis names (see electra_jax.model); `MeshConfig.rules` maps each name to mesh axes
('data', 'fsdp', 'tensor'). Data parallelism is the mesh (-1, 1, 1); FSDP puts devices on 'fsdp'; tensor
parallelism on 'tensor'. Nothing else in the code knows which one is in use.
"""

import dataclasses
import os
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from electra_jax.config import ConfigError

AXES = ('data', 'fsdp', 'tensor')
BATCH = ('batch', 'length')  # logical axes of every [batch, length] input array


@dataclasses.dataclass(frozen=True)
class MeshConfig:
  shape: tuple = (-1, 1, 1)
  rules: tuple = ()

  def __post_init__(self):
    object.__setattr__(self, 'shape', tuple(int(s) for s in self.shape))
    object.__setattr__(self, 'rules', tuple((name, tuple(axes) if isinstance(axes, list) else axes)
                                            for name, axes in self.rules))
    if len(self.shape) != len(AXES) or list(self.shape).count(-1) > 1:
      raise ConfigError(f'mesh.shape must have {len(AXES)} entries for {AXES} with at most one -1, '
                        f'got {self.shape}')


def mesh_shape(config: MeshConfig, num_devices: int) -> tuple[int, ...]:
  """Fills the -1 entry of `config.shape` so the product is `num_devices`.

  A shape without -1 may use fewer devices than there are (the first ones), e.g. (1, 1, 1) for one device.
  """
  known = int(np.prod([s for s in config.shape if s != -1]))
  shape = tuple(num_devices // known if s == -1 else s for s in config.shape)
  if int(np.prod(shape)) != num_devices and (-1 in config.shape or int(np.prod(shape)) > num_devices):
    raise ConfigError(f'mesh.shape {config.shape} does not fit {num_devices} devices; '
                      f'make the product equal the device count or put a -1 on one axis')
  return shape


def make_mesh(config: MeshConfig, devices=None) -> jax.sharding.Mesh:
  devices = jax.devices() if devices is None else devices
  shape = mesh_shape(config, len(devices))
  devices = devices[:int(np.prod(shape))]
  return jax.make_mesh(shape, AXES, axis_types=(jax.sharding.AxisType.Auto,) * len(AXES), devices=devices)


def logical_shardings(mesh, rules, logical_tree) -> Any:
  """Maps a tree of logical PartitionSpecs (or boxed abstract values) to NamedShardings on `mesh`."""
  specs = nn.get_partition_spec(logical_tree)
  return nn.logical_to_mesh_sharding(specs, mesh, rules)


def batch_sharding(mesh, rules) -> NamedSharding:
  """Sharding of a [batch, length] input: the batch split over the axes 'batch' maps to."""
  return NamedSharding(mesh, nn.logical_to_mesh_axes(BATCH, rules))


def replicated(mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec())


def global_batch(local_batch: dict[str, np.ndarray], sharding: NamedSharding) -> dict[str, jax.Array]:
  """Assembles this process's rows into global arrays (each process holds its contiguous share)."""
  return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in local_batch.items()}


def initialize_distributed():
  """Starts jax.distributed when this is one process of a multi-process job; a no-op otherwise.

  Cloud TPU pods and SLURM jobs are detected by jax itself; elsewhere set JAX_COORDINATOR_ADDRESS,
  JAX_NUM_PROCESSES and JAX_PROCESS_ID.
  """
  env = os.environ
  multi_process = (
      'JAX_COORDINATOR_ADDRESS' in env
      or int(env.get('SLURM_NTASKS', '1')) > 1
      or ',' in env.get('TPU_WORKER_HOSTNAMES', ''))
  if not multi_process:
    return
  if 'JAX_COORDINATOR_ADDRESS' in env:
    jax.distributed.initialize(coordinator_address=env['JAX_COORDINATOR_ADDRESS'],
                               num_processes=int(env['JAX_NUM_PROCESSES']),
                               process_id=int(env['JAX_PROCESS_ID']))
  else:
    jax.distributed.initialize()
