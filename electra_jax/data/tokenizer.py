"""Tokenizers with the special tokens ELECTRA needs: [PAD] [UNK] [CLS] [SEP] [MASK].

Two kinds share one interface (`Tokenizer`): a SentencePiece model (unigram or BPE), and a BERT-style WordPiece
vocab.txt read with the `tokenizers` library, so Google-compatible models can be trained. Tokenizers trained here
put the special tokens at ids 0..4; an existing model or vocabulary is accepted if it defines all five.

`save(directory)` writes the tokenizer file (tokenizer.model or vocab.txt) plus electra_tokenizer.json (its kind
and casing), and `load(directory)` reads them back: that is how a run's workdir and a built dataset carry theirs.
"""

import collections
import hashlib
import json
import os
import random
import re
import subprocess
import sys
import tempfile
from typing import Iterable, Sequence

from electra_jax import fileio
from electra_jax.config import TOKENIZER_TYPES
from electra_jax.errors import DataError
from electra_jax.masking import SpecialIds

SPECIAL_PIECES = ('[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]')
CONFIG_FILE = 'electra_tokenizer.json'
HF_TOKENIZER_FILE = 'tokenizer.json'  # what transformers 5 saves a fast tokenizer as (no vocab.txt)
# What a saved tokenizer directory may hold (`Tokenizer.save`, `python -m electra_jax.data tokenizer`, transformers).
FILES = (CONFIG_FILE, 'tokenizer.model', 'vocab.txt', HF_TOKENIZER_FILE)
TYPES = TOKENIZER_TYPES  # data.tokenizer_type: config.py holds them, where DataConfig checks them
# Why a tokenizer cannot be trained on a corpus without a line of text (data.source, or --source of `data tokenizer`).
NO_TEXT = 'the corpus is empty (not one line of text): point the source at files that hold text'


def _special_ids(ids: dict[str, int | None], where: str) -> SpecialIds:
  missing = [piece for piece in SPECIAL_PIECES if ids.get(piece) is None]
  if missing:
    raise DataError(f'tokenizer {where!r} lacks the special tokens {missing}; ELECTRA needs '
                    f'{list(SPECIAL_PIECES)}: train one with `python -m electra_jax.data tokenizer`')
  return SpecialIds(pad=ids['[PAD]'], cls=ids['[CLS]'], sep=ids['[SEP]'], mask=ids['[MASK]'], unk=ids['[UNK]'])


class Tokenizer:
  """What the data pipeline and the trainer need of a tokenizer; subclasses wrap one library each.

  Attributes:
    model_file: the file the tokenizer was read from (tokenizer .model or vocab.txt).
    lowercase: whether text is lower-cased before tokenizing.
    num_threads: threads a batch `encode` may use (-1: all cores).
    special: ids of [PAD] [CLS] [SEP] [MASK] [UNK].
  """
  kind = ''
  file_name = ''  # name of the tokenizer file inside a saved directory
  # How `encode` changed since text was first packed with this kind, named in the packed data cache's key (not in
  # the fingerprint, which built datasets and checkpoints record): text packed before is packed again.
  encode_changes: tuple[str, ...] = ()
  model_file: str
  lowercase: bool
  num_threads: int
  special: SpecialIds

  @property
  def vocab_size(self) -> int:
    raise NotImplementedError

  def encode(self, lines: Sequence[str]) -> list[list[int]]:
    """Token ids of each line (no [CLS]/[SEP] added)."""
    raise NotImplementedError

  def decode(self, ids: Iterable[int]) -> str:
    raise NotImplementedError

  def pieces(self, ids: Iterable[int]) -> list[str]:
    raise NotImplementedError

  model_bytes: bytes  # the tokenizer file's content, read once (it may be a gs:// object)

  @property
  def fingerprint(self) -> str:
    """sha256 of the tokenizer file, kind and casing: what a packed dataset was tokenized with."""
    return hashlib.sha256(f'{self.kind}:{self.lowercase}:'.encode() + self.model_bytes).hexdigest()

  def save(self, directory) -> str:
    """Writes the tokenizer file and electra_tokenizer.json into `directory` (local or gs://); returns the
    tokenizer file's path."""
    path = fileio.path(directory) / self.file_name
    if path != fileio.path(self.model_file):
      with fileio.atomic_writer(path) as f:
        f.write(self.model_bytes)
    fileio.write_json(fileio.path(directory) / CONFIG_FILE,
                      {'type': self.kind, 'file': self.file_name, 'lowercase': self.lowercase})
    return str(path)

  def __reduce__(self):
    # Worker processes rebuild the tokenizer from its file rather than pickling library objects.
    return type(self), (self.model_file, self.lowercase, self.num_threads)


class SentencePieceTokenizer(Tokenizer):
  """A SentencePiece model (unigram or BPE); text is lower-cased here when `lowercase`."""
  kind = 'sentencepiece'
  file_name = 'tokenizer.model'

  def __init__(self, model_file: str, lowercase: bool = True, num_threads: int = -1):
    import sentencepiece as spm  # noqa: PLC0415
    self.num_threads = num_threads
    self.model_bytes = _read_bytes(model_file)
    try:
      self.sp = spm.SentencePieceProcessor(model_proto=self.model_bytes, num_threads=num_threads)
    except (RuntimeError, OSError) as e:
      raise DataError(f'{model_file!r} is not a SentencePiece model ({e})') from None
    self.model_file, self.lowercase = model_file, lowercase
    ids = {piece: self.sp.piece_to_id(piece) for piece in SPECIAL_PIECES}
    self.special = _special_ids({p: i for p, i in ids.items() if self.sp.id_to_piece(i) == p}, model_file)

  @property
  def vocab_size(self) -> int:
    return self.sp.get_piece_size()

  def encode(self, lines: Sequence[str]) -> list[list[int]]:
    if self.lowercase:
      lines = [line.lower() for line in lines]
    return self.sp.encode(list(lines))

  def decode(self, ids: Iterable[int]) -> str:
    return self.sp.decode([int(i) for i in ids])

  def pieces(self, ids: Iterable[int]) -> list[str]:
    return [self.sp.id_to_piece(int(i)) for i in ids]


# The official tokenizer (BERT's WordpieceTokenizer) reads a longer word as [UNK]; the `tokenizers` library's default
# is 100 characters.
MAX_WORD_CHARS = 200


class WordPieceTokenizer(Tokenizer):
  """A BERT WordPiece vocabulary ('##' continuations) with BERT's normaliser and pre-tokenizer.

  Read from a vocab.txt (one token per line, as Google and older transformers save it) or from the WordPiece
  model inside a Hugging Face tokenizer.json (what transformers 5 saves instead). `lowercase` None takes the
  tokenizer.json's casing (a vocab.txt: uncased). With `lowercase`, accents are stripped too, as BERT's uncased
  models do (a tokenizer.json: as its normaliser says). As the official tokenizer,
  it splits text that spells a special token ('[SEP]') like any other text and reads words of up to MAX_WORD_CHARS
  characters (a tokenizer.json: its own limit).
  """
  kind = 'wordpiece'
  file_name = 'vocab.txt'
  encode_changes = ('special-token spellings and words of up to 200 characters as the official tokenizer',)

  def __init__(self, model_file: str, lowercase: bool | None = None, num_threads: int = -1):
    # The tokenizers library sizes its thread pool from RAYON_NUM_THREADS / TOKENIZERS_PARALLELISM instead.
    from tokenizers import Tokenizer as Pipeline, decoders, models, normalizers, pre_tokenizers  # noqa: PLC0415
    self.num_threads = num_threads
    self.model_bytes = _read_bytes(model_file)
    options = {'unk_token': '[UNK]', 'continuing_subword_prefix': '##', 'max_input_chars_per_word': MAX_WORD_CHARS}
    normalizer = {'lowercase': True}  # BERT's: strip_accents follows lowercase
    if model_file.endswith('.json'):
      self.file_name = HF_TOKENIZER_FILE
      vocab, options, normalizer = _read_tokenizer_json(model_file, self.model_bytes)
    else:
      vocab = _read_vocab(model_file, self.model_bytes)
    if lowercase is not None:
      normalizer['lowercase'] = lowercase
    self.special = _special_ids(vocab, model_file)
    self.model_file, self.lowercase = model_file, normalizer['lowercase']
    # No special token is an added token of the pipeline: `tokenizers` would match those in the raw text, so that a
    # corpus spelling '[PAD]' got a pad id (a hole in its input mask) and '[MASK]' one never chosen for masking.
    self.tokenizer = Pipeline(models.WordPiece(vocab, **options))
    self.tokenizer.normalizer = normalizers.BertNormalizer(**normalizer)
    self.tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    self.tokenizer.decoder = decoders.WordPiece(prefix=options['continuing_subword_prefix'])
    self._vocab_size = max(vocab.values()) + 1  # the embedding rows: a vocab.txt's lines, with any unused ones

  @property
  def vocab_size(self) -> int:
    return self._vocab_size

  def encode(self, lines: Sequence[str]) -> list[list[int]]:
    return [e.ids for e in self.tokenizer.encode_batch(list(lines), add_special_tokens=False)]

  def decode(self, ids: Iterable[int]) -> str:
    return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)

  def pieces(self, ids: Iterable[int]) -> list[str]:
    return [self.tokenizer.id_to_token(int(i)) for i in ids]


def _read_bytes(path: str) -> bytes:
  try:
    return fileio.path(path).read_bytes()
  except OSError as e:
    raise DataError(f'cannot read tokenizer {path!r}: {fileio.describe(e)}') from None


def _read_vocab(path: str, content: bytes) -> dict[str, int]:
  try:
    tokens = [line.rstrip('\r') for line in content.decode('utf-8').split('\n')]
  except UnicodeDecodeError:
    raise DataError(f'{path!r} is not a WordPiece vocab.txt (not UTF-8 text)') from None
  while tokens and not tokens[-1]:
    tokens.pop()
  # As BERT's and transformers' readers: line N is id N-1, a blank line and a repeated token's earlier line included
  # (a repeated token takes its last line's id), so that every token has its embedding row's id.
  vocab = {token: index for index, token in enumerate(tokens) if token}
  if not vocab:
    raise DataError(f'WordPiece vocabulary {path!r} is empty')
  return vocab


def _read_tokenizer_json(path: str, content: bytes) -> tuple[dict[str, int], dict, dict]:
  """The WordPiece vocabulary of a Hugging Face tokenizer.json, its WordPiece model's options and its
  BertNormalizer's (lowercase True when it says nothing). Another normaliser or pre-tokenizer than BERT's is refused:
  the file's ids would not be ours."""
  spec = _read_json_object(path, content)
  model = spec.get('model')
  if not isinstance(model, dict) or model.get('type') != 'WordPiece' or not isinstance(model.get('vocab'), dict):
    kind = model.get('type') if isinstance(model, dict) else None
    raise DataError(f'{path!r} holds a {kind or "unknown"} tokenizer, not WordPiece; electra_jax reads WordPiece '
                    'tokenizer.json files (BERT, ELECTRA), WordPiece vocab.txt and SentencePiece .model files')
  vocab = model['vocab']
  if sorted(vocab.values()) != list(range(len(vocab))):
    raise DataError(f'{path!r}: the WordPiece vocabulary\'s ids are not 0..{len(vocab) - 1}')
  for step, bert in (('normalizer', 'BertNormalizer'), ('pre_tokenizer', 'BertPreTokenizer')):
    kind = spec.get(step).get('type') if isinstance(spec.get(step), dict) else None
    if kind != bert:
      raise DataError(f'{path!r}: its {step} is {kind or "none"}, not {bert}; electra_jax reads BERT-style '
                      'WordPiece tokenizers, and would give other ids than this file')
  normalizer = {k: v for k, v in spec['normalizer'].items() if k in ('clean_text', 'handle_chinese_chars',
                                                                     'strip_accents')}
  normalizer['lowercase'] = bool(spec['normalizer'].get('lowercase', True))
  return vocab, {'unk_token': model.get('unk_token', '[UNK]'),
                 'continuing_subword_prefix': model.get('continuing_subword_prefix', '##'),
                 'max_input_chars_per_word': model.get('max_input_chars_per_word', 100)}, normalizer


def _read_json_object(path: str, content: bytes) -> dict:
  try:
    spec = json.loads(content.decode('utf-8'))
  except (UnicodeDecodeError, json.JSONDecodeError):
    spec = None
  if not isinstance(spec, dict):
    raise DataError(f'{path!r} is not a Hugging Face tokenizer.json (not a JSON object)')
  return spec


def _saved(location) -> dict | None:
  """The electra_tokenizer.json `Tokenizer.save` wrote into directory `location` (an epath), its casing filled in
  (uncased when it says nothing); None if there is none."""
  if not (location / CONFIG_FILE).is_file():
    return None
  config = fileio.read_json(location / CONFIG_FILE, 'restore it, or save the tokenizer again', DataError)
  return {**config, 'lowercase': config.get('lowercase', True)}


def saved_lowercase(path: str) -> bool | None:
  """The casing saved with the tokenizer directory `path` (local or gs://); None for a file, or a directory
  without electra_tokenizer.json."""
  saved = _saved(fileio.path(path if fileio.is_remote(path) else os.path.expanduser(path)))
  return None if saved is None else saved['lowercase']


def load(path: str, lowercase: bool | None = None, num_threads: int = -1) -> Tokenizer:
  """Reads a tokenizer: a SentencePiece .model, a WordPiece vocab.txt or Hugging Face tokenizer.json, or a
  directory holding one (`Tokenizer.save` writes such a directory).

  `lowercase` None takes the casing saved with the tokenizer (uncased when nothing says). `path` may be gs://.
  """
  location = fileio.path(path)
  path = os.fspath(location) if fileio.is_remote(location) else os.path.expanduser(os.fspath(path))
  if location.is_dir():
    if config := _saved(location):
      kind, file = config['type'], os.fspath(location / config['file'])
      lowercase = config['lowercase'] if lowercase is None else lowercase
    elif (location / SentencePieceTokenizer.file_name).exists():
      kind, file = SentencePieceTokenizer.kind, os.fspath(location / SentencePieceTokenizer.file_name)
    elif (location / HF_TOKENIZER_FILE).exists():  # before vocab.txt beside it: it holds the normaliser's options
      kind, file = WordPieceTokenizer.kind, os.fspath(location / HF_TOKENIZER_FILE)
    elif (location / WordPieceTokenizer.file_name).exists():
      kind, file = WordPieceTokenizer.kind, os.fspath(location / WordPieceTokenizer.file_name)
    else:
      raise DataError(f'directory {path!r} holds no tokenizer (tokenizer.model, vocab.txt or tokenizer.json)')
  elif location.is_file():
    file = path
    kind = WordPieceTokenizer.kind if path.endswith(('.txt', '.json')) else SentencePieceTokenizer.kind
  else:
    raise DataError(f'tokenizer {path!r} does not exist; give a SentencePiece .model, a WordPiece vocab.txt or '
                    'tokenizer.json, or a directory holding one')
  if kind == WordPieceTokenizer.kind:  # lowercase None: a tokenizer.json's own casing
    return WordPieceTokenizer(file, lowercase, num_threads)
  return SentencePieceTokenizer(file, True if lowercase is None else lowercase, num_threads)


def train(lines: Iterable[str], output: str, *, vocab_size: int, kind: str = 'unigram', lowercase: bool = True,
          max_sentences: int = 2_000_000) -> Tokenizer:
  """Trains a tokenizer on `lines` and saves it into directory `output` (see `Tokenizer.save`).

  `kind` is 'unigram' or 'bpe' (SentencePiece) or 'wordpiece' (BERT vocab.txt); [PAD] [UNK] [CLS] [SEP] [MASK]
  get ids 0..4. Both trainers see a uniform sample of at most `max_sentences` lines.
  """
  if kind not in TYPES:
    raise DataError(f'unknown tokenizer type {kind!r}; choose one of {", ".join(TYPES)}')
  with fileio.removed_on_failure(output):  # a failure or a Ctrl-C: leave no half-made tokenizer directory behind
    if not fileio.is_remote(output):
      os.makedirs(output, exist_ok=True)
    # The trainers write local files: beside a local output, else in the machine's temporary directory.
    with tempfile.TemporaryDirectory(dir=None if fileio.is_remote(output) else output) as tmp:
      lines = (line.lower() if lowercase and kind != 'wordpiece' else line for line in lines if line.strip())
      sample = _sample(lines, max_sentences)
      if kind == 'wordpiece':
        tokenizer = _train_wordpiece(sample, tmp, vocab_size=vocab_size, lowercase=lowercase)
      else:
        tokenizer = _train_sentencepiece(sample, tmp, vocab_size=vocab_size, model_type=kind, lowercase=lowercase,
                                         max_sentences=max_sentences)
      tokenizer.save(output)
  return load(output)


def _sample(lines: Iterable[str], count: int, seed: int = 0) -> list[str]:
  """A uniform sample of `count` lines (all of them if there are fewer), in corpus order: reservoir sampling."""
  rng, sample = random.Random(seed), []
  for i, line in enumerate(lines):
    if i < count:
      sample.append((i, line))
    elif (j := rng.randrange(i + 1)) < count:
      sample[j] = (i, line)
  return [line for _, line in sorted(sample)]


# SentencePiece's trainer, run in a child process: it holds a Ctrl-C until it is done (minutes on a large corpus),
# while a child stops with the command at once (subprocess.run kills it when this process is interrupted).
_SENTENCEPIECE_TRAINER = ('import json, sys, sentencepiece; '
                          'sentencepiece.SentencePieceTrainer.train(**json.loads(sys.argv[1]))')
# Its threads split the corpus between them, and another split gives other scores and pieces: a fixed count gives
# one corpus the same tokenizer on every machine, whatever its cores.
SENTENCEPIECE_THREADS = 16
# The trainer skips every line longer than this many UTF-8 bytes (its max_sentence_length), saying so only in its
# log: longer lines (a paragraph per line) are cut into pieces under it instead (`_cut`).
SENTENCEPIECE_MAX_BYTES = 4192
# The share of a corpus's characters a trained tokenizer gives pieces of their own (SentencePiece's
# character_coverage; the rarest others are [UNK]), and the fewest characters WordPiece keeps (its trainer's default).
CHARACTER_COVERAGE = 0.9995
WORDPIECE_ALPHABET = 1000
# What each trainer has changed since tokenizers were first cached, named in the cache's key: one cached before a
# change would stay on machines that had cached it while others trained anew.
TRAINER_CHANGES = {'unigram': (f'lines cut at {SENTENCEPIECE_MAX_BYTES}',),  # 83674ab
                   'bpe': (f'lines cut at {SENTENCEPIECE_MAX_BYTES}',),
                   'wordpiece': (f'alphabet covering {CHARACTER_COVERAGE}',)}


def _train_sentencepiece(sample, directory, *, vocab_size, model_type, lowercase, max_sentences) -> Tokenizer:
  if not sample:
    raise DataError(NO_TEXT)
  # The child reads the sample from a file, not the whole corpus. It runs in `directory` and names its files
  # relative to it: the trainer's options are saved in the model, and a temporary path there would change its bytes.
  with open(os.path.join(directory, 'text.txt'), 'w', encoding='utf-8') as f:
    f.writelines(piece + '\n' for line in sample for piece in _cut(line.replace('\n', ' ')))
  options = dict(
      input='text.txt', model_prefix='spm', vocab_size=vocab_size, model_type=model_type, pad_id=0, unk_id=1, bos_id=-1,
      eos_id=-1, pad_piece='[PAD]', unk_piece='[UNK]', user_defined_symbols=['[CLS]', '[SEP]', '[MASK]'],
      character_coverage=CHARACTER_COVERAGE, input_sentence_size=max_sentences, shuffle_input_sentence=True,
      num_threads=SENTENCEPIECE_THREADS, minloglevel=2)
  trained = subprocess.run([sys.executable, '-c', _SENTENCEPIECE_TRAINER, json.dumps(options)], capture_output=True,
                           text=True, check=False, cwd=directory)
  if trained.returncode:
    why = (trained.stderr.strip().splitlines() or [f'exit status {trained.returncode}'])[-1]
    why = why.removeprefix('RuntimeError: ').rstrip('.')
    raise DataError(f'training the SentencePiece tokenizer failed: {why}. {_vocabulary_advice(why)}')
  return SentencePieceTokenizer(os.path.join(directory, 'spm.model'), lowercase)


def _cut(line: str, limit: int = SENTENCEPIECE_MAX_BYTES) -> list[str]:
  """`line` cut into pieces of at most `limit` UTF-8 bytes, at the last space that fits (between two characters
  where a word is longer). SentencePiece's pieces never span a space, so cutting there loses it none."""
  text, pieces = line.encode('utf-8'), []
  while len(text) > limit:
    cut = text.rfind(b' ', 0, limit + 1)
    if cut <= 0:
      cut = limit
      while text[cut] & 0xC0 == 0x80:  # a UTF-8 continuation byte: inside a character
        cut -= 1
    pieces.append(text[:cut].decode('utf-8'))
    text = text[cut:].lstrip(b' ')
  return pieces + [text.decode('utf-8')] if text else pieces


def _vocabulary_advice(why: str) -> str:
  """What to do about SentencePiece's failure `why`: its two vocabulary-size errors name the bound."""
  most = re.search(r'set it to a value <= (\d+)', why)
  if most:
    return f'A small corpus supports only a small vocabulary: set data.vocab_size to {most[1]} or less'
  least = re.search(r'smaller than required_chars\. \d+ vs (\d+)', why)
  if least:
    return (f'Every character of the corpus and the special pieces need a piece of their own: set data.vocab_size '
            f'to {least[1]} or more')
  return 'Check data.vocab_size against the corpus'


def _alphabet_size(lines: Sequence[str], coverage: float = CHARACTER_COVERAGE) -> int:
  """How many of the most frequent characters of `lines` (spaces aside) make up `coverage` of their characters."""
  counts = collections.Counter()
  for line in lines:
    counts.update(line)
  frequencies = sorted((n for c, n in counts.items() if not c.isspace()), reverse=True)
  needed, covered = coverage * sum(frequencies), 0
  for size, n in enumerate(frequencies, 1):
    covered += n
    if covered >= needed:
      return size
  return 0


def _train_wordpiece(lines, directory, *, vocab_size, lowercase) -> Tokenizer:
  from tokenizers import BertWordPieceTokenizer  # noqa: PLC0415
  trainer = BertWordPieceTokenizer(lowercase=lowercase)
  # The trainer keeps only the 1,000 most frequent characters by default: a Chinese or Japanese corpus (one piece
  # per ideograph) lost the rest to [UNK]. At least those SentencePiece's coverage would keep.
  trainer.train_from_iterator(lines, vocab_size=vocab_size, special_tokens=list(SPECIAL_PIECES),
                              limit_alphabet=max(WORDPIECE_ALPHABET, _alphabet_size(lines)), show_progress=False)
  if trainer.get_vocab_size() <= len(SPECIAL_PIECES):
    raise DataError(NO_TEXT)
  # The trainer numbers its alphabet, and so the merges that tie with it, in hash order: another order each time.
  # Greedy longest-match WordPiece does not depend on ids, so the pieces are sorted after the special ones: the same
  # corpus gives the same vocab.txt.
  pieces = sorted(set(trainer.get_vocab()) - set(SPECIAL_PIECES))
  with open(os.path.join(directory, 'vocab.txt'), 'w', encoding='utf-8') as f:
    f.writelines(piece + '\n' for piece in SPECIAL_PIECES + tuple(pieces))
  return WordPieceTokenizer(os.path.join(directory, 'vocab.txt'), lowercase)
