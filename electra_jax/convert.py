"""Checkpoints in and out: Hugging Face ELECTRA and Google's original TF checkpoints <-> an electra_jax workdir.

  python -m electra_jax.convert --from-hf HF_DIR [--from-hf-generator GEN_DIR] --out WORKDIR
  python -m electra_jax.convert --from-tf TF_CHECKPOINT [--vocab VOCAB_TXT] --out WORKDIR
  python -m electra_jax.convert --checkpoint WORKDIR [--step N] --to-hf HF_DIR

A workdir is what the trainer writes: config.json (every key of configs/default.py), tokenizer files and
checkpoints/<step>/ holding a TrainState. An import is step 0 with a fresh optimiser state: ready to fine-tune
(`electra_jax.pretrained.load_params`) or to continue pre-training. An export writes HF_DIR/discriminator
(ElectraForPreTraining) and HF_DIR/generator (ElectraForMaskedLM), each config.json + model.safetensors, and the
workdir's tokenizer as a fast tokenizer that transformers' AutoTokenizer loads (see `hf_tokenizer`). A run with no
generator of its own (electra_frozen) exports its discriminator alone; one whose discriminator-sized model has an
MLM head instead of the replaced-token detection head (mlm, replace_mlm, all_tokens_mlm) is refused.

Names: `hf_name` and `tf_name` map one of our parameter paths to its name in the other format. Imports invert them
by enumerating our own parameter tree, so each mapping is written once and serves both directions. Our two towers
share one `embeddings` subtree, while HF's two models each carry a copy: an export writes it into both, an import
takes the discriminator's (and warns if the generator's differs).
"""

import argparse
import json
import os
import re
import sys
import warnings
from typing import Callable, Hashable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import traverse_util

from electra_jax import checkpoint, cli, config_files, data, fileio, hf_tokenizer, objective, optimizer, pretrained
from electra_jax import config as config_lib
from electra_jax.config import ModelConfig, TowerConfig
from electra_jax.model import Electra, fold_embeddings_delta
from electra_jax.train_step import TrainState

DISC, GEN = 'discriminator', 'generator'
# Tokenizer files travel with the weights, whichever format they are in.
TOKENIZER_FILES = ('tokenizer.model', 'vocab.txt', 'tokenizer.json', 'tokenizer_config.json',
                   'special_tokens_map.json')
# Non-persistent buffers that older transformers versions saved; they hold no learned values.
HF_BUFFERS = ('electra.embeddings.position_ids', 'electra.embeddings.token_type_ids')
# TF checkpoint variables that are optimiser or schedule state, not model weights.
TF_NOT_WEIGHTS = re.compile(r'(^|/)(adam_[mv]|global_step|AdamWeightDecayOptimizer(_\d+)?|temperature)(/|$)')
# ElectraConfig's defaults, for keys a hub config.json leaves out.
HF_DEFAULTS = {'vocab_size': 30522, 'embedding_size': 128, 'hidden_size': 256, 'num_hidden_layers': 12,
               'num_attention_heads': 4, 'intermediate_size': 1024, 'hidden_act': 'gelu',
               'hidden_dropout_prob': 0.1, 'attention_probs_dropout_prob': 0.1, 'max_position_embeddings': 512,
               'type_vocab_size': 2, 'initializer_range': 0.02, 'layer_norm_eps': 1e-12, 'pad_token_id': 0,
               'tie_word_embeddings': True, 'position_embedding_type': 'absolute'}

Path = tuple[str, ...]


class ConversionError(ValueError):
  """Weights or a config that cannot be converted; the message says why."""


class ConversionWarning(UserWarning):
  """A conversion that worked but lost or invented something the user should know about."""


# ----------------------------------------------------------------------------------------------------------------
# Names: one function per foreign format, applied to our paths in both directions.


def _scope_name(scope: str, separator: str) -> str:
  """'layer_3' -> 'layer.3' for HF (a ModuleList index); every other scope name is the same in all formats."""
  match = re.fullmatch(r'layer_(\d+)', scope)
  return f'layer{separator}{match.group(1)}' if match else scope


def hf_name(path: Path) -> tuple[tuple[str, ...], str]:
  """Our parameter path -> (the HF models that hold it, its name in their state dicts).

  ('embeddings', 'LayerNorm', 'scale') -> ((DISC, GEN), 'electra.embeddings.LayerNorm.weight');
  ('discriminator', 'encoder', 'layer_3', 'attention', 'self', 'query', 'kernel') ->
  ((DISC,), 'electra.encoder.layer.3.attention.self.query.weight'). Kernels are also transposed (`hf_layout`).
  """
  *scopes, leaf = path
  if scopes[0] == 'embeddings':
    models, scopes = (DISC, GEN), ['electra'] + scopes
  else:
    models, scopes = (scopes[0],), scopes[1:]
    if scopes[0] in ('embeddings_project', 'encoder'):  # the encoder body lives in HF's `electra` submodule
      scopes = ['electra'] + scopes
  # Linear and LayerNorm weights, and embedding tables, are all `weight` in PyTorch.
  leaf = 'bias' if leaf == 'bias' else 'weight'
  return models, '.'.join([_scope_name(s, '.') for s in scopes] + [leaf])


def hf_layout(path: Path, array: np.ndarray) -> np.ndarray:
  """Converts a value between our layout and HF's, either way: Flax kernels are [in, out], torch Linear [out, in]."""
  return array.T if path[-1] == 'kernel' else array


def tf_name(path: Path) -> str:
  """Our parameter path -> its variable name in Google's original TF checkpoints (same [in, out] layout).

  The discriminator's encoder lives under `electra/`, the generator's under `generator/`, the shared embeddings
  under `electra/embeddings/`; the heads are top-level scopes.
  """
  *scopes, leaf = path
  if scopes[0] == 'embeddings':
    scopes = ['electra'] + scopes
  elif scopes[1] in ('embeddings_project', 'encoder') or scopes[:2] == [GEN, 'embeddings']:  # untied: its own
    scopes = ['electra' if scopes[0] == DISC else 'generator'] + scopes[1:]
  else:
    scopes = scopes[1:]
  if scopes[-1] == 'dense_prediction':  # an unnamed second tf.layers.dense
    scopes[-1] = 'dense_1'
  if scopes[-1] == 'generator_lm_head':
    return 'generator_predictions/output_bias'
  if leaf == 'embedding':
    return '/'.join(scopes)
  if scopes[-1] == 'LayerNorm':
    leaf = {'scale': 'gamma', 'bias': 'beta'}[leaf]
  return '/'.join(scopes + [leaf])


# ----------------------------------------------------------------------------------------------------------------
# Configs.


def _hf_config(values: dict, what: str) -> dict:
  """An HF ElectraConfig dict with defaults filled in, refused if our model cannot represent it."""
  values = dict(HF_DEFAULTS, **values)
  if values.get('model_type', 'electra') != 'electra':
    raise ConversionError(f'the {what} config has model_type {values["model_type"]!r}, not "electra"')
  if values['hidden_act'] != 'gelu':
    raise ConversionError(f'the {what} uses hidden_act={values["hidden_act"]!r}; electra_jax implements the '
                          'exact GELU ("gelu") only')
  if values['position_embedding_type'] != 'absolute':
    raise ConversionError(f'the {what} uses position_embedding_type={values["position_embedding_type"]!r}; '
                          'electra_jax implements absolute position embeddings only')
  return values


def model_section_from_hf(disc: dict, gen: dict | None) -> dict:
  """The `model` config section equivalent to HF discriminator (and generator) configs.

  Without a generator config the generator sizes keep configs/default.py's fractions.
  """
  disc = _hf_config(disc, 'discriminator')
  model = dict(config_lib.defaults(ModelConfig),
               vocab_size=disc['vocab_size'], embedding_size=disc['embedding_size'],
               hidden_size=disc['hidden_size'], num_layers=disc['num_hidden_layers'],
               num_heads=disc['num_attention_heads'], intermediate_size=disc['intermediate_size'],
               max_position_embeddings=disc['max_position_embeddings'], type_vocab_size=disc['type_vocab_size'],
               dropout_rate=float(disc['hidden_dropout_prob']),
               attention_dropout_rate=float(disc['attention_probs_dropout_prob']),
               initializer_range=float(disc['initializer_range']), layer_norm_eps=float(disc['layer_norm_eps']))
  if gen is None:
    return model
  gen = _hf_config(gen, 'generator')
  # The towers share their embeddings in electra_jax, and model.layer_norm_eps is one value for all LayerNorms.
  for key in ('vocab_size', 'embedding_size', 'max_position_embeddings', 'type_vocab_size', 'layer_norm_eps'):
    if gen[key] != disc[key]:
      raise ConversionError(f'generator {key}={gen[key]} but discriminator {key}={disc[key]}; electra_jax gives '
                            'both one set of embeddings and one layer_norm_eps, so these must be equal')
  if not gen['tie_word_embeddings']:
    raise ConversionError('the generator does not tie its output layer to the word embeddings '
                          '(tie_word_embeddings=false); electra_jax always ties them')
  model.update(generator_hidden_fraction=gen['hidden_size'] / disc['hidden_size'],
               generator_layers_fraction=gen['num_hidden_layers'] / disc['num_hidden_layers'])
  want = TowerConfig(gen['hidden_size'], gen['num_hidden_layers'], gen['num_attention_heads'],
                     gen['intermediate_size'])
  got = ModelConfig(**model).tower(generator=True)
  if got != want:
    raise ConversionError(
        f'electra_jax cannot represent this generator: it has hidden {want.hidden_size}, {want.num_layers} '
        f'layers, {want.num_heads} heads and FFN {want.intermediate_size}, but electra_jax derives a generator '
        f'of width {want.hidden_size} with heads = max(1, {want.hidden_size} // 64) = {got.num_heads} and FFN '
        f'4 * {want.hidden_size} = {got.intermediate_size} (and {got.num_layers} layers)')
  return model


def hf_configs(model: ModelConfig, pad_token_id: int = 0) -> dict[str, dict]:
  """HF ElectraConfig dicts {DISC: ElectraForPreTraining's, GEN: ElectraForMaskedLM's} for our model config."""
  common = {'model_type': 'electra', 'vocab_size': model.vocab_size, 'embedding_size': model.embedding_size,
            'hidden_act': 'gelu', 'hidden_dropout_prob': model.dropout_rate,
            'attention_probs_dropout_prob': model.attention_dropout_rate,
            'max_position_embeddings': model.max_position_embeddings, 'type_vocab_size': model.type_vocab_size,
            'initializer_range': model.initializer_range, 'layer_norm_eps': model.layer_norm_eps,
            'pad_token_id': pad_token_id, 'tie_word_embeddings': True, 'dtype': 'float32'}
  configs = {}
  for what, architecture in ((DISC, 'ElectraForPreTraining'), (GEN, 'ElectraForMaskedLM')):
    tower = model.tower(generator=what == GEN)
    configs[what] = dict(common, architectures=[architecture], hidden_size=tower.hidden_size,
                         num_hidden_layers=tower.num_layers, num_attention_heads=tower.num_heads,
                         intermediate_size=tower.intermediate_size)
  return configs


def model_section_from_tf(shapes: dict[str, tuple[int, ...]]) -> dict:
  """The `model` section of a TF checkpoint, read off its variable shapes.

  Head counts are not stored in a checkpoint; the official code derives them as max(1, hidden // 64)
  (google-research/electra util/training_utils.py get_bert_config, and get_generator_config for the generator). The
  official layouts: `generator/embeddings/` (untied_generator_embeddings: tables as wide as the generator, no
  generator embeddings_project) is model.tying='none'; generator_predictions without a `generator/encoder`
  (untied_generator=False: the generator's head on the discriminator's encoder) is model.tying='all'; neither
  `generator/` nor generator_predictions is a discriminator alone (a random generator is made).
  """
  def tower(scope):
    layers = {int(m.group(1)) for name in shapes for m in [re.match(rf'{scope}/encoder/layer_(\d+)/', name)] if m}
    if not layers:
      return None
    hidden = shapes[f'{scope}/encoder/layer_0/attention/self/query/kernel'][1]
    return TowerConfig(hidden, max(layers) + 1, max(1, hidden // 64),
                       shapes[f'{scope}/encoder/layer_0/intermediate/dense/kernel'][1])
  if 'electra/embeddings/word_embeddings' not in shapes or tower('electra') is None:
    raise ConversionError('this TF checkpoint has no electra/embeddings/word_embeddings or electra/encoder/: it is '
                          "not one of Google's ELECTRA pre-training checkpoints")
  disc, gen = tower('electra'), tower('generator')
  vocab_size, embedding_size = shapes['electra/embeddings/word_embeddings']
  model = dict(config_lib.defaults(ModelConfig), vocab_size=vocab_size, embedding_size=embedding_size,
               hidden_size=disc.hidden_size, num_layers=disc.num_layers, num_heads=disc.num_heads,
               intermediate_size=disc.intermediate_size,
               max_position_embeddings=shapes['electra/embeddings/position_embeddings'][0],
               type_vocab_size=shapes['electra/embeddings/token_type_embeddings'][0])
  if gen is None and 'generator_predictions/dense/kernel' in shapes:
    model.update(tying='all', generator_hidden_fraction=1.0, generator_layers_fraction=1.0)
  if gen is not None:
    model.update(generator_hidden_fraction=gen.hidden_size / disc.hidden_size,
                 generator_layers_fraction=gen.num_layers / disc.num_layers,
                 tying='none' if 'generator/embeddings/word_embeddings' in shapes else 'embeddings')
    if ModelConfig(**model).tower(generator=True) != gen:
      raise ConversionError(f'electra_jax cannot represent this generator ({gen}): its FFN must be 4 * hidden')
  return model


# ----------------------------------------------------------------------------------------------------------------
# Weights.


def _run_once_on_cpu(fn, *args):
  """jit(fn)(*args) on the host CPU, compiled without XLA's optimisations: for a function run once, they cost
  more compile time (about 3x) than they could save."""
  with jax.default_device(jax.devices('cpu')[0]):
    compiled = jax.jit(fn).lower(*args).compile(compiler_options={'xla_backend_optimization_level': 0,
                                                                  'xla_llvm_disable_expensive_passes': True})
    return compiled(*args)


def init_params(model: ModelConfig, seed: int = 0, method: str | None = None) -> dict:
  """Freshly initialised parameters of `Electra(model)`, as host arrays.

  `method='generator_logits'` initialises only the embeddings and the generator.
  """
  ids = jnp.zeros((1, 1), jnp.int32)
  init = lambda rng: nn.meta.unbox(Electra(model).init(rng, ids, ids, ids, ids, method=method)['params'])
  return jax.device_get(_run_once_on_cpu(init, jax.random.PRNGKey(seed)))


def fill_params(model: ModelConfig, names: Callable[[Path], Sequence[Hashable]], weights: dict[Hashable, np.ndarray],
                layout: Callable[[Path, np.ndarray], np.ndarray] = lambda path, x: x):
  """Each parameter of `Electra(model)` as `layout(path, weights[name])` for the first of `names(path)` present.

  Returns ({path: float32 array}, paths with none of their names in `weights`, names used, names that hold
  another value than the first one, e.g. a generator's own copy of the embeddings).
  """
  shapes = traverse_util.flatten_dict(pretrained.abstract_params(Electra(model)))
  found, missing, used, differing = {}, [], set(), []
  for path, shape in shapes.items():
    present = [name for name in names(path) if name in weights]
    if not present:
      missing.append(path)
      continue
    value = np.asarray(layout(path, weights[present[0]]), np.float32)
    if value.shape != shape.shape:
      raise ConversionError(f'{present[0]} has shape {value.shape}, but {"/".join(path)} needs {shape.shape}')
    found[path] = value
    used.update(present)
    differing += [name for name in present[1:] if not np.array_equal(weights[name], weights[present[0]])]
  return found, missing, used, differing


def _init_generator(model: ModelConfig, found: dict, missing: list[Path], seed: int, what: str) -> list[Path]:
  """Fills the generator's parameters in `found` randomly if `missing` holds all of them (warns); returns the
  paths still missing."""
  generator = [p for p in missing if p[0] == GEN]
  if not generator or any(p[0] == GEN for p in found):  # a partial generator is an error, not a fresh start
    return missing
  fresh = traverse_util.flatten_dict(init_params(model, seed, method='generator_logits'))
  found.update({p: fresh[p] for p in generator})
  tower = model.tower(generator=True)
  warnings.warn(f'{what} holds no generator: the generator ({tower.num_layers} layers of width {tower.hidden_size}) '
                'is initialised randomly. The discriminator is complete for fine-tuning and detection; continued '
                'pre-training starts with an untrained generator', ConversionWarning)
  return [p for p in missing if p[0] != GEN]


def read_hf_weights(directory: str) -> dict[str, np.ndarray]:
  """The state dict in an HF model directory (local or gs://: model.safetensors or pytorch_model.bin) as numpy
  arrays."""
  safetensors_file = fileio.path(directory) / 'model.safetensors'
  torch_file = fileio.path(directory) / 'pytorch_model.bin'
  if safetensors_file.is_file():
    from safetensors import SafetensorError  # noqa: PLC0415
    with fileio.local_file(safetensors_file) as local:
      try:
        from safetensors.numpy import load_file  # noqa: PLC0415
        return load_file(local)
      except TypeError:  # bfloat16 without ml_dtypes registered: read it through torch
        from safetensors.torch import load_file  # noqa: PLC0415
        return {k: v.float().numpy() for k, v in load_file(local).items()}
      except SafetensorError as e:  # cut short (a copy or download that stopped): a traceback before
        raise ConversionError(f'{safetensors_file} cannot be read ({e}): it is damaged or incomplete; copy or '
                              'download it again') from None
  if torch_file.is_file():
    try:
      import torch  # noqa: PLC0415
    except ImportError:
      raise ConversionError(f'{torch_file} is a PyTorch pickle, which needs torch to read: pip install torch, '
                            'or give a directory with model.safetensors') from None
    with fileio.local_file(torch_file) as local:
      state = torch.load(local, map_location='cpu', weights_only=True)
    return {k: v.float().numpy() for k, v in state.items()}
  raise ConversionError(f'{directory} has neither model.safetensors nor pytorch_model.bin (sharded checkpoints '
                        'are not supported; ELECTRA models fit one file)')


def _read_json(path) -> dict:
  if not fileio.path(path).is_file():
    raise ConversionError(f'{path} does not exist: give a Hugging Face model directory (config.json + weights)')
  return fileio.read_json(path, 'copy or download the model again', ConversionError)


def _hf_base_names(weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """An ElectraModel state dict (no `electra.` prefix, no head) named as the models with heads name it."""
  if any(k.startswith('electra.') for k in weights):
    return weights
  return {f'electra.{k}': v for k, v in weights.items()}


def params_from_hf(model: ModelConfig, disc_weights: dict[str, np.ndarray],
                   gen_weights: dict[str, np.ndarray] | None, *, seed: int = 0) -> dict:
  """Our parameter tree from HF state dicts; without a generator's, the generator is initialised randomly."""
  weights = {(DISC, k): v for k, v in _hf_base_names(disc_weights).items()}
  if gen_weights is not None:
    weights.update({(GEN, k): v for k, v in _hf_base_names(gen_weights).items()})
  def names(path):
    models, name = hf_name(path)
    return [(m, name) for m in models]
  found, missing, used, differing = fill_params(model, names, weights, hf_layout)
  if gen_weights is None:
    missing = _init_generator(model, found, missing, seed, 'the Hugging Face import (no --from-hf-generator)')
  if missing:
    raise ConversionError('the Hugging Face weights lack ' + ', '.join(
        f'{hf_name(p)[0][0]}:{hf_name(p)[1]}' for p in missing))
  if differing:
    warnings.warn(f'the generator\'s embeddings differ from the discriminator\'s ({", ".join(n for _, n in differing)}'
                  '); electra_jax shares one set of embeddings and keeps the discriminator\'s', ConversionWarning)
  unexpected = []
  for key in set(weights) - used:
    model_name, name = key
    if name in HF_BUFFERS:
      continue
    if name == 'generator_lm_head.weight' and model_name == GEN:
      if np.array_equal(weights[key], weights[(GEN, 'electra.embeddings.word_embeddings.weight')]):
        continue  # the tied copy of the word embeddings
      raise ConversionError('the generator\'s generator_lm_head.weight differs from its word embeddings; '
                            'electra_jax always ties them')
    unexpected.append(f'{model_name}:{name}')
  if unexpected:
    raise ConversionError(f'unexpected Hugging Face weights (not an ElectraForPreTraining / ElectraForMaskedLM '
                          f'of this config?): {", ".join(sorted(unexpected))}')
  return traverse_util.unflatten_dict(found)


def params_from_tf(model: ModelConfig, weights: dict[str, np.ndarray], *, seed: int = 0) -> dict:
  """Our parameter tree from the variables of Google's TF checkpoint (optimiser slots already dropped)."""
  found, missing, used, _ = fill_params(model, lambda path: [tf_name(path)], weights)
  missing = _init_generator(model, found, missing, seed, 'the TF checkpoint')
  if missing:
    raise ConversionError('the TF checkpoint lacks ' + ', '.join(tf_name(p) for p in missing))
  unexpected = sorted(set(weights) - used)
  if unexpected:
    raise ConversionError(f'unexpected TF variables: {", ".join(unexpected)}')
  return traverse_util.unflatten_dict(found)


def read_tf_checkpoint(path: str) -> dict[str, np.ndarray]:
  """The model variables of a TF checkpoint (a prefix like model.ckpt-1000000, or its directory)."""
  try:
    import tensorflow as tf  # noqa: PLC0415
  except ImportError:
    raise ConversionError("reading Google's original TF checkpoints needs TensorFlow, which is not installed: "
                          'pip install tensorflow') from None
  if tf.io.gfile.isdir(path):  # TensorFlow reads gs:// itself
    path = tf.train.latest_checkpoint(path) or path
  reader = tf.train.load_checkpoint(path)
  return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()
          if not TF_NOT_WEIGHTS.search(name)}


# ----------------------------------------------------------------------------------------------------------------
# Workdirs.


def _copy_tokenizer_files(source, destination):
  for name in TOKENIZER_FILES:
    if (fileio.path(source) / name).is_file():
      fileio.copy(fileio.path(source) / name, fileio.path(destination) / name)


def _do_lower_case(directory) -> bool | None:
  """tokenizer_config.json's do_lower_case; None (the tokenizer file decides) if it says nothing."""
  path = fileio.path(directory) / 'tokenizer_config.json'
  if path.is_file():
    value = json.loads(path.read_text()).get('do_lower_case')
    return None if value is None else bool(value)
  return None


def _tokenizer_file(tokenizer_dir: str | None, vocab_file: str | None) -> str | None:
  """The file `write_workdir` reads the tokenizer from: `vocab_file`, else the first of tokenizer.model,
  tokenizer.json (which holds the normaliser's options) and vocab.txt in `tokenizer_dir` (an HF directory may hold
  several); None if there is none."""
  if vocab_file:
    return vocab_file
  for name in ('tokenizer.model', 'tokenizer.json', 'vocab.txt'):
    if tokenizer_dir and (fileio.path(tokenizer_dir) / name).is_file():
      return os.fspath(fileio.path(tokenizer_dir) / name)
  return None


def write_workdir(out: str, model_section: dict, params: dict, *, tokenizer_dir: str | None = None,
                  vocab_file: str | None = None):
  """Writes `out` as the trainer would: config.json, tokenizer files (those in `tokenizer_dir`, or `vocab_file`)
  and checkpoints/0/ (fresh optimiser state)."""
  out = fileio.path(out)
  if (out / 'config.json').exists() or (out / 'checkpoints').exists():
    raise ConversionError(f'{out} already holds a run; give a new --out directory')
  config = ml_collections.ConfigDict(config_lib.defaults(config_lib.TrainConfig))  # configs/default.py's values
  config.model.update(model_section)
  config.data.max_seq_length = min(config.data.max_seq_length, config.model.max_position_embeddings)
  config.data.vocab_size = config.model.vocab_size
  source = _tokenizer_file(tokenizer_dir, vocab_file)
  tokenizer = None  # cased as tokenizer_config.json says, else as the tokenizer file does
  if source:
    tokenizer = data.tokenizer.load(source, lowercase=_do_lower_case(tokenizer_dir) if tokenizer_dir else None)
  # Checked before anything is written: with another size, ids would name rows that are not their tokens'.
  if tokenizer and tokenizer.vocab_size != config.model.vocab_size:
    raise ConversionError(f'{source} holds {tokenizer.vocab_size} tokens but the word embeddings have '
                          f'{config.model.vocab_size} rows: give the tokenizer the model was trained with')
  with fileio.removed_on_failure(out):  # an interrupted import leaves no checkpoints/ that would refuse the rerun
    if tokenizer_dir:
      _copy_tokenizer_files(tokenizer_dir, out)
    if vocab_file:
      fileio.copy(fileio.path(vocab_file), out / 'vocab.txt')
    if tokenizer:  # record the tokenizer (and its casing) so the trainer and the detector read it as is
      tokenizer.save(out)
      # data.tokenizer stays '': the trainer and the readers take the one saved in the workdir, wherever it is
      # moved.
      config.data.update(vocab_size=config.model.vocab_size, lowercase=tokenizer.lowercase)
    c = config_lib.load(config)
    tx, _ = optimizer.make_optimizer(c.optimizer, c.train_steps)
    params = jax.device_put(params, jax.devices('cpu')[0])  # written from the host, whatever accelerator there is
    state = TrainState(jnp.zeros((), jnp.int32), params, _run_once_on_cpu(tx.init, params))
    checkpointer = checkpoint.Checkpointer(out)
    try:
      checkpointer.save(0, state, {})  # no data position: a run from it starts at the start of its data
    finally:
      checkpointer.close()  # waits for orbax's background write: none may go on in what a failure removes
    fileio.write_json(out / 'config.json', config.to_dict())


def _check_architecture(config: dict, directory: str, *, generator: bool):
  """Refuses an HF directory given for the discriminator (or the `generator`) whose config.json names another model
  class, with the flag it belongs to; a config without `architectures` is taken as given."""
  wanted = 'ElectraForMaskedLM' if generator else 'ElectraForPreTraining'
  architectures = config.get('architectures') or [wanted]
  if wanted in architectures:
    return
  if architectures[0] == 'ElectraForMaskedLM':
    raise ConversionError(f'{directory} is an ElectraForMaskedLM (a generator): pass it as --from-hf-generator, and '
                          'the ElectraForPreTraining (the discriminator) as --from-hf')
  if architectures[0] == 'ElectraForPreTraining':
    raise ConversionError(f'{directory} is an ElectraForPreTraining (a discriminator): pass it as --from-hf, and '
                          'the ElectraForMaskedLM (the generator) as --from-hf-generator')
  flag, what = ('--from-hf-generator', 'generator') if generator else ('--from-hf', 'discriminator')
  raise ConversionError(f'{directory} is a Hugging Face {architectures[0]}, but {flag} takes the pre-trained '
                        f'{what} with its head, an {wanted} (such as google/electra-small-{what})')


def import_hf(hf_dir: str, out: str, *, generator_dir: str | None = None, seed: int = 0):
  """HF ElectraForPreTraining (and ElectraForMaskedLM) directories -> an electra_jax workdir `out`."""
  disc_config = _read_json(fileio.path(hf_dir) / 'config.json')
  _check_architecture(disc_config, hf_dir, generator=False)
  gen_config = _read_json(fileio.path(generator_dir) / 'config.json') if generator_dir else None
  if gen_config:
    _check_architecture(gen_config, generator_dir, generator=True)
  model_section = model_section_from_hf(disc_config, gen_config)
  model = config_lib.from_dict(ModelConfig, model_section, where='model')
  params = params_from_hf(model, read_hf_weights(hf_dir),
                          read_hf_weights(generator_dir) if generator_dir else None, seed=seed)
  has_tokenizer = any((fileio.path(hf_dir) / n).is_file() for n in TOKENIZER_FILES)
  tokenizer_dir = hf_dir if has_tokenizer else generator_dir
  if not _tokenizer_file(tokenizer_dir, None):
    warnings.warn(f'{" and ".join(filter(None, (hf_dir, generator_dir)))} hold no tokenizer (tokenizer.model, '
                  f'tokenizer.json or vocab.txt): copy the one the model was trained with into {out} before '
                  'fine-tuning it or running detect', ConversionWarning)
  write_workdir(out, model_section, params, tokenizer_dir=tokenizer_dir)


def tf_vocab(tf_checkpoint: str, vocab: str | None = None) -> str:
  """The vocab.txt of a TF checkpoint: `vocab` if given, else the one next to the checkpoint, else the one in its
  run's DATA_DIR (the official run_pretraining.py writes DATA_DIR/models/NAME/model.ckpt-* and reads
  DATA_DIR/vocab.txt)."""
  if vocab:
    if not fileio.path(vocab).is_file():
      raise ConversionError(f'--vocab {vocab} does not exist; give the WordPiece vocab.txt the model was trained with')
    return vocab
  path = fileio.path(tf_checkpoint)
  directory = path if path.is_dir() else path.parent
  candidates = [directory / 'vocab.txt']
  if directory.parent.name == 'models':
    candidates.append(directory.parent.parent / 'vocab.txt')
  for candidate in candidates:
    if candidate.is_file():
      return os.fspath(candidate)
  raise ConversionError(f'found no vocab.txt in {" or ".join(os.fspath(c.parent) for c in candidates)}: give the '
                        'vocabulary the model was trained with as --vocab VOCAB_TXT')


def import_tf(tf_checkpoint: str, out: str, *, vocab: str | None = None, seed: int = 0):
  """Google's original ELECTRA TF checkpoint -> an electra_jax workdir `out`, with its vocab.txt (`tf_vocab`)."""
  vocab = tf_vocab(tf_checkpoint, vocab)
  weights = read_tf_checkpoint(tf_checkpoint)
  model_section = model_section_from_tf({k: v.shape for k, v in weights.items()})
  model = config_lib.from_dict(ModelConfig, model_section, where='model')
  params = params_from_tf(model, weights, seed=seed)
  write_workdir(out, model_section, params, vocab_file=vocab)


def hf_state_dicts(params: dict) -> dict[str, dict[str, np.ndarray]]:
  """Our parameters -> {DISC: ElectraForPreTraining state dict, GEN: ElectraForMaskedLM state dict}.

  With model.tying='gdes' the discriminator's embeddings are the shared ones plus its delta (folded in); the
  generator's are the shared ones.
  """
  state_dicts = {DISC: {}, GEN: {}}
  for what, tree in ((DISC, fold_embeddings_delta(params)), (GEN, params)):
    for path, value in traverse_util.flatten_dict(jax.device_get(tree)).items():
      if path[:2] in ((GEN, 'adversarial_baseline'), (DISC, 'embeddings_delta')):  # training only; folded
        continue
      models, name = hf_name(path)
      if what in models:
        state_dicts[what][name] = np.ascontiguousarray(hf_layout(path, np.asarray(value)))
  return state_dicts


def export_hf(workdir: str, out: str, *, step: int | None = None) -> list[str]:
  """An electra_jax workdir -> `out`/discriminator and `out`/generator Hugging Face model directories (only
  `out`/discriminator for a run with no generator of its own: electra_frozen). Returns the directories written."""
  from safetensors.numpy import save  # noqa: PLC0415
  for what in (DISC, GEN):  # writing over another export would mix its files (a tokenizer of another kind) in
    if (fileio.path(out) / what).exists():
      raise ConversionError(f'{fileio.path(out) / what} already exists: give a new --to-hf directory, or remove it')
  config = config_files.load_config(workdir)  # refused on its settings before the checkpoint is read
  trained = objective.get(config.objective.name)
  if not trained.detects_replaced:  # ElectraForPreTraining would load without its head and draw one
    exportable = [name for name, o in objective.OBJECTIVES.items() if o.detects_replaced]
    raise ConversionError(
        f'{workdir} was pre-trained with objective.name={config.objective.name!r}, whose discriminator-sized model '
        'has an MLM head, not the replaced-token detection head of ElectraForPreTraining: the export takes runs of '
        f'{", ".join(exportable)}. Fine-tune this one from the workdir directly (--config.init_checkpoint)')
  if config.model.tying not in ('embeddings', 'gdes'):  # gdes: the delta is folded into the discriminator
    raise ConversionError(
        f'{workdir} was trained with model.tying={config.model.tying!r}; the export writes the Hugging Face pair '
        'of models whose generator shares only the embeddings with the discriminator (model.tying=embeddings). '
        'For the discriminator alone, fine-tune from the workdir directly (--config.init_checkpoint)')
  tokenizer = _workdir_tokenizer(workdir)
  if tokenizer:
    hf_tokenizer.to_hf(tokenizer)  # one it cannot convert fails here, before anything is written
  config, params = pretrained.load_params(workdir, step)
  configs = hf_configs(config.model, tokenizer.special.pad if tokenizer else 0)  # HF's configs record [PAD]
  written = []
  with fileio.removed_on_failure(out):  # an interrupted export leaves no discriminator/ that would refuse the rerun
    for what, state_dict in hf_state_dicts(params).items():
      if what == GEN and not trained.with_generator:  # it would hold the embeddings alone
        continue
      directory = fileio.path(out) / what
      with fileio.atomic_writer(directory / 'model.safetensors') as f:
        f.write(save(state_dict, metadata={'format': 'pt'}))
      fileio.write_json(directory / 'config.json', configs[what])
      if tokenizer:  # its own file (for SentencePiece or BERT code) and the fast tokenizer AutoTokenizer loads
        tokenizer.save(directory)
        hf_tokenizer.save(tokenizer, directory, max_length=config.model.max_position_embeddings)
      written.append(os.fspath(directory))
  return written


def _workdir_tokenizer(workdir: str) -> data.tokenizer.Tokenizer | None:
  """The workdir's tokenizer; None (with a warning) if it has none."""
  try:
    return data.tokenizer.load(workdir)
  except data.DataError as e:
    warnings.warn(f'the export holds no tokenizer: {e}', ConversionWarning)
    return None


def main(argv=None):
  parser = argparse.ArgumentParser(prog='python -m electra_jax.convert', description=__doc__.split('\n')[0])
  source = parser.add_mutually_exclusive_group(required=True)
  source.add_argument('--from-hf', metavar='HF_DIR', help='an ElectraForPreTraining directory to import')
  source.add_argument('--from-tf', metavar='TF_CHECKPOINT', help="Google's original TF checkpoint to import")
  source.add_argument('--checkpoint', metavar='WORKDIR', help='an electra_jax workdir to export (with --to-hf)')
  parser.add_argument('--from-hf-generator', metavar='GEN_DIR', help='its ElectraForMaskedLM generator')
  parser.add_argument('--out', metavar='WORKDIR', help='the workdir an import writes')
  parser.add_argument('--to-hf', metavar='HF_DIR', help='where an export writes discriminator/ and generator/')
  parser.add_argument('--step', type=int, help='the checkpoint step to export (default: the latest)')
  parser.add_argument('--seed', type=int, default=0, help='seeds the weights an import has to initialise')
  parser.add_argument('--vocab', metavar='VOCAB_TXT', help='with --from-tf: its vocab.txt, if it is neither next to '
                      'the checkpoint nor in the DATA_DIR of an official run (DATA_DIR/models/NAME/)')
  args = parser.parse_args(argv)
  if args.checkpoint and not args.to_hf:
    parser.error('--checkpoint needs --to-hf HF_DIR')
  if not args.checkpoint and not args.out:
    parser.error('--from-hf/--from-tf need --out WORKDIR')
  if args.vocab and not args.from_tf:
    parser.error('--vocab goes with --from-tf')
  if args.from_hf_generator and not args.from_hf:
    parser.error('--from-hf-generator goes with --from-hf')

  warnings.simplefilter('always', ConversionWarning)
  warnings.showwarning = lambda message, *_: print(f'warning: {message}', file=sys.stderr)
  cli.run(_convert, args, errors=(ConversionError,))


def _convert(args):
  if args.from_hf:
    import_hf(args.from_hf, args.out, generator_dir=args.from_hf_generator, seed=args.seed)
    print(f'wrote {fileio.path(args.out)}')
  elif args.from_tf:
    import_tf(args.from_tf, args.out, vocab=args.vocab, seed=args.seed)
    print(f'wrote {fileio.path(args.out)}')
  else:
    written = export_hf(args.checkpoint, args.to_hf, step=args.step)
    if len(written) == 1:
      print(f'wrote {written[0]} only: the run has no generator of its own (electra_frozen samples from another '
            'run\'s, objective.generator_checkpoint)')
    else:
      print(f'wrote {" and ".join(written)}')


if __name__ == '__main__':
  main()
