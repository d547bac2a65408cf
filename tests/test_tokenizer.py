"""Tokenizers: SentencePiece and WordPiece round trips, special ids, save/load, bad vocabularies."""

import pickle

import pytest

from electra_jax.data import DataError, corpus
from electra_jax.data import tokenizer as tokenizer_lib


@pytest.fixture(scope='module')
def lines(corpus_file):
  return [line for document in corpus.read_documents([corpus_file]) for line in document]


@pytest.mark.parametrize('kind', ['unigram', 'bpe', 'wordpiece'])
def test_trained_tokenizer_round_trip(kind, lines, tmp_path):
  tokenizer = tokenizer_lib.train(lines, str(tmp_path / kind), vocab_size=64, kind=kind)
  assert tokenizer.special.pad == 0 and tokenizer.special.unk == 1
  assert (tokenizer.special.cls, tokenizer.special.sep, tokenizer.special.mask) == (2, 3, 4)
  assert tokenizer.pieces([2, 3, 4]) == ['[CLS]', '[SEP]', '[MASK]']
  sample = lines[:50]
  ids = tokenizer.encode(sample)
  assert len(ids) == len(sample) and all(ids)
  assert [tokenizer.decode(i) for i in ids] == [line.lower() for line in sample]
  assert tokenizer.special.unk not in {t for i in ids for t in i}
  # Saved and loaded again (as the trainer's workdir and a built dataset carry it), or pickled for a worker.
  again = tokenizer_lib.load(tokenizer.save(str(tmp_path / 'saved')).rsplit('/', 1)[0])
  assert again.encode(sample) == ids and again.fingerprint == tokenizer.fingerprint
  assert pickle.loads(pickle.dumps(tokenizer)).encode(sample) == ids


def test_cased_tokenizer_keeps_case(lines, tmp_path):
  tokenizer = tokenizer_lib.train(lines, str(tmp_path), vocab_size=64, lowercase=False)
  assert tokenizer.decode(tokenizer.encode(['The cat.'])[0]) == 'The cat.'
  assert tokenizer_lib.load(str(tmp_path)).lowercase is False


def _write_vocab(path, tokens):
  path.write_text('\n'.join(tokens) + '\n', encoding='utf-8')
  return str(path)


def test_google_style_vocab_txt(tmp_path):
  """A BERT vocab.txt with the Google layout ([PAD] 0, [UNK] 100, [CLS] 101, [SEP] 102, [MASK] 103)."""
  tokens = ['[PAD]'] + [f'[unused{i}]' for i in range(99)] + ['[UNK]', '[CLS]', '[SEP]', '[MASK]']
  tokens += ['the', 'cat', '##s', 'sat', 'on', 'mat', '.', ',']
  tokenizer = tokenizer_lib.load(_write_vocab(tmp_path / 'vocab.txt', tokens))
  assert isinstance(tokenizer, tokenizer_lib.WordPieceTokenizer)
  assert tokenizer.special == tokenizer_lib.SpecialIds(pad=0, cls=101, sep=102, mask=103, unk=100)
  assert tokenizer.vocab_size == len(tokens)
  ids = tokenizer.encode(['The cats sat on the MAT.', 'Zebras sat.'])
  assert tokenizer.pieces(ids[0]) == ['the', 'cat', '##s', 'sat', 'on', 'the', 'mat', '.']
  assert ids[1] == [100, tokens.index('sat'), tokens.index('.')]
  assert tokenizer.decode(ids[0]) == 'the cats sat on the mat.'


def test_vocab_without_special_tokens(tmp_path):
  path = _write_vocab(tmp_path / 'vocab.txt', ['[PAD]', '[UNK]', '[CLS]', '[SEP]', 'the', 'cat'])
  with pytest.raises(DataError, match=r"lacks the special tokens \['\[MASK\]'\]"):
    tokenizer_lib.load(path)


def test_sentencepiece_without_special_tokens(lines, tmp_path):
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_prefix=str(tmp_path / 'plain'),
                                 vocab_size=60, minloglevel=2)
  with pytest.raises(DataError, match='lacks the special tokens'):
    tokenizer_lib.load(str(tmp_path / 'plain.model'))


def test_bad_tokenizer_paths(tmp_path):
  with pytest.raises(DataError, match='does not exist'):
    tokenizer_lib.load(str(tmp_path / 'missing.model'))
  (tmp_path / 'garbage.model').write_bytes(b'\x00\x01 not a model')
  with pytest.raises(DataError, match='is not a SentencePiece model'):
    tokenizer_lib.load(str(tmp_path / 'garbage.model'))
  with pytest.raises(DataError, match='holds no tokenizer'):
    tokenizer_lib.load(str(tmp_path))
  with pytest.raises(DataError, match='unknown tokenizer type'):
    tokenizer_lib.train(['a b'], str(tmp_path / 't'), vocab_size=10, kind='char')
