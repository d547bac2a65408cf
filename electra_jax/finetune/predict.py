"""Inference with a fine-tuned model: examples -> features -> head outputs -> predictions, and the files they go
to (dev predictions, GLUE/SQuAD submission files). `Predictor(workdir)` loads what `train.run` saved.

Input of `--mode=predict` (`--config.predict_input`, one example per line; '-' for stdin):
  classification/regression  `sentence[<TAB>sentence2]`;  tagging  whitespace-separated words;
  squad                      `question<TAB>context`.
Output (`--config.predict_format`), one line per input line, in order:
  tsv     a header, then `prediction[<TAB>p_LABEL...]<TAB>input columns` (class probabilities for classification;
          tags space-separated for tagging);
  jsonl   {"input": [columns] (words for tagging), "prediction": ..., "probabilities": {label: p}} per line;
  labels  the bare prediction (label, number, space-separated tags, or answer text).
"""

import csv
import io
import json
import os
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from electra_jax import data, fileio, sharding
from electra_jax.config import ConfigError, ModelConfig
from electra_jax.errors import DataError
from electra_jax.finetune import features as features_lib
from electra_jax.finetune import files, heads, squad, tasks
from electra_jax.finetune.config import FinetuneConfig, SquadConfig, load as load_config

INPUTS = ('input_ids', 'segment_ids', 'input_mask')


def eval_step(params, batch, *, model: heads.Finetuner):
  """The head's predictions for a batch (see heads.predictions), dropout off."""
  return heads.predictions(model.kind, model.apply({'params': params}, batch, train=False))


def encode(task: tasks.Task, examples: list, tokenizer: data.Tokenizer, max_seq_length: int,
           squad_config: SquadConfig, *, training: bool) -> features_lib.Features:
  """Examples -> Features for any task kind."""
  if task.kind == tasks.TAGGING:
    return features_lib.encode_words(task, examples, tokenizer, max_seq_length)
  if task.kind == tasks.SQUAD:
    return squad.encode(examples, tokenizer, max_seq_length, squad_config, training=training)
  return features_lib.encode_texts(task, examples, tokenizer, max_seq_length, training=training)


def infer(eval_fn, params, feats: features_lib.Features, batch_size: int, batch_sharding=None) -> dict:
  """`eval_fn(params, batch)` on every row of `feats`; host arrays with leading dimension len(feats)."""
  outputs = []
  rows = None if batch_sharding is None else sharding.local_rows(batch_sharding, batch_size)
  for batch in features_lib.eval_batches(feats.arrays, batch_size, rows):
    batch = {k: batch[k] for k in INPUTS}
    if batch_sharding is not None:
      batch = sharding.global_batch(batch, batch_sharding)
    outputs.append(eval_fn(params, batch))
  outputs = jax.device_get(outputs)
  return {k: np.concatenate([o[k] for o in outputs])[:len(feats)] for k in outputs[0]} if outputs else {}


def decode(task: tasks.Task, feats: features_lib.Features, outputs: dict, squad_config: SquadConfig,
           tokenizer: data.Tokenizer) -> list:
  """Per-example predictions: a label name, a number, a list of tags, or {'answer', 'span', 'null_odds'} (SQuAD:
  the best span's text, spelled by `tokenizer` (see squad.final_text), its null odds (2.0; else None), and the
  answer, '' when those exceed squad_config.na_threshold)."""
  if not len(feats):
    empty = {'answer': '', 'span': '', 'null_odds': None}
    return [dict(empty) for _ in feats.examples] if task.kind == tasks.SQUAD else []
  if task.kind == tasks.CLASSIFICATION:
    return [task.labels[i] for i in np.argmax(outputs['logits'], -1)]
  if task.kind == tasks.REGRESSION:
    return [task.unscale(float(x)) for x in outputs['logits'][:, 0]]
  if task.kind == tasks.TAGGING:
    fallback = 'O' if 'O' in task.labels else task.labels[0]
    result = []
    for example, tags, positions in zip(feats.examples, outputs['tags'], feats.word_positions):
      predicted = [task.labels[t] for t in tags[positions]]
      result.append(predicted + [fallback] * (len(example.words) - len(predicted)))
    return result
  spans, null_odds = squad.decode(feats, outputs, squad_config, task.squad_v2, tokenizer)
  return [{'answer': squad.answer(spans[e.guid], null_odds.get(e.guid), squad_config), 'span': spans[e.guid],
           'null_odds': null_odds.get(e.guid)} for e in feats.examples]


def probabilities(task: tasks.Task, outputs: dict) -> np.ndarray | None:
  """[examples, classes] softmax of a classifier's logits (`infer`'s outputs); None for other task kinds."""
  if task.kind != tasks.CLASSIFICATION or 'logits' not in outputs:
    return None
  logits = np.asarray(outputs['logits'], np.float64)
  exp = np.exp(logits - logits.max(-1, keepdims=True))
  return exp / exp.sum(-1, keepdims=True)


def _cell(value) -> str:
  return '' if value is None else f'{value:.4f}' if isinstance(value, float) else str(value)


def write_predictions(directory: str, task: tasks.Task, split: tasks.Split, examples: list, predicted: list,
                      probs: np.ndarray | None = None):
  """Writes one split's predictions under `directory`:

  GLUE test splits: `index<TAB>prediction`, the leaderboard's format under its file names (CoLA.tsv, MNLI-m.tsv,
  AX.tsv, ...; class ids, or names for MNLI/QNLI/RTE/AX; STS-B scores 0-5);
  other text splits (GLUE dev, task directories): `id<TAB>gold<TAB>prediction[<TAB>p_LABEL...]<TAB>texts`, labels
  by name, gold empty when unlabelled, `probs` [examples, classes] as p_ columns;
  CoNLL: `word<TAB>gold tag<TAB>predicted tag` (`word<TAB>predicted tag` when unlabelled);
  SQuAD: {id: answer} JSON; for a 2.0 dev split, as the official qa_preds_file, {id: best span} and
  <split>_null_odds.json, which the official squad_official_eval.py reads (`-n`, `-t -2.75` for our threshold) to
  score them as we do and to search the best threshold.
  """
  directory = fileio.path(directory)
  if task.kind == tasks.SQUAD:
    test = split.submission and split.name.startswith('test')
    name = split.submission if test else f'{split.name}.json'
    key = 'answer' if test else 'span'
    fileio.write_text(directory / name, json.dumps({e.guid: p[key] for e, p in zip(examples, predicted)},
                                                   indent=1))
    if task.squad_v2:
      fileio.write_text(directory / f'{split.name}_null_odds.json',
                        json.dumps({e.guid: p['null_odds'] for e, p in zip(examples, predicted)}, indent=1))
    return
  if task.kind == tasks.TAGGING:
    fileio.write_text(directory / f'{split.name}.conll', ''.join(
        ''.join('\t'.join([w] + ([g] if example.tags else []) + [t]) + '\n'
                for w, g, t in zip(example.words, example.tags or example.words, tags)) + '\n'
        for example, tags in zip(examples, predicted)))
    return
  f = io.StringIO(newline='')
  writer = csv.writer(f, delimiter='\t', quoting=csv.QUOTE_NONE, escapechar='\\', lineterminator='\n')
  if task.glue_submission and split.submission:
    writer.writerow(['index', 'prediction'])
    for example, p in zip(examples, predicted):
      if task.kind == tasks.CLASSIFICATION and not task.label_names_in_submission:
        p = task.labels.index(p)
      writer.writerow([example.guid, _cell(p)])
    fileio.write_text(directory / split.submission, f.getvalue())
    return
  texts = ['sentence', 'sentence2'][:max((len(e.texts) for e in examples), default=1)]
  writer.writerow(['id', 'gold', 'prediction'] + _probability_columns(task, probs) + texts)
  for i, (example, p) in enumerate(zip(examples, predicted)):
    writer.writerow([example.guid, _cell(example.label), _cell(p)] + _probability_cells(probs, i) + list(example.texts))
  fileio.write_text(directory / f'{split.name}.tsv', f.getvalue())


def _probability_columns(task: tasks.Task, probs) -> list[str]:
  return [] if probs is None else [f'p_{label}' for label in task.labels]


def _probability_cells(probs, row: int) -> list[str]:
  return [] if probs is None else [f'{p:.4f}' for p in probs[row]]


class Predictor:
  """A fine-tuned model from a `train.run` WORKDIR, ready to predict on new inputs (one device)."""

  def __init__(self, workdir: str, seed: int | None = None):
    workdir = fileio.path(workdir)
    if not (workdir / 'finetune.json').exists():
      raise ConfigError(f'{workdir} is not a fine-tuning workdir (no finetune.json); run --mode=finetune first')
    saved = json.loads((workdir / 'finetune.json').read_text())
    self.task = tasks.Task.from_dict(saved['task'])
    self.max_seq_length = saved['max_seq_length']
    self.squad_config = SquadConfig(**saved['config'].get('squad', {}))
    self.tokenizer = data.tokenizer.load(os.fspath(workdir), lowercase=saved['lowercase'])
    if seed is None:
      seed = json.loads((workdir / 'results.json').read_text())['best_seed']
    self.seed = seed
    self.model = heads.make_model(self.task, ModelConfig(**saved['model']), 0.0, self.squad_config)
    ids = jnp.zeros((1, 16), jnp.int32)
    abstract = jax.eval_shape(lambda: nn.meta.unbox(self.model.init(
        jax.random.PRNGKey(0), {'input_ids': ids, 'segment_ids': ids, 'input_mask': ids})['params']))
    params_dir = workdir / 'seeds' / str(seed) / 'params'
    if not params_dir.is_dir():
      raise ConfigError(f'{params_dir} does not exist: fine-tune with --config.save_model=True (the default)')
    with ocp.StandardCheckpointer() as checkpointer:
      self.params = checkpointer.restore(params_dir, abstract)
    self.eval_fn = jax.jit(lambda params, batch: eval_step(params, batch, model=self.model))

  def examples(self, inputs: list) -> list:
    """Raw inputs -> examples: str or (str, str) texts; word lists (tagging); (question, context) (SQuAD)."""
    out = []
    for i, x in enumerate(inputs):
      if self.task.kind == tasks.TAGGING:
        out.append(tasks.TaggingExample(str(i), tuple(x.split() if isinstance(x, str) else x)))
      elif self.task.kind == tasks.SQUAD:
        out.append(tasks.SquadExample(str(i), x[0], x[1]))
      else:
        out.append(tasks.TextExample(str(i), (x,) if isinstance(x, str) else tuple(x)))
    return out

  def predict(self, inputs: list, batch_size: int = 32) -> list:
    return [p['answer'] if isinstance(p, dict) else p for p in self.predict_with_details(inputs, batch_size)[0]]

  def predict_with_details(self, inputs: list, batch_size: int = 32) -> tuple[list, np.ndarray | None]:
    """(predictions as `decode` gives them, [inputs, classes] class probabilities or None)."""
    examples = self.examples(inputs)
    feats = encode(self.task, examples, self.tokenizer, self.max_seq_length, self.squad_config, training=False)
    outputs = infer(self.eval_fn, self.params, feats, batch_size)
    return decode(self.task, feats, outputs, self.squad_config, self.tokenizer), probabilities(self.task, outputs)


def format_predictions(task: tasks.Task, inputs: list, predicted: list, probs: np.ndarray | None,
                       fmt: str) -> str:
  """The text --mode=predict prints for `inputs` (tuples of columns, or word strings for tagging): see the module
  docstring for the formats."""
  def bare(p):
    return ' '.join(p) if isinstance(p, list) else p['answer'] if isinstance(p, dict) else _cell(p)
  if fmt == 'labels':
    return ''.join(bare(p) + '\n' for p in predicted)
  if fmt == 'jsonl':
    lines = []
    for i, (x, p) in enumerate(zip(inputs, predicted)):
      record = {'input': x.split() if isinstance(x, str) else list(x),
                'prediction': p['answer'] if isinstance(p, dict) else p}
      if isinstance(p, dict) and p.get('null_odds') is not None:
        record['null_odds'] = p['null_odds']
      if probs is not None:
        record['probabilities'] = {label: round(float(q), 6) for label, q in zip(task.labels, probs[i])}
      lines.append(json.dumps(record, ensure_ascii=False) + '\n')
    return ''.join(lines)
  f = io.StringIO(newline='')
  writer = csv.writer(f, delimiter='\t', quoting=csv.QUOTE_NONE, escapechar='\\', lineterminator='\n')
  columns = max((1 if isinstance(x, str) else len(x) for x in inputs), default=1)
  names = {tasks.TAGGING: ['words'], tasks.SQUAD: ['question', 'context']}.get(task.kind,
                                                                             ['sentence', 'sentence2'][:columns])
  writer.writerow(['prediction'] + _probability_columns(task, probs) + names)
  for i, (x, p) in enumerate(zip(inputs, predicted)):
    writer.writerow([bare(p)] + _probability_cells(probs, i) + ([x] if isinstance(x, str) else list(x)))
  return f.getvalue()


def parse_inputs(text: str, kind: str, name: str) -> list:
  """The examples of --mode=predict's input `text` (from `name`), one a line: word strings for tagging, else
  tuples of the tab-separated columns. Blank lines at the end are ignored; a blank line before them is a DataError,
  since the output has one line per input line, in order, and skipping it would shift every later line."""
  lines = files.split_lines(text)
  while lines and not lines[-1].strip():
    lines.pop()
  blank = [number for number, line in enumerate(lines, 1) if not line.strip()]
  if blank:
    raise DataError(f'--config.predict_input={name}: line {blank[0]} is blank ({len(blank)} blank line(s)); give one '
                    'example per line, without blank lines, so that output line N is the prediction for input line N')
  return [line if kind == tasks.TAGGING else tuple(line.split('\t')) for line in lines]


def predict_main(config, workdir: str):
  """--mode=predict: predictions for config.predict_input ('-': stdin) to config.predict_output ('': stdout)."""
  c: FinetuneConfig = load_config(config)
  if not c.predict_input:
    raise ConfigError('--mode=predict needs --config.predict_input=FILE (or - for stdin), one example per line')
  if c.predict_input != '-' and c.predict_output and fileio.resolved(c.predict_output) == fileio.resolved(
      c.predict_input):
    raise ConfigError(f'--config.predict_output={c.predict_output} is the input file, which the predictions would '
                      'replace: give another path')
  predictor = Predictor(workdir)
  print(f'predicting with seed {predictor.seed} of {workdir} (the best on dev)', file=sys.stderr)
  text = sys.stdin.read() if c.predict_input == '-' else files.read_text(c.predict_input)
  inputs = parse_inputs(text, predictor.task.kind, c.predict_input)
  predicted, probs = predictor.predict_with_details(inputs)
  text = format_predictions(predictor.task, inputs, predicted, probs, c.predict_format)
  if c.predict_output:
    fileio.write_text(c.predict_output, text)
  else:
    sys.stdout.write(text)
