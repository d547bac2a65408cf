"""JAX's persistent compilation cache: on by default under the cache dir, off on request, a given one kept."""

import jax
import pytest

from electra_jax import compile_cache
from helpers import CACHE_OPTIONS  # pylint: disable=g-bad-import-order


@pytest.fixture
def no_cache_configured():
  """No compilation cache directory set for the test; the process's settings restored after it."""
  saved = {name: getattr(jax.config, name) for name in CACHE_OPTIONS}
  jax.config.update('jax_compilation_cache_dir', None)
  yield
  for name, value in saved.items():
    jax.config.update(name, value)


def test_on_by_default_under_the_cache_dir(tmp_path, monkeypatch, no_cache_configured):
  del no_cache_configured
  monkeypatch.delenv('ELECTRA_JAX_COMPILATION_CACHE', raising=False)
  assert compile_cache.enable(str(tmp_path)) == str(tmp_path / 'jax') == jax.config.jax_compilation_cache_dir
  assert jax.config.jax_persistent_cache_min_compile_time_secs == compile_cache.MIN_COMPILE_SECONDS
  monkeypatch.setenv('ELECTRA_JAX_CACHE', str(tmp_path / 'env'))
  jax.config.update('jax_compilation_cache_dir', None)
  assert compile_cache.enable('') == str(tmp_path / 'env' / 'jax')  # data.cache_dir unset: $ELECTRA_JAX_CACHE


def test_off_on_request_and_a_given_directory_kept(tmp_path, monkeypatch, no_cache_configured):
  del no_cache_configured
  monkeypatch.setenv('ELECTRA_JAX_COMPILATION_CACHE', 'off')
  assert compile_cache.enable(str(tmp_path)) is None and jax.config.jax_compilation_cache_dir is None
  monkeypatch.setenv('ELECTRA_JAX_COMPILATION_CACHE', '1')
  jax.config.update('jax_compilation_cache_dir', str(tmp_path / 'mine'))  # as JAX_COMPILATION_CACHE_DIR sets it
  assert compile_cache.enable(str(tmp_path)) == str(tmp_path / 'mine')


def test_an_entry_cut_short_is_a_miss_and_written_again(tmp_path, monkeypatch, no_cache_configured):
  """An entry whose write a full disk cut short: jax warned at each read and compiled again, but never replaced it
  (it skips a key it has), so no later run started warm. It is now a miss, removed, and the next write succeeds."""
  del no_cache_configured
  from jax._src import compilation_cache, lru_cache  # noqa: PLC0415  # pylint: disable=g-import-not-at-top
  monkeypatch.delenv('ELECTRA_JAX_COMPILATION_CACHE', raising=False)
  monkeypatch.setattr(lru_cache.LRUCache, 'get', lru_cache.LRUCache.get)  # undone after the test
  compile_cache.enable(str(tmp_path))
  cache = lru_cache.LRUCache(str(tmp_path / 'jax'), max_size=-1)
  entry = compilation_cache.compress_executable(b'a compiled program' * 1000)
  cache.put('step', entry[:len(entry) // 2])  # as the disk filled up
  assert cache.get('step') is None and not (tmp_path / 'jax' / 'step-cache').exists()
  cache.put('step', entry)
  assert cache.get('step') == entry
