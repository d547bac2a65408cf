"""Replaced-token detection on your own text: the discriminator's probability that each token was replaced.

  python -m electra_jax.detect --checkpoint WORKDIR "the chef ate the meal"
  python -m electra_jax.detect --checkpoint WORKDIR --json "the chef ate the meal"

WORKDIR is a pre-training run or an import (`python -m electra_jax.convert`). Its tokenizer is
WORKDIR/tokenizer.model (SentencePiece, what the trainer writes), WORKDIR/tokenizer.json (WordPiece, what transformers
saves) or WORKDIR/vocab.txt (WordPiece, what Google ships). The text is encoded as
[CLS] text [SEP], one segment.
"""

import argparse
import functools
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np

from electra_jax import cli, data, fileio, objective, pretrained
from electra_jax.config import ModelConfig
from electra_jax.model import Electra

# Sequences are padded to a multiple of this, so texts of similar length share one compiled forward pass.
LENGTH_BUCKET = 32


class DetectError(ValueError):
  """The workdir cannot be used for detection; the message says why."""


class WorkdirTokenizer:
  """Text -> ([CLS] ids [SEP], their token strings) with the tokenizer a workdir holds (SentencePiece or WordPiece)."""

  def __init__(self, workdir: str):
    try:
      self.tokenizer = data.tokenizer.load(workdir)
    except data.DataError as e:
      raise DetectError(str(e)) from None

  def encode(self, text: str) -> tuple[list[int], list[str]]:
    """[CLS] text [SEP] as (ids, tokens), both of length = number of tokens + 2."""
    special = self.tokenizer.special
    ids = [special.cls] + self.tokenizer.encode([text])[0] + [special.sep]
    return ids, self.tokenizer.pieces(ids)


@functools.partial(jax.jit, static_argnames='config')
def replaced_probabilities(params, input_ids, input_mask, *, config: ModelConfig):
  """[batch, length] ids and mask -> [batch, length] probability that each token was replaced (deterministic)."""
  logits = Electra(config).apply({'params': params}, input_ids, jnp.zeros_like(input_ids), input_mask,
                                 deterministic=True, method='discriminator_logits')
  return jax.nn.sigmoid(logits)


class Detector:
  """A workdir's discriminator and tokenizer, loaded once for any number of texts."""

  def __init__(self, workdir: str, step: int | None = None):
    if not fileio.path(workdir).is_dir():
      raise DetectError(f'{workdir} {"is not a directory" if fileio.path(workdir).exists() else "does not exist"}: '
                        'give the workdir of a pre-training run or of an import (python -m electra_jax.convert)')
    self.tokenizer = WorkdirTokenizer(workdir)  # fails fast
    self.config, self.params = pretrained.load_params(workdir, step)
    self.limit = pretrained.trained_length(workdir, self.config)
    name = self.config.objective.name
    if not objective.get(name).detects_replaced:
      raise DetectError(f'{workdir} was pre-trained with objective {name}, whose discriminator predicts masked '
                        'words, not replaced ones: detect needs a replaced-token detection run (objective electra, '
                        'its default)')

  def __call__(self, text: str) -> list[dict]:
    """[{'token': str, 'p_replaced': float}] for [CLS] text [SEP], cut to the length the model was trained on
    (`pretrained.trained_length`: positions beyond it may have had no gradient)."""
    try:
      text.encode('utf-8')
    except UnicodeEncodeError:  # undecodable bytes in argv arrive as lone surrogates
      raise DetectError('the text is not UTF-8: convert it first (e.g. iconv -f latin1 -t utf-8)') from None
    ids, tokens = self.tokenizer.encode(text)
    limit = self.limit
    if len(ids) > limit:  # keep [SEP] last, as the model saw in pre-training
      print(f'note: the text is {len(ids)} tokens with [CLS] and [SEP]; the model was trained on {limit}: only the '
            f'first {limit - 1} and [SEP] are shown', file=sys.stderr)
      ids, tokens = ids[:limit - 1] + ids[-1:], tokens[:limit - 1] + tokens[-1:]
    length = min(limit, -(-len(ids) // LENGTH_BUCKET) * LENGTH_BUCKET)
    padded = np.zeros((1, length), np.int32)  # padding is masked out of attention: it changes no probability
    padded[0, :len(ids)] = ids
    probabilities = jax.device_get(replaced_probabilities(
        self.params, padded, (np.arange(length) < len(ids)).astype(np.int32)[None], config=self.config.model))[0]
    return [{'token': t, 'p_replaced': float(p)} for t, p in zip(tokens, probabilities)]


def format_table(rows: list[dict]) -> str:
  """One line per token: the token, its probability of having been replaced, and a bar of that length."""
  width = max([len('token')] + [len(r['token']) for r in rows])
  lines = [f'{"token":<{width}}  p_replaced']
  for r in rows:
    p = r['p_replaced']
    lines.append(f'{r["token"]:<{width}}  {p:10.4f}  {"#" * round(20 * p)}')
  return '\n'.join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(prog='python -m electra_jax.detect', description=__doc__.split('\n')[0])
  parser.add_argument('--checkpoint', required=True, metavar='WORKDIR', help='a pre-training run or an import')
  parser.add_argument('--step', type=int, help='the checkpoint step (default: the latest)')
  parser.add_argument('--json', action='store_true', help='print [{"token": ..., "p_replaced": ...}, ...]')
  parser.add_argument('text', nargs='+', help='the text (several arguments are joined by spaces)')
  args = parser.parse_args(argv)
  rows = cli.run(lambda: Detector(args.checkpoint, args.step)(' '.join(args.text)), errors=(DetectError,))
  print(json.dumps(rows, ensure_ascii=False) if args.json else format_table(rows))


if __name__ == '__main__':
  main()
