"""The GPU path that can be checked without a GPU: the device line every run prints, the warning when an NVIDIA GPU
is visible but JAX runs on the CPU, the GPU quickstart's config, and the GPU check's stages in --tiny mode."""

import dataclasses
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from configs import small
from electra_jax import config as config_lib, report, scaffold, sharding
from electra_jax.masking import SpecialIds
from electra_jax.train_step import Pretraining

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_nvidia_gpu_visible_by_the_driver_or_nvidia_smi(tmp_path, monkeypatch):
  monkeypatch.setenv('PATH', str(tmp_path))  # no nvidia-smi
  assert not report.nvidia_gpu_visible(str(tmp_path / 'no_driver'))
  (tmp_path / 'driver').mkdir()
  assert report.nvidia_gpu_visible(str(tmp_path / 'driver'))
  smi = tmp_path / 'nvidia-smi'
  smi.write_text('#!/bin/sh\n')
  smi.chmod(0o755)
  assert report.nvidia_gpu_visible(str(tmp_path / 'no_driver'))


def test_device_line_names_platform_count_and_kind(monkeypatch):
  monkeypatch.setattr(report, 'nvidia_gpu_visible', lambda: False)
  line = report.devices_line()
  assert line == (f'devices: {jax.device_count()} x cpu (cpu), 1 process, jax {jax.__version__}')


def test_a_visible_gpu_unused_by_jax_is_a_one_line_warning(monkeypatch):
  monkeypatch.setattr(report, 'nvidia_gpu_visible', lambda: True)
  lines = report.devices_line().splitlines()
  assert len(lines) == 2 and lines[1].startswith('warning: an NVIDIA GPU is visible but JAX runs on the CPU')
  assert f'pip install "jax[cuda12]=={jax.__version__}"' in lines[1]


def test_gpu_quickstart_is_small_with_a_vocabulary_the_builtin_corpus_supports():
  c = config_lib.load(small.get_config('quickstart'), vocab_size=8000)
  paper = config_lib.load(small.get_config(), vocab_size=30522)
  assert c.model.num_layers == paper.model.num_layers == 12 and c.model.hidden_size == 256
  assert c.batch_size == 128 and c.data.max_seq_length == 128
  assert c.data.vocab_size == 8000 and c.data.source == ''  # the built-in corpus, which cannot train 30522 pieces
  assert c.model.dropout_rate == paper.model.dropout_rate == 0.1


@pytest.mark.parametrize('preset', ['', 'quickstart', 'gpu', 'gpu:2'])
def test_small_runs_five_steps_a_call_and_its_periods_allow_it(preset):
  # 5 steps a call (measured: the quickstart's loop 2.7x on an H200); the trainer refuses periods that are not
  # multiples of 5, so every variant's must be (the refusal itself: tests/test_config.py).
  c = config_lib.load(small.get_config(preset), vocab_size=8000)
  assert c.steps_per_call == 5
  c.check_steps_per_call()
  with pytest.raises(config_lib.ConfigError, match='multiples of 5: log_every'):
    dataclasses.replace(c, log_every=c.log_every + 1).check_steps_per_call()


@pytest.mark.e2e  # compiles and trains tiny models in subprocesses (about two minutes on 2 cores)
def test_gpu_check_tiny_runs_every_stage(tmp_path):
  out = tmp_path / 'check'
  done = subprocess.run([sys.executable, 'bench/gpu_check.py', str(out), '--tiny', '--budget=3000'], cwd=REPO,
                        capture_output=True, text=True, timeout=3600, check=False)
  assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
  rows = [json.loads(line) for line in (out / 'results.jsonl').read_text().splitlines()]
  profiled = 'command buffers off'  # gpu_check.PROFILED[0]
  compiles = ['compile: XLA defaults', 'compile: fusion autotuner off',
              'compile: autotune results of the first compile', 'compile: fused_qkv off, dropout_draw=rbg',
              'compile: autotune off', 'compile: autotune level 1', 'compile: scan_layers']
  assert [r['stage'] for r in rows] == ['versions', 'small', 'quickstart', 'resume', 'loop', 'loop, 1 step a call',
                                        *compiles, 'base',
                                        'lever compiles', f'lever: {profiled}', 'lever: prng=rbg',
                                        'lever: 1 step a call']
  assert all(r['status'] == 'ok' for r in rows), rows
  assert rows[1]['tokens_per_second'] > 0 and rows[1]['torch_step_seconds'] > 0
  assert rows[1]['steps_per_call'] == 5 and 'a call of 5 steps returns in ' in rows[1]['result']  # as Small
  assert rows[2]['checkpoint'] and rows[3]['first_step_seconds'] > 0
  printed = rows[3]['printed_at']  # when the resumed run printed each line, in seconds from its launch
  assert 0 < printed['compiling the train step...'] < rows[3]['first_step_seconds'], printed
  assert '(at ' in rows[3]['result']
  assert re.match(r'the loop: [0-9.]+ ms per step on the host over 19 steps \(batch [0-9.]+ ms', rows[5]['result'])
  assert re.match(r'the loop: [0-9.]+ ms per step on the host over 15 steps .* 5 step\(s\) a call', rows[4]['result'])
  assert all(r['compile_seconds'] > 0 and 'step compiled in ' in r['result'] for r in rows[6:13])
  lever_compiles, levers = rows[14]['compile'], rows[15:]
  assert set(lever_compiles) == {profiled, 'prng=rbg', '1 step a call'}  # each lever's step beside the others
  assert all('read from the cache' in r['result'] and r['compile_seconds'] < lever_compiles[r['stage'][7:]]
             for r in levers)
  assert 'profile: ' in levers[0]['result'] and levers[0]['profile_ms']['model'] > 0 and levers[0]['profile_top']
  measured, least = levers[0]['profile_least_ms']['fusion']  # XLA:CPU's fusions against their bytes' least time
  assert least > 0 and f'fusion {least / measured:.0%} of {measured:.2f} ms' in levers[0]['result']
  assert levers[2]['steps_per_call'] == 1 and 'a call returns in ' in levers[2]['result']
  trace = out / 'trace' / 'command_buffers_off'
  assert 'HloModule' in (trace / 'train_step.hlo.txt').read_text() and list(trace.glob('**/*.xplane.pb'))
  table = (out / 'table.md').read_text()
  assert table.startswith('| stage | status | seconds | result |') and done.stdout.rstrip().endswith(
      table.rstrip().splitlines()[-1])


def _gpu_check():
  spec = importlib.util.spec_from_file_location('gpu_check', os.path.join(REPO, 'bench', 'gpu_check.py'))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_gpu_check_reads_xla_s_log_of_its_cuda_graphs_and_a_result_line_a_log_line_ran_into():
  """The GPU check's timed runs log XLA's command-buffer thunk (GRAPH_LOG): launches, and the updates before some of
  them when buffers moved. Lines as XLA:GPU writes them (xla/backends/gpu/runtime/command_buffer_thunk.cc)."""
  gpu_check = _gpu_check()
  prefix = 'I1128 10:00:00.000000   4242 command_buffer_thunk.cc:{}] '
  update = ('Update command buffer on device #0 by recoding command buffer cmd sequence after {} executions since '
            'last update; num_commands={}; updated_allocs={}')
  output = '\n'.join([
      'step 1',
      prefix.format(301) + 'Execute command buffer on device #0; num_executions=1',
      prefix.format(270) + update.format(1, 1750, 3),
      prefix.format(288) + 'Updated command buffer in 5200 \u03bcs; num_commands=1750',
      prefix.format(301) + 'Execute command buffer on device #0; num_executions=1',
      prefix.format(270) + update.format(1, 12, 1),
      prefix.format(288) + 'Updated command buffer in 800 \u03bcs; num_commands=12',
      prefix.format(301) + 'Execute command buffer on device #0; num_executions=1',
      'RESULT {"step_seconds": 0.02}' + prefix.format(301) + 'Execute command buffer on device #0; num_executions=2',
  ])
  log, note = gpu_check.graph_updates(output)
  assert log == {'launches': 4, 'updates': 2, 'update_us': 6000, 'commands': [1750, 12], 'moved': [3, 1]}
  # The graph of 1750 commands took 5.2 of the 6.0 ms.
  assert note == ("; CUDA graphs (XLA's log): 4 launches, 2 after an update, 6.0 ms of updates in all; most of it a "
                  'graph of 1750 commands, updated 1 time, 5200 us each, 3 buffers moved (medians)')
  # jax 0.11.2's XLA words them otherwise (lines from an H200, 2026-11-28): the same numbers.
  newer = '\n'.join([
      prefix.format(371) + '[0] Execute command buffer; num_executions=1',
      prefix.format(336) + '[0] Create/Update command buffer by recoding command buffer cmd sequence after 1 '
      'executions since last update; num_commands=1785; updated_allocs=27; is_first_record=false; needs_update=true',
      prefix.format(362) + '[0] Updated command buffer in 6228 \u03bcs; num_commands=1785',
      prefix.format(371) + '[0] Execute command buffer; num_executions=2',
  ])
  log, note = gpu_check.graph_updates(newer)
  assert log == {'launches': 2, 'updates': 1, 'update_us': 6228, 'commands': [1785], 'moved': [27]}
  assert gpu_check.graph_updates('step 1\nstep 2') == (None, '')  # a CPU, or a GPU without command buffers
  assert gpu_check._result(output) == {'step_seconds': 0.02}  # pylint: disable=protected-access


def test_gpu_check_skips_a_lever_whose_xla_flag_this_jax_does_not_know(tmp_path, monkeypatch):
  """XLA aborts on a flag it does not know (levers are read from XLA's newest source; the GPU image's jax may be
  older): the lever's compile fails at once, and its timing is skipped with the flag named, not run again."""
  gpu_check = _gpu_check()
  monkeypatch.setattr(gpu_check, 'LEVERS', {'bogus': ({'XLA_FLAGS': '--xla_gpu_no_such_flag=true'}, [])})
  monkeypatch.setattr(gpu_check, 'TINY_LEVERS', ('bogus',))
  check = gpu_check.Check(str(tmp_path), tiny=True, budget=300, python=sys.executable)
  check.levers()
  assert [row[:2] for row in check.rows] == [('lever compiles', '0 of 1'), ('lever: bogus', 'skipped')]
  assert check.rows[1][3] == "this jax's XLA has no flag --xla_gpu_no_such_flag=true"


@pytest.mark.e2e  # trains in a subprocess (about 40 s on 2 cores)
def test_loop_overhead_times_the_training_loop_alone(tmp_path):
  """bench/loop_overhead.py runs the real training loop with a step that returns at once and prints its host time."""
  done = subprocess.run([sys.executable, 'bench/loop_overhead.py', str(tmp_path / 'run'), '--steps=30'], cwd=REPO,
                        capture_output=True, text=True, timeout=900, check=False,
                        env={**os.environ, 'ELECTRA_JAX_CACHE': str(tmp_path / 'cache')})
  assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
  # The quickstart's 5 steps a call: the first call's 5 steps (the compile) are not counted.
  assert re.search(r'the loop: [0-9.]+ ms per step on the host over 25 steps .* 5 step\(s\) a call',
                   done.stdout), done.stdout[-2000:]
  assert json.loads((tmp_path / 'run' / 'metrics.jsonl').read_text().splitlines()[-1])['step'] == 30


def test_the_initialiser_on_the_host_gives_the_devices_state(monkeypatch):
  """ELECTRA_JAX_INIT=host (the GPU default for states of up to 8 GiB) computes the state on the CPU and lays it
  over the devices: the same values in the same shardings as the jitted initialiser (both on a CPU here)."""
  c = config_lib.load({'batch_size': 8, 'data': {'max_seq_length': 16}, 'mesh': {'shape': (-1, 2, 1)},
                       'model': {'vocab_size': 50, 'embedding_size': 16, 'hidden_size': 16, 'num_layers': 1,
                                 'num_heads': 1, 'intermediate_size': 32, 'max_position_embeddings': 16}})
  run = Pretraining(c, SpecialIds(pad=0, cls=2, sep=3, mask=4), sharding.make_mesh(c.mesh))
  assert not run._init.on_host()  # pylint: disable=protected-access  (auto: the device on a CPU)
  on_device = run.init_state(jax.random.PRNGKey(3))
  monkeypatch.setenv('ELECTRA_JAX_INIT', 'host')
  on_host = run.init_state(jax.random.PRNGKey(3))
  for a, b in zip(jax.tree.leaves(on_device), jax.tree.leaves(on_host)):
    assert a.sharding == b.sharding and a.dtype == b.dtype
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_threefry_kernels_on_gpus_unless_the_user_says_otherwise(monkeypatch):
  """The train step and the initialiser are lowered with threefry's CUDA kernel on GPUs (a CPU ignores the
  setting); a JAX_THREEFRY_GPU_KERNEL_LOWERING the user set is kept."""
  monkeypatch.delenv('JAX_THREEFRY_GPU_KERNEL_LOWERING', raising=False)
  with scaffold.threefry_kernels():
    assert jax.config.jax_threefry_gpu_kernel_lowering
  assert not jax.config.jax_threefry_gpu_kernel_lowering
  monkeypatch.setenv('JAX_THREEFRY_GPU_KERNEL_LOWERING', 'false')
  with scaffold.threefry_kernels():
    assert not jax.config.jax_threefry_gpu_kernel_lowering


def test_gpu_check_levers_named_whole_are_those_alone():
  """--levers: a whole name is that lever ('fused_qkv off' is not also 'fused_qkv off, dropout_draw=rbg'); another
  word is the beginning of names."""
  gpu_check = _gpu_check()
  names = ['none', 'fused_qkv off, dropout_draw=rbg', 'fused_qkv off', 'Base: none', 'Base: fused_qkv off']
  assert gpu_check.chosen(names, ('fused_qkv off', 'Base: none')) == ['fused_qkv off', 'Base: none']
  assert gpu_check.chosen(names, ('fused', 'Base')) == names[1:]
  assert gpu_check.chosen(names, ()) == names


@pytest.mark.e2e  # the check's first stages in subprocesses (about 10 s)
def test_a_stopped_gpu_check_kills_its_stage_and_writes_the_table(tmp_path):
  """A time limit's SIGTERM: the stage running (a process group of its own) is killed, nothing of the check is left
  running, and table.md holds the rows before with a STOPPED one."""
  out = tmp_path / 'check'
  check = subprocess.Popen([sys.executable, 'bench/gpu_check.py', str(out), '--tiny', '--stages=versions,small'],
                           cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  log = out / 'logs' / 'small.log'
  while not log.exists() and check.poll() is None:
    time.sleep(0.05)
  time.sleep(1)
  stage = [int(pid) for pid in subprocess.run(['pgrep', '-P', str(check.pid)], capture_output=True, text=True,
                                              check=False).stdout.split()]
  stage += [int(pid) for parent in stage for pid in subprocess.run(
      ['pgrep', '-P', str(parent)], capture_output=True, text=True, check=False).stdout.split()]
  check.send_signal(signal.SIGTERM)
  output = check.communicate(timeout=60)[0]
  assert check.returncode == 1, output
  rows = (out / 'table.md').read_text().splitlines()
  assert rows[2].startswith('| versions | ok |') and rows[-1].startswith('| check | STOPPED | 0 | SIGTERM at '), rows
  time.sleep(0.5)
  assert stage and not [pid for pid in stage if _running(pid)], stage


def _running(pid: int) -> bool:
  """Whether process `pid` exists and is not a zombie (killed, not yet reaped)."""
  try:
    with open(f'/proc/{pid}/stat', encoding='utf-8') as f:
      return f.read().rsplit(')', 1)[1].split()[0] != 'Z'
  except FileNotFoundError:
    return False
