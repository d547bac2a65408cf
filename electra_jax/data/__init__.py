"""Pre-training data: text -> tokenizer -> packed examples -> batches.

What the trainer calls: `load_tokenizer(config)`, `load_examples(config, tokenizer, seed)` and `BatchIterator`.
`data.source` is text files, `tfds:NAME[/CONFIG]`, or a directory `python -m electra_jax.data build` wrote, local
or gs://. Text sources are packed in memory on first use; that and any tokenizer trained here are cached under
`data.cache_dir`, keyed by the source (file names, sizes, contents) and the settings, so a second run starts at
once. Large corpora are built once instead (build.py), in parallel, into ArrayRecord shards the loader reads on
demand; shards on gs:// are read from a verified local copy in `data.cache_dir` (array_record opens local files
only), of this process's share of them when several processes train (`load_examples`).
"""

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile

import jax
import numpy as np

from electra_jax import fileio, hosts, report
from electra_jax.config import DataConfig
from electra_jax.data import build as build_lib
from electra_jax.data import corpus
from electra_jax.data import examples as examples_lib
from electra_jax.data import split as split_lib
from electra_jax.data import tokenizer as tokenizer_lib
from electra_jax.errors import DataError
from electra_jax.data.loader import BatchIterator
from electra_jax.data.tokenizer import Tokenizer

__all__ = ['DataConfig', 'DataError', 'BatchIterator', 'Tokenizer', 'load_tokenizer', 'load_examples',
           'load_eval_examples', 'open_source']

TOKENIZER_SAMPLE_LINES = 2_000_000
CACHE = 'the cache (data.cache_dir, or $ELECTRA_JAX_CACHE)'  # how errors name it


def cache_dir(config: DataConfig) -> str:
  """The local cache directory (tokenizers, packed text, copies of gs:// shards): each host keeps its own."""
  directory = config.cache_dir or corpus.default_cache_dir()
  if fileio.is_remote(directory):
    raise DataError(f'data.cache_dir={directory!r} must be a local directory: it holds what each machine reads '
                    'at random (packed examples, copies of gs:// shards); leave it empty for ~/.cache/electra_jax')
  return os.path.expanduser(directory)


def _fingerprint(*parts) -> str:
  return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def open_source(config: DataConfig) -> corpus.TextFiles | corpus.TfdsText:
  """The text source of `config` (not for a built directory: see `examples.is_built`)."""
  return corpus.open_source(config.source, text_field=config.text_field, tfds_split=config.tfds_split,
                            tfds_data_dir=config.tfds_data_dir, cache_dir=cache_dir(config))


def built_directory(config: DataConfig, shards: list[int] | None = None) -> str:
  """The built `data.source` as a local directory: itself, or for gs:// a verified copy in the cache of its
  metadata, its tokenizer and the shards numbered `shards` (None: all)."""
  if not fileio.is_remote(config.source):
    return os.path.expanduser(config.source)
  metadata = examples_lib.read_metadata(config.source)
  names = [examples_lib.METADATA, tokenizer_lib.CONFIG_FILE, metadata['tokenizer']['file']]
  shards = range(len(metadata['shards'])) if shards is None else shards
  try:
    return fileio.local_copy(config.source, names + [metadata['shards'][i]['file'] for i in shards],
                             cache_dir(config))
  except OSError as e:
    raise DataError(f'cannot copy the built dataset {config.source} to the local cache: '
                    f'{fileio.describe(e)}') from None


def load_tokenizer(config: DataConfig) -> Tokenizer:
  """`data.tokenizer`; else the one a built `data.source` was made with; else one trained on the source (cached).
  A data.tokenizer directory saved with another casing than data.lowercase is refused in one line.

  A tokenizer trained on the source is process 0's on every process of a multi-host run: each host's cache is its
  own, and tokenizers the hosts trained themselves could differ (another version of a trainer, or WordPiece's
  trainer breaking a tie at the vocabulary's size in hash order), giving one piece different ids."""
  if config.tokenizer:
    saved = tokenizer_lib.saved_lowercase(config.tokenizer)
    # data.lowercase always has a value (true by default), so a saved casing that differs cannot be taken silently:
    # a cased vocabulary would see lower-cased text, an uncased one cased text.
    if saved is not None and saved != config.lowercase:
      raise DataError(f'data.tokenizer={config.tokenizer} was saved {"uncased" if saved else "cased"} (lowercase='
                      f'{str(saved).lower()}), but data.lowercase={str(config.lowercase).lower()}; set data.lowercase='
                      f'{str(saved).lower()} to match it ({"without" if saved else "with"} --cased for `python -m '
                      'electra_jax.data`)')
    return tokenizer_lib.load(config.tokenizer, config.lowercase)
  if examples_lib.is_built(config.source):
    return tokenizer_lib.load(built_directory(config, shards=[]))
  source = open_source(config)
  key = _fingerprint(source.fingerprint(), config.tokenizer_type, config.vocab_size, config.lowercase,
                     *tokenizer_lib.TRAINER_CHANGES[config.tokenizer_type])
  directory = os.path.join(cache_dir(config), f'tokenizer-{config.tokenizer_type}-{config.vocab_size}-{key}')
  if hosts.processes() == 1:  # not jax.process_count(): `data build` and `data tokenizer` start no backend
    return _cached_or_trained(config, source, directory)
  return _from_process_0(lambda: _cached_or_trained(config, source, directory), directory)


def _cached_or_trained(config: DataConfig, source, directory: str) -> Tokenizer:
  """The tokenizer cached in `directory`, else one trained into a directory of this process's own and renamed into
  place: commands sharing a cache never train into one directory, and one interrupted removes only its own."""
  complete = os.path.join(directory, tokenizer_lib.CONFIG_FILE)  # written last: the tokenizer is complete
  if not os.path.exists(complete):
    fileio.check_writable_directory(os.path.dirname(directory), CACHE)
    os.makedirs(os.path.dirname(directory), exist_ok=True)
    own = tempfile.mkdtemp(prefix=f'{os.path.basename(directory)}.tmp', dir=os.path.dirname(directory))
    try:
      with report.stage(f'training a {config.tokenizer_type} tokenizer of {config.vocab_size} tokens on {source} '
                        f'(once: cached in {directory})', done='tokenizer trained'):
        tokenizer_lib.train(source.lines(TOKENIZER_SAMPLE_LINES), own, vocab_size=config.vocab_size,
                            kind=config.tokenizer_type, lowercase=config.lowercase,
                            max_sentences=TOKENIZER_SAMPLE_LINES)
    except BaseException:
      shutil.rmtree(own, ignore_errors=True)
      raise
    if os.path.isdir(directory) and not os.path.exists(complete):
      shutil.rmtree(directory, ignore_errors=True)  # left incomplete by a version that trained in place
    try:
      os.replace(own, directory)
    except OSError:  # another command's landed first: the same tokenizer
      shutil.rmtree(own, ignore_errors=True)
  return tokenizer_lib.load(directory, config.lowercase)


def _from_process_0(make, directory: str) -> Tokenizer:
  """The tokenizer `make()` gives on process 0, or the DataError it raises, on every process; the others save it
  into their cache `directory`."""
  from jax.experimental import multihost_utils  # noqa: PLC0415  (multi-host runs only)
  tokenizer = None
  sent = b''
  if jax.process_index() == 0:
    try:
      tokenizer = make()
      sent = json.dumps([tokenizer.file_name, tokenizer.lowercase]).encode() + b'\n' + tokenizer.model_bytes
    except DataError as e:  # the same line on every process, not a wait for a tokenizer that never comes
      sent = b'error\n' + str(e).encode()
  size = int(multihost_utils.broadcast_one_to_all(np.int32(len(sent))))
  received = np.asarray(multihost_utils.broadcast_one_to_all(
      np.frombuffer(sent, np.uint8) if sent else np.zeros(size, np.uint8))).tobytes()
  if tokenizer is not None:
    return tokenizer
  header, body = received.split(b'\n', 1)
  if header == b'error':  # raised by every process, process 0 included: no process needs telling (hosts.py)
    raise DataError(body.decode(), every_process=True)
  file_name, lowercase = json.loads(header)
  with fileio.atomic_writer(os.path.join(directory, file_name)) as f:
    f.write(body)
  tokenizer = tokenizer_lib.load(os.path.join(directory, file_name), lowercase)
  tokenizer.save(directory)  # its settings file, written last: the cached tokenizer is complete
  return tokenizer


def load_examples(config: DataConfig, tokenizer: Tokenizer, seed: int = 0, *, process_index: int = 0,
                  process_count: int = 1):
  """The packed training examples of `data.source`: a built directory's shards, or text packed in memory (cached
  .npz), without the documents `data.eval_fraction` holds out.

  Returns a store with `len()`, `max_length` and `read(indices)` for `BatchIterator`. `seed` drives the packing
  of text sources; a built directory was packed with the seed given to `build`. A built directory on gs:// read by
  several processes gives each only its own shards (`examples.host_shards`; the store's `host_part` is then
  (process_index, process_count)), so that each host copies only those to its disk.
  """
  return _load_examples(config, tokenizer, seed, split='train' if config.eval_fraction else '',
                        part=(process_index, process_count) if fileio.is_remote(config.source) else (0, 1))


def load_eval_examples(config: DataConfig, tokenizer: Tokenizer, seed: int = 0):
  """The held-out examples: those of `data.eval_source` (anything `data.source` accepts), or those of the documents
  `data.eval_fraction` holds out of `data.source`; None when neither is set."""
  if config.eval_source:
    eval_config = dataclasses.replace(config, source=config.eval_source, eval_source='', eval_fraction=0.0)
    try:
      return _load_examples(eval_config, tokenizer, seed, split='')
    except DataError as e:  # its messages name the key they read, data.source: here that is data.eval_source
      raise DataError(str(e).replace('data.source', 'data.eval_source')) from None
  if config.eval_fraction:
    return _load_examples(config, tokenizer, seed, split='eval')
  return None


def _load_examples(config: DataConfig, tokenizer: Tokenizer, seed: int, split: str, part=(0, 1)):
  """The examples of `config.source`, of one side of its held-out split when `split` is 'train' or 'eval'; of a
  built source, process part[0]'s share of its shards among part[1] processes."""
  if examples_lib.is_built(config.source):
    if split:
      raise DataError(f'data.eval_fraction holds documents out when text is packed, but data.source='
                      f'{config.source} was built (packed) already; give the held-out text as data.eval_source '
                      '(text files, tfds: or another built directory) and leave data.eval_fraction at 0')
    shards = examples_lib.host_shards(
        [shard['examples'] for shard in examples_lib.read_metadata(config.source)['shards']], *part)
    built = examples_lib.ArrayRecordExamples(built_directory(config, shards), shards)
    built.host_part = None if shards is None else part
    metadata = built.metadata
    if metadata['tokenizer']['fingerprint'] != tokenizer.fingerprint:
      raise DataError(f'{config.source} was built with another tokenizer than {tokenizer.model_file} '
                      f'(lowercase={tokenizer.lowercase}); leave data.tokenizer empty to use the one saved with it')
    if metadata.get('long_lines', 'split') != config.long_lines:
      raise DataError(f'{config.source} was built with long_lines={metadata.get("long_lines", "split")}, but '
                      f'data.long_lines={config.long_lines}; set it to match, or rebuild the data with `python -m '
                      f'electra_jax.data build --long_lines={config.long_lines}`')
    if metadata['max_seq_length'] != config.max_seq_length:
      raise DataError(f'{config.source} holds examples of max_seq_length={metadata["max_seq_length"]}, but '
                      f'data.max_seq_length={config.max_seq_length}; add --config.data.max_seq_length='
                      f'{metadata["max_seq_length"]} to match, or rebuild the data with `python -m electra_jax.data '
                      f'build --max_seq_length={config.max_seq_length}`')
    return built
  source = open_source(config)
  if split:
    source = split_lib.DocumentSplit(source, config.eval_fraction, split)
  how = build_lib.Packing(config.max_seq_length, seed, config.long_lines)
  key = _fingerprint(examples_lib.VERSION, source.fingerprint(), tokenizer.fingerprint, how.max_length, how.seed,
                     how.chunk_chars, *([how.long_lines] if how.long_lines != 'split' else []),
                     *tokenizer.encode_changes)
  # (long_lines='split', the default, is left out of the key: caches packed before the option stay valid.)
  path = os.path.join(cache_dir(config), f'packed-{key}.npz')
  if os.path.exists(path):
    with np.load(path) as cached:
      return examples_lib.InMemoryExamples(cached['input_ids'].astype(np.int32),
                                           cached['segment_ids'].astype(np.int32))
  fileio.check_writable_directory(os.path.dirname(path), CACHE)  # before the packing, not after it
  with report.stage(f'packing {source} into examples of {config.max_seq_length} tokens (once: cached in {path})',
                    done='packed'):
    try:
      examples = build_lib.pack_in_memory(source, tokenizer, how, progress=report.is_chief())
    except corpus.EmptyTextError:
      if split == 'eval':
        raise DataError(f'data.eval_fraction={config.eval_fraction} holds out no document of {source.source}; raise '
                        'it, or give held-out text as data.eval_source') from None
      if split == 'train' and any(source.source.documents()):  # there is text: all of it is held out
        raise DataError(f'data.eval_fraction={config.eval_fraction} holds out every document of {source.source}, '
                        'leaving none to train on; lower it, or add text') from None
      raise
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with fileio.atomic_writer(path) as f:
    np.savez(f, input_ids=examples.input_ids.astype(examples_lib.ids_dtype(tokenizer.vocab_size)),
             segment_ids=examples.segment_ids.astype(np.uint8))
  return examples
