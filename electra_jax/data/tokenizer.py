"""Tokenizers with the special tokens ELECTRA needs: [PAD] [UNK] [CLS] [SEP] [MASK].

A SentencePiece model trained here puts them at ids 0..4. An existing SentencePiece model is accepted if it
defines all five pieces.
"""

import os
import tempfile
from typing import Iterable, Sequence

import sentencepiece as spm

from electra_jax.data.corpus import DataError
from electra_jax.masking import SpecialIds

SPECIAL_PIECES = ('[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]')


class Tokenizer:
  """A SentencePiece model plus the ELECTRA special ids."""

  def __init__(self, model_file: str, lowercase: bool = True):
    if not os.path.isfile(model_file):
      raise DataError(f'tokenizer model {model_file!r} does not exist; give a SentencePiece .model file, '
                      'or leave data.tokenizer empty to train one on the corpus')
    try:
      self.sp = spm.SentencePieceProcessor(model_file=model_file)
    except (RuntimeError, OSError) as e:
      raise DataError(f'{model_file!r} is not a SentencePiece model ({e})') from None
    self.model_file = model_file
    self.lowercase = lowercase
    ids = {piece: self.sp.piece_to_id(piece) for piece in SPECIAL_PIECES}
    missing = [p for p, i in ids.items() if self.sp.id_to_piece(i) != p]
    if missing:
      raise DataError(f'tokenizer {model_file!r} lacks the special tokens {missing}; ELECTRA needs '
                      f'{list(SPECIAL_PIECES)}: train one with `python -m electra_jax.data tokenizer`')
    self.special = SpecialIds(pad=ids['[PAD]'], cls=ids['[CLS]'], sep=ids['[SEP]'], mask=ids['[MASK]'],
                              unk=ids['[UNK]'])

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


def train_sentencepiece(lines: Iterable[str], model_file: str, *, vocab_size: int, model_type: str = 'unigram',
                        lowercase: bool = True, max_sentences: int = 2_000_000) -> Tokenizer:
  """Trains a SentencePiece model on `lines` and writes it atomically to `model_file`."""
  directory = os.path.dirname(os.path.abspath(model_file))
  os.makedirs(directory, exist_ok=True)
  with tempfile.TemporaryDirectory(dir=directory) as tmp:
    prefix = os.path.join(tmp, 'spm')
    sentences = (line.lower() if lowercase else line for line in lines if line.strip())
    try:
      spm.SentencePieceTrainer.train(
          sentence_iterator=sentences, model_prefix=prefix, vocab_size=vocab_size, model_type=model_type,
          pad_id=0, unk_id=1, bos_id=-1, eos_id=-1, pad_piece='[PAD]', unk_piece='[UNK]',
          user_defined_symbols=['[CLS]', '[SEP]', '[MASK]'], character_coverage=0.9995,
          input_sentence_size=max_sentences, shuffle_input_sentence=True, num_threads=os.cpu_count() or 1,
          minloglevel=2)
    except RuntimeError as e:
      raise DataError(f'training the SentencePiece tokenizer failed: {e}. A small corpus supports only a '
                      'small vocabulary: lower data.vocab_size') from None
    os.replace(prefix + '.model', model_file)
  return Tokenizer(model_file, lowercase)
