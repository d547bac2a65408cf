"""Shared test setup: 8 faked CPU devices (set before jax is imported), small generated fixtures and a local
Cloud Storage emulator."""

import os

# LLVM -O0: XLA:CPU compiles the tiny test programs 3-4x faster (the tests are compile-bound, not run-bound).
os.environ.setdefault('XLA_FLAGS', '--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0')
os.environ.setdefault('JAX_PLATFORMS', 'cpu')

import gzip  # pylint: disable=g-import-not-at-top,wrong-import-position
import http.server
import json
import random
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid

import jax
from jax.experimental.compilation_cache import compilation_cache
import pytest

from configs import default  # pylint: disable=g-bad-import-order

WORDS = ('the cat dog bird sat ran on under a mat rug tree and saw big small red blue house field ate drank '
         'water food then quickly slowly happy sad man woman child old young walked over near far').split()


def make_corpus(path, *, documents: int = 60, seed: int = 0, gz: bool = False) -> str:
  """Writes a small synthetic corpus (one sentence per line, blank line between documents) to `path`."""
  rng = random.Random(seed)
  lines = []
  for _ in range(documents):
    for _ in range(rng.randint(3, 12)):
      lines.append(' '.join(rng.choice(WORDS) for _ in range(rng.randint(4, 16))).capitalize() + '.')
    lines.append('')
  text = '\n'.join(lines) + '\n'
  if gz:
    with gzip.open(path, 'wt', encoding='utf-8') as f:
      f.write(text)
  else:
    with open(path, 'w', encoding='utf-8') as f:
      f.write(text)
  return str(path)


@pytest.fixture(scope='session')
def cache_dir(tmp_path_factory):
  """A per-session cache for tokenizers and packed data, so tests never touch ~/.cache."""
  path = tmp_path_factory.mktemp('electra_cache')
  os.environ['ELECTRA_JAX_CACHE'] = str(path)
  return str(path)


CACHE_OPTIONS = {'jax_compilation_cache_dir': 'JAX_COMPILATION_CACHE_DIR',
                 'jax_persistent_cache_min_compile_time_secs': 'JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS',
                 'jax_persistent_cache_min_entry_size_bytes': 'JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES'}


@pytest.fixture(scope='module')
def compile_once(tmp_path_factory):
  """A persistent compilation cache for one module's runs, in this process and the processes it starts (their
  environment names it): runs of the same config build the same programs (same shapes, new jit objects), so they
  compile once. Tests that compare runs bit for bit then also run one program."""
  values = (str(tmp_path_factory.mktemp('jax_cache')), 0.0, 0)
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


GRAMMAR = {
    'det': 'the a every some'.split(),
    'adj': 'big small red old young happy'.split(),
    'noun': 'cat dog bird king woman child horse tree'.split(),
    'verb': 'saw found loved fed followed carried'.split(),
    'prep': 'near under behind beside'.split(),
}
TEMPLATES = (('det', 'adj', 'noun', 'verb', 'det', 'noun'),
             ('det', 'noun', 'verb', 'det', 'adj', 'noun', 'prep', 'det', 'noun'),
             ('det', 'adj', 'adj', 'noun', 'verb', 'det', 'noun'))


def make_grammar_corpus(path, *, documents: int = 150, seed: int = 0) -> str:
  """A corpus where context predicts each word's class (a noun follows a determiner or adjective, ...).

  A replaced token is detectable from its neighbours, so replaced-token detection is learnable in few steps;
  random-word corpora (make_corpus) offer no such signal.
  """
  rng = random.Random(seed)
  lines = []
  for _ in range(documents):
    for _ in range(rng.randint(4, 10)):
      lines.append(' '.join(rng.choice(GRAMMAR[c]) for c in rng.choice(TEMPLATES)) + ' .')
    lines.append('')
  with open(path, 'w', encoding='utf-8') as f:
    f.write('\n'.join(lines) + '\n')
  return str(path)


@pytest.fixture(scope='session')
def grammar_corpus(tmp_path_factory):
  return make_grammar_corpus(tmp_path_factory.mktemp('grammar') / 'grammar.txt')


def override(config, overrides: dict, sep: str = '.'):
  """Sets `section<sep>key` entries of a ConfigDict or nested dict in place and returns it."""
  for dotted, value in overrides.items():
    *path, key = dotted.split(sep)
    node = config
    for part in path:
      node = node[part]
    node[key] = value
  return config


def tiny_pretraining_config(source, cache_dir, **overrides):
  """The tests' tiny pre-training run (2 layers, H=32, 32-token sequences, 8 steps, one device); `overrides` are
  dotted keys (`**{'data.eval_fraction': 0.2}`)."""
  config = default.get_config()
  config.train_steps = 8
  config.batch_size = 8
  config.log_every = 1
  config.checkpoint_every = 4
  config.data.update(source=source, vocab_size=64, max_seq_length=32, cache_dir=cache_dir)
  config.model.update(embedding_size=16, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                      generator_hidden_fraction=0.5, max_position_embeddings=64)
  config.optimizer.update(learning_rate=1e-3, warmup_steps=2)
  config.mesh.shape = (1, 1, 1)  # one device: equivalence across meshes is tests/test_sharding.py's subject
  return override(config, overrides)


GCS_BUCKET = 'electra-test'


def free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def emulator_environment(url: str) -> dict[str, str]:
  """What points every Cloud Storage client of a run at the server at `url` instead of storage.googleapis.com."""
  return {
      'STORAGE_EMULATOR_HOST': url,  # gcsfs (epath's gs:// backend) and google-cloud-storage
      'TENSORSTORE_GCS_HTTP_URL': url,  # tensorstore: orbax's checkpoint arrays
      'GOOGLE_AUTH_TOKEN_FOR_TESTING': 'fake',  # tensorstore: no credential lookup
      # gcsfs would first ask the Storage Control API (which the emulator lacks) for the bucket's layout and, with
      # no credentials, log a warning on every call.
      'GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT': 'false',
  }


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
