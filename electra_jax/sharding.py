"""The device mesh and how parameters, optimiser state, batches and activations are laid out on it.

Parameters and key activations carry logical axis names (see electra_jax.model); `MeshConfig.rules` maps each
name to mesh axes ('data', 'fsdp', 'tensor'). Data parallelism is the mesh (-1, 1, 1); FSDP (ZeRO-3) puts devices
on 'fsdp' (parameters and optimiser state split over it, the batch over data x fsdp); tensor (Megatron-style)
parallelism on 'tensor' (heads, FFN and vocabulary split over it). Nothing else in the code knows which is in use.

Activations and inputs have logical names of their own ('activation_batch', 'activation_embed', ...; parameters
have 'embed', 'mlp', ...), as in MaxText: the rules are a priority list (flax `logical_to_mesh_axes`, a dimension
takes its rule's mesh axes only if no earlier dimension of the array took them), and with shared names an
activation's 'embed' stayed whole only because 'batch' came first and took fsdp. Apart, no activation name shares
a mesh axis with another dimension of the same activation, so the order of the rules cannot reshard activations
(tests/test_sharding.py permutes them).
"""

import contextlib
import os
from typing import Any

from absl import logging
import flax.linen as nn
import jax
from jax.experimental import multihost_utils
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from electra_jax import hosts
from electra_jax.config import AXES, ConfigError, MeshConfig

BATCH = ('activation_batch', 'activation_length')  # logical axes of every [batch, length] input array
# What srun sets for each task, and jax's SLURM cluster reads (an sbatch script's own shell has not all of them).
SLURM_TASK_VARIABLES = ('SLURM_JOB_ID', 'SLURM_STEP_NODELIST', 'SLURM_PROCID', 'SLURM_LOCALID')


def mesh_shape(config: MeshConfig, num_devices: int) -> tuple[int, ...]:
  """Fills the -1 entry of `config.shape` so the product is `num_devices`.

  A shape without -1 may use fewer devices than there are (the first ones), e.g. (1, 1, 1) for one device.
  """
  known = int(np.prod([s for s in config.shape if s != -1]))
  shape = tuple(num_devices // known if s == -1 else s for s in config.shape)
  if -1 in config.shape and (num_devices % known or known > num_devices):
    raise ConfigError(f'mesh.shape {config.shape}: the {num_devices} devices do not split into {known} for the '
                      f'other axes; make their product divide {num_devices}')
  if int(np.prod(shape)) > num_devices:
    raise ConfigError(f'mesh.shape {config.shape} does not fit {num_devices} devices; '
                      f'make the product equal the device count or put a -1 on one axis')
  return shape


def make_mesh(config: MeshConfig, devices=None) -> jax.sharding.Mesh:
  """The mesh of `config` over `devices` (default: all), the first ones if its shape takes fewer; in a run of
  several processes, as many of each process's (every process feeds its own rows to its own devices)."""
  devices = jax.devices() if devices is None else devices
  shape = mesh_shape(config, len(devices))
  taken = devices[:int(np.prod(shape))]
  if jax.process_count() > 1:
    per_process = [sum(d.process_index == p for d in taken) for p in range(jax.process_count())]
    if len(set(per_process)) > 1:
      raise ConfigError(f'mesh.shape {config.shape} takes {len(taken)} of the {len(devices)} devices ({per_process} '
                        f'of the {jax.process_count()} processes\' in turn), but each process feeds its own rows to '
                        'its own devices: make the product the device count, or put a -1 on one axis')
  return jax.make_mesh(shape, AXES, axis_types=(jax.sharding.AxisType.Auto,) * len(AXES), devices=taken)


@contextlib.contextmanager
def activate(mesh: jax.sharding.Mesh, rules):
  """The mesh and the logical axis rules in effect, so that the model's `nn.with_logical_constraint` calls on
  activations constrain them while a step is traced (outside this context they are no-ops)."""
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    yield


def axis_size(mesh, axes) -> int:
  """Number of devices along mesh axes `axes` (None, a name, or a tuple of names)."""
  if axes is None:
    return 1
  names = (axes,) if isinstance(axes, str) else tuple(axes)
  return int(np.prod([mesh.shape[name] for name in names]))


def logical_shardings(mesh, rules, logical_tree) -> Any:
  """Maps a tree of boxed abstract values (logical axis names) to NamedShardings on `mesh`.

  A dimension whose size is not divisible by the devices its rule gives it stays whole (replicated) along those
  axes, with a warning: e.g. a 30522-token vocabulary with 'vocab' on a 4-way 'tensor' axis.
  """
  shardings = nn.logical_to_mesh_sharding(nn.get_partition_spec(logical_tree), mesh, rules)
  shapes = nn.meta.unbox(logical_tree)
  undivided = []

  def fit(path, sharding, shape):
    spec = tuple(sharding.spec) + (None,) * (len(shape.shape) - len(sharding.spec))
    fitted = []
    for dim, (size, axes) in enumerate(zip(shape.shape, spec)):
      if size % axis_size(mesh, axes):
        undivided.append(f'{jax.tree_util.keystr(path)} dim {dim} ({size} over {axes})')
        axes = None
      fitted.append(axes)
    return NamedSharding(mesh, PartitionSpec(*fitted))

  shardings = jax.tree_util.tree_map_with_path(fit, shardings, shapes)
  if undivided:
    logging.warning('%d array dimension(s) are not divisible by the mesh axes their rule gives them and stay '
                    'replicated along those axes: %s. Sizes divisible by the mesh (e.g. a vocabulary padded to a '
                    'multiple of 128) avoid it.', len(undivided), '; '.join(undivided[:5]))
  return shardings


def batch_sharding(mesh, rules, axes=BATCH) -> NamedSharding:
  """Sharding of a [batch, length] input (of a [batch, ...] one with axes=BATCH[:1]): the batch split over the
  axes 'activation_batch' maps to."""
  return NamedSharding(mesh, nn.logical_to_mesh_axes(axes, rules))


def check_batch(mesh, rules, batch_size: int, grad_accum_steps: int = 1, name: str = 'batch_size'):
  """Raises ConfigError unless every micro-batch splits evenly over the devices the batch is sharded on, and the
  processes each feed their own rows. `name`: the config key that gave `batch_size`."""
  spec = batch_sharding(mesh, rules).spec
  devices = axis_size(mesh, spec[0] if spec else None)
  if batch_size % (grad_accum_steps * devices):
    accumulation = f'grad_accum_steps ({grad_accum_steps}) x ' if grad_accum_steps > 1 else ''
    raise ConfigError(f'{name} {batch_size} must be a multiple of {accumulation}the {devices} devices the batch is '
                      f'split over (mesh axes {spec[0] if spec else None}, mesh {dict(mesh.shape)})')
  if jax.process_count() > 1 and devices % jax.process_count():
    raise ConfigError(f'{jax.process_count()} processes each feed their own rows, so the batch must be split over '
                      f'a multiple of {jax.process_count()} devices; it is split over {devices} (mesh '
                      f'{dict(mesh.shape)}): put more devices on the data or fsdp axes')
  if jax.process_count() > 1:
    held = process_rows(batch_sharding(mesh, rules, BATCH[:1]), batch_size)
    if sum(len(rows) for rows in held.values()) != batch_size:  # rows held by several processes
      raise ConfigError(f'mesh.rules split the batch over mesh axes {spec[0] if spec else None} (mesh '
                        f'{dict(mesh.shape)}), along which the {jax.process_count()} processes hold the same rows, '
                        'but each process feeds rows of its own: map activation_batch to mesh axes across the '
                        "processes' devices, e.g. ('data', 'fsdp')")


def local_rows(batch: NamedSharding, batch_size: int) -> np.ndarray:
  """The rows of each global batch of `batch_size` that this process feeds under sharding `batch` (of a [batch,
  ...] array): those its devices hold, in order, which `global_batch` places at their positions. Each process's
  block of batch_size / processes rows on CPUs and GPUs; on a TPU slice jax lays the devices out in the slice's
  physical order, which interleaves the hosts' rows (a v4-32's four hosts: every fourth device's)."""
  rows = NamedSharding(batch.mesh, PartitionSpec(batch.spec[0] if batch.spec else None))
  return np.array(sorted(process_rows(rows, batch_size).get(jax.process_index(), ())), np.int64)


def process_rows(sharding: NamedSharding, batch_size: int) -> dict[int, set[int]]:
  """{process index: the rows of a [batch_size] array that its devices hold under `sharding`}."""
  held = {}
  for device, index in sharding.devices_indices_map((batch_size,)).items():
    held.setdefault(device.process_index, set()).update(range(*index[0].indices(batch_size)))
  return held


def replicated(mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec())


def global_batch(local_batch: dict[str, np.ndarray], sharding: NamedSharding) -> dict[str, jax.Array]:
  """Assembles this process's rows (`local_rows`, in order) into global arrays."""
  return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in local_batch.items()}


def _whole_number(key: str, default: int, minimum: int, unit: str = '') -> int:
  """Environment variable `key` (`default` when unset) as an int: anything but a whole number (of `unit`) of at
  least `minimum` is a ConfigError in one line, not a traceback from int()."""
  value = os.environ.get(key, str(default)).strip()
  if not value.isdigit() or int(value) < minimum:
    raise ConfigError(f'{key}={value} must be a whole number{f" of {unit}" if unit else ""}, at least {minimum}')
  return int(value)


def initialize_distributed():
  """Starts jax.distributed when this is one process of a multi-process job; a no-op otherwise.

  Explicit: JAX_COORDINATOR_ADDRESS=host:port, JAX_NUM_PROCESSES and JAX_PROCESS_ID (any cluster, localhost tests).
  Detected by jax itself: SLURM jobs of several tasks (one process per GPU, as jax's SLURM support assumes), GKE
  TPU pods (TPU_WORKER_HOSTNAMES), and whatever jax detects when ELECTRA_JAX_DISTRIBUTED=1 (Cloud TPU VM pod
  slices, which set no environment variable jax could be told apart by; launch/tpu_pod.sh sets it).

  Bounded waits (docs/faults.md, "On a pod"), in seconds, jax's defaults unless set:
  ELECTRA_JAX_START_TIMEOUT (300): how long each process waits for all of them to join at the start (a host that
  stopped before, e.g. on a bad ELECTRA_JAX_* variable, never joins: then the others stop with one line);
  ELECTRA_JAX_HEARTBEAT_TIMEOUT (100): how long the others wait for a process that stopped responding (killed,
  crashed, its machine gone) before they abort too; ELECTRA_JAX_SHUTDOWN_TIMEOUT (300): how long an exiting
  process waits for the others to exit too (after an error on one host, the others are stuck in a collective:
  then they all abort).
  """
  env = os.environ
  seconds = {name: _whole_number(f'ELECTRA_JAX_{name.upper()}_TIMEOUT', default, 1, 'seconds')
             for name, default in (('start', 300), ('heartbeat', 100), ('shutdown', 300))}
  timeouts = dict(initialization_timeout=seconds['start'] + 10,  # jax's own, after hosts.joined_within's line
                  heartbeat_timeout_seconds=seconds['heartbeat'], shutdown_timeout_seconds=seconds['shutdown'])
  if 'JAX_COORDINATOR_ADDRESS' in env:
    missing = [k for k in ('JAX_NUM_PROCESSES', 'JAX_PROCESS_ID') if k not in env]
    if missing:
      raise ConfigError(f'JAX_COORDINATOR_ADDRESS is set but {" and ".join(missing)} not: set all three')
    job = dict(coordinator_address=env['JAX_COORDINATOR_ADDRESS'],
               num_processes=_whole_number('JAX_NUM_PROCESSES', 1, 1, 'processes'),
               process_id=_whole_number('JAX_PROCESS_ID', 0, 0))
    if job['process_id'] >= job['num_processes']:
      raise ConfigError(f'JAX_PROCESS_ID={job["process_id"]} must be below JAX_NUM_PROCESSES={job["num_processes"]} '
                        '(processes are numbered from 0)')
  elif (tasks := _whole_number('SLURM_NTASKS', 1, 1, 'tasks')) > 1:
    if missing := [k for k in SLURM_TASK_VARIABLES if k not in env]:  # jax's SLURM detection needs them all
      raise ConfigError(f'SLURM_NTASKS={tasks} but this process is not one of the job\'s srun tasks '
                        f'({", ".join(missing)} unset): start it with srun (launch/gpu_slurm.sbatch does), or unset '
                        'SLURM_NTASKS to run one process')
    job = {}  # jax finds the coordinator and this process's place itself
  elif ',' in env.get('TPU_WORKER_HOSTNAMES', '') or env.get('ELECTRA_JAX_DISTRIBUTED') == '1':
    job = {}
  else:
    return  # one process
  with hosts.joined_within(seconds['start']):
    try:
      jax.distributed.initialize(**job, **timeouts)
    except ValueError as e:  # found no cluster (ELECTRA_JAX_DISTRIBUTED=1 off a TPU slice, say)
      if job:
        raise
      raise ConfigError(f'jax.distributed found no job this process is part of ({e}); on a Cloud TPU slice run '
                        'launch/tpu_pod.sh, elsewhere set JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and '
                        'JAX_PROCESS_ID') from None
  if jax.process_count() > 1 and jax.default_backend() == 'cpu':
    # gloo (CPU collectives) connects the processes at their first collective and gives up if one is 30 s late,
    # which start-up, data loading and compiling on loaded hosts can exceed. Connected now, while the processes are
    # in step (jax.distributed.initialize just met them all), later collectives over all devices wait as needed.
    multihost_utils.sync_global_devices('electra_jax: processes connected')
