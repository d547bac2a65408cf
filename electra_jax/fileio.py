"""How electra_jax writes its own files (workdirs, built datasets, caches): atomically, with the user's umask.

A file is written under a temporary name beside its destination and renamed over it only when complete, so a
crash, a kill or a full disk never leaves half a file under the final name. The temporary file is created with
mode 0666 minus the umask, as `open()` would (Python's `tempfile` uses 0600, which a rename would keep).
Orbax writes the checkpoints itself; everything else goes through here, so that remote paths are one change.
"""

import contextlib
import errno
import hashlib
import json
import os
import shutil
import uuid

# What a file-system error means for the user, by errno; `describe` appends it.
_ADVICE = {
    errno.ENOSPC: 'the disk is full: free some space and run the same command again',
    errno.EDQUOT: 'the disk quota is exhausted: free some space and run the same command again',
    errno.EROFS: 'the file system is read-only: choose a writable directory',
    errno.EACCES: 'permission denied: choose a directory you can write to, or fix its permissions',
    errno.EPERM: 'permission denied: choose a directory you can write to, or fix its permissions',
}


@contextlib.contextmanager
def atomic_writer(path: str, mode: str = 'wb'):
  """Yields a file object open on a temporary file that replaces `path` when the block ends without error."""
  directory, name = os.path.split(os.path.abspath(path))
  temporary = os.path.join(directory, f'.{name}.tmp-{uuid.uuid4().hex[:8]}')
  # 0o666: the umask applies, as with open(); O_EXCL: never write through a file or link someone else made.
  fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
  try:
    with os.fdopen(fd, mode, **({} if 'b' in mode else {'encoding': 'utf-8'})) as f:
      yield f
      f.flush()
      os.fsync(f.fileno())  # on disk before the rename makes it visible: a power cut leaves old or new, not empty
    os.replace(temporary, path)
  except BaseException:
    with contextlib.suppress(OSError):
      os.remove(temporary)
    raise


def write_text(path: str, text: str):
  with atomic_writer(path, 'w') as f:
    f.write(text)


def write_json(path: str, value):
  write_text(path, json.dumps(value, indent=2) + '\n')


def copy(source: str, destination: str):
  """Copies file `source` to `destination` atomically (the copy gets the umask's mode, not the source's)."""
  with open(source, 'rb') as src, atomic_writer(destination) as dst:
    shutil.copyfileobj(src, dst)


def sha256(path: str) -> str:
  """The sha256 of file `path`, read in blocks (shards are tens of MB)."""
  digest = hashlib.sha256()
  with open(path, 'rb') as f:
    for block in iter(lambda: f.read(1 << 20), b''):
      digest.update(block)
  return digest.hexdigest()


def check_writable_directory(path: str, what: str):
  """Raises OSError (one line: the path and what to do) unless `path` is, or can be created as, a writable
  directory. Writes nothing: runs check this before they validate anything else, and create `path` only after."""
  path = os.path.abspath(os.path.expanduser(path))
  existing = path
  while not os.path.exists(existing):
    existing = os.path.dirname(existing)
  if not os.path.isdir(existing):
    raise NotADirectoryError(f'{what} must be a directory, but {existing} is a file: choose another path')
  if not os.access(existing, os.W_OK | os.X_OK):
    raise PermissionError(f'{what} {path} cannot be written ({existing} does not allow it): choose a directory '
                          'you can write to')


def advice(number: int | None) -> str:
  """What to do about file-system error `number` (an errno), or ''."""
  return _ADVICE.get(number, '')


def describe(error: OSError) -> str:
  """One line for a file-system error: the file, what went wrong and, for the usual causes, what to do."""
  where = f'{error.filename}: ' if error.filename else ''
  what_to_do = advice(error.errno)
  return f'{where}{error.strerror or error}' + (f' ({what_to_do})' if what_to_do else '')
