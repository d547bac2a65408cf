"""`data build --runner=DirectRunner`: the Beam pipeline writes the local build's shards byte for byte, locally and
on (the emulator's) gs://, and a failed job leaves nothing that reads as a dataset."""

import dataclasses
import filecmp
import os

import numpy as np
import pytest

# CI installs `.[test]` only: Beam (the `beam` extra) holds protobuf below 7, which the sentencepiece the
# Hugging Face conversion imports cannot load with, so it is not part of the test extra.
pytest.importorskip('apache_beam', reason='Apache Beam is not installed (pip install -e ".[beam]")')

from electra_jax import data, fileio
from electra_jax.data import DataError, beam_build, build, corpus
from electra_jax.data import examples as examples_lib
from helpers import run_data_cli as _cli

HOW = build.Packing(64, seed=5, chunk_chars=3000)  # several chunks per file
SHARD_BYTES = 64 * 3 * 50  # and several shards


@pytest.fixture(scope='module')
def pool_build(corpus_dir, corpus_tokenizer, tmp_path_factory):
  """The local build (2 processes) of the corpus: (directory, metadata)."""
  directory = str(tmp_path_factory.mktemp('pool') / 'data')
  return directory, build.build(corpus.TextFiles(corpus_dir), corpus_tokenizer, directory, HOW, processes=2,
                                shard_bytes=SHARD_BYTES)


def assert_same_dataset(directory, pool_build):
  expected_dir, expected = pool_build
  metadata = examples_lib.read_metadata(directory)
  assert len(expected['shards']) == 8
  assert metadata['shards'] == expected['shards']  # names, counts, sizes and sha256
  assert metadata['statistics'] == expected['statistics'] and metadata['num_examples'] == expected['num_examples']
  assert metadata['tokenizer'] == expected['tokenizer'] and metadata['runner'] == 'DirectRunner'
  local = fileio.local_copy(directory, os.listdir(expected_dir), os.path.join(expected_dir, '..', 'copy')) \
      if fileio.is_remote(directory) else directory
  for name in os.listdir(expected_dir):
    assert filecmp.cmp(os.path.join(expected_dir, name), os.path.join(local, name), shallow=False) or \
        name == examples_lib.METADATA, name


def test_beam_writes_the_local_builds_shards(corpus_dir, corpus_tokenizer, pool_build, tmp_path, gcs_dir):
  source = corpus.TextFiles(corpus_dir)
  beam_build.build(source, corpus_tokenizer, str(tmp_path / 'beam'), HOW, runner='DirectRunner', processes=1,
                     shard_bytes=SHARD_BYTES)
  assert_same_dataset(str(tmp_path / 'beam'), pool_build)
  assert sorted(os.listdir(tmp_path)) == ['beam']  # the staging directory is gone
  beam_build.build(source, corpus_tokenizer, gcs_dir, HOW, runner='DirectRunner', processes=1, shard_bytes=SHARD_BYTES)
  assert_same_dataset(gcs_dir, pool_build)
  assert not (fileio.path(gcs_dir) / build.PARTIAL).exists()
  # What the trainer reads from gs:// is what the local build holds.
  config = data.DataConfig(source=gcs_dir, max_seq_length=64, cache_dir=str(tmp_path / 'cache'))
  from_gcs = data.load_examples(config, data.load_tokenizer(config))
  local = examples_lib.ArrayRecordExamples(pool_build[0])
  np.testing.assert_array_equal(from_gcs.read(np.arange(len(local)))[0], local.read(np.arange(len(local)))[0])


def test_beam_packs_long_lines_as_the_local_build(corpus_dir, corpus_tokenizer, tmp_path):
  """long_lines=truncate on Beam: the local build's shards and manifest value (a paragraph a line, each longer than
  an example)."""
  documents = list(corpus.TextFiles(corpus_dir).documents())
  text = tmp_path / 'paragraphs'
  text.mkdir()
  for i in range(2):
    (text / f'part{i}.txt').write_text('\n\n'.join(' '.join(d) for d in documents[20 * i:20 * i + 20]) + '\n')
  how = build.Packing(32, seed=5, long_lines='truncate', chunk_chars=3000)
  source = corpus.TextFiles(str(text))
  pool = build.build(source, corpus_tokenizer, str(tmp_path / 'pool'), how, processes=1, shard_bytes=32 * 3 * 20)
  beam = beam_build.build(source, corpus_tokenizer, str(tmp_path / 'beam'), how, runner='DirectRunner', processes=1,
                          shard_bytes=32 * 3 * 20)
  assert beam['long_lines'] == pool['long_lines'] == 'truncate' and len(pool['shards']) > 1
  assert beam['shards'] == pool['shards'] and beam['statistics'] == pool['statistics']
  split = build.build(source, corpus_tokenizer, str(tmp_path / 'split'), dataclasses.replace(how, long_lines='split'),
                      processes=1, shard_bytes=32 * 3 * 20)
  assert split['num_examples'] > pool['num_examples']  # the lines were longer than an example


def test_a_failed_job_leaves_no_dataset(corpus_dir, corpus_tokenizer, tmp_path, gcs_dir, monkeypatch):
  """A worker failing on one shard: no manifest on gs://, no output locally; an empty corpus is one clear error."""
  write = beam_build.WriteShard.process

  def fail_on_shard_3(self, shard_pieces):
    if shard_pieces[0] == 3:
      raise OSError('disk full')
    yield from write(self, shard_pieces)

  monkeypatch.setattr(beam_build.WriteShard, 'process', fail_on_shard_3)
  source = corpus.TextFiles(corpus_dir)
  for output in (gcs_dir, str(tmp_path / 'local')):
    with pytest.raises(Exception, match='disk full'):
      beam_build.build(source, corpus_tokenizer, output, HOW, runner='DirectRunner', processes=1,
                       shard_bytes=SHARD_BYTES)
    assert not examples_lib.is_built(output)
  assert os.listdir(tmp_path) == []
  with pytest.raises(DataError, match='pass --overwrite'):  # what the failed job left on gs://
    build.check_output(gcs_dir, overwrite=False, remote=True)
  build.check_output(gcs_dir, overwrite=True, remote=True)  # ... which --overwrite replaces
  (fileio.path(gcs_dir) / build.PARTIAL).unlink()
  with pytest.raises(DataError, match='refusing to delete'):
    build.check_output(gcs_dir, overwrite=True, remote=True)
  fileio.write_text(f'{gcs_dir}-corpus.txt', 'the user\'s corpus\n')  # an object, not a directory: never replaced
  with pytest.raises(DataError, match='exists and is not a directory'):
    build.check_output(f'{gcs_dir}-corpus.txt', overwrite=True, remote=True)
  (tmp_path / 'empty.txt').write_text('\n\n')
  with pytest.raises(DataError, match='holds no text'):
    beam_build.build(corpus.TextFiles(str(tmp_path / 'empty.txt')), corpus_tokenizer, str(tmp_path / 'out'), HOW,
                     runner='DirectRunner', processes=1, shard_bytes=SHARD_BYTES)
  assert os.listdir(tmp_path) == ['empty.txt']


def test_a_failed_job_over_an_earlier_build_on_gcs_keeps_it(corpus_dir, corpus_tokenizer, gcs_dir, monkeypatch):
  """--overwrite on gs:// deleted the earlier build before the job ran: a bad option or a failed job lost it."""
  source = corpus.TextFiles(corpus_dir)
  first = beam_build.build(source, corpus_tokenizer, gcs_dir, HOW, runner='DirectRunner', processes=1,
                           shard_bytes=SHARD_BYTES)
  parent = fileio.path(gcs_dir).parent
  before = sorted(p.name for p in parent.iterdir())
  with pytest.raises(DataError, match='^--max_seq_lenght: not an option of data build nor of Apache Beam'):
    beam_build.build(source, corpus_tokenizer, gcs_dir, HOW, runner='DirectRunner', processes=1, overwrite=True,
                     pipeline_args=['--max_seq_lenght=16'])  # Beam logged it and went on without it
  with pytest.raises(DataError, match='^Apache Beam refused the pipeline.s options'):
    beam_build.build(source, corpus_tokenizer, gcs_dir, HOW, runner='DirectRunner', processes=1, overwrite=True,
                     pipeline_args=['--direct_running_mode=bogus'])
  write = beam_build.WriteShard.process

  def fail_on_shard_3(self, shard_pieces):
    if shard_pieces[0] == 3:
      raise OSError('disk full')
    yield from write(self, shard_pieces)

  with monkeypatch.context() as patch:
    patch.setattr(beam_build.WriteShard, 'process', fail_on_shard_3)
    with pytest.raises(Exception, match='disk full'):
      beam_build.build(source, corpus_tokenizer, gcs_dir, HOW, runner='DirectRunner', processes=1, overwrite=True,
                       shard_bytes=SHARD_BYTES)
  assert examples_lib.read_metadata(gcs_dir)['shards'] == first['shards'] and not (
      fileio.path(gcs_dir) / build.PARTIAL).exists()
  assert sorted(p.name for p in parent.iterdir()) == before  # no staging left beside it
  # The job done, its move into place failing: the new build stays whole beside it, the output marked as a build
  # in progress (both were deleted: the finished build with the failed move's staging).
  with monkeypatch.context() as patch:
    patch.setattr(beam_build.fileio, 'move', lambda *_: (_ for _ in ()).throw(OSError('network down')))
    with pytest.raises(DataError, match=r'^the new build is whole in .*\.tmp\d+, but replacing .* failed'):
      beam_build.build(source, corpus_tokenizer, gcs_dir, HOW, runner='DirectRunner', processes=1, overwrite=True,
                       shard_bytes=SHARD_BYTES)
  staged = [p for p in parent.iterdir() if p.name not in before]
  assert len(staged) == 1 and examples_lib.read_metadata(str(staged[0]))['shards'] == first['shards']
  assert (fileio.path(gcs_dir) / build.PARTIAL).exists() and not examples_lib.is_built(gcs_dir)
  fileio.rmtree(staged[0])
  again = beam_build.build(source, corpus_tokenizer, gcs_dir, dataclasses.replace(HOW, seed=6), runner='DirectRunner',
                           processes=1, overwrite=True, shard_bytes=SHARD_BYTES)  # what --overwrite replaces
  assert examples_lib.read_metadata(gcs_dir) == again and again['shards'] != first['shards']
  assert sorted(p.name for p in parent.iterdir()) == before


def test_a_workers_data_error_is_one_line():
  """Beam re-raises a worker's exception inside its own (a multi-process DirectRunner: a RuntimeError holding the
  worker's traceback text)."""
  with pytest.raises(DataError, match='^x.txt is not valid UTF-8$'):
    with beam_build._pipeline_errors():  # pylint: disable=protected-access
      raise RuntimeError('Traceback (most recent call last):\n  ...\nelectra_jax.errors.DataError: x.txt is not valid '
                         'UTF-8\n')
  with pytest.raises(DataError, match='^Apache Beam refused the pipeline.s options: Pipeline has validations '):
    with beam_build._pipeline_errors():  # pylint: disable=protected-access
      raise ValueError('Pipeline has validations errors:\nMissing required option: project.')
  for error in (OSError('disk full'), ValueError('a worker: no such option')):  # anything else as it was
    with pytest.raises(type(error), match=str(error)):
      with beam_build._pipeline_errors():  # pylint: disable=protected-access
        raise error


def test_cli_runner_and_pipeline_options(corpus_dir, corpus_tokenizer, tmp_path, gcs_dir, capsys):
  """--runner passes Beam's own options through and writes gs://; without it, gs:// and Beam options are refused
  with what to do."""
  common = [f'--source={corpus_dir}', f'--tokenizer={os.path.dirname(corpus_tokenizer.model_file)}',
            '--max_seq_length=32']
  status, out, _ = _cli(capsys, 'build', *common, f'--output={gcs_dir}', '--runner=DirectRunner',
                        '--direct_num_workers=1', '--direct_running_mode=in_memory')
  assert status == 0 and 'fill ratio' in out, out
  assert examples_lib.read_metadata(gcs_dir)['max_seq_length'] == 32
  status, _, err = _cli(capsys, 'build', *common, f'--output={gcs_dir}', '--runner=DirectRunner')
  assert status == 1 and '--overwrite' in err
  status, _, err = _cli(capsys, 'build', *common, f'--output={gcs_dir}/other')
  assert status == 1 and err.startswith('error: ') and '--runner=DirectRunner' in err
  status, _, err = _cli(capsys, 'build', *common, f'--output={tmp_path}/x', '--direct_num_workers=1')
  assert status == 2 and 'unrecognized arguments: --direct_num_workers=1' in err
  status, _, err = _cli(capsys, 'build', *common, f'--output={gcs_dir}/other', '--runner=DataflowRunner')
  assert status == 1 and 'give the corpus and --output on gs://' in err
