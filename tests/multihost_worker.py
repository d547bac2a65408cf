"""One process of the 2-process test in test_multihost.py; run as `python tests/multihost_worker.py OUT_DIR`.

jax.distributed starts from JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID (as
`sharding.initialize_distributed` reads them in any multi-host job); this process feeds only its own rows of the
shared tiny batch, trains 10 steps on a data x FSDP mesh spanning both processes, writes metrics through
MetricsWriter (process 0 only) and a checkpoint through orbax (all processes). Exit code 3: this jax has no CPU
collectives.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax

from electra_jax import metrics as metrics_lib, sharding
from electra_jax.checkpoint import Checkpointer
import scale_setup as setup

MESH = (2, 2, 1)  # data across the two processes, FSDP within each


def main(out_dir):
  sharding.initialize_distributed()
  assert jax.process_count() == 2 and jax.device_count() == 4, (jax.process_count(), jax.device_count())
  run = setup.pretraining(MESH)
  try:
    state = run.init_state(jax.random.PRNGKey(0))  # sharded over both processes
    jax.block_until_ready(state)
  except Exception as e:  # pylint: disable=broad-except
    if 'collective' in str(e).lower() or 'multiprocess' in str(e).lower().replace('-', ''):
      print(f'no CPU collectives in this jax build: {e}', file=sys.stderr)
      sys.exit(3)
    raise
  rows = setup.B // jax.process_count()
  mine = slice(jax.process_index() * rows, (jax.process_index() + 1) * rows)
  batch = sharding.global_batch({k: v[mine] for k, v in setup.numpy_batch().items()}, run.batch_sharding)
  writer = metrics_lib.MetricsWriter(out_dir)
  step_fn = setup.compiled_step(MESH)
  for step in range(1, setup.STEPS + 1):
    state, metrics = step_fn(state, batch, setup.replicated_rng(run))
    writer.write(step, metrics_lib.summarize(metrics))
  writer.close()
  assert int(state.step) == setup.STEPS  # a replicated value reads on every process, as the trainer does
  checkpointer = Checkpointer(out_dir)
  checkpointer.save(setup.STEPS, state, {'process_count': jax.process_count()})
  checkpointer.close()
  with open(os.path.join(out_dir, f'done.{jax.process_index()}.json'), 'w', encoding='utf-8') as f:
    json.dump({'local_devices': jax.local_device_count()}, f)


if __name__ == '__main__':
  main(sys.argv[1])
