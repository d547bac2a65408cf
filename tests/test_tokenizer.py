"""Tokenizers: SentencePiece and WordPiece round trips, special ids, save/load, bad vocabularies."""

import os
import pickle
import random
import re
import signal
import stat
import subprocess
import sys
import time

import hypothesis
from hypothesis import strategies as st
import pytest

from electra_jax import cli, data
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


@pytest.mark.parametrize('kind', ['unigram', 'bpe', 'wordpiece'])
def test_one_corpus_gives_the_same_tokenizer_file_on_any_machine(kind, lines, tmp_path, monkeypatch):
  """Trained twice, as on machines with 1 and 64 cores, into other directories: the same bytes (SentencePiece's
  pieces depend on its thread count, its model file holds the paths it was given, and WordPiece's trainer numbers
  pieces in hash order)."""
  trained = []
  for cores in (1, 64):
    monkeypatch.setattr(os, 'cpu_count', lambda cores=cores: cores)
    trained.append(tokenizer_lib.train(lines, str(tmp_path / f'{cores}'), vocab_size=64, kind=kind).model_bytes)
  assert trained[0] == trained[1]


def test_wordpiece_keeps_the_characters_of_a_corpus_with_more_than_a_thousand(tmp_path):
  """A Chinese or Japanese corpus has thousands of characters, each a word of its own: WordPiece keeps those that
  make up 99.95% of the text (its trainer's default kept 1,000, the rest were [UNK])."""
  ideographs = [chr(0x4E00 + i) for i in range(1500)]
  text = ''.join(random.Random(0).sample(ideographs * 5, 7500))
  lines = [text[i:i + 50] for i in range(0, len(text), 50)]
  tokenizer = tokenizer_lib.train(lines, str(tmp_path / 'wp'), vocab_size=2000, kind='wordpiece')
  assert tokenizer.special.unk not in {i for ids in tokenizer.encode(lines) for i in ids}
  assert tokenizer_lib._alphabet_size(lines) == 1500  # pylint: disable=protected-access


def test_cased_tokenizer_keeps_case(lines, tmp_path):
  tokenizer = tokenizer_lib.train(lines, str(tmp_path), vocab_size=64, lowercase=False)
  assert tokenizer.decode(tokenizer.encode(['The cat.'])[0]) == 'The cat.'
  assert tokenizer_lib.load(str(tmp_path)).lowercase is False


def test_data_tokenizer_is_used_with_the_casing_saved_with_it(lines, tmp_path):
  """data.lowercase is true unless set: a cased tokenizer directory given as data.tokenizer would have been fed
  lower-cased text. A casing that contradicts the saved one is refused; the saved one is used."""
  cased = tokenizer_lib.train(lines[:200], str(tmp_path / 'cased'), vocab_size=64, lowercase=False)
  tokenizer_lib.load(cased.model_file, lowercase=True).save(str(tmp_path / 'uncased'))  # the same model, uncased
  with pytest.raises(DataError) as error:
    data.load_tokenizer(data.DataConfig(tokenizer=str(tmp_path / 'cased')))
  assert str(error.value) == (f'data.tokenizer={tmp_path}/cased was saved cased (lowercase=false), but '
                              'data.lowercase=true; set data.lowercase=false to match it (with --cased for `python -m '
                              'electra_jax.data`)')
  with pytest.raises(DataError, match=r'saved uncased \(lowercase=true\), but data.lowercase=false; set '
                     'data.lowercase=true to match it'):
    data.load_tokenizer(data.DataConfig(tokenizer=str(tmp_path / 'uncased'), lowercase=False))
  tokenizer = data.load_tokenizer(data.DataConfig(tokenizer=str(tmp_path / 'cased'), lowercase=False))
  assert tokenizer.lowercase is False and tokenizer.decode(tokenizer.encode(['The cat.'])[0]) == 'The cat.'
  uncased = data.load_tokenizer(data.DataConfig(tokenizer=str(tmp_path / 'uncased')))
  assert uncased.lowercase is True and uncased.decode(uncased.encode(['The cat.'])[0]) == 'the cat.'
  # A bare model file records no casing: data.lowercase decides.
  assert data.load_tokenizer(data.DataConfig(tokenizer=cased.model_file)).lowercase is True


def test_sentencepiece_learns_from_lines_over_its_length_limit(tmp_path):
  """SentencePiece's trainer skips lines over 4192 bytes: a word found only in such lines (one paragraph per line)
  was [UNK]. They are cut at spaces, or between characters where there is none, into lines under the limit."""
  short = ['the cat sat on the mat.', 'a dog ran far and fast.', 'ten old hens lay eggs.', 'we go home.'] * 50
  long_line = ' '.join(['quiz'] * 1500)  # 7499 bytes
  tokenizer = tokenizer_lib.train(short + [long_line] * 3, str(tmp_path), vocab_size=32, kind='unigram')
  assert tokenizer.pieces(tokenizer.encode(['quiz'])[0]) == ['▁quiz']
  assert [len(piece) for piece in tokenizer_lib._cut(long_line)] == [4189, 3309]  # 838 words, then 662
  assert [len(piece) for piece in tokenizer_lib._cut('é' * 3000)] == [2096, 904]  # 2 bytes each: 4192 bytes, 1808


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


def test_wordpiece_reads_text_as_the_official_tokenizer_does(tmp_path):
  """As BERT's FullTokenizer: text that spells a special token is split like any other (a corpus spelling '[PAD]'
  gets no pad id, which would open a hole in its input mask), and a word of up to 200 characters is read; a longer
  one is [UNK]."""
  tokens = ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]', '[', ']', 'pad', 'sep', 'mask', 'x', 'a', '##a']
  tokenizer = tokenizer_lib.load(_write_vocab(tmp_path / 'vocab.txt', tokens))
  ids = tokenizer.encode(['x [PAD] [SEP]x [MASK]', 'a' * 200, 'a' * 201])
  assert tokenizer.pieces(ids[0]) == ['x', '[', 'pad', ']', '[', 'sep', ']', 'x', '[', 'mask', ']']
  assert ids[1] == [11] + [12] * 199
  assert ids[2] == [1]


def test_a_vocab_txt_is_numbered_by_line_as_bert_numbers_it(tmp_path):
  """BERT and transformers give line N id N-1, blank lines and repeated tokens included (a repeated token: its last
  line's id). We skipped both and numbered on: every later token got another id than its embedding row (published
  vocabularies repeat tokens, e.g. conv-bert-base's). Blank lines at the end are only the file's end."""
  tokens = ['[PAD]', '[UNK]', '', '[CLS]', '[SEP]', '[MASK]', 'the', 'cat', 'the', 'sat', '', '']
  tokenizer = tokenizer_lib.load(_write_vocab(tmp_path / 'vocab.txt', tokens))
  assert tokenizer.vocab_size == 10 and tokenizer.special == tokenizer_lib.SpecialIds(pad=0, cls=3, sep=4, mask=5,
                                                                                       unk=1)
  assert tokenizer.encode(['the cat sat'])[0] == [8, 7, 9]


def test_vocab_without_special_tokens(tmp_path):
  path = _write_vocab(tmp_path / 'vocab.txt', ['[PAD]', '[UNK]', '[CLS]', '[SEP]', 'the', 'cat'])
  with pytest.raises(DataError, match=r"lacks the special tokens \['\[MASK\]'\]"):
    tokenizer_lib.load(path)


def test_sentencepiece_without_special_tokens(lines, tmp_path):
  import sentencepiece as spm  # noqa: PLC0415
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


def _tokenizer_json(path, model, normalizer=None):
  """A Hugging Face tokenizer.json with `model` and BERT's pipeline, cased unless `normalizer` (the `tokenizers`
  library's own serialisation)."""
  from tokenizers import Tokenizer, normalizers, pre_tokenizers  # noqa: PLC0415
  tokenizer = Tokenizer(model)
  tokenizer.normalizer = normalizer or normalizers.BertNormalizer(lowercase=False)
  tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
  tokenizer.save(str(path))
  return str(path)


def test_wordpiece_tokenizer_json_reads_like_its_vocab_txt(tmp_path):
  """transformers 5 saves a fast tokenizer as tokenizer.json only: the same WordPiece vocabulary, the same ids,
  and the casing its normaliser records (here cased)."""
  from tokenizers.models import WordPiece  # noqa: PLC0415
  tokens = ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]', 'the', 'The', 'cat', '##s', 'sat', '.']
  json_file = _tokenizer_json(tmp_path / 'tokenizer.json',
                              WordPiece({t: i for i, t in enumerate(tokens)}, unk_token='[UNK]'))
  from_json = tokenizer_lib.load(json_file)
  from_txt = tokenizer_lib.load(_write_vocab(tmp_path / 'vocab.txt', tokens), lowercase=False)
  assert from_json.lowercase is False and from_json.vocab_size == len(tokens) == from_txt.vocab_size
  text = ['The cats sat.', 'the Dog sat']
  assert from_json.encode(text) == from_txt.encode(text) == [[6, 7, 8, 9, 10], [5, 1, 9]]
  saved = tmp_path / 'saved'
  from_json.save(str(saved))  # a workdir keeps the tokenizer.json and reads it back
  assert sorted(p.name for p in saved.iterdir()) == ['electra_tokenizer.json', 'tokenizer.json']
  assert tokenizer_lib.load(str(saved)).encode(text) == from_json.encode(text)
  assert pickle.loads(pickle.dumps(from_json)).encode(text) == from_json.encode(text)


def test_a_tokenizer_json_reads_text_as_its_normaliser_says(tmp_path):
  """A BertNormalizer's options are the file's (an uncased tokenizer that keeps accents, as some HF models'), and a
  normaliser we would not run as the file does is refused in one line rather than giving other ids."""
  from tokenizers import normalizers  # noqa: PLC0415
  from tokenizers.models import WordPiece  # noqa: PLC0415
  tokens = ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]', 'cafe', 'café']
  model = WordPiece({t: i for i, t in enumerate(tokens)}, unk_token='[UNK]')
  keeps_accents = tokenizer_lib.load(_tokenizer_json(
      tmp_path / 'keeps.json', model, normalizers.BertNormalizer(lowercase=True, strip_accents=False)))
  assert keeps_accents.lowercase and keeps_accents.encode(['CAFÉ Cafe']) == [[6, 5]]
  # An HF directory holding both (transformers 4 saves both): tokenizer.json, whose normaliser says to keep them.
  both = tmp_path / 'hf'
  both.mkdir()
  os.rename(keeps_accents.model_file, both / 'tokenizer.json')
  _write_vocab(both / 'vocab.txt', tokens)
  assert tokenizer_lib.load(str(both)).encode(['CAFÉ Cafe']) == [[6, 5]]
  nfc = _tokenizer_json(tmp_path / 'nfc.json', model, normalizers.Sequence([normalizers.NFC()]))
  with pytest.raises(DataError, match=r"nfc.json': its normalizer is Sequence, not BertNormalizer; electra_jax reads "
                                      r'BERT-style WordPiece tokenizers, and would give other ids than this file'):
    tokenizer_lib.load(nfc)


def test_tokenizer_json_that_is_not_wordpiece_is_one_clear_error(tmp_path):
  from tokenizers.models import BPE  # noqa: PLC0415
  path = _tokenizer_json(tmp_path / 'tokenizer.json', BPE({'a': 0, 'b': 1, 'ab': 2}, [('a', 'b')]))
  with pytest.raises(DataError, match='holds a BPE tokenizer, not WordPiece'):
    tokenizer_lib.load(str(tmp_path))
  (tmp_path / 'tokenizer.json').write_text('{"model": ')
  with pytest.raises(DataError, match='not a Hugging Face tokenizer.json'):
    tokenizer_lib.load(path)


@pytest.mark.parametrize('umask', [0o022, 0o002])
def test_saved_files_follow_the_umask(lines, tmp_path, umask):
  """Files are written under a temporary name and renamed; they still get 0666 minus the umask, as open() gives
  (Python's tempfile would give 0600)."""
  tokenizer = tokenizer_lib.train(lines, str(tmp_path / 'trained'), vocab_size=64, kind='wordpiece')
  previous = os.umask(umask)
  try:
    tokenizer.save(str(tmp_path / 'saved'))
  finally:
    os.umask(previous)
  for name in ('vocab.txt', tokenizer_lib.CONFIG_FILE):
    assert stat.S_IMODE(os.stat(tmp_path / 'saved' / name).st_mode) == 0o666 & ~umask


# Text the tokenizers meet in real corpora and in user input: any unicode (control characters, surrogates
# excluded as they cannot be UTF-8 text), empty lines, and lines far longer than any example.
_TEXT = st.text(st.characters(exclude_categories=('Cs',)), max_size=200)
_LINES = st.lists(st.one_of(_TEXT, st.just(''), st.builds(lambda t, n: t * n, _TEXT, st.integers(50, 400))),
                  max_size=8)


@pytest.fixture(scope='module')
def trained(lines, tmp_path_factory):
  directory = tmp_path_factory.mktemp('property')
  return [tokenizer_lib.train(lines, str(directory / kind), vocab_size=64, kind=kind) for kind in
          ('unigram', 'wordpiece')]


@hypothesis.settings(max_examples=60, deadline=None, derandomize=True,
                     suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture])
@hypothesis.given(_LINES)
def test_any_text_encodes_to_ids_in_range(trained, batch):
  for tokenizer in trained:
    ids = tokenizer.encode(batch)
    assert len(ids) == len(batch)
    for line, line_ids in zip(batch, ids):
      assert all(0 <= i < tokenizer.vocab_size for i in line_ids)
      assert bool(line_ids) <= bool(line.strip())  # nothing from an empty or blank line
    tokenizer.decode([i for line_ids in ids for i in line_ids])


@pytest.mark.parametrize('kind', ['unigram', 'wordpiece'])
def test_sample_spans_a_corpus_sorted_by_domain(kind, tmp_path, monkeypatch):
  """`data tokenizer` on a corpus larger than its sample (4 files of 1200 lines, 300 sampled), each file a domain
  spelt with letters of its own: the sample reaches every file, so no domain's text encodes to [UNK]."""
  from electra_jax import data  # noqa: PLC0415
  from electra_jax.data import __main__ as cli  # noqa: PLC0415
  rng = random.Random(0)
  alphabets = ['abcdef', 'ghijkl', 'mnopqr', 'stuvwx']
  for number, letters in enumerate(alphabets):
    words = [''.join(rng.choice(letters) for _ in range(rng.randint(2, 6))) for _ in range(30)]
    lines = [' '.join(rng.choice(words) for _ in range(8)) for _ in range(1200)]
    (tmp_path / f'{number}-domain.txt').write_text('\n'.join(lines) + '\n', encoding='utf-8')
  monkeypatch.setattr(data, 'TOKENIZER_SAMPLE_LINES', 300)
  cli.main(['tokenizer', f'--source={tmp_path}/*-domain.txt', f'--output={tmp_path}/tok', f'--type={kind}',
            '--vocab_size=60'])
  tokenizer = tokenizer_lib.load(str(tmp_path / 'tok'))
  for letters in alphabets:
    ids = tokenizer.encode([' '.join(letters[i:] + letters[:i] for i in range(len(letters)))])[0]
    assert tokenizer.special.unk not in ids, (letters, tokenizer.pieces(ids))


@pytest.mark.parametrize('kind', ['unigram', 'wordpiece'])
@pytest.mark.parametrize('vocab_size', [100, 30522])
def test_an_empty_corpus_says_so_and_leaves_no_tokenizer_directory(kind, vocab_size, tmp_path):
  """Not 'lower data.vocab_size' (the same failure comes at any size), and no empty cache folder left behind."""
  (tmp_path / 'empty.txt').write_text('\n  \n\n', encoding='utf-8')  # blank lines only
  config = data.DataConfig(source=str(tmp_path / 'empty.txt'), vocab_size=vocab_size, tokenizer_type=kind,
                           cache_dir=str(tmp_path / 'cache'))
  with pytest.raises(DataError) as error:
    data.load_tokenizer(config)
  assert str(error.value) == tokenizer_lib.NO_TEXT
  assert not [name for name in os.listdir(tmp_path / 'cache') if name.startswith('tokenizer-')]


@pytest.mark.parametrize('vocab_size, way', [
    (5000, 'less'),  # more pieces than the text holds
    (8, 'more'),  # fewer pieces than its characters and the special ones
])
def test_a_vocabulary_the_corpus_cannot_fill_says_which_way_to_move(lines, tmp_path, vocab_size, way):
  advice = rf'set data\.vocab_size to (\d+) or {way}'
  with pytest.raises(DataError, match=advice) as error:
    tokenizer_lib.train(lines[:200], str(tmp_path / 'tok'), vocab_size=vocab_size, kind='unigram')
  bound = int(re.search(advice, str(error.value))[1])
  assert bound < vocab_size if way == 'less' else bound > vocab_size
  tokenizer_lib.train(lines[:200], str(tmp_path / 'ok'), vocab_size=bound, kind='unigram')  # the bound trains


def test_an_interrupted_training_leaves_no_directory_and_stops_in_one_line(lines, tmp_path, capsys):
  """Ctrl-C while the tokenizer trains: one line and the shell's status for SIGINT, no half-made directory; a
  directory the user gave that existed before is left as it was."""

  def interrupted():
    yield from lines[:20]
    raise KeyboardInterrupt

  with pytest.raises(SystemExit) as exit_info:
    cli.run(lambda: tokenizer_lib.train(interrupted(), str(tmp_path / 'tok'), vocab_size=64))
  assert exit_info.value.code == 130 and not os.path.exists(tmp_path / 'tok')
  err = capsys.readouterr().err
  assert err.startswith('stopped by Ctrl-C (SIGINT)') and err.count('\n') == 1
  (tmp_path / 'mine').mkdir()
  with pytest.raises(KeyboardInterrupt):
    tokenizer_lib.train(interrupted(), str(tmp_path / 'mine'), vocab_size=64, kind='wordpiece')
  assert os.listdir(tmp_path / 'mine') == []

  # A SIGTERM before the training steps (a preemption while the tokenizer trains) stops the same way, in one line
  # with the shell's status for it, and the handler before the command is back afterwards.
  def terminated():
    yield from lines[:20]
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)
    yield 'never reached'
  handler = signal.getsignal(signal.SIGTERM)
  with pytest.raises(SystemExit) as exit_info:
    cli.run(lambda: tokenizer_lib.train(terminated(), str(tmp_path / 'tok'), vocab_size=64))
  assert exit_info.value.code == 143 and not os.path.exists(tmp_path / 'tok')
  assert capsys.readouterr().err == ('stopped by SIGTERM; nothing half-written was kept: run the same command again '
                                     'to go on\n')
  assert signal.getsignal(signal.SIGTERM) is handler


@pytest.mark.slow
def test_ctrl_c_stops_sentencepiece_training_at_once(tmp_path):
  """SentencePiece's trainer holds a SIGINT until it is done (minutes on a large corpus): the command must stop at
  once all the same, in one line, leaving nothing behind."""
  rng = random.Random(0)
  words = [''.join(rng.choice('abcdefghijklmnop') for _ in range(rng.randint(2, 9))) for _ in range(20000)]
  with open(tmp_path / 'big.txt', 'w', encoding='utf-8') as f:  # ~12 MB: a minute or more of training
    f.writelines(' '.join(rng.choice(words) for _ in range(20)) + '\n' for _ in range(100_000))
  # `python -m electra_jax.data tokenizer ...`, with Python's Ctrl-C handler even where this process was started
  # with SIGINT ignored (a background job), which its children would inherit.
  program = ('import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler); '
             'runpy.run_module("electra_jax.data", run_name="__main__", alter_sys=True)')
  command = [sys.executable, '-c', program, 'tokenizer', f'--source={tmp_path}/big.txt', f'--output={tmp_path}/tok',
             '--vocab_size=8000']
  with subprocess.Popen(command, stderr=subprocess.PIPE, text=True, cwd=tmp_path) as process:
    assert process.stderr.readline().startswith('training a unigram tokenizer')
    time.sleep(2)  # into the trainer
    process.send_signal(signal.SIGINT)
    sent = time.monotonic()
    err = process.stderr.read()
    assert process.wait(timeout=60) == 130
  assert time.monotonic() - sent < 30  # the training itself would take far longer
  assert err.startswith('stopped by Ctrl-C (SIGINT)') and err.count('\n') == 1
  assert not os.path.exists(tmp_path / 'tok')


LOAD_WITHOUT_A_BACKEND = """
import sys
from jax._src import xla_bridge
from electra_jax import data
data.load_tokenizer(data.DataConfig(source=sys.argv[1], vocab_size=60, cache_dir=sys.argv[2]))
print('backend started' if xla_bridge.backends_are_initialized() else 'no backend')
"""


def test_loading_a_tokenizer_starts_no_jax_backend(lines, tmp_path):
  """`data build` and `data tokenizer` train or load a tokenizer only: on a TPU host a started backend would take
  the chips. (Asking jax.process_count() whether the run is multi-host started it.)"""
  (tmp_path / 'text.txt').write_text('\n'.join(lines[:200]) + '\n', encoding='utf-8')
  done = subprocess.run([sys.executable, '-c', LOAD_WITHOUT_A_BACKEND, str(tmp_path / 'text.txt'),
                         str(tmp_path / 'cache')], capture_output=True, text=True, check=False,
                        env=dict(os.environ, JAX_PLATFORMS='cpu'))
  assert done.stdout.strip() == 'no backend', done.stderr[-2000:]


def test_a_cache_that_cannot_be_written_is_one_line_before_any_work(corpus_file, tmp_path, monkeypatch):
  """A read-only cache stops the training of a tokenizer, and the packing of text, at once in one line naming the
  cache (it named a temporary file in it; packing failed only at its end); what the cache holds is still read."""
  config = data.DataConfig(source=corpus_file, vocab_size=60, cache_dir=str(tmp_path / 'cache'))
  tokenizer = data.load_tokenizer(config)
  access = os.access
  monkeypatch.setattr(os, 'access', lambda p, mode, **kw: not str(p).startswith(str(tmp_path)) and access(p, mode))
  assert data.load_tokenizer(config).fingerprint == tokenizer.fingerprint  # from the cache
  line = rf'^the cache \(data.cache_dir, or \$ELECTRA_JAX_CACHE\) {tmp_path / "cache"} cannot be written'
  with pytest.raises(PermissionError, match=line):
    data.load_tokenizer(data.DataConfig(source=corpus_file, vocab_size=61, cache_dir=config.cache_dir))
  with pytest.raises(PermissionError, match=line):
    data.load_examples(config, tokenizer)
  assert [n for n in os.listdir(tmp_path / 'cache') if not n.startswith('tokenizer-unigram-60-')] == []
