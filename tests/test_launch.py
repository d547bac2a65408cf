"""The GPU launch scripts (launch/): bash syntax, the exact command and environment each builds (DRY_RUN=1), and
that jax 0.10.2's XLA knows every XLA flag they set."""

import os
import shlex
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASH = shutil.which('bash')
SCRIPTS = ('launch/gpu_env.sh', 'launch/gpu_single_node.sh', 'launch/gpu_slurm.sbatch', 'launch/tpu_pod.sh')
FLAGS = ('--xla_gpu_enable_latency_hiding_scheduler=true --xla_gpu_enable_highest_priority_async_stream=true '
         '--xla_gpu_all_reduce_combine_threshold_bytes=134217728 '
         '--xla_gpu_all_gather_combine_threshold_bytes=134217728 '
         '--xla_gpu_reduce_scatter_combine_threshold_bytes=67108864')


def bash(*args, **env):
  clean = {k: v for k, v in os.environ.items() if not k.startswith(('XLA_', 'NCCL_', 'SLURM_', 'GPUS', 'CONFIG'))}
  return subprocess.run([BASH, *args], cwd=REPO, env={**clean, **env}, capture_output=True, text=True, check=False)


@pytest.mark.parametrize('script', SCRIPTS)
def test_syntax(script):
  result = bash('-n', script)
  assert result.returncode == 0, result.stderr


def dry_run(script, *args, **env) -> dict:
  result = bash(script, *args, DRY_RUN='1', **env)
  assert result.returncode == 0, result.stderr
  *assignments, command = result.stdout.splitlines()
  return dict(shlex.split(a)[0].split('=', 1) for a in assignments) | {'command': shlex.split(command)}


def test_single_node_command():
  got = dry_run('launch/gpu_single_node.sh', '--config.train_steps=10', WORKDIR='runs/base', GPUS='8')
  assert got == {'XLA_PYTHON_CLIENT_MEM_FRACTION': '0.9', 'XLA_FLAGS': FLAGS, 'NCCL_DEBUG': 'WARN',
                 'command': ['python3', '-m', 'electra_jax.main', '--config=configs/base.py:gpu:8',
                             '--workdir=runs/base', '--config.train_steps=10']}


def test_slurm_command_keeps_the_users_settings():
  got = dry_run('launch/gpu_slurm.sbatch', '--config.data.source=/data/my corpus', WORKDIR='/shared/large',
                SLURM_NTASKS='16', SLURM_SUBMIT_DIR=REPO, XLA_FLAGS='--xla_dump_to=/tmp/hlo',
                XLA_PYTHON_CLIENT_MEM_FRACTION='.8', NCCL_SOCKET_IFNAME='ib0')
  assert got == {'XLA_PYTHON_CLIENT_MEM_FRACTION': '.8', 'XLA_FLAGS': FLAGS + ' --xla_dump_to=/tmp/hlo',
                 'NCCL_DEBUG': 'WARN', 'NCCL_SOCKET_IFNAME': 'ib0',
                 'command': ['srun', '--kill-on-bad-exit=1', 'python3', '-m', 'electra_jax.main',
                             '--config=configs/large.py:gpu:16', '--workdir=/shared/large',
                             '--config.data.source=/data/my corpus']}
  got = dry_run('launch/gpu_slurm.sbatch', WORKDIR='/w', SLURM_NTASKS='8', SLURM_SUBMIT_DIR=REPO,
                CONFIG='configs/small.py:gpu:8')
  assert got['command'][5] == '--config=configs/small.py:gpu:8'


def test_tpu_pod_command_runs_the_entry_point_on_every_worker():
  got = dry_run('launch/tpu_pod.sh', "--config.tasks='a','b'", '--config.data.source=/data/my corpus',
                TPU_NAME='electra-v4-32', ZONE='us-central2-b', BUCKET='bkt', CONFIG='configs/small.py:quickstart')
  *gcloud, remote = got['command']
  assert gcloud == ['gcloud', 'compute', 'tpus', 'tpu-vm', 'ssh', 'electra-v4-32', '--zone', 'us-central2-b',
                    '--worker=all', '--command']
  # What each worker's shell runs: $HOME expanded there, each argument as typed here.
  assert shlex.split(remote) == ['cd', '$HOME/electra_jax', '&&', 'ELECTRA_JAX_DISTRIBUTED=1', '.venv/bin/python', '-m',
                                 'electra_jax.main', '--config=configs/small.py:quickstart',
                                 '--workdir=gs://bkt/electra/small_quickstart', "--config.tasks='a','b'",
                                 '--config.data.source=/data/my corpus']
  got = dry_run('launch/tpu_pod.sh', TPU_NAME='t', ZONE='z', BUCKET='b', REPO='/opt/my repo', PYTHON='python3.12')
  assert shlex.split(got['command'][-1])[:5] == ['cd', '/opt/my repo', '&&', 'ELECTRA_JAX_DISTRIBUTED=1', 'python3.12']
  got = dry_run('launch/tpu_pod.sh', TPU_NAME='t', ZONE='z', BUCKET='b', REPO='~/src/electra_jax')  # ~ in quotes: $HOME
  assert shlex.split(got['command'][-1])[1] == '$HOME/src/electra_jax'
  assert '--workdir=gs://b/electra/large' in shlex.split(got['command'][-1])


@pytest.mark.parametrize('script, env, message', [
    ('launch/gpu_single_node.sh', {}, 'WORKDIR: set WORKDIR'),
    ('launch/gpu_single_node.sh', {'WORKDIR': 'w', 'PATH': 'NO_NVIDIA_SMI'},
     'no GPU found by nvidia-smi: set GPUS=N (how many this machine has)'),
    # nvidia-smi failing (no driver, a mismatched one) prints its error on stdout: those lines are no GPUs.
    ('launch/gpu_single_node.sh', {'WORKDIR': 'w', 'PATH': 'FAILING_NVIDIA_SMI'},
     'no GPU found by nvidia-smi: set GPUS=N (how many this machine has)'),
    ('launch/gpu_single_node.sh', {'WORKDIR': 'w', 'CUDA_VISIBLE_DEVICES': ''},
     'no GPU found: CUDA_VISIBLE_DEVICES is empty; set GPUS=N or CUDA_VISIBLE_DEVICES'),
    ('launch/gpu_slurm.sbatch', {'WORKDIR': 'w'}, 'SLURM_NTASKS: run it with sbatch (SLURM_NTASKS is not set)'),
    ('launch/gpu_slurm.sbatch', {'WORKDIR': 'w', 'SLURM_NTASKS': '8', 'SLURM_SUBMIT_DIR': '/nonexistent'},
     'no /nonexistent/launch/gpu_env.sh: sbatch this script from the repository\'s root'),
])
def test_missing_setting_is_one_line(script, env, message, tmp_path):
  if env.get('PATH', '').endswith('NVIDIA_SMI'):  # the tools the script uses, without a working nvidia-smi
    for tool in ('dirname', 'grep'):
      os.symlink(shutil.which(tool), tmp_path / tool)
    if env['PATH'] == 'FAILING_NVIDIA_SMI':
      _write_tool(tmp_path / 'nvidia-smi', 'echo "NVIDIA-SMI has failed because it couldn\'t communicate with the '
                  'NVIDIA driver."; echo; exit 9')
    env = {**env, 'PATH': str(tmp_path)}
  result = bash(script, DRY_RUN='1', **env)
  assert result.returncode != 0 and result.stdout == ''
  assert result.stderr.strip().endswith(message) and len(result.stderr.strip().splitlines()) == 1


def _write_tool(path, body):
  path.write_text(f'#!{BASH}\n{body}\n')
  path.chmod(0o755)


def test_single_node_counts_the_gpus_cuda_may_use(tmp_path):
  """NVML lists every GPU of the machine; CUDA_VISIBLE_DEVICES says how many the run gets (the preset's gradient
  accumulation is sized by it)."""
  _write_tool(tmp_path / 'nvidia-smi', 'for i in 0 1 2 3; do echo "GPU $i: NVIDIA H100 80GB HBM3 (UUID: GPU-$i)"; done')
  path = f'{tmp_path}:{os.environ["PATH"]}'
  assert dry_run('launch/gpu_single_node.sh', WORKDIR='w', PATH=path)['command'][3] == '--config=configs/base.py:gpu:4'
  got = dry_run('launch/gpu_single_node.sh', WORKDIR='w', PATH=path, CUDA_VISIBLE_DEVICES='0,1')
  assert got['command'][3] == '--config=configs/base.py:gpu:2'


def test_xla_knows_every_flag():
  """XLA aborts on a flag it does not know (MaxText's --xla_gpu_pipeline_all_gather, say, which jaxlib 0.10 lacks
  and 0.11 has): jaxlib's CPU client parses XLA_FLAGS with the same XLA as the CUDA plugin of the same version."""
  check = f'source launch/gpu_env.sh && {shlex.quote(sys.executable)} -c "import jax; jax.devices()"'
  known = bash('-c', check, JAX_PLATFORMS='cpu')
  assert known.returncode == 0, known.stderr
  unknown = bash('-c', check, JAX_PLATFORMS='cpu', XLA_FLAGS='--xla_gpu_no_such_flag=on')  # in no XLA
  assert unknown.returncode != 0 and 'Unknown flag in XLA_FLAGS: --xla_gpu_no_such_flag=on' in unknown.stderr
