"""Runs gcp-storage-emulator (same arguments as its `gcp-storage-emulator` command) with the response header it
leaves out and tensorstore needs.

Cloud Storage answers every object download with the object's generation in an `x-goog-generation` header;
tensorstore (orbax's checkpoint I/O) reads it to revalidate what it caches and fails with "Malformed
StorageGeneration" without it. The emulator sets the generation in the object's metadata but not in that header.
"""

import sys

from gcp_storage_emulator import __main__ as emulator
from gcp_storage_emulator.handlers import objects

_download = objects.download


def download(request, response, storage, *args, **kwargs):
  _download(request, response, storage, *args, **kwargs)
  if response.status.value < 300:
    obj = storage.get_file_obj(request.params['bucket_name'], request.params['object_id'])
    response['x-goog-generation'] = obj['generation']


objects.download = download  # what objects.get (the JSON API's ?alt=media download) calls

if __name__ == '__main__':
  emulator.main(sys.argv[1:])
