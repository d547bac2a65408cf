"""Our tokenizers as Hugging Face fast tokenizers: the tokenizer.json and tokenizer_config.json of an HF export.

`transformers.AutoTokenizer.from_pretrained` loads the directory `save` writes and encodes text to the ids
electra_jax's `Tokenizer.encode` gives, wrapped as `[CLS] a [SEP]` or `[CLS] a [SEP] b [SEP]` (segment ids 0 and 1)
as the data pipeline and fine-tuning wrap them. Built with the `tokenizers` library alone (transformers is not
needed to export):

- SentencePiece (unigram or BPE): the model's pieces and scores, its normaliser (the precompiled NFKC character
  map), whitespace as '▁' with a leading one (SentencePiece's dummy prefix), and lower-casing first when ours
  lower-cases (as Python's str.lower: a word-final 'Σ' becomes 'ς'). Pieces never span a space (SentencePiece's
  split_by_whitespace), so splitting at spaces first, as the Metaspace pre-tokenizer does, changes nothing.
- WordPiece: the `tokenizers` pipeline `WordPieceTokenizer` already runs (BERT's normaliser and pre-tokenizer).

Text that spells a special token ("[MASK]") is that token, as in transformers' own tokenizers; our WordPiece and
uncased SentencePiece tokenizers read it as text (the pieces of "[", "mask", "]"), a cased SentencePiece one reads
[CLS], [SEP] and [MASK] as themselves after a '▁' piece, and [PAD] as text.
"""


import tokenizers
from tokenizers import decoders, normalizers, pre_tokenizers, processors

from electra_jax import fileio
from electra_jax.errors import DataError
from electra_jax.data.tokenizer import SPECIAL_PIECES, SentencePieceTokenizer, Tokenizer, WordPieceTokenizer

TOKENIZER_FILE = 'tokenizer.json'
CONFIG_FILE = 'tokenizer_config.json'
SPACE = '\u2581'  # '▁': SentencePiece's visible space
# SentencePiece's ModelProto: trainer_spec.model_type and the piece types that are special.
UNIGRAM, BPE = 1, 2
CONTROL, USER_DEFINED = 3, 4
# A capital sigma that ends a word, as Unicode's Final_Sigma context defines it: Python's str.lower(), which our
# SentencePiece tokenizers lower-case with, makes it 'ς'; the `tokenizers` Lowercase maps characters alone ('σ').
# (Cased letters that are also case-ignorable, such as U+02B0 'ʰ', count as case-ignorable, as CPython reads the rule.)
FINAL_SIGMA = (r'(?<=[\p{Cased}&&\P{Case_Ignorable}]\p{Case_Ignorable}*)Σ'
               r'(?!\p{Case_Ignorable}*[\p{Cased}&&\P{Case_Ignorable}])')


def _sentencepiece(tokenizer: SentencePieceTokenizer) -> tokenizers.Tokenizer:
  from sentencepiece import sentencepiece_model_pb2  # noqa: PLC0415
  proto = sentencepiece_model_pb2.ModelProto()
  proto.ParseFromString(tokenizer.model_bytes)
  pieces = [(p.piece, p.score) for p in proto.pieces]
  unk_id = proto.trainer_spec.unk_id
  byte_fallback = proto.trainer_spec.byte_fallback
  if proto.trainer_spec.model_type == UNIGRAM:
    model = tokenizers.models.Unigram(pieces, unk_id=unk_id, byte_fallback=byte_fallback)
  elif proto.trainer_spec.model_type == BPE:
    vocab = {piece: i for i, (piece, _) in enumerate(pieces)}
    model = tokenizers.models.BPE(vocab, _bpe_merges(pieces, vocab), unk_token=pieces[unk_id][0], fuse_unk=True,
                                  byte_fallback=byte_fallback)
  else:
    raise DataError(f'{tokenizer.model_file!r} is a SentencePiece model of type {proto.trainer_spec.model_type}; '
                     'the Hugging Face export handles unigram and BPE models')
  spec = proto.normalizer_spec
  if not (spec.add_dummy_prefix and spec.remove_extra_whitespaces and proto.trainer_spec.split_by_whitespace):
    raise DataError(f'{tokenizer.model_file!r} was trained with add_dummy_prefix={spec.add_dummy_prefix}, '
                    f'remove_extra_whitespaces={spec.remove_extra_whitespaces}, split_by_whitespace='
                    f'{proto.trainer_spec.split_by_whitespace}; the Hugging Face export handles models with all '
                    'three on (SentencePiece\'s defaults, what electra_jax trains)')
  hf = tokenizers.Tokenizer(model)
  steps = [normalizers.Replace(tokenizers.Regex(FINAL_SIGMA), 'ς'), normalizers.Lowercase()] if tokenizer.lowercase \
      else []
  if proto.normalizer_spec.precompiled_charsmap:
    steps.append(normalizers.Precompiled(proto.normalizer_spec.precompiled_charsmap))
  # SentencePiece drops leading and trailing whitespace and keeps one space of each run.
  steps += [normalizers.Strip(), normalizers.Replace(tokenizers.Regex(' {2,}'), ' ')]
  hf.normalizer = normalizers.Sequence(steps)
  hf.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme='always')
  hf.decoder = decoders.Metaspace(replacement=SPACE, prepend_scheme='always')
  # SentencePiece matches user-defined pieces ([CLS] [SEP] [MASK]) in the raw text; control pieces ([PAD]) never.
  hf.add_special_tokens([tokenizers.AddedToken(p.piece, normalized=False, special=True) for p in proto.pieces
                         if p.type in (CONTROL, USER_DEFINED)])
  return hf


def _bpe_merges(pieces: list[tuple[str, float]], vocab: dict[str, int]) -> list[tuple[str, str]]:
  """SentencePiece BPE merges the adjacent pair whose union is the best-scored piece: every split of a piece into
  two pieces is a merge, ranked by the piece's score (SentencePiece lists pieces best first)."""
  merges = []
  for piece, score in pieces:
    for i in range(1, len(piece)):
      if piece[:i] in vocab and piece[i:] in vocab:
        merges.append((-score, vocab[piece], vocab[piece[:i]], piece[:i], piece[i:]))
  return [(left, right) for *_, left, right in sorted(merges)]


def to_hf(tokenizer: Tokenizer) -> tokenizers.Tokenizer:
  """A `tokenizers.Tokenizer` that encodes as `tokenizer` does, adding [CLS] and [SEP] like electra_jax."""
  if isinstance(tokenizer, SentencePieceTokenizer):
    hf = _sentencepiece(tokenizer)
  elif isinstance(tokenizer, WordPieceTokenizer):
    hf = tokenizers.Tokenizer.from_str(tokenizer.tokenizer.to_str())
    hf.add_special_tokens([tokenizers.AddedToken(piece, special=True) for piece in SPECIAL_PIECES])
  else:
    raise TypeError(f'no Hugging Face tokenizer for {type(tokenizer).__name__}')
  cls, sep = (tokenizer.pieces([i])[0] for i in (tokenizer.special.cls, tokenizer.special.sep))
  hf.post_processor = processors.TemplateProcessing(
      single=f'{cls}:0 $A:0 {sep}:0', pair=f'{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1',
      special_tokens=[(cls, tokenizer.special.cls), (sep, tokenizer.special.sep)])
  return hf


def save(tokenizer: Tokenizer, directory, *, max_length: int) -> list[str]:
  """Writes tokenizer.json and tokenizer_config.json (a `PreTrainedTokenizerFast`, with its special tokens and
  casing) into `directory` (local or gs://); returns the names written."""
  special = tokenizer.special
  names = dict(zip(('pad', 'unk', 'cls', 'sep', 'mask'),
                   tokenizer.pieces([special.pad, special.unk, special.cls, special.sep, special.mask])))
  with fileio.atomic_writer(fileio.path(directory) / TOKENIZER_FILE) as f:
    f.write(to_hf(tokenizer).to_str().encode('utf-8'))
  config = {'tokenizer_class': 'PreTrainedTokenizerFast', 'model_max_length': max_length,
            'do_lower_case': tokenizer.lowercase, 'clean_up_tokenization_spaces': False,
            'model_input_names': ['input_ids', 'token_type_ids', 'attention_mask'],
            **{f'{name}_token': piece for name, piece in names.items()}}
  fileio.write_json(fileio.path(directory) / CONFIG_FILE, config)
  return [TOKENIZER_FILE, CONFIG_FILE]
