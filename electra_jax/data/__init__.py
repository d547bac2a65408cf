"""Pre-training data: text -> tokenizer -> packed examples -> batches.

`load(config)` is what the trainer calls. Tokenizers trained here and packed examples are cached under
`data.cache_dir`, keyed by the source files (path, size, mtime) and the settings, so a second run starts at once.
"""

import dataclasses
import hashlib
import json
import os

import numpy as np

from electra_jax.data import corpus, packing
from electra_jax.data.corpus import DataError
from electra_jax.data.loader import BatchIterator
from electra_jax.data.tokenizer import Tokenizer, train_sentencepiece

__all__ = ['DataConfig', 'DataError', 'BatchIterator', 'Tokenizer', 'load_tokenizer', 'load_examples']


@dataclasses.dataclass(frozen=True)
class DataConfig:
  source: str = ''
  tokenizer: str = ''
  vocab_size: int = 8000
  lowercase: bool = True
  max_seq_length: int = 128
  cache_dir: str = ''


def cache_dir(config: DataConfig) -> str:
  return os.path.expanduser(config.cache_dir or os.environ.get('ELECTRA_JAX_CACHE', '~/.cache/electra_jax'))


def _fingerprint(*parts) -> str:
  return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def _files_fingerprint(files: list[str]):
  return [(os.path.abspath(f), os.path.getsize(f), int(os.path.getmtime(f))) for f in files]


def load_tokenizer(config: DataConfig) -> Tokenizer:
  """The configured SentencePiece model, or one trained on the source (once; then read from the cache)."""
  if config.tokenizer:
    return Tokenizer(config.tokenizer, config.lowercase)
  files = corpus.resolve_files(config.source)
  key = _fingerprint(_files_fingerprint(files), config.vocab_size, config.lowercase)
  model_file = os.path.join(cache_dir(config), f'spm-{config.vocab_size}-{key}.model')
  if os.path.exists(model_file):
    return Tokenizer(model_file, config.lowercase)
  lines = (line for document in corpus.read_documents(files) for line in document)
  return train_sentencepiece(lines, model_file, vocab_size=config.vocab_size, lowercase=config.lowercase)


def load_examples(config: DataConfig, tokenizer: Tokenizer, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
  """Packed (input_ids, segment_ids) [num_examples, max_seq_length] for the source; cached as .npz."""
  files = corpus.resolve_files(config.source)
  with open(tokenizer.model_file, 'rb') as f:
    tokenizer_hash = hashlib.sha256(f.read()).hexdigest()
  key = _fingerprint(_files_fingerprint(files), tokenizer_hash, config.lowercase, config.max_seq_length, seed)
  path = os.path.join(cache_dir(config), f'packed-{key}.npz')
  if os.path.exists(path):
    with np.load(path) as cached:
      return cached['input_ids'], cached['segment_ids']
  documents = (tokenizer.encode(document) for document in corpus.read_documents(files))
  input_ids, segment_ids = packing.pack_documents(documents, tokenizer.special, config.max_seq_length, seed)
  if not len(input_ids):
    raise DataError(f'data.source={config.source!r} holds no text (every line is empty); give a corpus with '
                    'one sentence or paragraph per line')
  os.makedirs(os.path.dirname(path), exist_ok=True)
  tmp = path + f'.tmp{os.getpid()}.npz'
  np.savez(tmp, input_ids=input_ids, segment_ids=segment_ids)
  os.replace(tmp, path)
  return input_ids, segment_ids
