"""gs:// paths everywhere, against a local Cloud Storage emulator (the `gcs_bucket` fixture in conftest.py)."""

import errno
import gzip
import json
import os
import random
import shutil
import subprocess
import sys
import types
import uuid

import fsspec
import jax
import numpy as np
import pytest
import tensorflow_datasets as tfds

from configs import finetune as finetune_config
from electra_jax import checkpoint, convert, data, detect, fileio, finetune, trainer
from electra_jax.data import DataError, build, corpus
from helpers import REPO, WORDS, final_params, make_corpus, override  # pylint: disable=g-bad-import-order
from helpers import sigterm_at_step, tiny_pretraining_config as tiny_config

# Every test here compiles or trains a model (or shares a module fixture that does): the slow tier.
pytestmark = pytest.mark.slow


def upload(local_dir, remote: str):
  """Copies every file under `local_dir` to the same relative names under `remote`."""
  for root, _, names in os.walk(local_dir):
    for name in names:
      relative = os.path.relpath(os.path.join(root, name), local_dir)
      (fileio.path(remote) / relative).write_bytes(open(os.path.join(root, name), 'rb').read())


def test_text_files_directories_and_globs(tmp_path, gcs_dir):
  """A gs:// object, directory (recursive, hidden names skipped) and glob read as the same local files do."""
  (tmp_path / 'a.txt').write_text('One.\nTwo.\n\n\nThree.\n', encoding='utf-8')
  (tmp_path / 'sub').mkdir()
  with gzip.open(tmp_path / 'sub' / 'b.txt.gz', 'wt', encoding='utf-8') as f:
    f.write('Four.\r\n  \r\nFive.\r\nSix.')
  (tmp_path / '.hidden').write_text('ignored\n')
  upload(tmp_path, gcs_dir)
  expected = [['One.', 'Two.'], ['Three.'], ['Four.'], ['Five.', 'Six.']]
  assert list(corpus.TextFiles(str(tmp_path)).documents()) == expected
  assert list(corpus.TextFiles(gcs_dir).documents()) == expected
  assert list(corpus.TextFiles(f'{gcs_dir}/*.txt').documents()) == expected[:2]
  assert list(corpus.TextFiles(f'{gcs_dir}/**/*.gz').documents()) == expected[2:]
  assert corpus.TextFiles(gcs_dir).files == [f'{gcs_dir}/a.txt', f'{gcs_dir}/sub/b.txt.gz']
  with pytest.raises(DataError, match='no objects found at data.source'):
    corpus.TextFiles(f'{gcs_dir}/nothing-here/*.txt')


def test_text_source_packs_like_the_local_copy(tmp_path, gcs_dir, cache_dir):
  """Same examples from gs:// as from the same file on disk; the cache key changes when the object changes."""
  local = make_corpus(tmp_path / 'corpus.txt.gz', documents=30, gz=True)
  remote = f'{gcs_dir}/corpus.txt.gz'
  upload(tmp_path, gcs_dir)
  tokenizer = data.load_tokenizer(data.DataConfig(source=local, vocab_size=60))
  config = data.DataConfig(source=remote, vocab_size=60, max_seq_length=32)
  from_gcs = data.load_examples(config, tokenizer)
  from_disk = data.load_examples(data.DataConfig(source=local, vocab_size=60, max_seq_length=32), tokenizer)
  np.testing.assert_array_equal(from_gcs.input_ids, from_disk.input_ids)
  before = data.open_source(config).fingerprint()
  make_corpus(tmp_path / 'corpus.txt.gz', documents=31, gz=True)
  upload(tmp_path, gcs_dir)
  assert data.open_source(config).fingerprint() != before
  del cache_dir


@pytest.fixture(scope='module')
def built(tmp_path_factory, corpus_file):
  """A dataset built on disk: (its directory, the tokenizer it holds)."""
  directory = tmp_path_factory.mktemp('built') / 'data'
  tokenizer = data.load_tokenizer(data.DataConfig(source=corpus_file, vocab_size=60,
                                                  cache_dir=str(tmp_path_factory.mktemp('cache'))))
  build.build(corpus.TextFiles(corpus_file), tokenizer, str(directory), build.Packing(32), processes=1,
              shard_bytes=2000)
  return str(directory), tokenizer


def test_each_process_copies_and_reads_only_its_own_shards(built, gcs_dir, tmp_path):
  """Two processes on a gs:// built dataset: process p copies shards p, p+2, ... alone, reads only their examples in
  an order of its own that resumes exactly, and a checkpoint of that order is refused on another process count."""
  directory, tokenizer = built
  upload(directory, gcs_dir)
  whole = data.load_examples(data.DataConfig(source=directory, max_seq_length=32), tokenizer)
  shards = whole.metadata['shards']
  assert len(shards) >= 4
  for p in range(2):
    cache = str(tmp_path / f'host{p}')
    config = data.DataConfig(source=gcs_dir, max_seq_length=32, cache_dir=cache)
    examples = data.load_examples(config, tokenizer, process_index=p, process_count=2)
    copied = sorted(f for f in os.listdir(fileio.cache_path(cache, gcs_dir)) if f.endswith('.array_record'))
    assert copied == [shards[i]['file'] for i in range(p, len(shards), 2)]
    own = np.concatenate([np.arange(whole.starts[i], whole.starts[i + 1]) for i in range(p, len(shards), 2)])
    np.testing.assert_array_equal(examples.read(np.arange(len(examples)))[0], whole.read(own)[0])

    batches = data.BatchIterator(examples, tokenizer.special, batch_size=8, seed=0, process_index=p, process_count=2)
    seen = np.concatenate([next(batches)['input_ids'] for _ in range(3)])
    assert seen.shape == (12, 32)
    own_rows = {row.tobytes() for row in whole.read(own)[0]}
    assert all(row.tobytes() in own_rows for row in seen)
    state = json.loads(json.dumps(batches.get_state()))  # as a checkpoint stores it
    expected = next(batches)
    resumed = data.BatchIterator(examples, tokenizer.special, batch_size=8, seed=0, process_index=p,
                                 process_count=2)
    resumed.set_state(state)
    np.testing.assert_array_equal(next(resumed)['input_ids'], expected['input_ids'])
    everything = data.BatchIterator(whole, tokenizer.special, batch_size=8, seed=0)
    with pytest.raises(DataError, match='each of 2 processes reading its own shards of the built data.source, but '
                       'this run has every process reading from the whole'):
      everything.set_state(state)


def test_built_shards_are_read_from_a_verified_local_copy(built, gcs_dir, tmp_path, capsys):
  directory, tokenizer = built
  upload(directory, gcs_dir)
  config = data.DataConfig(source=gcs_dir, max_seq_length=32, cache_dir=str(tmp_path))
  assert data.load_tokenizer(config).fingerprint == tokenizer.fingerprint
  assert 'copying 3 file(s)' in capsys.readouterr().err  # the metadata and the tokenizer, no shard
  examples = data.load_examples(config, tokenizer)
  assert f'copying {len(examples.metadata["shards"])} file(s)' in capsys.readouterr().err
  data.load_examples(config, tokenizer)
  assert 'copying' not in capsys.readouterr().err  # the copy is reused
  local = data.load_examples(data.DataConfig(source=directory, max_seq_length=32), tokenizer)
  assert len(local.metadata['shards']) > 1
  everything = np.arange(len(local))
  np.testing.assert_array_equal(examples.read(everything)[0], local.read(everything)[0])

  # A changed object is copied again; a missing one is one clear error.
  shard = local.metadata['shards'][0]['file']
  (fileio.path(gcs_dir) / shard).write_bytes((fileio.path(directory) / shard).read_bytes())
  data.load_examples(config, tokenizer)
  assert '1 file(s)' in capsys.readouterr().err
  (fileio.path(gcs_dir) / shard).unlink()
  with pytest.raises(DataError, match=f'{gcs_dir}/{shard} does not exist'):
    data.load_examples(config, tokenizer)


def test_local_copy_checks_disk_space_first(built, gcs_dir, tmp_path, monkeypatch):
  directory, _ = built
  upload(directory, gcs_dir)
  monkeypatch.setattr(shutil, 'disk_usage', lambda _: shutil._ntuple_diskusage(10**9, 10**9 - 100, 100))
  with pytest.raises(OSError, match='GiB are free: set data.cache_dir') as error:
    fileio.local_copy(gcs_dir, os.listdir(directory), str(tmp_path))
  assert error.value.errno == errno.ENOSPC
  assert not os.listdir(fileio.cache_path(str(tmp_path), gcs_dir))


@pytest.fixture(scope='module')
def tfds_dir(tmp_path_factory):
  """A tensorflow-datasets dataset prepared in ArrayRecord format (tfds does that without TensorFlow)."""

  class ElectraGcsText(tfds.core.GeneratorBasedBuilder):
    VERSION = tfds.core.Version('1.0.0')

    def _info(self):
      return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({'text': tfds.features.Text()}))

    def _split_generators(self, dl_manager):
      del dl_manager
      return {'train': self._generate_examples(12), 'validation': self._generate_examples(3)}

    def _generate_examples(self, count):
      for i in range(count):
        yield i, {'text': f'Document {i}.\nIts second line.'}

  directory = str(tmp_path_factory.mktemp('tfds'))
  ElectraGcsText(data_dir=directory, file_format='array_record').download_and_prepare()
  return directory


def test_tfds_data_dir_on_gcs(tfds_dir, gcs_dir, tmp_path):
  upload(tfds_dir, gcs_dir)
  local = corpus.open_source('tfds:electra_gcs_text', tfds_data_dir=tfds_dir)
  remote = corpus.open_source('tfds:electra_gcs_text', tfds_data_dir=gcs_dir, cache_dir=str(tmp_path))
  assert sorted(map(tuple, remote.documents())) == sorted(map(tuple, local.documents()))
  assert len(remote.records) == 12
  # Only the split asked for is copied, with the dataset's metadata.
  copied = sorted(os.listdir(os.path.join(fileio.cache_path(str(tmp_path), gcs_dir), 'electra_gcs_text', '1.0.0')))
  assert [name for name in copied if not name.startswith('.')] == [
      'dataset_info.json', 'electra_gcs_text-train.array_record-00000-of-00001', 'features.json']
  assert remote.fingerprint()[2] == gcs_dir


def _one_line_error(argv, env=None) -> str:
  """The stderr of a command that must fail with one line `error: ...` and status 1."""
  result = subprocess.run([sys.executable, '-m', *argv], capture_output=True, text=True, env=env, timeout=300,
                          cwd=REPO)
  assert result.returncode == 1, result.stderr[-3000:]
  lines = [line for line in result.stderr.splitlines() if line.strip()]
  assert len(lines) == 1 and lines[0].startswith('error: '), result.stderr[-3000:]
  return lines[0]


def test_data_errors_on_gcs_are_one_line(gcs_dir, tmp_path, forbidden_gcs_environment):
  line = _one_line_error(['electra_jax.data', 'inspect', '--source=gs://no-such-bucket/corpus/*.txt'])
  assert 'gs://no-such-bucket: bucket not found' in line and 'gcloud storage buckets create' in line
  line = _one_line_error(['electra_jax.data', 'inspect', f'--source={gcs_dir}/corpus.txt'],
                         env=forbidden_gcs_environment)
  assert f'no access to {gcs_dir}/corpus.txt (tester@example.com does not have' in line
  assert 'roles/storage.objectUser' in line
  # An object that goes away between listing and reading.
  (fileio.path(gcs_dir) / 'a.txt').write_text('One.\n')
  source = corpus.TextFiles(gcs_dir)
  (fileio.path(gcs_dir) / 'a.txt').unlink()
  with pytest.raises(DataError, match=f'^{gcs_dir}/a.txt does not exist'):
    list(source.documents())


def test_cache_dir_must_be_local(gcs_dir):
  with pytest.raises(DataError, match='must be a local directory'):
    data.load_tokenizer(data.DataConfig(source=gcs_dir, cache_dir=gcs_dir))


def test_staging_uploads_changed_files_and_keeps_them_when_it_cannot(gcs_dir):
  remote = fileio.path(gcs_dir)
  (remote / 'metrics.jsonl').write_text('{"step": 1}\n')
  stage = fileio.Staging(gcs_dir, fetch=['metrics.jsonl'])
  assert (stage.local / 'metrics.jsonl').read_text() == '{"step": 1}\n'
  with open(stage.local / 'metrics.jsonl', 'a', encoding='utf-8') as f:
    f.write('{"step": 2}\n')
  (stage.local / 'tensorboard').mkdir()
  (stage.local / 'tensorboard' / 'events').write_bytes(b'x')
  stage.sync(every=3600)  # the last sync (at creation) was just now: nothing is uploaded yet
  assert (remote / 'metrics.jsonl').read_text() == '{"step": 1}\n' and not (remote / 'tensorboard').exists()
  stage.sync()
  assert (remote / 'metrics.jsonl').read_text() == '{"step": 1}\n{"step": 2}\n'
  before = fsspec.filesystem('gs').info(f'{gcs_dir}/tensorboard/events')['generation']
  (stage.local / 'metrics.jsonl').write_text('{"step": 1}\n{"step": 2}\n{"step": 3}\n')
  stage.close()
  assert (remote / 'metrics.jsonl').read_text().count('\n') == 3
  # Unchanged since the last sync: not uploaded again.
  assert fsspec.filesystem('gs').info(f'{gcs_dir}/tensorboard/events')['generation'] == before
  assert not stage.local.exists()

  stage = fileio.Staging('gs://no-such-bucket/run')
  (stage.local / 'metrics.jsonl').write_text('{"step": 1}\n')
  with pytest.raises(OSError, match=f'the files are kept in {stage.local}'):
    stage.close()
  assert (stage.local / 'metrics.jsonl').read_text() == '{"step": 1}\n'
  shutil.rmtree(stage.local)


# ----------------------------------------------------------------------------------------------------------------
# A run on gs:// end to end: pre-training stopped by SIGTERM and resumed, fine-tuning, prediction, detection and
# conversion, against the same run on local disk.


def _read_jsonl(location) -> list[dict]:
  return [json.loads(line) for line in fileio.path(location).read_text().splitlines()]


@pytest.fixture(scope='module')
def runs(tmp_path_factory, gcs_bucket, corpus_file, cache_dir, compile_once):
  """The same 8-step tiny pre-training: on local disk without a stop, and on gs:// stopped by a SIGTERM after
  step 3 and run again. The gs:// run reads its corpus and tokenizer from the bucket too.

  Returns: local (workdir), remote (gs:// workdir), root (gs:// directory for other tests' files), config (of the
  gs:// run) and stopped ((checkpoint steps, metrics steps) on gs:// after the SIGTERM).
  """
  del compile_once  # the three invocations compile once
  root = f'{gcs_bucket}/runs-{uuid.uuid4().hex[:8]}'
  local = tmp_path_factory.mktemp('runs')
  tokenizer = data.load_tokenizer(data.DataConfig(source=corpus_file, vocab_size=64, cache_dir=cache_dir))
  tokenizer.save(local / 'tokenizer')
  tokenizer.save(f'{root}/tokenizer')
  fileio.copy(corpus_file, f'{root}/corpus/corpus.txt')
  one_go = tiny_config(corpus_file, cache_dir, **{'data.tokenizer': str(local / 'tokenizer')})
  trainer.train(one_go, local / 'one_go')

  config = tiny_config(f'{root}/corpus', cache_dir, **{'data.tokenizer': f'{root}/tokenizer'})
  with sigterm_at_step(3):
    trainer.train(config, f'{root}/run')
  stopped = (checkpoint_steps(f'{root}/run'), [m['step'] for m in _read_jsonl(f'{root}/run/metrics.jsonl')])
  trainer.train(config, f'{root}/run')
  return types.SimpleNamespace(local=str(local / 'one_go'), remote=f'{root}/run', root=root, config=config,
                               stopped=stopped)


def checkpoint_steps(workdir) -> list[int]:
  return sorted(int(p.name) for p in (fileio.path(workdir) / 'checkpoints').iterdir() if p.name.isdigit())


def files_under(directory) -> list[str]:
  return sorted(name[len(os.fspath(directory)) + 1:] for name in fileio.list_files(os.fspath(directory)))


@pytest.mark.e2e  # a whole workflow on gs:// (the README suite's 5-minute bound)
def test_pretraining_on_gcs_resumes_bit_identically(runs):
  # The SIGTERM left a checkpoint of step 3 and the metrics of steps 1-3 (uploaded when the run stopped).
  assert runs.stopped == ([3], [1, 2, 3])
  a, b = _read_jsonl(f'{runs.local}/metrics.jsonl'), _read_jsonl(f'{runs.remote}/metrics.jsonl')
  assert [m['step'] for m in b] == list(range(1, 9))
  # The same program on the same inputs on CPU: the losses are equal to the last bit, not just close.
  assert [m['loss'] for m in b] == [m['loss'] for m in a]
  params_a, data_a = final_params(runs.local)
  params_b, data_b = final_params(runs.remote)
  assert data_a == data_b
  jax.tree.map(np.testing.assert_array_equal, params_a, params_b)
  run = fileio.path(runs.remote)
  assert {p.name for p in run.iterdir()} >= {'config.json', 'tokenizer.model', 'electra_tokenizer.json',
                                             'metrics.jsonl', 'tensorboard', 'checkpoints'}
  assert len(list((run / 'tensorboard').iterdir())) == 2  # one events file per invocation
  # Checkpoint checksums on Cloud Storage are the objects' CRC32C (nothing read back).
  recorded = json.loads((run / 'checkpoints' / '8' / checkpoint.CHECKSUMS).read_text())
  assert recorded and all(digest.startswith('crc32c:') for _, digest in recorded.values())


@pytest.mark.e2e  # a whole workflow on gs:// (the README suite's 5-minute bound)
def test_gcs_errors_are_one_line_and_lose_nothing(runs, forbidden_gcs_environment, capsys):
  """Missing bucket and no permission: refused before anything starts. An object of the newest checkpoint gone:
  detect says so in one line; training moves that checkpoint aside (kept) and redoes its steps from the one
  before, to the same parameters."""
  line = _one_line_error(['electra_jax.main', '--config=configs/tiny.py', '--workdir=gs://no-such-bucket/run'])
  assert 'gs://no-such-bucket: bucket not found' in line and 'gcloud storage buckets create' in line
  line = _one_line_error(['electra_jax.main', '--config=configs/tiny.py', f'--workdir={runs.root}/new'],
                         env=forbidden_gcs_environment)
  assert f'no access to {runs.root}/new' in line and 'roles/storage.objectUser' in line

  damaged = f'{runs.root}/damaged'
  for name in files_under(runs.remote):
    fileio.copy(f'{runs.remote}/{name}', f'{damaged}/{name}')
  assert checkpoint_steps(damaged) == [3, 4, 8]
  newest = fileio.path(damaged) / 'checkpoints' / '8'
  gone = next(name for name in json.loads((newest / checkpoint.CHECKSUMS).read_text()) if '/d/' in name)
  kept = [name for name in files_under(newest) if name != gone]
  (newest / gone).unlink()
  capsys.readouterr()
  with pytest.raises(SystemExit):
    detect.main(['--checkpoint', damaged, 'the cat'])
  error = capsys.readouterr().err.strip()
  assert '\n' not in error and error.startswith('error: checkpoint 8 in ') and 'Other steps: 3, 4' in error

  trainer.train(runs.config, damaged)
  assert f'checkpoint 8 in {damaged}/checkpoints cannot be read' in capsys.readouterr().err
  moved = fileio.path(damaged) / checkpoint.UNREADABLE / '8'
  assert files_under(moved) == kept
  assert checkpoint_steps(damaged) == [3, 4, 8]  # steps 5-8 again, from checkpoint 4
  jax.tree.map(np.testing.assert_array_equal, final_params(runs.local)[0], final_params(damaged)[0])
  # metrics.jsonl reads as one run: the lines of steps 5-8 replaced, not repeated.
  assert [(m['step'], m['loss']) for m in _read_jsonl(f'{damaged}/metrics.jsonl')] == [
      (m['step'], m['loss']) for m in _read_jsonl(f'{runs.local}/metrics.jsonl')]


@pytest.mark.e2e  # a whole workflow on gs:// (the README suite's 5-minute bound)
def test_finetune_predict_detect_and_convert_on_gcs(runs, cache_dir, capsys):
  local, remote, root = runs.local, runs.remote, runs.root
  task = f'{root}/task'
  rng = random.Random(0)
  for split, count in (('train', 32), ('dev', 16)):
    lines = ['label\tsentence']
    for _ in range(count):
      positive = rng.random() < 0.5
      words = [rng.choice(WORDS) for _ in range(5)] + (['happy'] if positive else [])
      lines.append(f'{"yes" if positive else "no"}\t{" ".join(words)}')
    fileio.write_text(f'{task}/{split}.tsv', '\n'.join(lines) + '\n')
  config = finetune_config.get_config()
  override(config, {'task': task, 'init_checkpoint': remote, 'seeds': 1, 'batch_size': 16, 'eval_batch_size': 16,
                    'epochs': 1.0, 'max_seq_length': 32, 'log_every': 1000, 'mesh.shape': (1, 1, 1),
                    'data.cache_dir': cache_dir})
  results = finetune.run(config, f'{root}/finetuned')
  assert json.loads(fileio.path(f'{root}/finetuned/results.json').read_text())['median'] == results['median']
  assert (fileio.path(root) / 'finetuned' / 'seeds' / '0' / 'predictions' / 'dev.tsv').is_file()

  fileio.write_text(f'{root}/inputs.txt', 'the happy cat\nthe dog ran\n')
  override(config, {'predict_input': f'{root}/inputs.txt', 'predict_output': f'{root}/predicted.txt',
                    'predict_format': 'labels'})
  finetune.predict_main(config, f'{root}/finetuned')
  assert set(fileio.path(f'{root}/predicted.txt').read_text().split()) <= {'yes', 'no'}
  assert len(fileio.path(f'{root}/predicted.txt').read_text().splitlines()) == 2

  # Detection on the gs:// run equals detection on the local one (their parameters are equal).
  capsys.readouterr()
  detect.main(['--checkpoint', remote, '--json', 'the cat sat on the mat'])
  from_gcs = json.loads(capsys.readouterr().out)
  detect.main(['--checkpoint', local, '--json', 'the cat sat on the mat'])
  assert json.loads(capsys.readouterr().out) == from_gcs
  # Export to Hugging Face on gs:// and import back: the same detector.
  convert.main(['--checkpoint', remote, '--to-hf', f'{root}/hf'])
  convert.main(['--from-hf', f'{root}/hf/discriminator', '--from-hf-generator', f'{root}/hf/generator',
                '--out', f'{root}/imported'])
  capsys.readouterr()
  detect.main(['--checkpoint', f'{root}/imported', '--json', 'the cat sat on the mat'])
  imported = json.loads(capsys.readouterr().out)
  assert [r['token'] for r in imported] == [r['token'] for r in from_gcs]
  np.testing.assert_allclose([r['p_replaced'] for r in imported], [r['p_replaced'] for r in from_gcs], atol=1e-6)
