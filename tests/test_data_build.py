"""Building ArrayRecord shards: the same examples and batches as the in-memory path; the CLI and its errors."""

import json
import os
import shutil

import numpy as np
import pytest

from helpers import run_data_cli as _cli
from electra_jax import data
from electra_jax.data import BatchIterator, DataError, build, examples as examples_lib
from electra_jax.data import tokenizer as tokenizer_lib


@pytest.mark.slow
def test_build_equals_streaming(corpus_dir, corpus_tokenizer, tmp_path):
  source = data.open_source(data.DataConfig(source=corpus_dir))
  # Small chunks, so several worker processes each pack some of them.
  how = build.Packing(64, 5, chunk_chars=3000)
  metadata = build.build(source, corpus_tokenizer, str(tmp_path / 'built'), how, processes=2, shard_bytes=64 * 3 * 50)
  assert len(metadata['shards']) > 1 and metadata['statistics']['skipped'] == {}
  built = examples_lib.ArrayRecordExamples(str(tmp_path / 'built'))
  streamed = build.pack_in_memory(source, corpus_tokenizer, how, processes=1)
  assert len(built) == len(streamed) == metadata['num_examples']
  input_ids, segment_ids = built.read(np.arange(len(built)))
  np.testing.assert_array_equal(input_ids, streamed.input_ids)
  np.testing.assert_array_equal(segment_ids, streamed.segment_ids)
  batches = [BatchIterator(e, corpus_tokenizer.special, batch_size=16, seed=0) for e in (built, streamed)]
  for _ in range(2 * len(built) // 16):
    a, b = next(batches[0]), next(batches[1])
    for key in a:
      np.testing.assert_array_equal(a[key], b[key])
  stats = metadata['statistics']
  assert stats == {**stats, **examples_lib.statistics(built, corpus_tokenizer.special)}  # each recomputed value
  assert stats['documents'] == 120 and 0.5 < stats['fill_ratio'] <= 1 and stats['unknown_rate'] == 0
  assert 0.7 < stats['kept_token_fraction'] <= 1


def test_built_directory_as_data_source(corpus_dir, corpus_tokenizer, tmp_path):
  source = data.open_source(data.DataConfig(source=corpus_dir))
  build.build(source, corpus_tokenizer, str(tmp_path / 'built'), build.Packing(32), processes=1)
  config = data.DataConfig(source=str(tmp_path / 'built'), max_seq_length=32)
  loaded = data.load_tokenizer(config)  # the one saved with the data
  assert loaded.fingerprint == corpus_tokenizer.fingerprint and isinstance(loaded, tokenizer_lib.WordPieceTokenizer)
  assert len(data.load_examples(config, loaded)) > 0
  with pytest.raises(DataError, match='max_seq_length=32'):
    data.load_examples(data.DataConfig(source=config.source, max_seq_length=64), loaded)
  cased = tokenizer_lib.load(corpus_tokenizer.model_file, lowercase=False)
  with pytest.raises(DataError, match='built with another tokenizer'):
    data.load_examples(config, cased)
  os.remove(tmp_path / 'built' / 'examples-00000.array_record')
  with pytest.raises(DataError, match='is missing'):
    data.load_examples(config, loaded)


def test_hosts_read_their_own_shards_only_when_their_shares_are_close():
  """Each host draws B/P rows of every batch from its own share: shares of 300 and 18 examples would show the 18
  about 17 times as often, so every host reads the whole dataset then."""
  def shares(counts, processes):
    return [examples_lib.host_shards(counts, p, processes) for p in range(processes)]
  assert shares([64] * 4, 4) == [[0], [1], [2], [3]]  # evenly divisible
  # The benchmark's 12957 examples in 8 shards: 6480 and 6477 examples on 2 hosts, 3240 and 3237 on 4.
  assert shares([1620] * 7 + [1617], 2) == [[0, 2, 4, 6], [1, 3, 5, 7]]
  assert shares([1620] * 7 + [1617], 4) == [[0, 4], [1, 5], [2, 6], [3, 7]]
  assert shares([10] * 20 + [5], 2) == [list(range(0, 21, 2)), list(range(1, 20, 2))]  # 105 vs 100: 1.05 times
  assert shares([300, 18], 2) == [None, None]  # 16.7 times
  assert shares([100, 100, 100, 18], 2) == [None, None]  # 200 vs 118
  assert shares([10] * 11 + [5], 4) == [None] * 4  # 30, 30, 30 and 25: 1.2 times
  assert shares([10], 2) == [None, None] and shares([10, 10], 1) == [None]  # fewer shards than hosts; one host


def test_cli(corpus_dir, tmp_path, capsys, cache_dir):
  status, out, _ = _cli(capsys, 'tokenizer', f'--source={corpus_dir}', f'--output={tmp_path}/tok',
                        '--type=bpe', '--vocab_size=64')
  assert status == 0 and 'tokenizer.model' in out
  status, out, _ = _cli(capsys, 'build', f'--source={corpus_dir}', f'--tokenizer={tmp_path}/tok',
                        f'--output={tmp_path}/out', '--max_seq_length=32', '--processes=1')
  assert status == 0 and 'fill ratio' in out
  with open(tmp_path / 'out' / examples_lib.METADATA, encoding='utf-8') as f:
    metadata = json.load(f)
  assert metadata['max_seq_length'] == 32 and metadata['tokenizer']['type'] == 'sentencepiece'
  status, out, _ = _cli(capsys, 'inspect', f'--source={tmp_path}/out', '--examples=2')
  assert status == 0 and out.count('--- example') == 2 and 'A: [CLS]' in out and 'unknown-token rate' in out
  # Another length than the build's: inspect's own flag, not main's --config.data.max_seq_length, is the advice.
  status, _, err = _cli(capsys, 'inspect', f'--source={tmp_path}/out', '--max_seq_length=64')
  assert status == 1 and err == (f'error: {tmp_path}/out was built with examples of 32 tokens: leave '
                                 '--max_seq_length out to inspect it\n')
  # Text sources are packed as the trainer would (and cached).
  status, out, _ = _cli(capsys, 'inspect', f'--source={corpus_dir}', f'--tokenizer={tmp_path}/tok', '--pieces')
  assert status == 0 and 'examples:' in out and '[SEP]' in out
  # An existing output is never replaced without --overwrite, and never deleted if it is not a built dataset.
  status, _, err = _cli(capsys, 'build', f'--source={corpus_dir}', f'--output={tmp_path}/out')
  assert status == 1 and err.startswith('error: ') and '--overwrite' in err and len(err.splitlines()) == 1
  status, _, _ = _cli(capsys, 'build', f'--source={corpus_dir}', f'--tokenizer={tmp_path}/tok',
                      f'--output={tmp_path}/out', '--max_seq_length=16', '--processes=1', '--overwrite')
  assert status == 0 and examples_lib.read_metadata(f'{tmp_path}/out')['max_seq_length'] == 16
  (tmp_path / 'mine').mkdir()
  (tmp_path / 'mine' / 'notes.txt').write_text('precious')
  status, _, err = _cli(capsys, 'build', f'--source={corpus_dir}', f'--output={tmp_path}/mine', '--overwrite')
  assert status == 1 and 'refusing to delete' in err and (tmp_path / 'mine' / 'notes.txt').exists()
  # A corpus inside an earlier build's directory is never replaced with it, even with --overwrite.
  shutil.copy(os.path.join(corpus_dir, sorted(os.listdir(corpus_dir))[0]), tmp_path / 'out' / 'more.txt')
  status, _, err = _cli(capsys, 'build', f'--source={tmp_path}/out/more.txt', f'--tokenizer={tmp_path}/tok',
                        f'--output={tmp_path}/out', '--overwrite')
  assert status == 1 and err.splitlines()[-1] == (f'error: --source file {tmp_path}/out/more.txt lies in --output='
                                                 f'{tmp_path}/out, which the build replaces: move the corpus out of '
                                                 'it, or choose another --output')
  assert (tmp_path / 'out' / 'more.txt').exists() and examples_lib.is_built(str(tmp_path / 'out'))
  del cache_dir


@pytest.mark.parametrize('argv, message', [
    (['inspect', '--source=/nonexistent/*.txt'], 'no text files found'),
    (['inspect', '--source={tmp}/empty.txt', '--tokenizer={tmp}/vocab.txt'], 'holds no text'),
    (['inspect', '--source={tmp}/binary.txt'], 'NUL bytes'),
    (['inspect', '--source={tmp}/latin1.txt'], 'not valid UTF-8'),
    (['inspect', '--source={tmp}/empty.txt', '--tokenizer={tmp}/bad_vocab.txt'], 'lacks the special tokens'),
])
def test_cli_bad_input(argv, message, tmp_path, capsys, cache_dir):
  (tmp_path / 'empty.txt').write_text('\n\n')
  (tmp_path / 'binary.txt').write_bytes(b'\x00\x01\x02\x03')
  (tmp_path / 'latin1.txt').write_bytes('na\xefve\n'.encode('latin-1'))
  (tmp_path / 'vocab.txt').write_text('\n'.join(tokenizer_lib.SPECIAL_PIECES + ('a',)))
  (tmp_path / 'bad_vocab.txt').write_text('[PAD]\n[UNK]\na\n')
  status, out, err = _cli(capsys, *(a.format(tmp=tmp_path) for a in argv))
  assert status == 1 and out == ''
  # One error line, after at most the lines saying what was being done (training a tokenizer, packing).
  *doing, last = [line for line in err.strip().splitlines() if line.strip()]
  assert last.startswith('error: ') and message in last
  assert all(line.endswith('...') or line.startswith('packing:') for line in doing), doing
  del cache_dir


def test_a_negative_count_is_refused_by_argparse(capsys):
  # --examples=-1 was a numpy traceback from inspect; --processes=-1 was taken ('-1 processes').
  for argv in (['inspect', '--examples=-1'], ['build', '--output=x', '--processes=-1']):
    status, out, err = _cli(capsys, *argv)
    assert status == 2 and out == ''
    assert err.strip().splitlines()[-1].endswith(f"argument {argv[-1].split('=')[0]}: '-1' is not a whole number (0 "
                                                 'or more)')


def test_cli_help_shows_the_defaults(capsys):
  status, out, _ = _cli(capsys, 'build', '--help')
  assert status == 0
  assert '(default: 8000)' in out and '(default: unigram)' in out and '(default: train)' in out
  assert 'packing processes; 0: one per CPU core (default: 0)' in ' '.join(out.split())
  assert '(default: None)' not in out and '(default: False)' not in out


def test_long_lines(corpus_dir, corpus_tokenizer, tmp_path, cache_dir):
  """One paragraph on one line, L=32: 'split' packs all its n tokens (ceil(n / 29) examples of up to L - 3),
  'truncate' one example of its first 30 (L - 2), and neither reuses the other's cached or built examples."""
  del cache_dir
  document = next(iter(data.open_source(data.DataConfig(source=corpus_dir)).documents()))
  (tmp_path / 'text').mkdir()
  (tmp_path / 'text' / 'paragraph.txt').write_text(' '.join(document * 3) + '\n', encoding='utf-8')
  n = len(corpus_tokenizer.encode([' '.join(document * 3)])[0])
  assert n > 3 * 29
  text = data.DataConfig(source=str(tmp_path / 'text'), max_seq_length=32)
  assert len(data.load_examples(text, corpus_tokenizer)) == -(-n // 29)
  truncated = data.load_examples(data.DataConfig(source=text.source, max_seq_length=32, long_lines='truncate'),
                                 corpus_tokenizer)
  ids = truncated.read(np.arange(len(truncated)))[0]
  special = corpus_tokenizer.special
  assert len(ids) == 1 and int(np.isin(ids, [special.pad, special.cls, special.sep], invert=True).sum()) == 30
  source = data.open_source(text)
  metadata = build.build(source, corpus_tokenizer, str(tmp_path / 'built'), build.Packing(32, long_lines='truncate'),
                         processes=1)
  assert metadata['long_lines'] == 'truncate' and metadata['num_examples'] == 1
  with pytest.raises(DataError, match='built with long_lines=truncate, but data.long_lines=split'):
    data.load_examples(data.DataConfig(source=str(tmp_path / 'built'), max_seq_length=32), corpus_tokenizer)
  with pytest.raises(DataError, match="data.long_lines must be one of split, truncate, got 'cut'"):
    data.DataConfig(long_lines='cut')
