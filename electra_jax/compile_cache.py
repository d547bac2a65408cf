"""JAX's persistent compilation cache, on by default: a rerun, a resume or another fine-tuning seed of the same
shapes loads the compiled step from disk instead of compiling it again (on a 2-core CPU the tiny config's train
step takes ~30 s to compile; see BENCHMARKS.md, "How long to the first step?").

The cache lives in DATA_CACHE/jax (DATA_CACHE: `data.cache_dir`, else $ELECTRA_JAX_CACHE, else
~/.cache/electra_jax). ELECTRA_JAX_COMPILATION_CACHE=0 turns it off; a directory the user already gave JAX
(JAX_COMPILATION_CACHE_DIR) is kept.
"""

import contextlib
import os

import jax

from electra_jax.data import corpus

OFF = ('0', 'false', 'no', 'off')
# Programs that compile faster than this are not worth a disk entry (JAX's default is 1 s; the tiny config's
# helpers — state initialisation, metric sums, fine-tuning's eval step — take 0.2-1 s each on a 2-core CPU).
MIN_COMPILE_SECONDS = 0.2


def enable(data_cache_dir: str = '') -> str | None:
  """Turns the persistent compilation cache on (once, before the first compile); returns its directory, or None
  when ELECTRA_JAX_COMPILATION_CACHE turns it off."""
  if os.environ.get('ELECTRA_JAX_COMPILATION_CACHE', '1').strip().lower() in OFF:
    return None
  directory = jax.config.jax_compilation_cache_dir
  if not directory:
    base = os.path.expanduser(data_cache_dir) if data_cache_dir else corpus.default_cache_dir()
    directory = os.path.join(base, 'jax')
    jax.config.update('jax_compilation_cache_dir', directory)
    jax.config.update('jax_persistent_cache_min_compile_time_secs', MIN_COMPILE_SECONDS)
    jax.config.update('jax_persistent_cache_min_entry_size_bytes', 0)
  _drop_unreadable_entries()
  return directory


def _drop_unreadable_entries():
  """Makes a cache entry jax cannot decompress (its write cut short: a full disk, a kill) a miss, and removes it.
  jax only warns that it cannot read it and compiles again, but never writes it anew (it adds no entry under a key
  it has), so every later run compiled again. (jax's cache class is private: without it, nothing changes.)"""
  try:
    from jax._src import compilation_cache, lru_cache  # noqa: PLC0415
    get, suffix = lru_cache.LRUCache.get, lru_cache._CACHE_SUFFIX  # pylint: disable=protected-access
  except (ImportError, AttributeError):
    return
  if getattr(get, 'drops_unreadable', False):
    return

  def checked_get(self, key):
    value = get(self, key)
    if value is None:
      return None
    try:
      compilation_cache.decompress_executable(value)
    except Exception:  # pylint: disable=broad-except  # zlib.error, zstd's own errors
      with contextlib.suppress(OSError):
        (self.path / f'{key}{suffix}').unlink()
      return None
    return value
  checked_get.drops_unreadable = True
  lru_cache.LRUCache.get = checked_get
