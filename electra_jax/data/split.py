"""Held-out documents: a fixed fraction of a text source's documents, set aside for evaluation.

A document is held out when the hash of its text falls below `fraction` (see `held_out`): the choice depends on
the document alone, not on its position, the file order, the chunking or the number of packing processes, and
copies of a document fall on the same side. `DocumentSplit` is a text source (what corpus.open_source returns)
seen through that choice: the training side or the held-out side. The tokenizer is trained on the whole source
(both sides; it fits the vocabulary, not the model), so runs with and without a held-out split share it.
"""

import hashlib
from typing import Iterator

SPLITS = ('train', 'eval')


def held_out(document: list[str], fraction: float) -> bool:
  """Whether `document` (its lines) is held out: the first 8 bytes of the sha256 of its text, read as a number in
  [0, 1), fall below `fraction`."""
  digest = hashlib.sha256('\n'.join(document).encode('utf-8')).digest()
  return int.from_bytes(digest[:8], 'big') / 2.0**64 < fraction


class DocumentSplit:
  """The documents of `source` on one side of the held-out split: 'train' (kept) or 'eval' (held out)."""

  def __init__(self, source, fraction: float, split: str):
    if split not in SPLITS:
      raise ValueError(f'split must be one of {SPLITS}, got {split!r}')
    self.source, self.fraction, self.split = source, fraction, split
    self.skipped = source.skipped

  def __str__(self) -> str:
    side = 'held out of' if self.split == 'eval' else 'kept for training from'
    return f'the documents {side} {self.source} (data.eval_fraction={self.fraction})'

  def documents(self) -> Iterator[list[str]]:
    keep = self.split == 'eval'
    return (document for document in self.source.documents() if held_out(document, self.fraction) == keep)

  def fingerprint(self) -> list:
    """The source's, with the side and the fraction: each side's packed examples are cached apart."""
    return [self.source.fingerprint(), 'split', self.split, self.fraction]
