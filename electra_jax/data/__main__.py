"""Command line for the data pipeline: flags and dispatch only.

  python -m electra_jax.data tokenizer --source=corpus/*.txt.gz --output=tok/ [--type=wordpiece] [--vocab_size=30522]
  python -m electra_jax.data build --source=corpus/*.txt.gz --output=data/ [--tokenizer=tok/] [--processes=8]
  python -m electra_jax.data build ... --runner=DirectRunner|DataflowRunner|... [Beam's own --options]
  python -m electra_jax.data inspect --source=data/ [--examples=3]

--source is what `data.source` accepts: text files (glob, directory, .gz), tfds:NAME[/CONFIG], or a built directory.
Errors in the input print one line `error: ...` and exit with status 1.
"""

import argparse
import os
import sys
import time

import numpy as np

from electra_jax import cli, data, fileio
from electra_jax.config import LONG_LINES
from electra_jax.data import build as build_lib
from electra_jax.data import examples as examples_lib
from electra_jax.data import tokenizer as tokenizer_lib


def _count(text: str) -> int:
  """An argparse type: a whole number, 0 or more (-1 examples was a numpy traceback, -1 processes accepted)."""
  if not text.strip().isdigit():
    raise argparse.ArgumentTypeError(f'{text!r} is not a whole number (0 or more)')
  return int(text)


def _config(args) -> data.DataConfig:
  max_seq_length = getattr(args, 'max_seq_length', None)
  if max_seq_length is None:
    built = examples_lib.is_built(args.source)
    max_seq_length = examples_lib.read_metadata(args.source)['max_seq_length'] if built else 128
  return data.DataConfig(
      source=args.source, tokenizer=getattr(args, 'tokenizer', ''), tokenizer_type=args.type,
      vocab_size=args.vocab_size, lowercase=not args.cased, max_seq_length=max_seq_length,
      long_lines=getattr(args, 'long_lines', 'split'), text_field=args.text_field, tfds_split=args.tfds_split,
      tfds_data_dir=args.tfds_data_dir)


def _log(message: str):
  print(message, file=sys.stderr, flush=True)


def train_tokenizer(args):
  output = fileio.path(args.output)
  if output.is_dir() and any(output.iterdir()) and not args.overwrite:
    raise data.DataError(f'{args.output} already exists; pass --overwrite to replace it, or choose another --output')
  config = _config(args)
  source = data.open_source(config)
  _log(f'training a {args.type} tokenizer of {args.vocab_size} tokens on {source}...')
  started = time.time()
  tokenizer = tokenizer_lib.train(source.lines(data.TOKENIZER_SAMPLE_LINES), args.output,
                                  vocab_size=args.vocab_size, kind=args.type, lowercase=config.lowercase,
                                  max_sentences=data.TOKENIZER_SAMPLE_LINES)
  print(f'wrote {tokenizer.model_file} ({tokenizer.vocab_size} tokens, special ids {tokenizer.special}) in '
        f'{time.time() - started:.1f} s')


def build(args):
  config = _config(args)
  if examples_lib.is_built(config.source):
    raise data.DataError(f'{config.source} is already a built dataset; give text files or tfds:NAME as --source')
  build_lib.check_output(args.output, args.overwrite, remote=bool(args.runner))  # before a tfds copy; the build
  source = data.open_source(config)  # checks its text files are not under --output
  tokenizer = data.load_tokenizer(config)
  how = build_lib.Packing(config.max_seq_length, args.seed, config.long_lines)
  if args.runner:
    _build_on_beam(args, how, source, tokenizer)
    return
  _log(f'packing {source} with {tokenizer.model_file} into {args.output} ({args.processes or os.cpu_count()} '
       'processes)')
  last = [time.time()]

  def progress(counts):
    if time.time() - last[0] > 10:
      last[0] = time.time()
      _log(f'  {counts["documents"]} documents -> {counts["examples"]} examples')

  metadata = build_lib.build(source, tokenizer, args.output, how, processes=args.processes, overwrite=args.overwrite,
                             progress=progress)
  print(f'wrote {metadata["num_examples"]} examples in {len(metadata["shards"])} shard(s) to {args.output} '
        f'in {metadata["build_seconds"]} s')
  _print_statistics(metadata['statistics'])


def _build_on_beam(args, how: build_lib.Packing, source, tokenizer):
  try:
    from electra_jax.data import beam_build  # noqa: PLC0415
  except ImportError as e:
    raise data.DataError(f'--runner={args.runner} needs Apache Beam ({e}): pip install -e ".[beam]"') from None
  _log(f'packing {source} with {tokenizer.model_file} into {args.output} on Beam {args.runner} '
       f'({" ".join(args.pipeline_args) or "no pipeline options"})')
  metadata = beam_build.build(source, tokenizer, args.output, how, runner=args.runner,
                              pipeline_args=args.pipeline_args, processes=args.processes, overwrite=args.overwrite)
  print(f'wrote {metadata["num_examples"]} examples in {len(metadata["shards"])} shard(s) to {args.output} '
        f'in {metadata["build_seconds"]} s')
  _print_statistics(metadata['statistics'])


def inspect(args):
  config = _config(args)
  if args.max_seq_length is not None and examples_lib.is_built(config.source):
    built = examples_lib.read_metadata(config.source)['max_seq_length']
    if built != args.max_seq_length:
      raise data.DataError(f'{config.source} was built with examples of {built} tokens: leave --max_seq_length out '
                           'to inspect it')
  tokenizer = data.load_tokenizer(config)
  examples = data.load_examples(config, tokenizer, seed=args.seed)
  print(f'source: {config.source or "(quickstart corpus)"}  tokenizer: {tokenizer.model_file} '
        f'({tokenizer.kind}, {tokenizer.vocab_size} tokens, lowercase={tokenizer.lowercase})')
  rng = np.random.default_rng(args.seed)
  rows = np.sort(rng.choice(len(examples), size=min(args.examples, len(examples)), replace=False))
  input_ids, segment_ids = examples.read(rows)
  for row, ids, segments in zip(rows, input_ids, segment_ids):
    print(_describe(tokenizer, int(row), ids, segments, pieces=args.pieces))
  if isinstance(examples, examples_lib.ArrayRecordExamples):
    examples.verify()
    print(f'checksums: the {len(examples.metadata["shards"])} shard(s) are as built')
    stats = examples.metadata['statistics']
  else:
    stats = examples_lib.statistics(examples, tokenizer.special)
  _print_statistics(stats)


def _describe(tokenizer, row: int, ids: np.ndarray, segments: np.ndarray, pieces: bool) -> str:
  """One example as '[CLS] A [SEP] || B [SEP]' with its segment lengths."""
  length = int((ids != tokenizer.special.pad).sum())
  a, b = ids[:length][segments[:length] == 0], ids[:length][segments[:length] == 1]
  show = (lambda t: ' '.join(tokenizer.pieces(t))) if pieces else tokenizer.decode
  lines = [f'--- example {row}: {length} tokens, segment A {len(a)} (with [CLS] [SEP]), segment B {len(b)}']
  lines.append(f'A: {show(a)}')
  if len(b):
    lines.append(f'B: {show(b)}')
  return '\n'.join(lines)


def _print_statistics(stats: dict):
  print(f'examples: {stats["examples"]}  tokens: {stats["tokens"]}  fill ratio: {stats["fill_ratio"]:.3f}  '
        f'unknown-token rate: {stats["unknown_rate"]:.4%}  single-segment: {stats["single_segment_fraction"]:.3f}')
  if 'source_tokens' in stats:
    print(f'documents: {stats["documents"]}  tokenized: {stats["source_tokens"]}  kept in examples: '
          f'{stats["kept_token_fraction"]:.3f} (the rest overflowed an example and was cut, as the official builder '
          'does)')
  for reason, count in stats.get('skipped', {}).items():
    print(f'skipped: {count} {reason}')


class _HelpWithDefaults(argparse.ArgumentDefaultsHelpFormatter):
  """--help shows each option's default, except where there is none to show (required options, switches, '')."""

  def _get_help_string(self, action):
    shown = action.default is not None and action.default is not False and action.default not in ('', argparse.SUPPRESS)
    if action.required or not shown:
      return action.help
    return super()._get_help_string(action)


def parse_args(argv):
  parser = argparse.ArgumentParser(prog='python -m electra_jax.data', description=__doc__.split('\n')[0])
  commands = parser.add_subparsers(dest='command', required=True)

  def add(name, function, help_text):
    command = commands.add_parser(name, help=help_text, description=help_text, formatter_class=_HelpWithDefaults)
    command.set_defaults(function=function)
    command.add_argument('--source', default='', help="text files (a file, directory or glob; plain or .gz), "
                         "'tfds:NAME[/CONFIG]' or a built directory; '': the built-in quickstart corpus")
    command.add_argument('--type', default='unigram', choices=tokenizer_lib.TYPES,
                         help='tokenizer to train: SentencePiece unigram/bpe, or BERT wordpiece')
    command.add_argument('--vocab_size', type=int, default=8000, help='size of a tokenizer trained here')
    command.add_argument('--cased', action='store_true', help='keep case (default: lower-case)')
    command.add_argument('--text_field', default='text', help='tfds: the feature holding the text')
    command.add_argument('--tfds_split', default='train', help='tfds: the split to read')
    command.add_argument('--tfds_data_dir', default='', help="tfds: where the prepared dataset is; '': tfds's own")
    return command

  command = add('tokenizer', train_tokenizer, 'train a tokenizer on a corpus')
  command.add_argument('--output', required=True, help='directory for the tokenizer files')
  command.add_argument('--overwrite', action='store_true', help='replace an existing --output')
  for name, function, help_text in (('build', build, 'pack a corpus once into ArrayRecord shards'),
                                    ('inspect', inspect, 'print decoded examples and corpus statistics')):
    command = add(name, function, help_text)
    command.add_argument('--tokenizer', default='', help='.model, vocab.txt or tokenizer directory; '
                         "'': the built dataset's, or train one (cached)")
    command.add_argument('--max_seq_length', type=int, default=None,
                         help="tokens per example; default: a built --source's, else 128")
    command.add_argument('--seed', type=int, default=0, help='packing seed (inspect: also picks the examples)')
    command.add_argument('--long_lines', choices=LONG_LINES, default='split',
                         help="a line longer than an example: 'split' keeps all its tokens, 'truncate' keeps its "
                         'first max_seq_length - 2 (as the official builder)')
    if name == 'build':
      command.add_argument('--output', required=True, help='directory to write')
      command.add_argument('--processes', type=_count, default=0, help='packing processes; 0: one per CPU core')
      command.add_argument('--overwrite', action='store_true', help='replace an existing built --output')
      command.add_argument('--runner', default='', help="Apache Beam runner to build on (DirectRunner, "
                           "DataflowRunner, FlinkRunner, SparkRunner; needs the [beam] extra), with any other "
                           "options passed to Beam (DirectRunner: --processes workers); '': this machine's "
                           "processes (fastest on one machine)")
    else:
      command.add_argument('--examples', type=_count, default=3, help='how many examples to print')
      command.add_argument('--pieces', action='store_true', help='print token pieces instead of decoded text')
  args, unknown = parser.parse_known_args(argv)
  args.pipeline_args = unknown
  if unknown and not getattr(args, 'runner', ''):
    parser.error(f'unrecognized arguments: {" ".join(unknown)}')  # Beam's options only follow --runner
  return args


def main(argv=None):
  args = parse_args(sys.argv[1:] if argv is None else argv)
  cli.run(args.function, args)


if __name__ == '__main__':
  main()
