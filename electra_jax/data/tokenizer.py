"""Tokenizers with the special tokens ELECTRA needs: [PAD] [UNK] [CLS] [SEP] [MASK].

Two kinds share one interface (`Tokenizer`): a SentencePiece model (unigram or BPE), and a BERT-style WordPiece
vocab.txt read with the `tokenizers` library, so Google-compatible models can be trained. Tokenizers trained here
put the special tokens at ids 0..4; an existing model or vocabulary is accepted if it defines all five.

`save(directory)` writes the tokenizer file (tokenizer.model or vocab.txt) plus electra_tokenizer.json (its kind
and casing), and `load(directory)` reads them back: that is how a run's workdir and a built dataset carry theirs.
"""

import hashlib
import json
import os
import random
import tempfile
from typing import Iterable, Sequence

from electra_jax import fileio
from electra_jax.data.corpus import DataError
from electra_jax.masking import SpecialIds

SPECIAL_PIECES = ('[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]')
CONFIG_FILE = 'electra_tokenizer.json'
HF_TOKENIZER_FILE = 'tokenizer.json'  # what transformers 5 saves a fast tokenizer as (no vocab.txt)
TYPES = ('unigram', 'bpe', 'wordpiece')


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

  @property
  def fingerprint(self) -> str:
    """sha256 of the tokenizer file, kind and casing: what a packed dataset was tokenized with."""
    digest = hashlib.sha256(f'{self.kind}:{self.lowercase}:'.encode())
    with open(self.model_file, 'rb') as f:
      digest.update(f.read())
    return digest.hexdigest()

  def save(self, directory: str) -> str:
    """Writes the tokenizer file and electra_tokenizer.json into `directory`; returns the tokenizer file's path."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, self.file_name)
    if os.path.abspath(path) != os.path.abspath(self.model_file):
      fileio.copy(self.model_file, path)
    fileio.write_json(os.path.join(directory, CONFIG_FILE),
                      {'type': self.kind, 'file': self.file_name, 'lowercase': self.lowercase})
    return path

  def __reduce__(self):
    # Worker processes rebuild the tokenizer from its file rather than pickling library objects.
    return type(self), (self.model_file, self.lowercase, self.num_threads)


class SentencePieceTokenizer(Tokenizer):
  """A SentencePiece model (unigram or BPE); text is lower-cased here when `lowercase`."""
  kind = 'sentencepiece'
  file_name = 'tokenizer.model'

  def __init__(self, model_file: str, lowercase: bool = True, num_threads: int = -1):
    import sentencepiece as spm  # pylint: disable=g-import-not-at-top
    self.num_threads = num_threads
    try:
      self.sp = spm.SentencePieceProcessor(model_file=model_file, num_threads=num_threads)
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


class WordPieceTokenizer(Tokenizer):
  """A BERT WordPiece vocabulary ('##' continuations) with BERT's normaliser and pre-tokenizer.

  Read from a vocab.txt (one token per line, as Google and older transformers save it) or from the WordPiece
  model inside a Hugging Face tokenizer.json (what transformers 5 saves instead). With `lowercase`, accents are
  stripped too, as BERT's uncased models do.
  """
  kind = 'wordpiece'
  file_name = 'vocab.txt'

  def __init__(self, model_file: str, lowercase: bool = True, num_threads: int = -1):
    # The tokenizers library sizes its thread pool from RAYON_NUM_THREADS / TOKENIZERS_PARALLELISM instead.
    from tokenizers import BertWordPieceTokenizer  # pylint: disable=g-import-not-at-top
    self.num_threads = num_threads
    options = {}
    if model_file.endswith('.json'):
      self.file_name = HF_TOKENIZER_FILE
      vocab, options = _read_tokenizer_json(model_file)
    else:
      vocab = _read_vocab(model_file)
    # BertWordPieceTokenizer would silently append missing special tokens: check them first.
    self.special = _special_ids(vocab, model_file)
    self.model_file, self.lowercase = model_file, lowercase
    self.tokenizer = BertWordPieceTokenizer(vocab, lowercase=lowercase, **options)
    self._vocab_size = len(vocab)

  @property
  def vocab_size(self) -> int:
    return self._vocab_size

  def encode(self, lines: Sequence[str]) -> list[list[int]]:
    return [e.ids for e in self.tokenizer.encode_batch(list(lines), add_special_tokens=False)]

  def decode(self, ids: Iterable[int]) -> str:
    return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)

  def pieces(self, ids: Iterable[int]) -> list[str]:
    return [self.tokenizer.id_to_token(int(i)) for i in ids]


def _read_vocab(path: str) -> dict[str, int]:
  try:
    with open(path, encoding='utf-8') as f:
      tokens = [line.rstrip('\r\n') for line in f]
  except UnicodeDecodeError:
    raise DataError(f'{path!r} is not a WordPiece vocab.txt (not UTF-8 text)') from None
  vocab = {}
  for token in tokens:
    if token:
      vocab.setdefault(token, len(vocab))
  if not vocab:
    raise DataError(f'WordPiece vocabulary {path!r} is empty')
  return vocab


def _read_tokenizer_json(path: str) -> tuple[dict[str, int], dict]:
  """The WordPiece vocabulary of a Hugging Face tokenizer.json, and BertWordPieceTokenizer's options for it."""
  model = _read_json_object(path).get('model')
  if not isinstance(model, dict) or model.get('type') != 'WordPiece' or not isinstance(model.get('vocab'), dict):
    kind = model.get('type') if isinstance(model, dict) else None
    raise DataError(f'{path!r} holds a {kind or "unknown"} tokenizer, not WordPiece; electra_jax reads WordPiece '
                    'tokenizer.json files (BERT, ELECTRA), WordPiece vocab.txt and SentencePiece .model files')
  vocab = model['vocab']
  if sorted(vocab.values()) != list(range(len(vocab))):
    raise DataError(f'{path!r}: the WordPiece vocabulary\'s ids are not 0..{len(vocab) - 1}')
  return vocab, {'unk_token': model.get('unk_token', '[UNK]'),
                 'wordpieces_prefix': model.get('continuing_subword_prefix', '##')}


def _json_lowercase(path: str) -> bool:
  """Whether a tokenizer.json lower-cases (its BertNormalizer's setting; True if it has none)."""
  normalizer = _read_json_object(path).get('normalizer')
  return bool(normalizer.get('lowercase', True)) if isinstance(normalizer, dict) else True


def _read_json_object(path: str) -> dict:
  try:
    with open(path, encoding='utf-8') as f:
      spec = json.load(f)
  except (UnicodeDecodeError, json.JSONDecodeError):
    spec = None
  if not isinstance(spec, dict):
    raise DataError(f'{path!r} is not a Hugging Face tokenizer.json (not a JSON object)')
  return spec


def load(path: str, lowercase: bool | None = None, num_threads: int = -1) -> Tokenizer:
  """Reads a tokenizer: a SentencePiece .model, a WordPiece vocab.txt or Hugging Face tokenizer.json, or a
  directory holding one (`Tokenizer.save` writes such a directory).

  `lowercase` None takes the casing saved with the tokenizer (uncased when nothing says).
  """
  path = os.path.expanduser(path)
  if os.path.isdir(path):
    config_path = os.path.join(path, CONFIG_FILE)
    if os.path.exists(config_path):
      with open(config_path, encoding='utf-8') as f:
        config = json.load(f)
      kind, file = config['type'], os.path.join(path, config['file'])
      lowercase = config.get('lowercase', True) if lowercase is None else lowercase
    elif os.path.exists(os.path.join(path, SentencePieceTokenizer.file_name)):
      kind, file = SentencePieceTokenizer.kind, os.path.join(path, SentencePieceTokenizer.file_name)
    elif os.path.exists(os.path.join(path, WordPieceTokenizer.file_name)):
      kind, file = WordPieceTokenizer.kind, os.path.join(path, WordPieceTokenizer.file_name)
    elif os.path.exists(os.path.join(path, HF_TOKENIZER_FILE)):
      kind, file = WordPieceTokenizer.kind, os.path.join(path, HF_TOKENIZER_FILE)
    else:
      raise DataError(f'directory {path!r} holds no tokenizer (tokenizer.model, vocab.txt or tokenizer.json)')
  elif os.path.isfile(path):
    file = path
    kind = WordPieceTokenizer.kind if path.endswith(('.txt', '.json')) else SentencePieceTokenizer.kind
  else:
    raise DataError(f'tokenizer {path!r} does not exist; give a SentencePiece .model, a WordPiece vocab.txt or '
                    'tokenizer.json, or a directory holding one')
  if lowercase is None:
    lowercase = _json_lowercase(file) if file.endswith('.json') else True
  if kind == WordPieceTokenizer.kind:
    return WordPieceTokenizer(file, lowercase, num_threads)
  return SentencePieceTokenizer(file, lowercase, num_threads)


def train(lines: Iterable[str], output: str, *, vocab_size: int, kind: str = 'unigram', lowercase: bool = True,
          max_sentences: int = 2_000_000) -> Tokenizer:
  """Trains a tokenizer on `lines` and saves it into directory `output` (see `Tokenizer.save`).

  `kind` is 'unigram' or 'bpe' (SentencePiece) or 'wordpiece' (BERT vocab.txt); [PAD] [UNK] [CLS] [SEP] [MASK]
  get ids 0..4. Both trainers see a uniform sample of at most `max_sentences` lines.
  """
  if kind not in TYPES:
    raise DataError(f'unknown tokenizer type {kind!r}; choose one of {", ".join(TYPES)}')
  os.makedirs(output, exist_ok=True)
  with tempfile.TemporaryDirectory(dir=output) as tmp:
    lines = (line.lower() if lowercase and kind != 'wordpiece' else line for line in lines if line.strip())
    if kind == 'wordpiece':
      tokenizer = _train_wordpiece(_sample(lines, max_sentences), tmp, vocab_size=vocab_size, lowercase=lowercase)
    else:
      tokenizer = _train_sentencepiece(lines, tmp, vocab_size=vocab_size, model_type=kind, lowercase=lowercase,
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


def _train_sentencepiece(lines, directory, *, vocab_size, model_type, lowercase, max_sentences) -> Tokenizer:
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  prefix = os.path.join(directory, 'spm')
  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_prefix=prefix, vocab_size=vocab_size, model_type=model_type,
        pad_id=0, unk_id=1, bos_id=-1, eos_id=-1, pad_piece='[PAD]', unk_piece='[UNK]',
        user_defined_symbols=['[CLS]', '[SEP]', '[MASK]'], character_coverage=0.9995,
        input_sentence_size=max_sentences, shuffle_input_sentence=True, num_threads=os.cpu_count() or 1,
        minloglevel=2)
  except RuntimeError as e:
    raise DataError(f'training the SentencePiece tokenizer failed: {str(e).rstrip(".")}. A small corpus supports '
                    'only a small vocabulary: lower data.vocab_size') from None
  return SentencePieceTokenizer(prefix + '.model', lowercase)


def _train_wordpiece(lines, directory, *, vocab_size, lowercase) -> Tokenizer:
  from tokenizers import BertWordPieceTokenizer  # pylint: disable=g-import-not-at-top
  trainer = BertWordPieceTokenizer(lowercase=lowercase)
  trainer.train_from_iterator(lines, vocab_size=vocab_size, special_tokens=list(SPECIAL_PIECES),
                              show_progress=False)
  if trainer.get_vocab_size() <= len(SPECIAL_PIECES):
    raise DataError('training the WordPiece tokenizer found no text; give a corpus with some lines of text')
  trainer.save_model(directory)
  return WordPieceTokenizer(os.path.join(directory, 'vocab.txt'), lowercase)
