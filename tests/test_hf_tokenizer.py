"""The Hugging Face export's tokenizer: transformers' AutoTokenizer loads it and encodes exactly as electra_jax."""

import random

import pytest

transformers = pytest.importorskip('transformers')
import tokenizers  # noqa: E402  (transformers' dependency)

from electra_jax import convert, hf_tokenizer  # noqa: E402
from electra_jax.data import tokenizer as tokenizer_lib  # noqa: E402
from helpers import CONVERT_MODEL, random_params  # noqa: E402  # pylint: disable=g-bad-import-order

# Words with accents, capitals, digits, punctuation and a few scripts; rare characters fall outside SentencePiece's
# character coverage and become [UNK].
WORDS = ('the cat dog Bird sat ran on under café naïve résumé 42 3.14 hello, world! don\'t e-mail ÉCOLE straße '
         'Ωmega 東京 (x) [y] {z} $5 100% a+b=c The THE Über').split()
SENTENCES = [
    'The cat sat on the mat.', 'CAFÉ naïve résumé', '  leading, trailing   and   repeated spaces  ',
    'tab\there\nnewline', '東京 Ωmega straße', 'Unknown ☃ snowman ☃☃ and 😀 emoji', '3.14 100% $5 a+b=c 2026-11-23',
    "don't e-mail (x) [y] {z}", 'ﬁ ligature ① circled Ｆｕｌｌ width', 'İstanbul ΣΟΦΟΣ Straße', '', 'x', 'zzz qqq',
    'hello,world!!!', '\u00a0no-break\u2003em space', 'a\u200bzero width', 'MiXeD CaSe 123abc', 'ÜBER über Über',
    'ÉCOLE école', 'Bird BIRD bird', '"quoted" \'single\' `back`', 'ellipsis... and—dash – en', '#hash @at ^caret',
    '١٢٣ arabic digits', 'The dog ran under the tree, and the cat ran on the mat.', 'a' * 40, '....', 'é' * 5,
]
PAIRS = [('The cat sat.', 'On the mat!'), ('', 'only b'), ('CAFÉ', '東京 ☃'), ('42', '3.14')]


@pytest.fixture(scope='module')
def lines():
  rng = random.Random(0)
  return [' '.join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) for _ in range(600)]


def our_ids(tokenizer, a, b=None):
  """[CLS] a [SEP] (b [SEP]) with segment ids 0 then 1, as the data pipeline and fine-tuning build them."""
  a_ids = [tokenizer.special.cls] + tokenizer.encode([a])[0] + [tokenizer.special.sep]
  b_ids = tokenizer.encode([b])[0] + [tokenizer.special.sep] if b is not None else []
  return a_ids + b_ids, [0] * len(a_ids) + [1] * len(b_ids)


@pytest.mark.parametrize('kind,lowercase,vocab_size', [('unigram', True, 70), ('unigram', False, 70),
                                                       ('bpe', True, 70), ('wordpiece', True, 150),
                                                       ('wordpiece', False, 150)])
def test_auto_tokenizer_encodes_as_we_do(lines, tmp_path, kind, lowercase, vocab_size):
  ours = tokenizer_lib.train(lines, str(tmp_path / 'ours'), vocab_size=vocab_size, kind=kind, lowercase=lowercase)
  assert hf_tokenizer.save(ours, tmp_path / 'hf', max_length=128) == ['tokenizer.json', 'tokenizer_config.json']
  theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path / 'hf'))

  assert (theirs.cls_token_id, theirs.sep_token_id, theirs.pad_token_id, theirs.mask_token_id,
          theirs.unk_token_id) == (2, 3, 0, 4, 1)
  assert theirs.model_max_length == 128
  encoded = [our_ids(ours, s)[0] for s in SENTENCES]
  assert theirs(SENTENCES)['input_ids'] == encoded
  assert any(ours.special.unk in ids for ids in encoded)  # unknown characters are covered
  for a, b in PAIRS:
    pair = theirs(a, b)
    assert (pair['input_ids'], pair['token_type_ids']) == our_ids(ours, a, b)
  assert theirs('the [MASK] sat')['input_ids'].count(ours.special.mask) == 1  # a special token in text is itself


@pytest.mark.parametrize('kind', ['unigram', 'bpe'])
def test_uncased_export_lowercases_a_final_sigma_as_we_do(tmp_path, kind):
  """str.lower() makes a word-final 'Σ' 'ς' (Unicode's Final_Sigma, across an apostrophe or a period too); the
  tokenizers library's Lowercase made it 'σ', so the export split the default (uncased SentencePiece) tokenizer's
  Greek words differently."""
  words = 'σοφος ας οδυσσευς λογος τελος σας εσυ ος σ ς'.split()
  rng = random.Random(0)
  ours = tokenizer_lib.train([' '.join(rng.choice(words) for _ in range(8)) for _ in range(300)],
                             str(tmp_path / 'ours'), vocab_size=25, kind=kind, lowercase=True)
  hf_tokenizer.save(ours, tmp_path / 'hf', max_length=128)
  theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path / 'hf'))
  texts = ['ΣΟΦΟΣ', 'ΤΕΛΟΣ, ΛΟΓΟΣ.', "ΑΣ'Β", 'Α.Σ', 'ΑΣ.Β', 'Σ ΣΑΣ', 'ΟΔΥΣΣΕΥΣ ΚΑΙ ΕΣΥ', 'ΟΣ\u0301 ΣΟΦΟΣ']
  assert 'ς' in ''.join(t.lower() for t in texts)
  assert theirs(texts)['input_ids'] == [our_ids(ours, t)[0] for t in texts]
  # The lower-casing alone, on strings of letters that are cased, case-ignorable or both (U+02B0, U+0345).
  lower = tokenizers.normalizers.Sequence([tokenizers.normalizers.Replace(
      tokenizers.Regex(hf_tokenizer.FINAL_SIGMA), 'ς'), tokenizers.normalizers.Lowercase()])
  rng = random.Random(0)
  for text in (''.join(rng.choice('aΣʰ:\u0345\' Β.\u03011') for _ in range(rng.randint(1, 6))) for _ in range(3000)):
    assert lower.normalize_str(text) == text.lower(), text


@pytest.mark.slow
def test_export_of_a_sentencepiece_workdir_loads_with_auto_tokenizer(lines, tmp_path):
  """The command line's export: AutoTokenizer loads both models' tokenizers, and an import reads it back."""
  ours = tokenizer_lib.train(lines, str(tmp_path / 'tokenizer'), vocab_size=70)
  section = dict(CONVERT_MODEL, vocab_size=ours.vocab_size)
  convert.write_workdir(str(tmp_path / 'run'), section, random_params(convert.ModelConfig(**section)),
                        tokenizer_dir=str(tmp_path / 'tokenizer'))
  convert.main(['--checkpoint', str(tmp_path / 'run'), '--to-hf', str(tmp_path / 'hf')])
  for what in ('discriminator', 'generator'):
    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path / 'hf' / what))
    assert theirs(SENTENCES)['input_ids'] == [our_ids(ours, s)[0] for s in SENTENCES]
  convert.import_hf(str(tmp_path / 'hf' / 'discriminator'), str(tmp_path / 'back'),
                    generator_dir=str(tmp_path / 'hf' / 'generator'))
  back = tokenizer_lib.load(str(tmp_path / 'back'))
  assert (back.kind, back.lowercase, back.model_bytes) == ('sentencepiece', True, ours.model_bytes)


@pytest.mark.parametrize('field', ['normalizer_spec.add_dummy_prefix', 'normalizer_spec.remove_extra_whitespaces',
                                   'trainer_spec.split_by_whitespace'])
def test_a_sentencepiece_model_the_export_cannot_match_is_refused(lines, tmp_path, field):
  """Another tool's model with one of these off: the export assumed them on and split text otherwise, in silence."""
  from sentencepiece import sentencepiece_model_pb2  # noqa: PLC0415
  proto = sentencepiece_model_pb2.ModelProto()
  proto.ParseFromString(tokenizer_lib.train(lines, str(tmp_path / 'ours'), vocab_size=70).model_bytes)
  spec, name = field.split('.')
  setattr(getattr(proto, spec), name, False)
  (tmp_path / 'theirs.model').write_bytes(proto.SerializeToString())
  with pytest.raises(tokenizer_lib.DataError, match=f'{name}=False.*the Hugging Face export handles models with all '
                     'three on'):
    hf_tokenizer.to_hf(tokenizer_lib.load(str(tmp_path / 'theirs.model')))
