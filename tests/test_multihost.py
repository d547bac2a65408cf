"""Two processes on localhost (jax.distributed with CPU collectives), each feeding its own rows, train as one."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from electra_jax import sharding
from electra_jax.checkpoint import Checkpointer
import scale_setup as setup
from scale_setup import ATOL_PARAMS, RTOL
from helpers import free_port  # pylint: disable=g-bad-import-order

# Two processes starting and compiling take ~4 min of a loaded 2-core machine: with the entry point's multi-process
# runs, apart from the default suite (`python -m pytest -q -n 2 -m multihost tests`, .ci/run).
pytestmark = pytest.mark.multihost

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'multihost_worker.py')
TIMEOUT = 300  # seconds; the run itself takes ~15 s on two idle cores


def _run_two_processes(out_dir):
  port = free_port()
  procs = []
  for process_id in range(2):
    env = dict(os.environ, JAX_PLATFORMS='cpu', JAX_COORDINATOR_ADDRESS=f'127.0.0.1:{port}', JAX_NUM_PROCESSES='2',
               JAX_PROCESS_ID=str(process_id),
               XLA_FLAGS='--xla_force_host_platform_device_count=2 --xla_backend_optimization_level=0')
    procs.append(subprocess.Popen([sys.executable, WORKER, str(out_dir)], env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True))
  outputs = []
  try:
    for proc in procs:
      outputs.append(proc.communicate(timeout=TIMEOUT)[0])
  finally:
    for proc in procs:
      if proc.poll() is None:
        proc.kill()
        proc.wait()
  return [proc.returncode for proc in procs], outputs


def test_two_processes_train_like_one_device(tmp_path):
  codes, outputs = _run_two_processes(tmp_path)
  if 3 in codes:
    pytest.skip(f'this jax build has no CPU collectives: {outputs[codes.index(3)][-500:]}')
  assert codes == [0, 0], '\n'.join(out[-3000:] for out in outputs)
  assert [json.loads((tmp_path / f'done.{i}.json').read_text())['local_devices'] for i in range(2)] == [2, 2]
  # Only process 0 logs: one line per step, not two.
  with open(tmp_path / 'metrics.jsonl', encoding='utf-8') as f:
    logged = [json.loads(line) for line in f]
  assert [m['step'] for m in logged] == list(range(1, setup.STEPS + 1))
  reference, reference_state = setup.trained()
  np.testing.assert_allclose([m['loss'] for m in logged],
                             [num / den for num, den in (m['loss'] for m in reference)], rtol=RTOL)
  np.testing.assert_allclose([m['gen_accuracy'] for m in logged],
                             [num / den for num, den in (m['gen_accuracy'] for m in reference)], rtol=1e-6)
  # The checkpoint both processes wrote restores here, on one device, to the one-device run's parameters.
  checkpointer = Checkpointer(tmp_path)
  run = setup.pretraining()
  state, data_state = checkpointer.restore(setup.STEPS, run.abstract_state())
  checkpointer.close()
  assert data_state == {'process_count': 2}
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL_PARAMS), setup.host(state.params),
               reference_state.params)


def test_partial_distributed_environment_is_a_clear_error(monkeypatch):
  monkeypatch.setenv('JAX_COORDINATOR_ADDRESS', '127.0.0.1:1234')
  monkeypatch.delenv('JAX_NUM_PROCESSES', raising=False)
  monkeypatch.setenv('JAX_PROCESS_ID', '0')
  with pytest.raises(sharding.ConfigError, match='JAX_NUM_PROCESSES not: set all three'):
    sharding.initialize_distributed()


@pytest.mark.parametrize('name', ['ELECTRA_JAX_START_TIMEOUT', 'ELECTRA_JAX_HEARTBEAT_TIMEOUT',
                                  'ELECTRA_JAX_SHUTDOWN_TIMEOUT'])
def test_a_bad_timeout_is_a_clear_error(monkeypatch, name):
  monkeypatch.setenv('JAX_COORDINATOR_ADDRESS', '127.0.0.1:1234')
  monkeypatch.setenv(name, '1m')
  with pytest.raises(sharding.ConfigError, match=f'{name}=1m must be a whole number of seconds'):
    sharding.initialize_distributed()


@pytest.mark.parametrize('environment, message', [
    ({'JAX_COORDINATOR_ADDRESS': '127.0.0.1:1234', 'JAX_NUM_PROCESSES': 'two', 'JAX_PROCESS_ID': '0'},
     'JAX_NUM_PROCESSES=two must be a whole number of processes, at least 1'),
    ({'JAX_COORDINATOR_ADDRESS': '127.0.0.1:1234', 'JAX_NUM_PROCESSES': '2', 'JAX_PROCESS_ID': '-1'},
     'JAX_PROCESS_ID=-1 must be a whole number, at least 0'),
    ({'SLURM_NTASKS': 'x'}, 'SLURM_NTASKS=x must be a whole number of tasks, at least 1'),
    ({'JAX_COORDINATOR_ADDRESS': '127.0.0.1:1234', 'JAX_NUM_PROCESSES': '2', 'JAX_PROCESS_ID': '2'},
     'JAX_PROCESS_ID=2 must be below JAX_NUM_PROCESSES=2 (processes are numbered from 0)'),
    # A job of 8 tasks whose script runs python itself, not through srun (jax: 'coordinator_address should be
    # defined', a traceback).
    ({'SLURM_NTASKS': '8', 'SLURM_JOB_ID': '123'},
     'SLURM_NTASKS=8 but this process is not one of the job\'s srun tasks (SLURM_STEP_NODELIST, SLURM_PROCID, '
     'SLURM_LOCALID unset): start it with srun (launch/gpu_slurm.sbatch does), or unset SLURM_NTASKS to run one '
     'process'),
])
def test_a_bad_process_count_is_a_clear_error(monkeypatch, environment, message):
  """The job's size and place are read before anything starts: a value int() cannot read is one line, not a
  traceback (as for the timeouts above)."""
  for name in ('JAX_COORDINATOR_ADDRESS', 'SLURM_NTASKS', *sharding.SLURM_TASK_VARIABLES):
    monkeypatch.delenv(name, raising=False)
  for name, value in environment.items():
    monkeypatch.setenv(name, value)
  with pytest.raises(sharding.ConfigError) as error:
    sharding.initialize_distributed()
  assert str(error.value) == message


# Two runs in one process, as fine-tuning does for each seed: each enters the hosts' watch and leaves it normally.
TWO_WATCHES = """
from electra_jax import hosts, sharding
sharding.initialize_distributed()
for run in range(2):
  with hosts.Watch():
    pass
print('two watches ended normally')
"""


def test_a_second_watch_in_one_process_ends_normally():
  port = free_port()
  procs = [subprocess.Popen(
      [sys.executable, '-c', TWO_WATCHES], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
      env=dict(os.environ, JAX_PLATFORMS='cpu', JAX_COORDINATOR_ADDRESS=f'127.0.0.1:{port}', JAX_NUM_PROCESSES='2',
               JAX_PROCESS_ID=str(i))) for i in range(2)]
  outputs = [proc.communicate(timeout=TIMEOUT)[0] for proc in procs]
  assert [proc.returncode for proc in procs] == [0, 0], outputs
  assert all('two watches ended normally' in out for out in outputs), outputs
