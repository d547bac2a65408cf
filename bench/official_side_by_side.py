"""electra_jax against google-research/electra at the tiny config's sizes: both trained on the same text, every
checkpoint scored by one evaluator.

  python bench/official_side_by_side.py --official=OFFICIAL --tf_python=TFVENV/bin/python \
      --corpus=CORPUS/wikipedia_sample.txt.gz,CORPUS/austen.txt.gz --workdir=WORKDIR [--split_sentences]

OFFICIAL is a checkout of google-research/electra (or its bare git directory); it is copied to WORKDIR/official
and its one TF1-only import (`tensorflow.contrib.layers`) is pointed at tf_slim there, nothing else changed.
TFVENV is a virtualenv with tensorflow-cpu==2.15.1 and tf_slim (Python 3.11). The stages (--stages, in order):

- data: the corpus as plain text files (with --split_sentences one sentence a line, a blank line still between
  documents: the input the official builder expects; fed a paragraph a line, it keeps each line's first 62 tokens
  only), a 4000-piece WordPiece vocab.txt trained by electra_jax on it (both sides read it), the official
  tfrecords from the official build_pretraining_dataset.py (--max-seq-length 64);
- official: the official run_pretraining.py, once per seed (the official code sets no seed: each run draws
  afresh), checkpoints every 100 steps;
- ours: `python -m electra_jax.main --config=configs/tiny.py` on the same text and vocab, once per seed, with the
  official settings where tiny.py differs (no Adam bias correction) and --ours_overrides
  (`data.long_lines=truncate`: the official builder's examples, also of paragraph-a-line text);
- evaluate: each official checkpoint of --steps imported (its variables read with TFVENV's TensorFlow, converted
  by electra_jax.convert), then every checkpoint of both sides scored on the same --eval_batches batches of
  held-out examples with the same masking and sampling keys: the discriminator's recall and loss (over every
  non-pad token), the generator's loss, and the AUC. The held-out examples are electra_jax's 3% of documents
  (data.eval_fraction), which the official run trains on and ours does not.

Both sides: H 128, 4 layers, 2 heads, FFN 512, E 128, generator 1/4, no dropout, batch 32, lr 1e-3 with 50 warm-up
steps, 1000 steps, samples at temperature 2, 64 tokens. Prints a markdown table; its rows are also appended to
WORKDIR/side_by_side.jsonl.
"""

import functools
import gzip
import json
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax
import jax.numpy as jnp
import numpy as np

from electra_jax import config as config_lib, convert, data, evaluation, objective, pretrained
from electra_jax.model import Electra

_OFFICIAL = flags.DEFINE_string('official', None, 'google-research/electra: a checkout or its bare git directory.')
_TF_PYTHON = flags.DEFINE_string('tf_python', None, 'The python of a virtualenv with tensorflow-cpu and tf_slim.')
_CORPUS = flags.DEFINE_list('corpus', None, 'Text files (plain or .gz; one paragraph a line, blank lines between '
                            'documents).')
_WORKDIR = flags.DEFINE_string('workdir', None, 'Where everything is written.')
_SEEDS = flags.DEFINE_list('seeds', ['0', '1'], 'Runs per side (electra_jax: config.seed).')
_STEPS = flags.DEFINE_list('steps', ['200', '500', '1000'], 'Checkpoints to score.')
_STAGES = flags.DEFINE_list('stages', ['data', 'official', 'ours', 'evaluate'], 'What to do, in this order.')
_OURS_OVERRIDES = flags.DEFINE_list('ours_overrides', [], "More electra_jax config overrides (KEY=VALUE, no "
                                    "'--config.'), e.g. objective.duplicate_samples=first")
_EVAL_BATCHES = flags.DEFINE_integer('eval_batches', 13, 'Held-out batches of 32 (13: the 418 examples of the 3% '
                                     'split of wikipedia_sample and austen).')
_SPLIT_SENTENCES = flags.DEFINE_bool('split_sentences', False, 'data stage: write the corpus one sentence a line '
                                      '(see split_sentences), the input the official builder expects, for both sides.')
_EVAL_DUPLICATES = flags.DEFINE_enum('eval_duplicates', 'mean', config_lib.DUPLICATE_SAMPLES,
                                     "The evaluator's objective.duplicate_samples: 'mean' scores as the official "
                                     'code corrupts, for both sides.')

VOCAB_SIZE, LENGTH, STEPS = 4000, 64, 1000
OFFICIAL_HPARAMS = {
    'model_size': 'small', 'embedding_size': 128, 'generator_hidden_size': 0.25, 'max_seq_length': LENGTH,
    'train_batch_size': 32, 'learning_rate': 1e-3, 'num_warmup_steps': 50, 'num_train_steps': STEPS,
    'temperature': 2.0, 'vocab_size': VOCAB_SIZE, 'save_checkpoints_steps': 100, 'keep_checkpoint_max': 0,
    'iterations_per_loop': 100,
    'model_hparam_overrides': {'hidden_size': 128, 'num_hidden_layers': 4, 'num_attention_heads': 2,
                               'intermediate_size': 512, 'hidden_dropout_prob': 0.0,
                               'attention_probs_dropout_prob': 0.0}}
OURS = ['optimizer.bias_correction=False']  # and save_steps: the --steps to score (main)
# Run by --tf_python: a TF checkpoint's model variables (no Adam slots, no global_step) -> an npz.
READ_CHECKPOINT = """
import sys, numpy as np, tensorflow as tf
reader = tf.train.load_checkpoint(sys.argv[1])
names = [n for n in reader.get_variable_to_shape_map() if not re.search('adam_[mv]|global_step', n)]
np.savez(sys.argv[2], **{n: reader.get_tensor(n) for n in names})
""".replace('import sys', 'import re, sys')


# A sentence ends at . ! or ? (then any closing quotes or brackets) before whitespace and a capital letter or digit
# (after any opening quote or bracket), unless the word before the stop is an abbreviation or a single letter.
SENTENCE_END = re.compile(r'(?<=[.!?])["\')\]\u2019\u201d]*\s+(?=["\'(\[\u2018\u201c]*[A-Z0-9])')
ABBREVIATIONS = frozenset('mr mrs ms dr st jr sr prof gen col capt lt sgt rev hon gov sen rep no vs etc cf al e.g '
                          'i.e u.s u.k mt ft co corp inc ltd jan feb mar apr jun jul aug sep sept oct nov dec'.split())


def split_sentences(paragraph: str) -> list[str]:
  """A paragraph -> its sentences, by the rule of SENTENCE_END (rule-based, English; good enough for a builder that
  only needs lines of sentence length)."""
  sentences, start = [], 0
  for end in SENTENCE_END.finditer(paragraph):
    words = paragraph[start:end.start()].split()
    last = words[-1].rstrip('.!?"\')]\u2019\u201d').lstrip('("\'').lower() if words else ''
    if len(last) <= 1 or last in ABBREVIATIONS:
      continue
    sentences.append(paragraph[start:end.start()].strip())
    start = end.end()
  sentences.append(paragraph[start:].strip())
  return [s for s in sentences if s]


def path(*parts):
  return os.path.join(_WORKDIR.value, *parts)


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(command, log):
  """Runs `command` from the repository root, its output to the file `log`."""
  print('+', ' '.join(command), f'> {log}', flush=True)
  with open(log, 'w') as out:
    subprocess.run(command, check=True, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)


def prepare_data():
  os.makedirs(path('corpus'), exist_ok=True)
  for source in _CORPUS.value:
    name = os.path.basename(source).removesuffix('.gz')
    with (gzip.open if source.endswith('.gz') else open)(source, 'rt', encoding='utf-8') as f:
      text = f.read()
    if _SPLIT_SENTENCES.value:  # a blank line (between documents) stays one blank line
      text = ''.join('\n'.join(split_sentences(line)) + '\n' if line.strip() else '\n'
                     for line in text.splitlines())
    with open(path('corpus', name), 'w', encoding='utf-8') as f:
      f.write(text)
  run([sys.executable, '-m', 'electra_jax.data', 'tokenizer', '--source', path('corpus'), '--type', 'wordpiece',
       '--vocab_size', str(VOCAB_SIZE), '--output', path('tokenizer'), '--overwrite'], log=path('tokenizer.log'))
  os.makedirs(path('official_data'), exist_ok=True)
  shutil.copy(path('tokenizer', 'vocab.txt'), path('official_data', 'vocab.txt'))
  shutil.rmtree(path('official'), ignore_errors=True)
  official = _OFFICIAL.value
  bare = os.path.isdir(os.path.join(official, 'objects')) and not os.path.isdir(os.path.join(official, '.git'))
  if not bare:
    shutil.copytree(_OFFICIAL.value, path('official'), ignore=shutil.ignore_patterns('.git'))
  else:  # a bare git directory
    os.makedirs(path('official'))
    archive = subprocess.run(['git', '-C', _OFFICIAL.value, 'archive', 'HEAD'], check=True, capture_output=True)
    subprocess.run(['tar', '-x', '-C', path('official')], input=archive.stdout, check=True)
  modeling = path('official', 'model', 'modeling.py')
  with open(modeling) as f:
    source = f.read()
  with open(modeling, 'w') as f:
    f.write(source.replace('from tensorflow.contrib import layers as contrib_layers',
                           'import tf_slim as contrib_layers'))
  run([_TF_PYTHON.value, path('official', 'build_pretraining_dataset.py'), '--corpus-dir', path('corpus'),
       '--vocab-file', path('official_data', 'vocab.txt'), '--output-dir', path('official_data', 'pretrain_tfrecords'),
       '--max-seq-length', str(LENGTH), '--num-processes', '1'], log=path('official_build.log'))


def train_official(seed):
  run([_TF_PYTHON.value, path('official', 'run_pretraining.py'), '--data-dir', path('official_data'),
       '--model-name', f'seed{seed}', '--hparams', json.dumps(OFFICIAL_HPARAMS)], log=path(f'official_seed{seed}.log'))


def data_flags():
  return [f'--config.data.source={path("corpus")}', f'--config.data.tokenizer={path("tokenizer", "vocab.txt")}',
          f'--config.data.cache_dir={path("cache")}']


def train_ours(seed):
  overrides = [f'--config.{o}' for o in OURS + [f'save_steps=({",".join(_STEPS.value)},)'] + _OURS_OVERRIDES.value]
  run([sys.executable, '-m', 'electra_jax.main', '--config=configs/tiny.py', *data_flags(), *overrides,
       f'--config.seed={seed}', f'--workdir={path(f"ours_seed{seed}")}'], log=path(f'ours_seed{seed}.log'))


def import_official(seed, step) -> str:
  out = path('imports', f'official_seed{seed}_{step}')
  if not os.path.isdir(out):
    npz = out + '.npz'
    os.makedirs(os.path.dirname(out), exist_ok=True)
    ckpt = path('official_data', 'models', f'seed{seed}', f'model.ckpt-{step}')
    subprocess.run([_TF_PYTHON.value, '-c', READ_CHECKPOINT, ckpt, npz], check=True, capture_output=True)
    with np.load(npz) as weights:
      weights = dict(weights)
    section = convert.model_section_from_tf({k: v.shape for k, v in weights.items()})
    model = config_lib.from_dict(config_lib.ModelConfig, section, where='model')
    convert.write_workdir(out, section, convert.params_from_tf(model, weights),
                          vocab_file=path('tokenizer', 'vocab.txt'))
  return out


class Scorer:
  """One evaluator for both sides: fixed held-out batches, fixed masking and sampling keys."""

  def __init__(self):
    config = data.DataConfig(source=path('corpus'), tokenizer=path('tokenizer', 'vocab.txt'), vocab_size=VOCAB_SIZE,
                             max_seq_length=LENGTH, eval_fraction=0.03, cache_dir=path('cache'))
    tokenizer = data.load_tokenizer(config)
    examples = data.load_eval_examples(config, tokenizer, seed=0)
    self.special = tokenizer.special
    rows = np.random.default_rng(0).choice(len(examples), _EVAL_BATCHES.value * 32, replace=False)
    self.batches = []
    for i in range(_EVAL_BATCHES.value):
      ids, segments = examples.read(rows[i * 32:(i + 1) * 32])
      self.batches.append({'input_ids': jnp.asarray(ids), 'segment_ids': jnp.asarray(segments),
                           'input_mask': jnp.asarray(ids != self.special.pad, jnp.int32)})
    self.objective = config_lib.ObjectiveConfig(temperature=2.0, duplicate_samples=_EVAL_DUPLICATES.value)
    self.sums_fn = functools.cache(self._sums_fn)

  def _sums_fn(self, model_config):
    """The jitted sums of one held-out batch for models of `model_config`: compiled once, for every checkpoint."""
    model = Electra(model_config)
    apply_fn = lambda p, *args, **kwargs: model.apply({'params': p}, *args, **kwargs)

    def sums(params, batch, key):
      masked, sample, rngs = objective.mask_and_sampler(key, batch, config=self.objective, special=self.special,
                                                        vocab_size=model_config.vocab_size, progress=1.0)
      s, detection = objective.replaced_token_detection(apply_fn, params, batch, masked, sample, rngs=rngs,
                                                        deterministic=True)
      s['histograms'] = jnp.stack(evaluation.logit_histograms(detection.disc_logits, detection.labels,
                                                              detection.token_weights))
      return s
    return jax.jit(sums)

  def __call__(self, workdir, step=None) -> dict:
    config, params = pretrained.load_params(workdir, step)
    sums = self.sums_fn(config.model)
    total = None
    for i, batch in enumerate(self.batches):
      s = sums(params, batch, jax.random.fold_in(jax.random.PRNGKey(0), i))
      total = s if total is None else jax.tree.map(jnp.add, total, s)
    s = jax.device_get(total)
    return {'disc_recall': s['true_positives'] / s['replaced'], 'disc_loss': s['disc_xent'] / s['tokens'],
            'gen_loss': s['gen_xent'] / s['selected'], 'disc_auc': evaluation.binned_auc(*s['histograms']),
            'replaced_fraction': s['replaced'] / s['tokens']}


def evaluate():
  scorer = Scorer()
  rows = []
  for seed in _SEEDS.value:
    for step in map(int, _STEPS.value):
      rows.append(('official', seed, step, scorer(import_official(seed, step))))
      rows.append(('electra_jax', seed, step, scorer(path(f'ours_seed{seed}'), step)))
  print(f'\nscored on {_EVAL_BATCHES.value} held-out batches of 32, duplicate_samples={_EVAL_DUPLICATES.value}; '
        'electra_jax with ' + ' '.join(OURS + _OURS_OVERRIDES.value))
  print('| step | side | seed | disc_recall | disc_loss | gen_loss | disc_auc |\n|---|---|---|---|---|---|---|')
  with open(path('side_by_side.jsonl'), 'a') as f:
    for side, seed, step, m in sorted(rows, key=lambda r: (r[2], r[0], r[1])):
      print(f'| {step} | {side} | {seed} | {m["disc_recall"]:.3f} | {m["disc_loss"]:.4f} | {m["gen_loss"]:.3f} | '
            f'{m["disc_auc"]:.4f} |')
      f.write(json.dumps({'side': side, 'seed': seed, 'step': step, 'ours_overrides': _OURS_OVERRIDES.value,
                          'eval_duplicates': _EVAL_DUPLICATES.value, **{k: float(v) for k, v in m.items()}}) + '\n')


def main(argv):
  del argv
  os.makedirs(_WORKDIR.value, exist_ok=True)
  for stage in _STAGES.value:
    if stage == 'data':
      prepare_data()
    elif stage == 'official':
      for seed in _SEEDS.value:
        train_official(seed)
    elif stage == 'ours':
      for seed in _SEEDS.value:
        train_ours(seed)
    elif stage == 'evaluate':
      evaluate()
    else:
      raise app.UsageError(f'unknown stage {stage!r}: data, official, ours, evaluate')


if __name__ == '__main__':
  flags.mark_flags_as_required(['official', 'tf_python', 'corpus', 'workdir'])
  app.run(main)
