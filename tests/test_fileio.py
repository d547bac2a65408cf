"""fileio: a damaged JSON file the runs wrote is one line naming it and the fix; a file error is one line."""

import errno

import pytest

from electra_jax import errors, fileio
from electra_jax.data import examples


@pytest.mark.parametrize('text, reason', [
    ('{"format": "electra', r': Unterminated string'), ('', r': Expecting value'), ('[]', ''), ('\xff', r': ')])
def test_a_damaged_json_file_is_one_line(tmp_path, text, reason):
  path = tmp_path / 'electra_data.json'
  path.write_bytes(text.encode('latin-1'))
  with pytest.raises(errors.DataError, match=rf'^{path} is damaged \(not a JSON object{reason}.*\): rebuild the '
                     r'dataset with `python -m electra_jax.data build --overwrite`$'):
    examples.read_metadata(str(tmp_path))
  path.write_text('{"a": [1]}')
  assert fileio.read_json(path, 'fix it') == {'a': [1]}


def test_writing_over_a_directory_names_it(tmp_path):
  """An output path that is a directory (predict_output, plot --output): the error named the temporary file."""
  (tmp_path / 'out').mkdir()
  with pytest.raises(IsADirectoryError, match=rf"Is a directory: '{tmp_path}/out'$"):
    fileio.write_text(tmp_path / 'out', 'predictions')
  assert sorted(p.name for p in tmp_path.iterdir()) == ['out'] and not list((tmp_path / 'out').iterdir())


def test_describe_a_local_error_in_one_line():
  """A read refused as a write would be: the advice suits both (it told a reader to choose a directory to write)."""
  assert fileio.describe(PermissionError(errno.EACCES, 'Permission denied', '/data/c.txt')) == (
      '/data/c.txt: Permission denied (fix its permissions, or choose another path)')
  assert fileio.describe(OSError(errno.ENOSPC, 'No space left on device')) == (
      'No space left on device (the disk is full: free some space and run the same command again)')
  assert fileio.describe(OSError(errno.EIO, 'Input/output error\n  at block 7', 'f')) == (
      'f: Input/output error at block 7')
