"""Builders the test files share: tiny generated corpora and tasks, the tiny configs, the special ids, readers of a
run's metrics and checkpoints. Test files import these (`from helpers import ...`), never one another; fixtures
stay in conftest.py."""

import contextlib
import gzip
import json
import math
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from configs import default
from electra_jax import config as config_lib
from electra_jax import data, objective, pretrained, sharding
from electra_jax.data import __main__ as data_cli
from electra_jax.checkpoint import Checkpointer
from electra_jax.config import ModelConfig
from electra_jax.masking import SpecialIds
from electra_jax.model import Electra
from electra_jax.train_step import Pretraining

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The special ids of the tests' hand-made batches ([PAD] 0, [UNK] 1, [CLS] 2, [SEP] 3, [MASK] 4, words from 5).
SPECIAL = SpecialIds(pad=0, cls=2, sep=3, mask=4, unk=1)

WORDS = ('the cat dog bird sat ran on under a mat rug tree and saw big small red blue house field ate drank '
         'water food then quickly slowly happy sad man woman child old young walked over near far').split()


def make_corpus(path, *, documents: int = 60, seed: int = 0, gz: bool = False) -> str:
  """Writes a small synthetic corpus (one sentence per line, blank line between documents) to `path`."""
  rng = random.Random(seed)
  lines = []
  for _ in range(documents):
    for _ in range(rng.randint(3, 12)):
      lines.append(' '.join(rng.choice(WORDS) for _ in range(rng.randint(4, 16))).capitalize() + '.')
    lines.append('')
  text = '\n'.join(lines) + '\n'
  if gz:
    with gzip.open(path, 'wt', encoding='utf-8') as f:
      f.write(text)
  else:
    with open(path, 'w', encoding='utf-8') as f:
      f.write(text)
  return str(path)


GRAMMAR = {
    'det': 'the a every some'.split(),
    'adj': 'big small red old young happy'.split(),
    'noun': 'cat dog bird king woman child horse tree'.split(),
    'verb': 'saw found loved fed followed carried'.split(),
    'prep': 'near under behind beside'.split(),
}
TEMPLATES = (('det', 'adj', 'noun', 'verb', 'det', 'noun'),
             ('det', 'noun', 'verb', 'det', 'adj', 'noun', 'prep', 'det', 'noun'),
             ('det', 'adj', 'adj', 'noun', 'verb', 'det', 'noun'))


def make_grammar_corpus(path, *, documents: int = 150, seed: int = 0) -> str:
  """A corpus where context predicts each word's class (a noun follows a determiner or adjective, ...).

  A replaced token is detectable from its neighbours, so replaced-token detection is learnable in few steps;
  random-word corpora (make_corpus) offer no such signal.
  """
  rng = random.Random(seed)
  lines = []
  for _ in range(documents):
    for _ in range(rng.randint(4, 10)):
      lines.append(' '.join(rng.choice(GRAMMAR[c]) for c in rng.choice(TEMPLATES)) + ' .')
    lines.append('')
  with open(path, 'w', encoding='utf-8') as f:
    f.write('\n'.join(lines) + '\n')
  return str(path)


KEYWORD = 'happy'


def keyword_free_sentence(rng: random.Random) -> list[str]:
  return [rng.choice([w for w in WORDS if w != KEYWORD]) for _ in range(rng.randint(4, 9))]


def make_tsv_task(directory, seed=0, sizes=(240, 80)):
  """A sentence-classification task: label 'yes' iff the sentence contains the keyword (40% of sentences);
  majority baseline = 'no'."""
  os.makedirs(directory, exist_ok=True)
  rng = random.Random(seed)
  for split, count in zip(('train', 'dev'), sizes):
    with open(os.path.join(directory, f'{split}.tsv'), 'w', encoding='utf-8') as f:
      f.write('label\tsentence\n')
      for _ in range(count):
        words, positive = keyword_free_sentence(rng), rng.random() < 0.4
        if positive:
          words.insert(rng.randrange(len(words) + 1), KEYWORD)
        f.write(f'{"yes" if positive else "no"}\t{" ".join(words)}\n')
  return str(directory)


def make_conll_task(directory, seed=0, sizes=(240, 80)):
  """A part-of-speech-like tagging task in CoNLL files: each word's tag is fixed by the word (one of three), so a
  model that reads its tokens learns it."""
  os.makedirs(directory, exist_ok=True)
  rng = random.Random(seed)
  for split, count in zip(('train', 'dev'), sizes):
    sentences = ['\n'.join(f'{w}\t{("NN", "VB", "JJ")[len(w) % 3]}' for w in keyword_free_sentence(rng))
                 for _ in range(count)]
    with open(os.path.join(directory, f'{split}.conll'), 'w', encoding='utf-8') as f:
      f.write('\n\n'.join(sentences) + '\n')
  return str(directory)


def override(config, overrides: dict, sep: str = '.'):
  """Sets `section<sep>key` entries of a ConfigDict or nested dict in place and returns it."""
  for dotted, value in overrides.items():
    *path, key = dotted.split(sep)
    node = config
    for part in path:
      node = node[part]
    node[key] = value
  return config


def tiny_pretraining_config(source, cache_dir, **overrides):
  """The tests' tiny pre-training run (1 layer per tower: a second one adds ~70% to the compile of every step and
  initialiser, and the tests that need two (scanned layers) say so; H=32, 32-token sequences, 8 steps, one device,
  dropout off: its random bits double the train step's compile on CPU; tests/test_trainer.py's resumes turn it on).
  `overrides` are dotted keys (`**{'data.eval_fraction': 0.2}`)."""
  config = default.get_config()
  config.train_steps = 8
  config.batch_size = 8
  config.log_every = 1
  config.checkpoint_every = 4
  config.data.update(source=source, vocab_size=64, max_seq_length=32, cache_dir=cache_dir)
  config.model.update(embedding_size=16, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
                      generator_hidden_fraction=0.5, max_position_embeddings=64, dropout_rate=0.0,
                      attention_dropout_rate=0.0)
  config.optimizer.update(learning_rate=1e-3, warmup_steps=2)
  config.mesh.shape = (1, 1, 1)  # one device: equivalence across meshes is tests/test_sharding.py's subject
  return override(config, overrides)


# Fine-tuning's tiny model. Encoder dropout off: its random bits double the compile time of the step on CPU (the
# head keeps dropout 0.1).
TINY_FINETUNE_MODEL = dict(embedding_size=32, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
                           max_position_embeddings=64, generator_hidden_fraction=0.5, dropout_rate=0.0,
                           attention_dropout_rate=0.0)


def pretraining_workdir(path, corpus_file, cache_dir, later_step=0):
  """A pre-training WORKDIR of the tiny fine-tuning model as trainer.train writes it (config.json, tokenizer.model,
  a checkpoint at step 3, and at `later_step` one holding other parameters), with random parameters: nothing is
  compiled. Returns the parameters of step 3."""
  base = default.get_config()
  base.model.update(TINY_FINETUNE_MODEL)
  base.data.update(source=corpus_file, vocab_size=60, cache_dir=cache_dir, max_seq_length=32)
  base.mesh.shape = (1, 1, 1)
  tokenizer = data.load_tokenizer(config_lib.from_dict(data.DataConfig, base.data.to_dict(), where='data'))
  c = config_lib.load(base, vocab_size=tokenizer.vocab_size)
  abstract = Pretraining(c, tokenizer.special, sharding.make_mesh(c.mesh)).abstract_state()
  rng = np.random.default_rng(7)
  state = jax.tree.map(lambda a: jax.device_put(rng.normal(size=a.shape).astype(a.dtype), a.sharding), abstract)
  os.makedirs(path)
  with open(os.path.join(path, 'config.json'), 'w', encoding='utf-8') as f:
    json.dump(base.to_dict(), f)
  shutil.copyfile(tokenizer.model_file, os.path.join(path, 'tokenizer.model'))
  checkpointer = Checkpointer(str(path))
  checkpointer.save(3, state, {'epoch': 0, 'batch': 3})
  if later_step:
    checkpointer.save(later_step, jax.tree.map(lambda a: a + 1, state), {'epoch': 0, 'batch': later_step})
  checkpointer.close()
  return state.params


class LocalProcesses:
  """`python -m electra_jax.main ARGS` in `processes` localhost processes of one jax.distributed job (one: a plain
  single-process run), one faked CPU device each, each process's output to a log file `log_prefix`.<i>.log.

  `env` is added to every process's environment, then `each[i]` to process i's. tests/hooks is first on their
  PYTHONPATH: its sitecustomize holds or fails a checkpoint write when an ELECTRA_JAX_TEST_ variable says so, and
  prints a process's stacks on SIGUSR1 (`kill`).
  """
  timeout = 300  # seconds for one run: a few seconds of steps, the rest start-up and compiling on a loaded machine

  def __init__(self, args: list[str], processes: int, log_prefix, env: dict[str, str] | None = None,
               each: list[dict[str, str]] | None = None):
    self.logs, self.procs = [], []
    hooks = os.path.join(REPO, 'tests', 'hooks')  # its sitecustomize, before whatever PYTHONPATH the caller set
    env = dict(env or {}, PYTHONPATH=os.pathsep.join(filter(None, [hooks, os.environ.get('PYTHONPATH', '')])))
    port = free_port()
    for i in range(processes):
      process_env = dict(os.environ, JAX_PLATFORMS='cpu',
                         XLA_FLAGS='--xla_force_host_platform_device_count=1 --xla_backend_optimization_level=0')
      process_env.update(env or {})
      process_env.update(each[i] if each else {})
      for key in ('JAX_COORDINATOR_ADDRESS', 'JAX_NUM_PROCESSES', 'JAX_PROCESS_ID'):
        process_env.pop(key, None)
      if processes > 1:
        process_env.update(JAX_COORDINATOR_ADDRESS=f'127.0.0.1:{port}', JAX_NUM_PROCESSES=str(processes),
                           JAX_PROCESS_ID=str(i))
      log = f'{log_prefix}.{i}.log'
      with open(log, 'w', encoding='utf-8') as out:
        self.procs.append(subprocess.Popen([sys.executable, '-m', 'electra_jax.main', *args], cwd=REPO,
                                           env=process_env, stdout=out, stderr=subprocess.STDOUT))
      self.logs.append(log)

  def output(self, i: int) -> str:
    with open(self.logs[i], encoding='utf-8', errors='replace') as f:
      return f.read()

  def wait_for(self, condition, timeout: float | None = None):
    """Polls `condition()` until true; fails (killing every process) if the run ends or the time runs out first."""
    deadline = time.time() + (timeout or self.timeout)
    while not condition():
      if time.time() > deadline or any(p.poll() is not None for p in self.procs):
        self.kill()
        pytest.fail(f'waited in vain for {condition.__doc__ or "the condition"}:\n' + self.tails())
      time.sleep(0.2)

  def finish(self, timeout: float | None = None) -> list[int]:
    """Exit codes of every process, once all have ended; fails (killing them) past `timeout` seconds. Calls
    `self.poll()` every 0.05 s meanwhile."""
    deadline = time.time() + (timeout or self.timeout)
    while any(proc.poll() is None for proc in self.procs):
      if time.time() > deadline:
        self.kill()
        pytest.fail(f'still running after {timeout or self.timeout} s:\n' + self.tails())
      self.poll()
      time.sleep(0.05)
    return [proc.returncode for proc in self.procs]

  def poll(self):
    """What a subclass records while `finish` waits."""

  def kill(self):
    """Kills the processes still running, a second after asking them for their threads' stacks (SIGUSR1:
    tests/hooks), which `tails` then shows."""
    running = [proc for proc in self.procs if proc.poll() is None]
    for proc in running:
      proc.send_signal(signal.SIGUSR1)
    if running:
      time.sleep(1.0)
    for proc in running:
      proc.kill()
      proc.wait()

  def tails(self) -> str:
    return '\n'.join(f'--- process {i}:\n{self.output(i)[-6000:]}' for i in range(len(self.procs)))


def one_error_line(output: str) -> str:
  """The only line of `output` that starts with 'error: ', after checking no traceback came with it."""
  errors = [line for line in output.splitlines() if line.startswith('error: ')]
  assert len(errors) == 1 and 'Traceback' not in output, output[-3000:]
  return errors[0]


# The tiny pre-training run of the fault and multi-process tests, as a user's --config file.
FAULTS_CONFIG_FILE = os.path.join('tests', 'faults_config.py')


def read_metrics(workdir) -> list[dict]:
  """The records of WORKDIR/metrics.jsonl, in order."""
  with open(os.path.join(workdir, 'metrics.jsonl'), encoding='utf-8') as f:
    return [json.loads(line) for line in f]


def final_params(workdir):
  """The parameters and data position of the latest checkpoint of `workdir`."""
  _, params = pretrained.load_params(str(workdir))
  ckpt = Checkpointer(str(workdir))
  data_state = ckpt.manager.restore(ckpt.latest_step(), args=ocp.args.Composite(data=ocp.args.JsonRestore()))
  ckpt.close()
  return jax.device_get(params), data_state['data']


def step_dirs(workdir) -> tuple[list[int], list[str]]:
  """(complete steps, other entries) of WORKDIR/checkpoints: orbax renames a step to its number when complete."""
  names = os.listdir(os.path.join(workdir, 'checkpoints'))
  return sorted(int(n) for n in names if n.isdigit()), sorted(n for n in names if not n.isdigit())


@contextlib.contextmanager
def sigterm_at_step(step: int):
  """Delivers a SIGTERM while the batch of `step` is being prepared: the run checkpoints after `step` and stops."""
  real_next, calls = data.BatchIterator.__next__, []

  def next_then_preempt(self):
    calls.append(1)
    if len(calls) == step:
      os.kill(os.getpid(), signal.SIGTERM)
    return real_next(self)

  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(data.BatchIterator, '__next__', next_then_preempt)
    yield


@contextlib.contextmanager
def traced_functions():
  """The names of the functions jax traces inside the block (a list, filled as they are traced)."""
  names = []

  def listen(event, duration, **kwargs):
    del duration
    if event == '/jax/core/compile/jaxpr_trace_duration':
      names.append(kwargs['fun_name'])

  jax.monitoring.register_event_duration_secs_listener(listen)
  try:
    yield names
  finally:
    jax.monitoring.unregister_event_duration_listener(listen)


def random_params(model_config, seed=0):
  """Random values (not just the initialiser's constants) for every parameter of `Electra(model_config)`."""
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda s: rng.normal(0, 0.1, s.shape).astype(np.float32),
                      pretrained.abstract_params(Electra(model_config)))


# A small converted model (test_convert, test_hf_tokenizer); the vocabulary size is the caller's.
CONVERT_MODEL = dict(embedding_size=32, hidden_size=64, num_layers=2, num_heads=2, intermediate_size=96,
                     generator_hidden_fraction=0.5, generator_layers_fraction=0.5, max_position_embeddings=32)

# A WordPiece vocabulary of 100 for the tiny Hugging Face models.
WORDPIECE_VOCAB = ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]'] + (
    'the cat dog bird sat ran on under a mat rug tree and saw big small red blue house field ate drank water food '
    'chef meal').split() + [f'##{c}' for c in 'abcdefghijklmnopqrstuvwxyz'] + [f'w{i}' for i in range(43)]

# (embedding size, discriminator hidden, generator hidden, generator layers): E != H with an un-projected
# generator of half the depth, and E == H with a projected generator.
HF_SIZES = {'E!=H': (32, 64, 32, 1), 'E==H': (64, 64, 32, 2)}


def hf_models(embedding_size, hidden, gen_hidden, gen_layers, *, seed=0, layers=2):
  """A random tiny ElectraForPreTraining (`layers` deep) / ElectraForMaskedLM pair sharing its embeddings, in eval
  mode.

  Every weight is perturbed so that LayerNorm scales, biases and the LM bias are not the constants 1 and 0
  (a swapped or missing mapping then changes the logits). Needs torch and transformers (the test extra).
  """
  import torch  # noqa: PLC0415  (only the conversion tests need it)
  import transformers  # noqa: PLC0415
  torch.manual_seed(seed)
  common = dict(vocab_size=len(WORDPIECE_VOCAB), embedding_size=embedding_size, max_position_embeddings=32,
                type_vocab_size=2, hidden_act='gelu', initializer_range=0.1)
  disc = transformers.ElectraForPreTraining(transformers.ElectraConfig(
      hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=2, intermediate_size=96, **common))
  gen = transformers.ElectraForMaskedLM(transformers.ElectraConfig(
      hidden_size=gen_hidden, num_hidden_layers=gen_layers, num_attention_heads=max(1, gen_hidden // 64),
      intermediate_size=4 * gen_hidden, **common))
  with torch.no_grad():
    for model in (disc, gen):
      for p in model.parameters():
        p.add_(0.1 * torch.randn_like(p))
    gen.electra.embeddings.load_state_dict(disc.electra.embeddings.state_dict())
  return disc.eval(), gen.eval()


def write_tokenizer_files(directory):
  with open(os.path.join(directory, 'vocab.txt'), 'w', encoding='utf-8') as f:
    f.write('\n'.join(WORDPIECE_VOCAB) + '\n')
  with open(os.path.join(directory, 'tokenizer_config.json'), 'w', encoding='utf-8') as f:
    json.dump({'do_lower_case': True, 'tokenizer_class': 'ElectraTokenizer'}, f)


def save_hf(tmp_path, disc, gen):
  disc.save_pretrained(tmp_path / 'hf_disc')
  gen.save_pretrained(tmp_path / 'hf_gen')
  write_tokenizer_files(tmp_path / 'hf_disc')
  return str(tmp_path / 'hf_disc'), str(tmp_path / 'hf_gen')


STUB_VOCAB = 8  # the objective tests' vocabulary: ids 0..4 special, 5, 6, 7 words


def stub_generator_logits(targets):
  """Stub generator: log-probabilities chosen so each cross-entropy and each argmax is known on paper.

  For a target t in {5, 6}: p(t) = 1/4, p(c) = 1/2 for the other word c (5 <-> 6), the 6 remaining ids 1/24 each.
  For t = 7: p(7) = 1/2, p(5) = 1/4, the rest 1/24 each. So CE = log 4 for 5 and 6, log 2 for 7, and the most
  likely token is c (a replacement) for 5 and 6 but the original for 7.
  """
  t = targets[..., None]
  vocab = jnp.arange(STUB_VOCAB)
  c = jnp.where(t == 5, 6, 5)
  probs = jnp.where(vocab == t, jnp.where(t == 7, 0.5, 0.25),
                    jnp.where(vocab == c, jnp.where(t == 7, 0.25, 0.5), 1 / 24))
  return jnp.log(probs)


def loss_of(name: str):
  """(loss, Metrics) of objective `name` for a batch whose masking and sampler are chosen (a test fixes them): its
  two halves, `Objective.sums` then `Objective.metrics`, as gradient accumulation runs them."""
  spec = objective.get(name)

  def loss(apply_fn, params, batch, masked, sample, *, config, deterministic=False):
    return spec.metrics(spec.sums(apply_fn, params, batch, masked, sample, config=config, deterministic=deterministic),
                        config)
  return loss


def token_batch(ids) -> dict[str, np.ndarray]:
  """A batch of the token ids [B, L] (0 = padding), one segment."""
  ids = np.asarray(ids, np.int32)
  return {'input_ids': ids, 'segment_ids': np.zeros_like(ids), 'input_mask': (ids != 0).astype(np.int32)}


# jax's persistent compilation cache options and the environment variables that set them in a subprocess.
CACHE_OPTIONS = {'jax_compilation_cache_dir': 'JAX_COMPILATION_CACHE_DIR',
                 'jax_persistent_cache_min_compile_time_secs': 'JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS',
                 'jax_persistent_cache_min_entry_size_bytes': 'JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES'}

GCS_BUCKET = 'electra-test'


def free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def emulator_environment(url: str) -> dict[str, str]:
  """What points every Cloud Storage client of a run at the server at `url` instead of storage.googleapis.com."""
  return {
      'STORAGE_EMULATOR_HOST': url,  # gcsfs (epath's gs:// backend) and google-cloud-storage
      'TENSORSTORE_GCS_HTTP_URL': url,  # tensorstore: orbax's checkpoint arrays
      'GOOGLE_AUTH_TOKEN_FOR_TESTING': 'fake',  # tensorstore: no credential lookup
      # gcsfs would first ask the Storage Control API (which the emulator lacks) for the bucket's layout and, with
      # no credentials, log a warning on every call.
      'GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT': 'false',
  }


# The tiny model of tests/test_model.py and tests/test_attention.py.
V, E, H = 72, 16, 32  # V differs from every other dimension, so a [V, .] shape is a vocab table
B, L, P = 2, 16, 3
# Generator width 32 * 0.5 = 16 = E, so only the discriminator has an embeddings_project (E=16 -> H=32).
# dtype, attention, dropout_draw and fused_qkv given (what 'auto' is on a CPU): resolving 'auto'
# (config.for_this_platform) would start jax's backend when this module is imported, before
# tests/multihost_worker.py calls jax.distributed.initialize.
MODEL_CONFIG = ModelConfig(vocab_size=V, embedding_size=E, hidden_size=H, num_layers=2, num_heads=2,
                           intermediate_size=64, generator_hidden_fraction=0.5, max_position_embeddings=32,
                           dtype='float32', attention='einsum', dropout_draw='bits16', fused_qkv=False)


def model_inputs(lengths=(16, 11), seed=0):
  r = np.random.RandomState(seed)
  ids = np.zeros((B, L), np.int32)
  segments = np.zeros((B, L), np.int32)
  for i, n in enumerate(lengths):
    ids[i, :n] = r.randint(5, V, n)
    ids[i, 0], ids[i, n - 1] = 2, 3
    segments[i, n // 2:n] = 1
  mask = (ids > 0).astype(np.int32)
  positions = np.array([[1, 5, 14], [2, 4, 9]], np.int32)  # inside each row's real tokens
  return ids, segments, mask, positions


def random_model_params(config, seed=0):
  """Generic parameters with O(1) activations (so GELU, LayerNorm and attention all matter numerically)."""
  ids, segments, mask, positions = model_inputs()
  shapes = nn.meta.unbox(jax.eval_shape(Electra(config).init, jax.random.PRNGKey(0), ids, segments, mask,
                                        positions)['params'])
  r = np.random.RandomState(seed)

  def draw(path, s):
    name = jax.tree_util.keystr(path)
    if 'scale' in name:
      return 1.0 + 0.1 * r.normal(size=s.shape)
    if 'bias' in name:
      return 0.1 * r.normal(size=s.shape)
    fan_in = s.shape[0] if 'kernel' in name else 1
    return r.normal(size=s.shape) / math.sqrt(fan_in)
  return jax.tree_util.tree_map_with_path(lambda p, s: np.asarray(draw(p, s), np.float32), shapes)


def run_data_cli(capsys, *argv):
  """Runs the CLI in this process; returns (exit status, stdout, stderr)."""
  try:
    data_cli.main(list(argv))
    status = 0
  except SystemExit as e:
    status = e.code
  out, err = capsys.readouterr()
  return status, out, err
