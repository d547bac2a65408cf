"""Fault injection: kills during checkpoint writes, damaged checkpoints, a full disk, data that changes under a run,
and every bad command line of issue #14. Each case states what must happen (docs/faults.md tells users the same).

The kill and disk-full cases run the real command line (`python -m electra_jax.main`) in a subprocess on a tiny
config (tests/faults_config.py); the rest call the trainer in this process, which is faster. Every run of the
module shares one persistent compilation cache, so a restarted process loads the train step instead of compiling
it again. Slow (processes started and killed): not in the default test run; `python -m pytest -q -n 2 -m faults
tests` runs it (README, .ci/run).
"""

import errno
import json
import os
import random
import re
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from electra_jax import checkpoint, cli, convert, data, detect, trainer
from electra_jax.data import build as build_lib
from electra_jax.data import corpus as corpus_lib
from electra_jax.experiments import compare
import faults_config  # pylint: disable=g-bad-import-order
from helpers import FAULTS_CONFIG_FILE as CONFIG_FILE, REPO  # pylint: disable=g-bad-import-order
from helpers import make_corpus, override, read_metrics, step_dirs

pytestmark = [pytest.mark.faults, pytest.mark.usefixtures('compile_once')]


def config_for(source, cache_dir, **overrides):
  config = faults_config.get_config()
  config.data.update(source=source, cache_dir=cache_dir)
  return override(config, overrides)


def command(workdir, source, cache_dir, *flags):
  """The command line a user would type for tests/faults_config.py."""
  return [sys.executable, '-m', 'electra_jax.main', f'--config={CONFIG_FILE}', f'--workdir={workdir}',
          f'--config.data.source={source}', f'--config.data.cache_dir={cache_dir}', *flags]


def assert_same_losses(workdir, reference):
  """The per-step losses of `workdir` are those of the uninterrupted `reference`: the same XLA program on the same
  inputs is deterministic on CPU (a resumed process recompiles; 1e-6 covers a changed reduction order, none seen)."""
  ours, theirs = read_metrics(workdir), read_metrics(reference)
  assert [m['step'] for m in ours] == [m['step'] for m in theirs]
  np.testing.assert_allclose([m['loss'] for m in ours], [m['loss'] for m in theirs], rtol=1e-6)


def one_error_line(stderr: str) -> str:
  """The last line of stderr, after checking it is the only error and no traceback came with it."""
  assert 'Traceback' not in stderr and 'Event loop is closed' not in stderr, stderr
  errors = [line for line in stderr.splitlines() if line.startswith('error: ')]
  assert len(errors) == 1 and stderr.rstrip().endswith(errors[0]), stderr
  return errors[0]


@pytest.fixture(scope='module')
def reference(tmp_path_factory, corpus_file, cache_dir):
  """The uninterrupted run of tests/faults_config.py (10 steps, a checkpoint after each)."""
  workdir = tmp_path_factory.mktemp('reference')
  trainer.train(config_for(corpus_file, cache_dir), workdir)
  return workdir


# ----------------------------------------------------------------------------------------------------------------
# kill -9 while a checkpoint is being written.


def test_kill_during_checkpoint_writes_resumes_from_the_newest_complete_one(tmp_path, corpus_file, cache_dir,
                                                                            reference):
  """Three SIGKILLs at random moments of checkpoint writes (seeded): each time the same command resumes from the
  newest complete step, never from a partial directory, and the losses end up those of the uninterrupted run."""
  workdir = tmp_path / 'run'
  rng = random.Random(14)
  hit_a_write = 0
  for kill in range(3):
    process = subprocess.Popen(command(workdir, corpus_file, cache_dir), cwd=REPO, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    before = step_dirs(workdir)[0] if (workdir / 'checkpoints').exists() else []
    # Wait until this process writes a step 2 past the newest complete one (a partial step directory left by the
    # previous kill is at most 1 past it), then kill within the next 0-30 ms.
    deadline = time.time() + 300
    while process.poll() is None and time.time() < deadline:
      if (workdir / 'checkpoints').exists():
        writing = [int(n.split('.')[0]) for n in step_dirs(workdir)[1] if n.split('.')[0].isdigit()]
        if writing and max(writing) >= max(before, default=0) + 2:
          break
      time.sleep(0.002)
    time.sleep(rng.uniform(0, 0.03) if kill else 0)  # the first kill lands at once, mid-write
    process.kill()
    _, stderr = process.communicate()
    assert process.returncode == -9, f'the run ended before it could be killed:\n{stderr}'
    resumed = re.search(r'resuming from checkpoint (\d+)', stderr)
    assert (resumed and int(resumed.group(1))) == (max(before) if before else None)
    complete, partial = step_dirs(workdir)
    hit_a_write += bool(partial)
  assert hit_a_write, 'no kill landed during a checkpoint write'
  newest = max(step_dirs(workdir)[0])
  result = subprocess.run(command(workdir, corpus_file, cache_dir), cwd=REPO, capture_output=True, text=True,
                          check=False, timeout=600)
  assert result.returncode == 0, result.stderr
  assert f'resuming from checkpoint {newest} ' in result.stderr
  complete, partial = step_dirs(workdir)
  assert partial == [] and complete[-1] == 10  # the partial directories were cleaned up, not used
  assert_same_losses(workdir, reference)


# ----------------------------------------------------------------------------------------------------------------
# A damaged latest checkpoint.


def damage(step_dir, how: str):
  """Damages checkpoint directory `step_dir` as a crash, a bad disk or a careless hand would."""
  files = sorted((p for p in (step_dir / 'state').rglob('*') if p.is_file()), key=lambda p: p.stat().st_size)
  if how == 'emptied':
    for path in files:
      path.write_bytes(b'')
  elif how == 'removed':  # the array data (the directories orbax names d/), as in issue #14
    for directory in sorted(p for p in (step_dir / 'state').rglob('d') if p.is_dir()):
      shutil.rmtree(directory)
  else:  # 64 random bytes in the middle of the largest file: orbax alone reads them back as numbers
    with open(files[-1], 'r+b') as f:
      f.seek(files[-1].stat().st_size // 2)
      f.write(random.Random(0).randbytes(64))


def snapshot(directory) -> dict:
  return {str(p.relative_to(directory)): p.read_bytes() for p in directory.rglob('*') if p.is_file()}


@pytest.mark.parametrize('how', ['emptied', 'removed', 'random bytes'])
def test_damaged_latest_checkpoint_is_moved_aside_and_the_run_resumes_from_the_one_before(
    tmp_path, corpus_file, cache_dir, reference, capsys, how):
  config = config_for(corpus_file, cache_dir, checkpoint_every=2)
  trainer.train(config, tmp_path, stop_after=4)  # checkpoints 2 and 4
  damage(tmp_path / 'checkpoints' / '4', how)
  damaged = snapshot(tmp_path / 'checkpoints' / '4')
  capsys.readouterr()
  trainer.train(config, tmp_path)
  warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith('warning: ')]
  assert len(warnings) == 1, warnings
  assert re.fullmatch(r'warning: checkpoint 4 in \S+ cannot be read \(.+\); moved it to \S+/unreadable_checkpoints/4, '
                      r'resuming from checkpoint 2', warnings[0]), warnings[0]
  assert snapshot(tmp_path / 'unreadable_checkpoints' / '4') == damaged  # moved as it was, never deleted
  assert step_dirs(tmp_path) == ([6, 8, 10], [])
  assert_same_losses(tmp_path, reference)


def test_no_readable_checkpoint_is_one_line_and_moves_nothing(tmp_path, corpus_file, cache_dir, capsys):
  config = config_for(corpus_file, cache_dir, checkpoint_every=2)
  trainer.train(config, tmp_path, stop_after=4)
  for step in ('2', '4'):
    damage(tmp_path / 'checkpoints' / step, 'removed')
  with pytest.raises(checkpoint.CheckpointError, match=r'no checkpoint in \S+ can be read \(steps 4, 2; the newest: '
                     r'checkpoint 4 .*\)\. Move them aside to train from step 0, or start a new --workdir'):
    trainer.train(config, tmp_path)
  assert step_dirs(tmp_path) == ([2, 4], []) and not (tmp_path / 'unreadable_checkpoints').exists()
  capsys.readouterr()
  for main, argv in ((detect.main, ['--checkpoint', str(tmp_path), 'the cat']),
                     (convert.main, ['--checkpoint', str(tmp_path), '--to-hf', str(tmp_path / 'hf')])):
    with pytest.raises(SystemExit, match='1'):
      main(argv)
    line = one_error_line(capsys.readouterr().err)
    assert re.fullmatch(r'error: checkpoint 4 in \S+ cannot be read \(.+\); it may be incomplete or damaged, or not '
                        r'match \S+config.json\. Other steps: 2', line), line
  assert not (tmp_path / 'hf').exists()


# ----------------------------------------------------------------------------------------------------------------
# A full disk.


def test_full_disk_during_a_metrics_write_stops_with_one_line_and_resumes(
    tmp_path, corpus_file, cache_dir, reference, capsys, monkeypatch):
  config = config_for(corpus_file, cache_dir, checkpoint_every=2)
  real_write = trainer.metrics_lib.MetricsWriter.write

  def write_until_full(self, step, scalars):
    if step == 5:
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / 'metrics.jsonl'))
    real_write(self, step, scalars)

  monkeypatch.setattr(trainer.metrics_lib.MetricsWriter, 'write', write_until_full)
  with pytest.raises(SystemExit, match='1'):
    cli.run(trainer.train, config, str(tmp_path))
  assert one_error_line(capsys.readouterr().err) == (
      f'error: step 5: {tmp_path}/metrics.jsonl: No space left on device (the disk is full: free some space and run '
      'the same command again). The checkpoints are not affected; the same command resumes from the newest one')
  assert step_dirs(tmp_path) == ([2, 4], [])
  monkeypatch.setattr(trainer.metrics_lib.MetricsWriter, 'write', real_write)
  trainer.train(config, tmp_path)
  assert_same_losses(tmp_path, reference)


def test_full_disk_during_a_checkpoint_write_stops_with_one_line_and_resumes(
    tmp_path, corpus_file, cache_dir, reference, capsys, monkeypatch):
  """The error as tensorstore raises it from orbax's writer (seen on a full tmpfs; the real thing below)."""
  config = config_for(corpus_file, cache_dir, checkpoint_every=2)
  real_save = checkpoint.ocp.CheckpointManager.save

  def save_until_full(self, step, *args, **kwargs):
    if step == 6:
      raise ValueError(f'RESOURCE_EXHAUSTED: Failed writing: "{tmp_path}/checkpoints/6.orbax-checkpoint-tmp/state/d/'
                       'a169": Failed to write 3026 bytes to file 11: No space left on device [os_error_code=\'28\']')
    return real_save(self, step, *args, **kwargs)

  monkeypatch.setattr(checkpoint.ocp.CheckpointManager, 'save', save_until_full)
  with pytest.raises(SystemExit, match='1'):
    cli.run(trainer.train, config, str(tmp_path))
  line = one_error_line(capsys.readouterr().err)
  assert re.fullmatch(r'error: writing a checkpoint to \S+/checkpoints failed \(ValueError: RESOURCE_EXHAUSTED: .* '
                      r'\[os_error_code=\'28\'\]; the disk is full: free some space and run the same command again\): '
                      r'the newest complete checkpoint is step 4, and the same command resumes from it', line), line
  monkeypatch.setattr(checkpoint.ocp.CheckpointManager, 'save', real_save)
  trainer.train(config, tmp_path)
  assert_same_losses(tmp_path, reference)


def _unshare_works() -> bool:
  """Whether this machine lets us mount a tmpfs in a private user and mount namespace (no root needed)."""
  try:
    return subprocess.run(['unshare', '-rm', 'mount', '-t', 'tmpfs', 'tmpfs', '/mnt'], capture_output=True,
                          timeout=30, check=False).returncode == 0
  except (OSError, subprocess.TimeoutExpired):
    return False


# Run inside `unshare -rm` with argv [mount point, JSON command]: mounts a 32 MB tmpfs, starts the run, fills the
# disk (64 KB left) once checkpoint 2 is complete, waits for the run to fail, frees the space, runs the same
# command again, and prints what happened as JSON (the tmpfs is gone for the test once this process exits).
_DISK_FULL_DRIVER = r"""
import json, os, subprocess, sys, time
mount, command = sys.argv[1], json.loads(sys.argv[2])
subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=32m', 'tmpfs', mount], check=True)
checkpoints = os.path.join(mount, 'run', 'checkpoints')
first = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
while first.poll() is None and not os.path.isdir(os.path.join(checkpoints, '2')):
  time.sleep(0.005)
filler = os.open(os.path.join(mount, 'filler'), os.O_WRONLY | os.O_CREAT)
try:
  while True:
    os.write(filler, bytes(1 << 16))
except OSError:
  pass
os.ftruncate(filler, os.fstat(filler).st_size - (1 << 16))
os.close(filler)
first_err = first.communicate()[1]
complete = sorted(int(n) for n in os.listdir(checkpoints) if n.isdigit())
os.remove(os.path.join(mount, 'filler'))
second = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
with open(os.path.join(mount, 'run', 'metrics.jsonl')) as f:
  metrics = f.read()
print(json.dumps({'first': [first.returncode, first_err], 'complete': complete,
                  'second': [second.returncode, second.stderr], 'metrics': metrics}))
"""


def test_unretrieved_failed_writes_are_not_printed_after_the_error_line(capfd):
  """tensorstore's write futures that failed on a full disk are collected at exit, when asyncio reports each one with
  no traceback; the error was already raised to the checkpointer and said in one line, so nothing more is printed."""
  import asyncio  # noqa: PLC0415
  import gc  # noqa: PLC0415
  import logging  # noqa: PLC0415
  checkpoint.quiet_failures()  # what every command's cli.run sets up
  logging.getLogger('asyncio').addHandler(handler := logging.StreamHandler())
  try:
    loop = asyncio.new_event_loop()
    future = loop.create_future()
    future.set_exception(OSError(errno.ENOSPC, 'No space left on device'))
    del future
    gc.collect()
    loop.close()
    logging.getLogger('asyncio').error('an unrelated asyncio error')
  finally:
    logging.getLogger('asyncio').removeHandler(handler)
  err = capfd.readouterr().err
  assert 'never retrieved' not in err and 'No space left' not in err, err
  assert 'an unrelated asyncio error' in err  # the filter drops only those reports


@pytest.mark.skipif(not _unshare_works(), reason='cannot mount a tmpfs here (unshare -rm refused)')
def test_full_tmpfs_stops_with_one_line_and_the_same_command_resumes(tmp_path, corpus_file, cache_dir, reference):
  """A real full disk: a 32 MB tmpfs filled while the run writes its checkpoints."""
  mount = tmp_path / 'mnt'
  mount.mkdir()
  result = subprocess.run(['unshare', '-rm', sys.executable, '-c', _DISK_FULL_DRIVER, str(mount),
                           json.dumps(command(mount / 'run', corpus_file, cache_dir))],
                          cwd=REPO, capture_output=True, text=True, timeout=600, check=True)
  report = json.loads(result.stdout)
  (returncode, stderr), complete = report['first'], report['complete']
  assert returncode == 1, stderr
  line = one_error_line(stderr)
  assert re.fullmatch(r'error: writing a checkpoint to \S+ failed \(.*No space left on device.*; the disk is full: '
                      rf'free some space and run the same command again\): the newest complete checkpoint is step '
                      rf'{complete[-1]}, and the same command resumes from it', line), line
  assert 2 <= complete[-1] < 10
  returncode, stderr = report['second']
  assert returncode == 0 and f'resuming from checkpoint {complete[-1]} ' in stderr, stderr
  (tmp_path / 'copy').mkdir()
  (tmp_path / 'copy' / 'metrics.jsonl').write_text(report['metrics'])
  assert_same_losses(tmp_path / 'copy', reference)


@pytest.mark.skipif(not _unshare_works(), reason='cannot mount a tmpfs here (unshare -rm refused)')
def test_read_only_workdir_is_one_line(tmp_path, corpus_file, cache_dir):
  mount = tmp_path / 'mnt'
  mount.mkdir()
  script = (f'mount -t tmpfs -o ro tmpfs {mount} && exec ' +
            ' '.join(command(mount / 'run', corpus_file, cache_dir)))
  result = subprocess.run(['unshare', '-rm', 'sh', '-c', script], cwd=REPO, capture_output=True, text=True,
                          timeout=300, check=False)
  assert result.returncode == 1
  assert one_error_line(result.stderr) == (
      f'error: --workdir {mount}/run cannot be written ({mount} does not allow it): choose a directory you can write '
      'to')


# ----------------------------------------------------------------------------------------------------------------
# Data that vanishes or changes under a run.


def test_text_corpus_that_changes_or_vanishes_between_runs_is_one_line(tmp_path, cache_dir):
  source = make_corpus(tmp_path / 'corpus.txt', documents=80)
  config = config_for(source, cache_dir, checkpoint_every=2)
  trainer.train(config, tmp_path / 'run', stop_after=2)
  with open(source, 'a', encoding='utf-8') as f:  # edited: one sentence more
    f.write('The cat sat on the mat near the old tree.\n')
  with pytest.raises(data.DataError, match='the corpus changed|other examples than data.source now gives'):
    trainer.train(config, tmp_path / 'run')
  os.remove(source)
  with pytest.raises(data.DataError, match='no text files found at data.source'):
    trainer.train(config, tmp_path / 'run')


@pytest.fixture()
def built(tmp_path, corpus_file, cache_dir):
  """A corpus packed into several small ArrayRecord shards, and the run config reading it."""
  source = corpus_lib.TextFiles(corpus_file)
  tokenizer = data.load_tokenizer(data.DataConfig(source=corpus_file, vocab_size=64, cache_dir=cache_dir))
  build_lib.build(source, tokenizer, str(tmp_path / 'built'), build_lib.Packing(32), processes=1, shard_bytes=4096)
  return tmp_path / 'built', config_for(str(tmp_path / 'built'), cache_dir, checkpoint_every=2)


def test_rebuilt_dataset_is_refused_on_resume(tmp_path, corpus_file, built):
  directory, config = built
  trainer.train(config, tmp_path / 'run', stop_after=2)
  tokenizer = data.load_tokenizer(data.DataConfig(source=str(directory)))
  build_lib.build(corpus_lib.TextFiles(corpus_file), tokenizer, str(directory), build_lib.Packing(32, seed=1),
                  processes=1, shard_bytes=4096, overwrite=True)  # other examples (packed with another seed)
  with pytest.raises(data.DataError, match='the corpus changed|other examples than data.source now gives'):
    trainer.train(config, tmp_path / 'run')


def test_shard_cut_short_is_one_line_before_and_during_a_run(tmp_path, built, monkeypatch):
  directory, config = built
  shard = sorted(directory.glob('*.array_record'))[0]
  real_next = data.BatchIterator.__next__
  calls = {'n': 0}

  def next_then_truncate(self):
    calls['n'] += 1
    if calls['n'] == 2:  # while the run reads it
      os.truncate(shard, 100)
    return real_next(self)

  monkeypatch.setattr(data.BatchIterator, '__next__', next_then_truncate)
  with pytest.raises(data.DataError, match=r'the built dataset changed or was damaged while in use'):
    trainer.train(config, tmp_path / 'run')
  with pytest.raises(data.DataError, match=rf'{shard} has \d+ bytes, \d+ when it was built: the built dataset '
                                           r'\S+ changed or is damaged; rebuild it'):
    trainer.train(config, tmp_path / 'run')


# ----------------------------------------------------------------------------------------------------------------
# Settings: checked before anything is written, refused when they would change a run, recorded as trained.


@pytest.mark.parametrize('overrides, message', [
    ({'mesh.shape': (16, 1, 1)}, r'mesh.shape \(16, 1, 1\) does not fit 8 devices'),
    ({'mesh.shape': (4, 1, 1), 'batch_size': 6}, 'batch_size 6 must be a multiple of'),
    ({'objective.name': 'bert'}, "unknown objective.name 'bert'"),
    ({'model.hidden_size': 31}, 'not divisible by model.num_heads'),
])
def test_a_refused_command_writes_nothing(tmp_path, corpus_file, cache_dir, overrides, message):
  with pytest.raises(trainer.config_lib.ConfigError, match=message):
    trainer.train(config_for(corpus_file, cache_dir, **overrides), tmp_path / 'run')
  assert not (tmp_path / 'run').exists()  # so the corrected command starts afresh, not "a run with other settings"


def test_resume_with_other_model_or_data_settings_is_refused_and_rewrites_nothing(tmp_path, corpus_file, cache_dir):
  config = config_for(corpus_file, cache_dir, checkpoint_every=2)
  trainer.train(config, tmp_path, stop_after=2)
  saved = (tmp_path / 'config.json').read_bytes()
  for key, value, section in (('model.hidden_size', 64, 'model'), ('data.max_seq_length', 16, 'data')):
    with pytest.raises(trainer.config_lib.ConfigError, match=rf'holds a run with different {section} settings '
                                                              rf'\({key}\); resume with the same settings'):
      trainer.train(override(config_for(corpus_file, cache_dir), {key: value}), tmp_path)
  assert (tmp_path / 'config.json').read_bytes() == saved


def test_a_run_that_trains_nothing_leaves_config_json_alone(tmp_path, corpus_file, cache_dir, reference, capsys):
  workdir = tmp_path / 'copy'
  shutil.copytree(reference, workdir)
  before = (workdir / 'config.json').read_bytes(), (workdir / 'config.json').stat().st_mtime_ns
  assert trainer.train(config_for(corpus_file, cache_dir, train_steps=5, **{'optimizer.learning_rate': 0.5}),
                       workdir) == {}
  assert 'already trained to step 10 >= train_steps=5' in capsys.readouterr().err
  assert ((workdir / 'config.json').read_bytes(), (workdir / 'config.json').stat().st_mtime_ns) == before
  # A run that does train records what it trained with.
  trainer.train(config_for(corpus_file, cache_dir, train_steps=11), workdir)
  assert json.loads((workdir / 'config.json').read_text())['train_steps'] == 11


def test_compare_names_the_key_it_reads(tmp_path):
  from configs.experiments import compare_cpu  # noqa: PLC0415
  config = compare_cpu.get_config()
  config.pretrain.data.source = str(tmp_path / 'missing' / '*.txt')
  with pytest.raises(data.DataError, match=r'no text files found at pretrain\.data\.source=.*leave it empty'):
    compare.plan(config)


def test_a_missing_input_file_is_one_line(capsys):
  def read_missing():
    with open('missing.txt', encoding='utf-8') as f:
      return f.read()
  with pytest.raises(SystemExit, match='1'):
    cli.run(read_missing)
  assert one_error_line(capsys.readouterr().err) == 'error: missing.txt: No such file or directory'


# ----------------------------------------------------------------------------------------------------------------
# The command line: one line for each mistake of issue #14, no traceback, nothing written.


@pytest.fixture(scope='module')
def broken_run(tmp_path_factory, corpus_file, cache_dir):
  """A workdir whose only checkpoint lost its array data (`state/d` deleted)."""
  workdir = tmp_path_factory.mktemp('broken')
  trainer.train(config_for(corpus_file, cache_dir, checkpoint_every=2), workdir, stop_after=2)
  damage(workdir / 'checkpoints' / '2', 'removed')
  return workdir


def test_command_line_mistakes_are_one_line(tmp_path, corpus_file, cache_dir, broken_run):
  main = [sys.executable, '-m', 'electra_jax.main']
  detect_cli = [sys.executable, '-m', 'electra_jax.detect']
  (tmp_path / 'a_file').write_text('')
  new = str(tmp_path / 'new')
  cases = {  # argv: a regex of the one line it must print
      'missing config file': (main + ['--config=configs/nope.py', f'--workdir={new}'],
                              r"--config=configs/nope.py cannot be loaded \(.*No such file or directory: "
                              r"'configs/nope.py'\); give a config file such as configs/tiny.py"),
      'workdir is a file': (main + ['--config=configs/tiny.py', f'--workdir={tmp_path}/a_file'],
                            r'--workdir must be a directory, but \S+/a_file is a file: choose another path'),
      'override without config': (main + ['--mode=predict', f'--workdir={new}', '--config.predict_input=x.txt'],
                                  r'--config.predict_input sets a key of a config file: give the file too, e.g. '
                                  r'--config=configs/finetune.py'),
      'typo in a fine-tuning key': (main + ['--config=configs/finetune.py', f'--workdir={new}',
                                            '--config.optimizer.learning_rte=1'],
                                    r'configs/finetune.py has no key optimizer.learning_rte \(did you mean '
                                    r'optimizer.learning_rate\?\); --config=configs/finetune.py --show_config lists '
                                    r'every key'),
      'fine-tuning mode, pre-training config': (main + ['--config=configs/tiny.py', '--mode=finetune',
                                                        f'--workdir={new}'],
                                                r'--mode=finetune needs a fine-tuning config such as '
                                                r'configs/finetune.py; configs/tiny.py is a pre-training config'),
      'fine-tuning config runs fine-tuning': (main + ['--config=configs/finetune.py', f'--workdir={new}'],
                                              r"unknown task '': give one of cola"),
      'mesh that does not fit': (command(new, corpus_file, cache_dir, '--config.mesh.shape=16,1,1'),
                                 r'mesh.shape \(16, 1, 1\) does not fit 8 devices'),
      'detect a missing workdir': (detect_cli + ['--checkpoint', new, 'the cat'],
                                   r'\S+/new does not exist: give the workdir of a pre-training run or of an import'),
      'detect a step that is not there': (detect_cli + ['--checkpoint', str(broken_run), '--step', '7', 'the cat'],
                                          r'\S+ has no checkpoint 7; its steps are 2'),
      'detect a damaged checkpoint': (detect_cli + ['--checkpoint', str(broken_run), 'the cat'],
                                      r'checkpoint 2 in \S+ cannot be read \(.*\); it may be incomplete or damaged, '
                                      r'or not match \S+/config.json'),
      'resume a damaged checkpoint': (command(broken_run, corpus_file, cache_dir),
                                      r'no checkpoint in \S+ can be read \(steps 2; the newest: checkpoint 2 in \S+ '
                                      r'cannot be read \(.*\)\)\. Move them aside'),
  }
  processes = {name: subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for name, (argv, _) in cases.items()}
  for name, process in processes.items():
    _, stderr = process.communicate(timeout=600)
    assert process.returncode in (1, 2), (name, stderr)
    line = one_error_line(stderr)
    assert re.fullmatch('error: ' + cases[name][1] + '.*', line), (name, line)
  assert not os.path.exists(new)


@pytest.mark.parametrize('config_file', ['configs/tiny.py', 'configs/finetune.py',
                                         'configs/experiments/compare_cpu.py'])
def test_show_config_gives_every_key_its_value_and_comment(config_file):
  import runpy  # noqa: PLC0415
  values = runpy.run_path(os.path.join(REPO, config_file))['get_config']()
  lines = cli.show_config(values, os.path.join(REPO, config_file)).splitlines()[1:]
  keys = [key for key, _ in cli.flat_keys(values)]
  assert [line.split(' = ')[0] for line in lines] == keys
  assert all(re.fullmatch(r'\S+ = .+  # \S.*', line) for line in lines), [l for l in lines if '  # ' not in l]
  by_key = dict(line.split(' = ', 1) for line in lines)
  if config_file == 'configs/tiny.py':  # the value tiny.py sets, the comment default.py writes
    assert by_key['model.hidden_size'] == '128  # H: discriminator width.'
    assert by_key['optimizer.b2'] == "0.999  # Adam's decay of the squared-gradient average (beta2)."
  if config_file == 'configs/finetune.py':  # fine-tuning's own learning_rate, not pre-training's
    assert by_key['optimizer.learning_rate'].endswith("0: the paper's for the model width.")
  if config_file.endswith('compare_cpu.py'):  # keys under pretrain. read configs/tiny.py's (default.py's) comments
    assert by_key['pretrain.optimizer.learning_rate'] == '0.001  # Peak learning rate.'
