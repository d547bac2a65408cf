"""Where and how electra_jax reads and writes files: local paths or Cloud Storage (`gs://bucket/...`), atomically.

`path(location)` gives an `etils.epath.Path` (the path type orbax uses): local paths go through `os`, gs:// paths
through gcsfs (fsspec) with the machine's Application Default Credentials (on a Cloud TPU VM, its service account).
Orbax writes checkpoints to gs:// with tensorstore's own client. Code that takes a location from the user takes
either kind and never calls `os.path` on it: `os.path.abspath('gs://b/x')` is a local path.

Writes are whole or absent. A local file is written under a temporary name beside its destination and renamed over
it only when complete, so a crash, a kill or a full disk never leaves half a file under the final name; the
temporary file is created with mode 0666 minus the umask, as `open()` would (Python's `tempfile` uses 0600, which a
rename would keep). A Cloud Storage object appears only when its upload completes, so it is uploaded directly once
its content is complete. Objects cannot be appended to: `Staging` keeps growing files (metrics) locally and
uploads them whole.

array_record's reader (built shards, tfds datasets) opens local files only: `local_copy` gives it a verified copy of
the remote files in the local cache. `check_writable_directory` and `check_remote` fail early, in one line, on a
missing bucket or missing permissions; `describe` turns any file error, local or Cloud Storage, into one line.
"""

import base64
import contextlib
import errno
import hashlib
import io
import json
import os
import re
import shutil
import sys
import tempfile
import time
import urllib.parse
import uuid
from typing import Iterable

from etils import epath
import fsspec.core

from electra_jax.errors import ConfigError

COPY_BLOCK = 16 << 20

# What a file-system error means for the user, by errno; `describe` appends it.
_ADVICE = {
    errno.ENOSPC: 'the disk is full: free some space and run the same command again',
    errno.EDQUOT: 'the disk quota is exhausted: free some space and run the same command again',
    errno.EROFS: 'the file system is read-only: choose a writable directory',
    errno.EACCES: 'fix its permissions, or choose another path',
    errno.EPERM: 'fix its permissions, or choose another path',
    # A file where a directory must go: in the path (ENOTDIR), or as the directory itself (EEXIST, from makedirs).
    errno.ENOTDIR: 'a file stands where the path needs a directory: move it away, or choose another directory',
    errno.EEXIST: 'a file stands where the path needs a directory: move it away, or choose another directory',
}


def resolved(location) -> str:
  """`location` spelled one way per file: a local path resolved ('~', '..', links), a remote one as given."""
  return os.fspath(location) if is_remote(location) else os.path.realpath(os.path.expanduser(location))


def check_fresh(directory, names, what: str, started):
  """Raises ConfigError if `directory` holds any of `names`, files a new `what` would write over (the user's own: a
  tokenizer directory given as --workdir), unless `started()` says, asked after, that a run has begun there
  meanwhile (another process of this run, which marks its start before it writes those)."""
  if (held := [name for name in names if (path(directory) / name).exists()]) and not started():
    raise ConfigError(f'{directory} holds {", ".join(held)}, which a new {what} would write over: give another '
                      '--workdir (a tokenizer directory is given as --config.data.tokenizer)')


def is_remote(location) -> bool:
  """Whether `location` is a URL such as gs://bucket/dir rather than a local path."""
  return '://' in os.fspath(location)


def path(location) -> epath.Path:
  """`location` (a str or Path) as a Path: a local one with ~ expanded and made absolute, a URL as given."""
  if is_remote(location):
    return epath.Path(location)
  return epath.Path(os.path.abspath(os.path.expanduser(os.fspath(location))))


def _filesystem(location: str):
  """The fsspec file system of URL `location` and the path inside it.

  It is the instance epath.Path uses (orbax's paths, ours): fsspec caches directory listings per instance, and
  with a second instance a directory one of them changed would be listed as it was by the other.
  """
  return epath.backend.fsspec_backend.fs(location), fsspec.core.strip_protocol(location)


def list_files(location: str) -> list[str]:
  """The files at remote `location`: the object itself, every object under it (a directory), or a glob's matches.

  Names starting with '.' are left out of directories, as local directory sources leave them out. Raises OSError
  (see `check_remote`) for a missing bucket or missing permission.
  """
  fs, inside = _filesystem(location)
  check_remote(location.split('*')[0].split('?')[0].split('[')[0])
  if fs.isdir(inside):
    found = [p for p in fs.find(inside) if not os.path.basename(p).startswith('.')]
  elif any(c in inside for c in '*?['):
    found = [p for p in fs.glob(inside) if fs.isfile(p)]
  else:
    found = [inside] if fs.isfile(inside) else []
  return sorted(fs.unstrip_protocol(p) for p in found)


@contextlib.contextmanager
def atomic_writer(location, mode: str = 'wb'):
  """Yields a file object whose content replaces file `location` (local or gs://) when the block ends without
  error; on an error nothing is written."""
  if is_remote(location):
    buffer = io.BytesIO() if 'b' in mode else io.StringIO()
    yield buffer
    content = buffer.getvalue()
    path(location).write_bytes(content if 'b' in mode else content.encode('utf-8'))
    return
  directory, name = os.path.split(os.fspath(path(location)))
  if os.path.isdir(os.path.join(directory, name)):  # the error os.replace gives names the temporary file
    raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), os.path.join(directory, name))
  os.makedirs(directory, exist_ok=True)
  temporary = os.path.join(directory, f'.{name}.tmp-{uuid.uuid4().hex[:8]}')
  # 0o666: the umask applies, as with open(); O_EXCL: never write through a file or link someone else made.
  fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
  try:
    with os.fdopen(fd, mode, **({} if 'b' in mode else {'encoding': 'utf-8'})) as f:
      yield f
      f.flush()
      os.fsync(f.fileno())  # on disk before the rename makes it visible: a power cut leaves old or new, not empty
    os.replace(temporary, os.path.join(directory, name))
  except BaseException:
    with contextlib.suppress(OSError):
      os.remove(temporary)
    raise


def write_text(location, text: str):
  with atomic_writer(location, 'w') as f:
    f.write(text)


def read_json(location, fix: str, error: type[Exception] = ConfigError) -> dict:
  """The JSON object in file `location` (it must exist); `error` in one line, naming the file and saying `fix`, when
  it holds none (cut short or edited by hand: a traceback from json before)."""
  try:
    value = json.loads(path(location).read_bytes().decode('utf-8'))
  except (UnicodeDecodeError, json.JSONDecodeError) as e:
    value, reason = None, f': {e}'
  else:
    reason = ''
  if not isinstance(value, dict):
    raise error(f'{location} is damaged (not a JSON object{reason}): {fix}')
  return value


def write_json(location, value):
  write_text(location, json.dumps(value, indent=2) + '\n')


def copy(source, destination):
  """Copies file `source` to `destination` atomically (the copy gets the umask's mode, not the source's)."""
  with path(source).open('rb') as src, atomic_writer(destination) as dst:
    shutil.copyfileobj(src, dst)


@contextlib.contextmanager
def local_file(location):
  """A local path holding file `location`'s content, for libraries that open local files only: the file itself,
  or a temporary copy of a remote one (removed afterwards)."""
  if not is_remote(location):
    yield os.fspath(path(location))
    return
  with tempfile.TemporaryDirectory(prefix='electra_jax_') as directory:
    local = os.path.join(directory, path(location).name)
    copy(location, local)
    yield local


def rmtree(location):
  """Removes directory `location` (local or remote) and everything in it, if it exists."""
  directory = path(location)
  if directory.exists():
    directory.rmtree()


@contextlib.contextmanager
def removed_on_failure(location):
  """Runs the block that writes into directory `location` (local or remote); if it raises or is interrupted
  (Ctrl-C), removes what the block added there: all of it if it did not exist before, else the entries that were
  not there. Nothing that was there before is removed, so a rerun finds the directory as the failed command did."""
  directory = path(location)
  existed = directory.exists()
  before = {entry.name for entry in directory.iterdir()} if directory.is_dir() else set()
  try:
    yield
  except BaseException:
    if not existed:
      rmtree(directory)
    elif directory.is_dir():
      for entry in directory.iterdir():
        if entry.name in before:
          continue
        if entry.is_dir():
          rmtree(entry)
        else:
          entry.unlink()
    raise


def sha256(location) -> str:
  """The sha256 of a file, read in blocks (shards are tens of MB)."""
  digest = hashlib.sha256()
  with path(location).open('rb') as f:
    for block in iter(lambda: f.read(1 << 20), b''):
      digest.update(block)
  return digest.hexdigest()


def move(source, destination):
  """Renames file or directory `source` to `destination`, which must not exist.

  On Cloud Storage every object is copied before any is deleted: a failure midway leaves `source` whole. (gcsfs's
  own mv moves object by object, and tries the move API first, retrying for a minute where it is not offered.)
  """
  if is_remote(source):
    fs, inside = _filesystem(os.fspath(source))
    fs.copy(inside, _filesystem(os.fspath(destination))[1], recursive=True)
    fs.rm(inside, recursive=True)
    return
  os.makedirs(os.path.dirname(os.fspath(path(destination))), exist_ok=True)
  os.rename(path(source), path(destination))


def file_digests(directory) -> dict[str, list]:
  """{path relative to `directory`: [size, digest]} of every file under it. The digest is the sha256 a local file
  is read for; on Cloud Storage the object's CRC32C, which the service keeps ('crc32c:...', nothing downloaded)."""
  if is_remote(directory):
    fs, inside = _filesystem(os.fspath(directory))
    inside = inside.rstrip('/')
    return {name[len(inside) + 1:]: [info['size'], f'crc32c:{info["crc32c"]}']
            for name, info in fs.find(inside, detail=True).items()}
  digests = {}
  for root, _, names in os.walk(directory):
    for name in names:
      file = os.path.join(root, name)
      digests[os.path.relpath(file, directory)] = [os.path.getsize(file), sha256(file)]
  return digests


def file_digest(location, like: str) -> tuple[int, str] | None:
  """(size, digest) of file `location` in the kind of digest `like` is (see `file_digests`); None if it is missing.
  """
  file = path(location)
  if not file.is_file():
    return None
  if is_remote(location):
    fs, inside = _filesystem(os.fspath(location))
    info = fs.info(inside)
    size, crc32c = info['size'], f'crc32c:{info["crc32c"]}'
  else:
    size, crc32c = os.path.getsize(file), None
  if like.startswith('crc32c:'):
    return size, crc32c or f'crc32c:{_crc32c(os.fspath(file))}'
  return size, sha256(file)


def check_writable_directory(location, what: str):
  """Raises OSError (one line: the path and what to do) unless `location` is, or can be created as, a writable
  directory; for gs://, unless its bucket exists and may be listed (`check_remote`). Writes nothing: runs check
  this before they validate anything else, and create `location` only after."""
  if is_remote(location):
    check_remote(location)
    return
  location = os.path.abspath(os.path.expanduser(location))
  existing = location
  while not os.path.exists(existing):
    existing = os.path.dirname(existing)
  if not os.path.isdir(existing):
    raise NotADirectoryError(f'{what} must be a directory, but {existing} is a file: choose another path')
  if not os.access(existing, os.W_OK | os.X_OK):
    raise PermissionError(f'{what} {location} cannot be written ({existing} does not allow it): choose a directory '
                          'you can write to')


def storage_errors() -> tuple[type, ...]:
  """What a failed file operation raises: OSError, and gcsfs's HttpError (Cloud Storage refused the credentials,
  say) once gcsfs is in use. For `except` clauses, evaluated when an exception is matched."""
  retry = sys.modules.get('gcsfs.retry')
  return (OSError, retry.HttpError) if retry else (OSError,)


def advice(number: int | None) -> str:
  """What to do about file-system error `number` (an errno), or ''."""
  return _ADVICE.get(number, '')


# gcsfs names the object of a failed request by its API path ('b/BUCKET/o/NAME', URL-quoted, maybe inside a URL).
_API_PATH = re.compile(r'(?:^|[/\s])b/(?P<bucket>[^/?\s]+)/o(?:/(?P<name>[^?\s]*))?')
ACCESS_ADVICE = ('grant the account this runs as roles/storage.objectUser on the bucket (roles/storage.objectViewer '
                 'to read only), or check the credentials it uses (`gcloud auth application-default login` outside '
                 'Cloud; a Cloud TPU VM uses its service account)')


def describe(error: Exception, location: str = '') -> str:
  """One line for a failed file operation. Cloud Storage: the gs:// object (or `location`, what was asked for) and
  what to do (a missing object or bucket, no permission, credentials refused). Local: the file, what went wrong
  and, for the usual causes, what to do."""
  text = str(error.args[0]) if len(error.args) == 1 else (getattr(error, 'strerror', None) or str(error))
  code = getattr(error, 'code', None)  # gcsfs's HttpError: what the API answered, e.g. 401
  match = _API_PATH.search(text)
  if match is None and code is None:
    where = f'{error.filename}: ' if getattr(error, 'filename', None) else ''
    what_to_do = advice(getattr(error, 'errno', None))
    message = ' '.join(str(getattr(error, 'strerror', None) or error).split())
    return f'{where}{message}' + (f' ({what_to_do})' if what_to_do else '')
  where = location or 'Cloud Storage'
  if match and not location:
    where = f'gs://{match["bucket"]}/{urllib.parse.unquote(match["name"] or "")}'.rstrip('/')
  lines = text.split('\n')
  if isinstance(error, FileNotFoundError):
    if match and not match['name']:
      return (f'{where}: bucket not found (or this account cannot see it); check the name, or create it with '
              f'`gcloud storage buckets create {where} --location=REGION`')
    return f'{where} does not exist (it was deleted, or the path is wrong)'
  if text.startswith('Forbidden') or code in (401, 403):
    detail = lines[1].strip() if len(lines) > 1 and lines[1].strip() else lines[0]
    return f'no access to {where} ({detail}); {ACCESS_ADVICE}'
  return f'{where}: {" ".join(text.split())}'


def check_remote(location: str):
  """Raises OSError (one line: what is wrong, what to do) unless remote `location`'s bucket exists and this machine
  may list it. Writes nothing: runs call it first, so a wrong bucket or missing permission costs no work."""
  fs, inside = _filesystem(location)
  bucket = inside.split('/', 1)[0]
  try:
    fs.ls(inside, refresh=True)
  except FileNotFoundError:
    if not fs.exists(bucket):
      raise FileNotFoundError(describe(FileNotFoundError(f'b/{bucket}/o'))) from None
  except storage_errors() as e:
    raise PermissionError(describe(e, location)) from None


def cache_path(cache_dir: str, location: str) -> str:
  """Where `local_copy` keeps the copy of remote directory `location`: CACHE/remote/SCHEME/BUCKET/PATH."""
  scheme, rest = os.fspath(location).split('://', 1)
  return os.path.join(cache_dir, 'remote', scheme, *[part for part in rest.split('/') if part])


def _crc32c(local: str) -> str:
  """The base64 CRC32C of a local file, as Cloud Storage reports it for an object."""
  import google_crc32c  # noqa: PLC0415  (installed with gcsfs)
  checksum = google_crc32c.Checksum()
  with open(local, 'rb') as f:
    for block in iter(lambda: f.read(COPY_BLOCK), b''):
      checksum.update(block)
  return base64.b64encode(checksum.digest()).decode()


def local_copy(location: str, names: Iterable[str], cache_dir: str) -> str:
  """A local copy of files `names` of remote directory `location`, for readers that open local files only.

  The copy is kept at `cache_path(cache_dir, location)` and reused while each object is unchanged (same
  generation and size, recorded beside each file). Files are downloaded (concurrently) under temporary names,
  checked against the objects' CRC32C and renamed into place only then, so a copy cut short is never used.
  Raises OSError (ENOSPC) before downloading anything if the disk lacks room, FileNotFoundError for a missing
  object.
  """
  fs, inside = _filesystem(location)
  inside = inside.rstrip('/')
  objects = fs.find(inside, detail=True)
  local_dir = cache_path(cache_dir, location)
  stale = []
  for name in names:
    info = objects.get(f'{inside}/{name}')
    if info is None:
      raise FileNotFoundError(f'{location}/{name} does not exist')
    stamp = f'{info.get("generation", "")}:{info["size"]}'
    local = os.path.join(local_dir, name)
    if not (os.path.isfile(local) and _read(_stamp_file(local)) == stamp):
      stale.append((name, info, stamp))
  if not stale:
    return local_dir
  needed = sum(info['size'] for _, info, _ in stale)
  os.makedirs(local_dir, exist_ok=True)
  free = shutil.disk_usage(local_dir).free
  if needed > free:
    raise OSError(errno.ENOSPC, f'copying {location} to {local_dir} (array_record reads local files only) needs '
                  f'{needed / 2**30:.2f} GiB but {free / 2**30:.2f} GiB are free: set data.cache_dir to a disk '
                  'with more room')
  print(f'copying {len(stale)} file(s), {needed / 2**20:.1f} MiB, of {location} to {local_dir} (array_record reads '
        'local files only; the copy is reused while the objects are unchanged)', file=sys.stderr, flush=True)
  suffix = f'.tmp-{uuid.uuid4().hex[:8]}'
  temporaries = [os.path.join(local_dir, name + suffix) for name, _, _ in stale]
  try:
    for temporary in temporaries:
      os.makedirs(os.path.dirname(temporary), exist_ok=True)
    fs.get([f'{inside}/{name}' for name, _, _ in stale], temporaries)
    for (name, info, stamp), temporary in zip(stale, temporaries):
      if 'crc32c' in info and _crc32c(temporary) != info['crc32c']:
        raise OSError(errno.EIO, f'{location}/{name} changed or was damaged while it was copied (CRC32C '
                      'mismatch); run the same command again')
      local = os.path.join(local_dir, name)
      os.replace(temporary, local)
      write_text(_stamp_file(local), stamp)
  finally:
    for temporary in temporaries:
      if os.path.exists(temporary):
        os.remove(temporary)
  return local_dir


def _stamp_file(local: str) -> str:
  directory, name = os.path.split(local)
  return os.path.join(directory, f'.{name}.source')


def _read(local: str) -> str:
  try:
    with open(local, encoding='utf-8') as f:
      return f.read()
  except FileNotFoundError:
    return ''


class Staging:
  """A local directory standing in for directory `location` for files that grow (metrics.jsonl, TensorBoard
  events): `location` itself when it is local. Cloud Storage objects cannot be appended to, so for a remote one it
  is a temporary directory, seeded with the existing `fetch` files, whose new or changed files `sync` uploads whole.
  """

  def __init__(self, location, fetch: Iterable[str] = ()):
    self.remote = path(location) if is_remote(location) else None
    if self.remote is None:
      self.local = path(location)
      return
    self.local = epath.Path(tempfile.mkdtemp(prefix='electra_jax_staging_'))
    for name in fetch:
      if (self.remote / name).exists():
        (self.local / name).write_bytes((self.remote / name).read_bytes())
    self._uploaded = {name: self._stamp(self.local / name) for name in fetch if (self.local / name).exists()}
    self._last_sync = time.monotonic()

  @staticmethod
  def _stamp(local: epath.Path) -> tuple:
    stat = os.stat(local)
    return stat.st_size, stat.st_mtime_ns

  def sync(self, every: float = 0.0):
    """Uploads the files written since the last sync, if `every` seconds have passed since it (no-op if local)."""
    if self.remote is None or time.monotonic() - self._last_sync < every:
      return
    for root, _, names in os.walk(self.local):
      for name in names:
        relative = os.path.relpath(os.path.join(root, name), self.local)
        stamp = self._stamp(self.local / relative)
        if self._uploaded.get(relative) != stamp:
          try:
            (self.remote / relative).write_bytes((self.local / relative).read_bytes())
          except OSError as e:
            raise OSError(f'cannot upload {relative} to {self.remote} ({describe(e)}); the files are kept in '
                          f'{self.local}') from None
          self._uploaded[relative] = stamp
    self._last_sync = time.monotonic()

  def close(self):
    """Uploads what is left and removes the temporary directory (kept if the upload fails)."""
    if self.remote is not None:
      self.sync()
      shutil.rmtree(self.local)
