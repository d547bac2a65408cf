"""Text sources: files, directories, globs, gzip, tfds (mock data), and every kind of bad input."""

import collections
import gzip
import os
import shutil

import pytest

from helpers import make_corpus
from electra_jax import data
from electra_jax.data import DataError, build, corpus

WIKIPEDIA = 'tfds:wikipedia/20230601.en'


def test_files_directories_and_globs(tmp_path):
  (tmp_path / 'a.txt').write_text('One.\nTwo.\n\n\nThree.\n', encoding='utf-8')
  with gzip.open(tmp_path / 'b.txt.gz', 'wt', encoding='utf-8') as f:
    f.write('Four.\r\n  \r\nFive.\r\nSix.')
  (tmp_path / '.hidden').write_text('ignored\n')
  expected = [['One.', 'Two.'], ['Three.'], ['Four.'], ['Five.', 'Six.']]
  assert list(corpus.TextFiles(str(tmp_path)).documents()) == expected
  assert list(corpus.TextFiles(str(tmp_path / '*.txt*')).documents()) == expected
  assert list(corpus.TextFiles(str(tmp_path / 'b.txt.gz')).documents()) == expected[2:]


def test_hidden_directories_of_a_directory_source_are_not_read(tmp_path):
  for path, text in [('a.txt', 'One.\n'), ('part/b.txt', 'Two.\n'), ('.git/COMMIT_EDITMSG', 'Fix typo.\n'),
                     ('.ipynb_checkpoints/a-checkpoint.txt', 'Old one.\n'), ('part/.cache/c.txt', 'Cached.\n')]:
    (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / path).write_text(text, encoding='utf-8')
  source = corpus.TextFiles(str(tmp_path))
  assert source.files == [str(tmp_path / 'a.txt'), str(tmp_path / 'part' / 'b.txt')]
  assert list(source.documents()) == [['One.'], ['Two.']]


def test_a_file_name_with_glob_characters_is_that_file(tmp_path):
  """'corpus[1].txt' as a glob matches 'corpus1.txt' only: the file of that exact name is read."""
  (tmp_path / 'corpus[1].txt').write_text('Bracketed.\n', encoding='utf-8')
  (tmp_path / 'corpus1.txt').write_text('Plain.\n', encoding='utf-8')
  source = corpus.TextFiles(str(tmp_path / 'corpus[1].txt'))
  assert source.files == [str(tmp_path / 'corpus[1].txt')]
  assert list(source.documents()) == [['Bracketed.']]
  assert corpus.TextFiles(str(tmp_path / 'corpus[0-9].txt')).files == [str(tmp_path / 'corpus1.txt')]  # a glob


def test_quickstart_corpus_is_the_default():
  source = corpus.open_source('')
  assert source.files == [corpus.QUICKSTART]
  assert len(next(source.documents())) > 0


@pytest.mark.parametrize('content, message', [
    (b'\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00>\x00', 'NUL bytes'),
    ('Caf\xe9 au lait.\n'.encode('latin-1'), 'not valid UTF-8'),
])
def test_binary_and_non_utf8_files(tmp_path, content, message):
  make_corpus(tmp_path / 'good.txt', documents=3)
  (tmp_path / 'bad.txt').write_bytes(content)
  with pytest.raises(DataError, match=message) as error:
    list(corpus.TextFiles(str(tmp_path)).documents())
  assert 'bad.txt line 1' in str(error.value)


@pytest.mark.parametrize('damage, why', [
    (lambda content: content[:len(content) // 2], 'Compressed file ended before the end-of-stream marker'),
    (lambda content: content[:100] + b'\xff' * 100 + content[200:], 'Error -3 while decompressing data'),  # zlib.error
])
def test_truncated_or_corrupt_gzip(tmp_path, damage, why):
  make_corpus(tmp_path / 'c.txt.gz', documents=40, gz=True)
  (tmp_path / 'c.txt.gz').write_bytes(damage((tmp_path / 'c.txt.gz').read_bytes()))
  with pytest.raises(DataError, match=f'{why}.*; fix or remove the file$') as error:
    list(corpus.TextFiles(str(tmp_path)).documents())
  assert str(error.value).startswith(f'cannot read {tmp_path / "c.txt.gz"}: ') and '\n' not in str(error.value)


def test_missing_path():
  with pytest.raises(DataError, match='no text files found'):
    corpus.open_source('/nonexistent/corpus/*.txt')


def test_empty_corpus(tmp_path, corpus_file, cache_dir):
  tokenizer = data.load_tokenizer(data.DataConfig(source=corpus_file, vocab_size=60))
  (tmp_path / 'empty.txt').write_text('\n \n\n', encoding='utf-8')
  source = corpus.TextFiles(str(tmp_path))
  with pytest.raises(DataError, match='holds no text'):
    build.pack_in_memory(source, tokenizer, build.Packing(32))
  with pytest.raises(DataError, match='holds no text'):
    build.build(source, tokenizer, str(tmp_path / 'out'), build.Packing(32), processes=1)
  assert not (tmp_path / 'out').exists()
  del cache_dir


def test_a_moved_corpus_keeps_its_tokenizer_and_packed_data(tmp_path, corpus_file, cache_dir, monkeypatch):
  """Caches are keyed by the text, not by where it lies or when it was written: a corpus copied, restored from a
  backup or re-mounted (new path, new mtime) reuses its cached tokenizer and packed examples."""
  config = data.DataConfig(source=corpus_file, vocab_size=60, max_seq_length=32)
  tokenizer = data.load_tokenizer(config)
  examples = data.load_examples(config, tokenizer)
  moved = tmp_path / 'restored' / os.path.basename(corpus_file)
  moved.parent.mkdir()
  shutil.copyfile(corpus_file, moved)
  os.utime(moved, (1e9, 1e9))
  moved_config = data.DataConfig(source=str(moved), vocab_size=60, max_seq_length=32)
  monkeypatch.setattr(build, 'pack_in_memory', lambda *args, **kwargs: pytest.fail('packed again'))
  monkeypatch.setattr(data.tokenizer_lib, 'train', lambda *args, **kwargs: pytest.fail('trained again'))
  digests = []
  monkeypatch.setattr(corpus.hashlib, 'file_digest', lambda f, name, real=corpus.hashlib.file_digest: (
      digests.append(f.name), real(f, name))[1])
  moved_tokenizer = data.load_tokenizer(moved_config)
  assert moved_tokenizer.fingerprint == tokenizer.fingerprint
  assert data.load_examples(moved_config, moved_tokenizer).fingerprint == examples.fingerprint
  assert digests == [str(moved)]  # read once for both cache keys

  # Other text under the same name, size and mtime is other text.
  text = bytearray(moved.read_bytes())
  text[len(text) // 2] ^= 1
  moved.write_bytes(bytes(text))
  os.utime(moved, (1e9, 1e9))
  assert corpus.open_source(str(moved)).fingerprint() != corpus.open_source(corpus_file).fingerprint()
  del cache_dir


def test_commands_sharing_a_cache_train_a_tokenizer_each_in_its_own_directory(tmp_path, corpus_file, monkeypatch):
  """A tokenizer is trained into a directory of this process's own, renamed into the cache when complete: a command
  that fails (or is interrupted) meanwhile removes only that one, not another command's training beside it."""
  cache = tmp_path / 'cache'
  monkeypatch.setenv('ELECTRA_JAX_CACHE', str(cache))
  config = data.DataConfig(source=corpus_file, vocab_size=60, tokenizer_type='wordpiece')
  train, outputs = data.tokenizer_lib.train, []
  def first_fails(lines, output, **kwargs):
    outputs.append(output)
    os.makedirs(cache / 'another.tmp1', exist_ok=True)  # another command's training, beside this one
    return train(lines if len(outputs) > 1 else [], output, **kwargs)
  monkeypatch.setattr(data.tokenizer_lib, 'train', first_fails)
  with pytest.raises(DataError, match='the corpus is empty'):
    data.load_tokenizer(config)
  assert os.listdir(cache) == ['another.tmp1']  # its own directory removed, the other's left
  tokenizer = data.load_tokenizer(config)
  cached = os.path.dirname(tokenizer.model_file)
  assert sorted(os.listdir(cache)) == sorted(['another.tmp1', os.path.basename(cached)])
  assert [os.path.basename(o).startswith(os.path.basename(cached) + '.tmp') for o in outputs] == [True, True]


def test_text_is_packed_again_when_its_tokenizer_encodes_otherwise(corpus_file, cache_dir, monkeypatch):
  """A change of how a tokenizer kind encodes (`Tokenizer.encode_changes`) keys the packed cache, not the tokenizer's
  fingerprint that built datasets and checkpoints record: the text is packed again with the same tokenizer."""
  config = data.DataConfig(source=corpus_file, tokenizer_type='wordpiece', vocab_size=100, max_seq_length=32)
  tokenizer = data.load_tokenizer(config)
  data.load_examples(config, tokenizer)
  packed = []
  monkeypatch.setattr(build, 'pack_in_memory', lambda *args, real=build.pack_in_memory, **kwargs: (
      packed.append(1), real(*args, **kwargs))[1])
  data.load_examples(config, tokenizer)
  assert not packed
  monkeypatch.setattr(type(tokenizer), 'encode_changes', (*tokenizer.encode_changes, 'a later change'))
  data.load_examples(config, tokenizer)
  assert packed == [1] and tokenizer.fingerprint == data.load_tokenizer(config).fingerprint
  del cache_dir


tfds = pytest.importorskip('tensorflow_datasets')


def test_tfds_source_with_mock_data(cache_dir):
  """tfds.data_source reads ArrayRecord without TensorFlow; mock_data fakes wikipedia's records."""
  with tfds.testing.mock_data(num_examples=40, policy=tfds.testing.MockPolicy.USE_CODE):
    config = data.DataConfig(source=WIKIPEDIA, vocab_size=40, max_seq_length=16)
    source = data.open_source(config)
    assert len(source.records) == 40
    documents = list(source.documents())
    assert len(documents) + sum(source.skipped.values()) == 40
    assert all(line and '\n' not in line for document in documents for line in document)
    tokenizer = data.load_tokenizer(config)
    examples = data.load_examples(config, tokenizer)
    assert len(examples) >= len(documents)
    with pytest.raises(DataError, match=r"no field 'body'.*'text', 'title'"):
      data.open_source(data.DataConfig(source=WIKIPEDIA, text_field='body'))
  del cache_dir


def test_tfds_text_field_is_part_of_the_fingerprint():
  """Another data.text_field is other text, so another tokenizer and other packed examples; the default field adds
  nothing, so caches keyed before the field was stay valid."""
  with tfds.testing.mock_data(num_examples=40, policy=tfds.testing.MockPolicy.USE_CODE):
    text = data.open_source(data.DataConfig(source=WIKIPEDIA)).fingerprint()
    title = data.open_source(data.DataConfig(source=WIKIPEDIA, text_field='title')).fingerprint()
  assert text[:2] == ['wikipedia/20230601.en', 'train'] and text[-1] == 40 and len(text) == 5
  assert title == text + ['title']


def test_tfds_paragraphs_and_skips():
  skipped = collections.Counter()
  assert corpus.paragraphs('First paragraph.\n\n  Second one. \n', skipped) == ['First paragraph.', 'Second one.']
  assert corpus.paragraphs(b'bytes \xc3\xa9', skipped) == ['bytes \xe9']
  assert corpus.paragraphs('  \n', skipped) == [] and corpus.paragraphs(b'\xff', skipped) == []
  assert dict(skipped) == {'empty records': 1, 'records not valid UTF-8': 1}


def test_tfds_dataset_not_prepared(tmp_path):
  with pytest.raises(DataError, match='tfds build'):
    corpus.open_source(WIKIPEDIA, tfds_data_dir=str(tmp_path))
  with pytest.raises(DataError, match='cannot open tensorflow-datasets'):
    corpus.open_source('tfds:no_such_dataset_xyz', tfds_data_dir=str(tmp_path))
