"""Shared test setup: 8 faked CPU devices (set before jax is imported), small generated fixtures and a local
Cloud Storage emulator."""

import os

import xla_flags

# Faster-compiling XLA:CPU settings (tests/xla_flags.py); subprocesses inherit them.
os.environ.setdefault('XLA_FLAGS', f'--xla_force_host_platform_device_count=8 {xla_flags.fast_compile()}')
os.environ.setdefault('JAX_PLATFORMS', 'cpu')

import http.server
import json
import subprocess
import sys
import threading
import time
import urllib.request
import uuid

import jax
from jax.experimental.compilation_cache import compilation_cache
import pytest

from electra_jax import compile_cache
from electra_jax.data import corpus, tokenizer as tokenizer_lib
from helpers import CACHE_OPTIONS, GCS_BUCKET  # pylint: disable=g-bad-import-order
from helpers import emulator_environment, free_port, make_corpus, make_grammar_corpus


@pytest.fixture(scope='session')
def cache_dir(tmp_path_factory):
  """A per-session cache for tokenizers and packed data, so tests never touch ~/.cache."""
  path = tmp_path_factory.mktemp('electra_cache')
  os.environ['ELECTRA_JAX_CACHE'] = str(path)
  return str(path)


@pytest.fixture(scope='module')
def compile_once(tmp_path_factory):
  """A persistent compilation cache for one module's runs, in this process and the processes it starts (their
  environment names it): runs of the same config build the same programs (same shapes, new jit objects), so they
  compile once. Tests that compare runs bit for bit then also run one program. Like the entry point's cache
  (electra_jax.compile_cache), it stores only programs that take MIN_COMPILE_SECONDS or more to compile (train steps,
  initialisers, evaluation steps): writing and reading back an entry costs more than compiling the hundreds of small
  programs it would otherwise store."""
  values = (str(tmp_path_factory.mktemp('jax_cache')), compile_cache.MIN_COMPILE_SECONDS, 0)
  saved = {name: getattr(jax.config, name) for name in CACHE_OPTIONS}
  saved_env = {env: os.environ.get(env) for env in CACHE_OPTIONS.values()}
  for (name, env), value in zip(CACHE_OPTIONS.items(), values):
    jax.config.update(name, value)
    os.environ[env] = str(value)
  compilation_cache.reset_cache()  # the cache's state is decided at the first compile, which may have happened
  yield
  for name, value in saved.items():
    jax.config.update(name, value)
  for env, value in saved_env.items():
    if value is None:
      os.environ.pop(env, None)
    else:
      os.environ[env] = value
  compilation_cache.reset_cache()


@pytest.fixture(scope='session')
def corpus_file(tmp_path_factory):
  return make_corpus(tmp_path_factory.mktemp('corpus') / 'corpus.txt', documents=80)


@pytest.fixture(scope='session')
def corpus_dir(tmp_path_factory):
  """A corpus of three gzipped files, 40 documents each: what the data builds (local and Beam) shard."""
  directory = tmp_path_factory.mktemp('corpus_dir')
  for i in range(3):
    make_corpus(directory / f'part{i}.txt.gz', documents=40, seed=i, gz=True)
  return str(directory)


@pytest.fixture(scope='session')
def corpus_tokenizer(corpus_dir, tmp_path_factory):
  """A 64-piece WordPiece tokenizer trained on `corpus_dir`."""
  lines = (line for document in corpus.TextFiles(corpus_dir).documents() for line in document)
  return tokenizer_lib.train(lines, str(tmp_path_factory.mktemp('tokenizer')), vocab_size=64, kind='wordpiece')


@pytest.fixture(scope='session')
def grammar_corpus(tmp_path_factory):
  return make_grammar_corpus(tmp_path_factory.mktemp('grammar') / 'grammar.txt')


@pytest.fixture(scope='session')
def gcs_bucket(tmp_path_factory):
  """A local Cloud Storage emulator (gcp-storage-emulator, in memory, on a free port) holding one empty bucket;
  yields 'gs://BUCKET'. The environment points this process's and its subprocesses' clients at it."""
  port = free_port()
  log = tmp_path_factory.mktemp('gcs') / 'emulator.log'
  with open(log, 'wb') as out:
    server = subprocess.Popen([sys.executable, os.path.join(os.path.dirname(__file__), 'gcs_emulator.py'), 'start',
                               '--host=127.0.0.1',
                               f'--port={port}', '--in-memory', f'--default-bucket={GCS_BUCKET}'],
                              stdout=out, stderr=subprocess.STDOUT)
  url = f'http://127.0.0.1:{port}'
  try:
    deadline = time.time() + 60
    while True:
      try:
        with urllib.request.urlopen(f'{url}/storage/v1/b/{GCS_BUCKET}', timeout=5) as response:
          if response.status == 200:
            break
      except OSError:
        pass
      if server.poll() is not None or time.time() > deadline:
        pytest.fail(f'the Cloud Storage emulator did not start: {log.read_text()[-2000:]}')
      time.sleep(0.2)
    with pytest.MonkeyPatch.context() as patch:
      for name, value in emulator_environment(url).items():
        patch.setenv(name, value)
      yield f'gs://{GCS_BUCKET}'
  finally:
    server.terminate()
    server.wait(timeout=30)


@pytest.fixture
def gcs_dir(gcs_bucket):
  """A fresh gs:// directory for one test."""
  return f'{gcs_bucket}/{uuid.uuid4().hex[:12]}'


class _Forbidden(http.server.BaseHTTPRequestHandler):
  """Answers every request as Cloud Storage answers an account without permission."""

  def _deny(self):
    body = json.dumps({'error': {'code': 403, 'message': 'tester@example.com does not have storage.objects.list '
                                 'access to the Google Cloud Storage bucket.', 'errors': [{'reason': 'forbidden'}]}})
    self.send_response(403)
    self.send_header('Content-Type', 'application/json')
    self.send_header('Content-Length', str(len(body)))
    self.end_headers()
    self.wfile.write(body.encode())

  do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _deny

  def log_message(self, *args):
    del args


@pytest.fixture(scope='module')
def forbidden_gcs_environment():
  """The environment (for a subprocess) of a machine whose credentials Cloud Storage refuses: every request is
  answered 403 by a local server."""
  server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), _Forbidden)
  thread = threading.Thread(target=server.serve_forever, daemon=True)
  thread.start()
  yield dict(os.environ, **emulator_environment(f'http://127.0.0.1:{server.server_address[1]}'))
  server.shutdown()
  server.server_close()


# The files that take longest, longest first (worker seconds on 2 idle cores, 2026-11-26: test_train_step 68-80,
# test_sharding 64-72, test_trainer 58-61, test_gcs 51-55, test_compare 51-54, test_continued 45-51, test_aot 35,
# test_finetune_train 35; the rest under 32). `--dist loadfile` hands whole files to the workers in collection order
# (pytest.ini turns off xdist's own order, by number of tests): short files go last and the two workers end
# together. Only the order changes: a file missing here runs after these, in its usual place. The multihost tier's
# longest file comes first too: one worker runs it, the other test_multihost.py and then test_multihost_finetune.py
# (xdist gives a worker a second file at once when its first has 2 tests or fewer left to run).
LONGEST_FIRST = ('test_multihost_main.py', 'test_train_step.py', 'test_sharding.py', 'test_trainer.py', 'test_gcs.py',
                 'test_compare.py', 'test_continued.py', 'test_aot.py', 'test_finetune_train.py', 'test_attention.py',
                 'test_objective_ablations.py', 'test_convert.py', 'test_frozen.py', 'test_precision.py',
                 'test_learning.py', 'test_model.py', 'test_gdes.py')


def pytest_collection_modifyitems(items):
  """Longest files first (LONGEST_FIRST; a stable sort keeps each file's tests together and in order). The fault
  and multi-process tests are slow too: `-m "not slow"` replaces pytest.ini's `-m`, and must still leave them out."""
  rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
  items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
  for item in items:
    if any(item.get_closest_marker(tier) for tier in ('faults', 'multihost', 'e2e')):
      item.add_marker(pytest.mark.slow)


@pytest.fixture
def online(monkeypatch):
  """tfds's download host counts as reachable (finetune.tasks checks it before a download): for tests whose tfds
  data is mock data or fixture files, which stand in for the network."""
  from electra_jax.finetune import tasks  # noqa: PLC0415  (only the tests that use tfds need it)
  monkeypatch.setattr(tasks, '_check_download_host', lambda *args: None)
