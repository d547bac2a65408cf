"""The training loop end to end: resume equality, preemption, NaN handling, bad input, the CLI."""

import json
import math
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

from electra_jax import checkpoint, config as config_lib, config_files, data, pretrained, train_step, trainer
from helpers import REPO, final_params, override, read_metrics, sigterm_at_step  # pylint: disable=g-bad-import-order
from helpers import tiny_pretraining_config as tiny_config, traced_functions

# Most runs here share one tiny config: with a persistent compilation cache they compile it once.
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures('compile_once')]

# The resumes below with dropout on (the tiny config has it off): its random bits must continue where they stopped.
DROPOUT = {'model.dropout_rate': 0.1, 'model.attention_dropout_rate': 0.1}


def assert_same_run(config, one_go, resumed):
  """Same per-step losses and same final parameters.

  Both runs execute the same XLA program on the same inputs on CPU, which is deterministic; a resumed run
  recompiles, so we allow 1e-6 relative difference for a reduction order that might change between
  compilations (none was seen: the values are equal).
  """
  a, b = read_metrics(one_go), read_metrics(resumed)
  assert [m['step'] for m in a] == [m['step'] for m in b] == list(range(1, config.train_steps + 1))
  np.testing.assert_allclose([m['loss'] for m in a], [m['loss'] for m in b], rtol=1e-6)
  # Cumulative FLOPs continue across the resume: step x the FLOPs of one step.
  assert [m['train_flops'] for m in a] == [m['train_flops'] for m in b] == [
      m['step'] * a[0]['train_flops'] for m in a]
  params_a, data_a = final_params(one_go)
  params_b, data_b = final_params(resumed)
  assert data_a == data_b
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7), params_a, params_b)


@pytest.fixture(scope='module')
def one_go(tmp_path_factory, corpus_file, cache_dir):
  """An uninterrupted 8-step run, dropout on."""
  workdir = tmp_path_factory.mktemp('one_go')
  trainer.train(tiny_config(corpus_file, cache_dir, **DROPOUT), workdir)
  return workdir


def _traced_last(x):  # traced last in test_resume_equals_uninterrupted: the listener is seen to work
  return x


def test_resume_equals_uninterrupted(tmp_path, corpus_file, cache_dir, one_go):
  config = tiny_config(corpus_file, cache_dir, **DROPOUT)
  trainer.train(config, tmp_path, stop_after=5)  # stops after step 5, past the step-4 checkpoint
  assert sorted(os.listdir(tmp_path / 'checkpoints')) == ['4', '5']
  with traced_functions() as traced:
    trainer.train(config, tmp_path)
    jax.jit(_traced_last).trace(0)
  assert_same_run(config, one_go, tmp_path)
  # The same config in the same process: its train step and initialiser are reused, nothing is traced again.
  assert traced == ['_traced_last'], traced


def test_staged_batches_train_as_fresh_ones(tmp_path, corpus_file, cache_dir, one_go, monkeypatch):
  """ELECTRA_JAX_STAGE_BATCHES=1 writes each batch over the device arrays of the one before: the same run."""
  monkeypatch.setenv('ELECTRA_JAX_STAGE_BATCHES', '1')
  config = tiny_config(corpus_file, cache_dir, **DROPOUT)
  trainer.train(config, tmp_path)
  assert_same_run(config, one_go, tmp_path)


def test_steps_per_call_trains_the_same_steps_and_resumes_between_calls(tmp_path, corpus_file, cache_dir, one_go,
                                                                       monkeypatch):
  """steps_per_call=2: the 8 steps as 4 calls of two, and a run stopped after step 3 then resumed (steps 3 and 4
  one a call, the rest two a call) with its batches staged (ELECTRA_JAX_STAGE_BATCHES=1: single and stacked ones
  each in their own arrays): the uninterrupted run's parameters, data position and losses (logged every 2 steps:
  the mean of each pair of its steps)."""
  config = tiny_config(corpus_file, cache_dir, steps_per_call=2, log_every=2, **DROPOUT)
  expected = [m['loss'] for m in read_metrics(one_go)]
  pairs = [(a + b) / 2 for a, b in zip(expected[::2], expected[1::2])]
  for workdir, stop_after in ((tmp_path / 'one_go', None), (tmp_path / 'resumed', 3)):
    if stop_after:
      monkeypatch.setenv('ELECTRA_JAX_STAGE_BATCHES', '1')
      trainer.train(config, workdir, stop_after=stop_after)
      assert [m['step'] for m in read_metrics(workdir)] == [2, 3]
    trainer.train(config, workdir)
    params, data_state = final_params(workdir)
    params_one_go, data_one_go = final_params(one_go)
    assert data_state == data_one_go
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-7), params, params_one_go)
  logged = read_metrics(tmp_path / 'one_go')
  assert [m['step'] for m in logged] == [2, 4, 6, 8]
  np.testing.assert_allclose([m['loss'] for m in logged], pairs, rtol=1e-5)
  assert [m['step'] for m in read_metrics(tmp_path / 'resumed')] == [2, 3, 4, 6, 8]  # 3: where the first one ended
  with pytest.raises(config_lib.ConfigError, match=r'steps_per_call=2 runs 2 steps in each call.*make these '
                     r'multiples of 2: log_every=3; or set steps_per_call=1'):
    trainer.train(tiny_config(corpus_file, cache_dir, steps_per_call=2, log_every=3), tmp_path / 'refused')
  assert not (tmp_path / 'refused').exists()


def test_flat_params_train_evaluate_and_resume_as_the_tree_run(tmp_path, corpus_file, cache_dir):
  """optimizer.flat_params=true (GPUs' default): the state stored as a few vectors, its checkpoints as the tree;
  the run stopped after step 5 and resumed, and the uninterrupted one-array-per-parameter run, train the same steps
  and evaluate the same (up to float32 summation order: the gradients' norm over a few vectors)."""
  runs = {}
  for flat in ('false', 'true'):
    config = tiny_config(corpus_file, cache_dir, **DROPOUT, **{'optimizer.flat_params': flat,
                                                               'data.eval_fraction': 0.2, 'eval_every': 4})
    if flat == 'true':
      trainer.train(config, tmp_path / flat, stop_after=5)
    trainer.train(config, tmp_path / flat)
    runs[flat] = read_metrics(tmp_path / flat), final_params(tmp_path / flat)
  (a, (params_a, data_a)), (b, (params_b, data_b)) = runs['false'], runs['true']
  assert [m['step'] for m in b] == list(range(1, 9)) and data_a == data_b
  for name in ('loss', 'disc_recall', 'grad_norm'):
    np.testing.assert_allclose([m[name] for m in a], [m[name] for m in b], rtol=1e-5, err_msg=name)
  for step in (4, 8):
    np.testing.assert_allclose(a[step - 1]['eval_disc_auc'], b[step - 1]['eval_disc_auc'], rtol=1e-5)
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6), params_a, params_b)


def test_sigterm_checkpoints_and_resumes(tmp_path, corpus_file, cache_dir, one_go):
  config = tiny_config(corpus_file, cache_dir, **DROPOUT)
  with sigterm_at_step(3):
    trainer.train(config, tmp_path)
  assert sorted(os.listdir(tmp_path / 'checkpoints')) == ['3']
  trainer.train(config, tmp_path)
  assert_same_run(config, one_go, tmp_path)


def test_a_stop_between_log_steps_writes_the_steps_since_the_last(tmp_path, corpus_file, cache_dir):
  """log_every=4, stopped after step 3, resumed: the metrics of steps 1-3 are written at the stop (they were lost,
  and the summary showed an older step's), step 4's window holds step 4 alone, step 8's steps 5-8: each the mean of
  the uninterrupted run's steps. Held-out rows between log steps carry train_flops (plots against FLOPs use it)."""
  settings = {**DROPOUT, 'data.eval_fraction': 0.2, 'eval_every': 2}
  trainer.train(tiny_config(corpus_file, cache_dir, **settings), tmp_path / 'each')  # log_every=1
  config = tiny_config(corpus_file, cache_dir, log_every=4, **settings)
  with sigterm_at_step(3):
    trainer.train(config, tmp_path / 'run')
  trainer.train(config, tmp_path / 'run')
  each = {m['step']: m['loss'] for m in read_metrics(tmp_path / 'each')}
  lines = {m['step']: m for m in read_metrics(tmp_path / 'run')}
  assert sorted(lines) == [2, 3, 4, 6, 8]
  for step, window in ((3, (1, 2, 3)), (4, (4,)), (8, (5, 6, 7, 8))):
    np.testing.assert_allclose(lines[step]['loss'], np.mean([each[s] for s in window]), rtol=1e-5)
  assert 'loss' not in lines[6] and lines[6]['train_flops'] == 6 * lines[8]['train_flops'] / 8
  assert 'eval_loss' in lines[2] and lines[2]['train_flops'] == lines[8]['train_flops'] / 4


def test_resume_keeps_the_runs_own_tokenizer(tmp_path, corpus_file):
  """A run resumed where the tokenizer cache does not hold its tokenizer (another machine, a cleared cache) must keep
  training with the tokenizer saved in its workdir rather than train (and save over it) a new one: sentencepiece
  training is not reproducible byte for byte."""
  corpus = tmp_path / 'corpus.txt'
  shutil.copyfile(corpus_file, corpus)
  cache, workdir = tmp_path / 'cache', tmp_path / 'run'
  config = tiny_config(str(corpus), str(cache))
  trainer.train(config, workdir, stop_after=4)
  saved = (workdir / 'tokenizer.model').read_bytes()
  assert len([p for p in cache.iterdir() if p.name.startswith('tokenizer-')]) == 1
  shutil.rmtree(cache)
  trainer.train(config, workdir)
  assert (workdir / 'tokenizer.model').read_bytes() == saved
  assert not [p for p in cache.iterdir() if p.name.startswith('tokenizer-')]  # none trained
  assert read_metrics(workdir)[-1]['step'] == config.train_steps
  # Naming another tokenizer for the resumed run is refused in one line, before anything is written.
  other = tmp_path / 'other'
  other_config = tiny_config(str(corpus), str(tmp_path / 'cache2'), **{'data.vocab_size': 48})
  data.load_tokenizer(config_lib.from_dict(data.DataConfig, other_config.to_dict()['data'], where='data')).save(other)
  with pytest.raises(config_lib.ConfigError, match=r'was trained with the tokenizer saved in it, not data.tokenizer'):
    trainer.train(tiny_config(str(corpus), str(cache), train_steps=10, **{'data.tokenizer': str(other)}), workdir)
  assert (workdir / 'tokenizer.model').read_bytes() == saved


def test_a_new_run_compiles_its_train_step_while_its_examples_are_packed(tmp_path, corpus_file, cache_dir,
                                                                         monkeypatch):
  """A new run starts its train step's compile before it packs its examples (packing a large corpus then takes no
  time of its own); a run with checkpoints packs first and starts the compile once they say steps are left."""
  calls = []

  class Packed(Exception):
    pass

  def batches(*_):
    calls.append('examples')
    raise Packed
  monkeypatch.setattr(trainer.scaffold, 'compile_in_thread', lambda what, _: calls.append(what))
  monkeypatch.setattr(trainer, '_batches', batches)
  config = tiny_config(corpus_file, cache_dir)
  with pytest.raises(Packed):
    trainer.train(config, tmp_path / 'new')
  assert calls == ['the train step', 'examples']
  calls.clear()
  (tmp_path / 'resumed' / 'checkpoints').mkdir(parents=True)
  with pytest.raises(Packed):
    trainer.train(config, tmp_path / 'resumed')
  assert calls == ['examples']


def test_precompile_writes_nothing_and_the_run_then_compiles_no_train_step(tmp_path, corpus_file, cache_dir,
                                                                           monkeypatch):
  """trainer.precompile (what experiments.compare runs for every run at once) compiles a run's train step and packs
  its examples without writing to its workdir; the run's `train` in the same process then compiles and packs
  none."""
  del cache_dir  # a data cache of its own: the examples are packed here, by precompile
  cache = tmp_path / 'cache'
  config = tiny_config(corpus_file, str(cache), train_steps=2, checkpoint_every=2, **{'optimizer.learning_rate': 2e-3})
  lines = trainer.precompile(config, tmp_path / 'run')()
  assert len(lines) == 1 and lines[0].startswith('compiled the train step in ')  # no evaluation: eval_every=0
  assert not (tmp_path / 'run').exists()
  assert len(list(cache.glob('packed-*.npz'))) == 1  # the training examples, packed while the step compiled
  monkeypatch.setattr(train_step.Pretraining, 'lower', lambda *_: pytest.fail('the train step compiled again'))
  monkeypatch.setattr(data.build_lib, 'pack_in_memory', lambda *_, **__: pytest.fail('the examples packed again'))
  trainer.train(config, tmp_path / 'run')
  assert [m['step'] for m in read_metrics(tmp_path / 'run')] == [1, 2]


def test_mlm_objective_trains(tmp_path, corpus_file, cache_dir):
  """An objective without generator or replaced-token metrics trains and logs (BERT baseline, 2 steps)."""
  config = tiny_config(corpus_file, cache_dir, train_steps=2, checkpoint_every=2, **{
      'objective.name': 'mlm', 'objective.mask_token_prob': 0.8, 'objective.random_token_prob': 0.1})
  last = trainer.train(config, tmp_path)
  assert last['mlm_loss'] > 0 and 'gen_loss' not in last
  assert [m['train_flops'] for m in read_metrics(tmp_path)] == [last['train_flops'] / 2, last['train_flops']]
  _, params = pretrained.load_params(str(tmp_path))
  assert 'generator' not in params and 'mlm_predictions' in params['discriminator']


def test_scanned_layers_train_and_load_unrolled(tmp_path, corpus_file, cache_dir):
  """A model.scan_layers run trains; load_params (fine-tuning, convert, detect) gets one subtree per layer."""
  config = tiny_config(corpus_file, cache_dir, train_steps=2, checkpoint_every=2,
                       **{'model.scan_layers': True, 'model.num_layers': 2})
  assert math.isfinite(trainer.train(config, tmp_path)['loss'])
  loaded, params = pretrained.load_params(str(tmp_path))
  assert not loaded.model.scan_layers
  for tower, width in (('discriminator', 32), ('generator', 16)):
    encoder = params[tower]['encoder']
    assert sorted(encoder) == ['layer_0', 'layer_1']
    # The discriminator's FFN is intermediate_size = 64 wide, the generator's 4 x its width 16.
    assert encoder['layer_1']['intermediate']['dense']['kernel'].shape == (width, 64)


def test_nan_loss_stops_and_keeps_last_good_checkpoint(tmp_path, corpus_file, cache_dir):
  # A learning rate of 1e30 blows the parameters up after the first update: step 1 is finite, step 2 is not.
  config = tiny_config(corpus_file, cache_dir, **{'checkpoint_every': 1, 'train_steps': 6,
                                                  'optimizer.learning_rate': 1e30, 'optimizer.warmup_steps': 0})
  with pytest.raises(trainer.TrainingError, match=r'step 2: .*loss=(nan|inf)'):
    trainer.train(config, tmp_path)
  assert os.listdir(tmp_path / 'checkpoints') == ['1']
  params, _ = final_params(tmp_path)
  assert all(np.isfinite(leaf).all() for leaf in jax.tree.leaves(params))


def test_corrupt_checkpoint_is_a_clear_error_and_is_not_deleted(tmp_path, corpus_file, cache_dir):
  config = tiny_config(corpus_file, cache_dir)  # the file's 8-step program (compiled once, then a cache hit)
  trainer.train(config, tmp_path, stop_after=4)
  state_dir = tmp_path / 'checkpoints' / '4' / 'state'
  damaged = []
  for root, _, files in os.walk(state_dir):
    for name in files:
      path = os.path.join(root, name)
      with open(path, 'wb') as f:
        f.write(b'\x00garbage')
      damaged.append(path)
  with pytest.raises(checkpoint.CheckpointError, match='no checkpoint in .* can be read'):
    trainer.train(config, tmp_path)
  assert all(os.path.exists(p) for p in damaged)


@pytest.mark.parametrize('problem', ['missing', 'empty', 'binary', 'latin1'])
def test_bad_corpus_is_one_clear_error(tmp_path, cache_dir, problem):
  path = tmp_path / 'corpus.txt'
  if problem == 'empty':
    path.write_text('\n\n   \n')
  elif problem == 'binary':
    path.write_bytes(b'\x7fELF\x02\x01\x01\x00\x00\x00' * 100)
  elif problem == 'latin1':
    path.write_bytes('caf\u00e9 au lait\n'.encode('latin-1'))
  expected = {'missing': 'no text files found', 'empty': 'the corpus is empty',
              'binary': 'binary', 'latin1': 'not valid UTF-8'}[problem]
  with pytest.raises(data.DataError, match=expected):
    trainer.train(tiny_config(str(path), cache_dir), tmp_path / 'work')


def test_pretraining_into_a_finetuning_workdir_is_refused(tmp_path, corpus_file, cache_dir):
  """A fine-tuning run's workdir keeps its tokenizer: pre-training there is refused before anything is written."""
  (tmp_path / 'finetune.json').write_text('{}')
  with pytest.raises(config_lib.ConfigError, match=r'holds a fine-tuning run \(finetune.json\); pre-training would '
                     'write over its tokenizer'):
    trainer.train(tiny_config(corpus_file, cache_dir), tmp_path)
  assert os.listdir(tmp_path) == ['finetune.json']


def test_held_out_text_short_of_a_batch_is_refused_before_anything_is_written(tmp_path, corpus_file, cache_dir,
                                                                              monkeypatch):
  """A refused command leaves no config.json or checkpoints/ behind, so the corrected one (a larger eval_fraction)
  is not refused as a resume with other data settings."""
  monkeypatch.setattr(trainer.scaffold, 'compile_in_thread', lambda *_: None)  # no step is needed to be refused
  config = tiny_config(corpus_file, cache_dir, eval_every=4, **{'data.eval_fraction': 0.02})
  with pytest.raises(config_lib.ConfigError, match=r'the held-out text packs into \d examples, fewer than one batch '
                     'of 8; raise data.eval_fraction'):
    trainer.train(config, tmp_path / 'run')
  assert not (tmp_path / 'run').exists()


def test_resume_with_another_seed_batch_size_or_optimizer_state_is_refused_naming_the_saved_value(
    tmp_path, corpus_file, cache_dir):
  """The examples' order depends on the seed and batch size: a resume with another value would mix two orders (a
  built dataset) or be refused as a changed corpus (text). optimizer.bias_correction shapes the optimiser state:
  another value would read the checkpoints as unreadable ones."""
  config = tiny_config(corpus_file, cache_dir)
  (tmp_path / 'config.json').write_text(json.dumps(config.to_dict()))
  trainer._check_resume_config(tmp_path, config.to_dict())  # pylint: disable=protected-access
  for key, saved, other in (('seed', 0, 5), ('batch_size', 8, 16), ('optimizer.bias_correction', False, True)):
    values = override(config.to_dict(), {key: other})
    with pytest.raises(config_lib.ConfigError, match=rf'holds a run with {key}={saved}; resume with '
                                                     rf'--config.{key}={saved}, or start a new --workdir'):
      trainer._check_resume_config(tmp_path, values)  # pylint: disable=protected-access


def test_vocab_size_mismatch_is_a_config_error(tmp_path, corpus_file, cache_dir):
  config = tiny_config(corpus_file, cache_dir, **{'model.vocab_size': 999})
  with pytest.raises(config_lib.ConfigError, match='tokenizer has 64 tokens'):
    trainer.train(config, tmp_path)


def test_cli_unknown_config_key_is_one_line(tmp_path):
  result = subprocess.run(
      [sys.executable, '-m', 'electra_jax.main', '--config=configs/tiny.py', f'--workdir={tmp_path}',
       '--config.model.hiden_size=3'], cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
  assert result.returncode == 2
  assert result.stderr == ('error: configs/tiny.py has no key model.hiden_size (did you mean model.hidden_size?); '
                           '--config=configs/tiny.py --show_config lists every key\n')


def test_save_steps_are_checkpointed_and_kept(tmp_path, corpus_file, cache_dir, monkeypatch):
  """Steps in save_steps get a checkpoint that keep_checkpoints=1 does not delete; load_params reads any step.
  Each checkpoint brings a gs:// workdir's metrics up to date (MetricsWriter.sync; a local one has nothing to do)."""
  synced = []
  monkeypatch.setattr(trainer.metrics_lib.MetricsWriter, 'sync', lambda self: synced.append(read_metrics(tmp_path)))
  config = tiny_config(corpus_file, cache_dir, checkpoint_every=100, keep_checkpoints=1, save_steps=(2, 3))
  trainer.train(config, tmp_path, stop_after=5)  # 8 steps' program, compiled once for this file; stopped at 5
  assert sorted(os.listdir(tmp_path / 'checkpoints'), key=int) == ['2', '3', '5']
  assert [[m['step'] for m in lines] for lines in synced] == [[1, 2], [1, 2, 3], [1, 2, 3, 4, 5]]
  params = {step: jax.device_get(pretrained.load_params(str(tmp_path), step=step)[1]) for step in (2, 3, 5)}
  kernel = lambda p: p['discriminator']['encoder']['layer_0']['output']['dense']['kernel']
  assert not np.array_equal(kernel(params[2]), kernel(params[3]))
  np.testing.assert_array_equal(kernel(params[5]), kernel(final_params(tmp_path)[0]))
  assert config_files.load_config(str(tmp_path)).save_steps == (2, 3)
  # Resumed without them (or with others), the run keeps what it was told to keep.
  trainer.train(tiny_config(corpus_file, cache_dir, checkpoint_every=100, keep_checkpoints=1, save_steps=(7,)),
                tmp_path)
  assert sorted(os.listdir(tmp_path / 'checkpoints'), key=int) == ['2', '3', '7', '8']
  assert config_files.load_config(str(tmp_path)).save_steps == (2, 3, 7)


def test_a_hugging_face_model_directory_is_no_pretraining_workdir(tmp_path, corpus_file, cache_dir):
  """A workdir without checkpoints/ whose config.json is not a run's (an HF model directory given as --workdir):
  refused before its config.json is replaced."""
  hf = '{"architectures": ["ElectraForPreTraining"], "hidden_size": 256}'
  (tmp_path / 'config.json').write_text(hf)
  with pytest.raises(config_lib.ConfigError, match=r"holds a config.json that is not an electra_jax run's \(a Hugging "
                                                   r'Face model directory\?\), which pre-training would replace'):
    trainer.train(tiny_config(corpus_file, cache_dir), tmp_path)
  assert os.listdir(tmp_path) == ['config.json'] and (tmp_path / 'config.json').read_text() == hf


def test_a_damaged_config_json_is_one_line_on_resume(tmp_path, corpus_file, cache_dir):
  """A run's config.json cut short (it was a json traceback): one line naming it; nothing else touched."""
  (tmp_path / 'checkpoints').mkdir()
  (tmp_path / 'config.json').write_text('{"model": {"hidden_')
  with pytest.raises(config_lib.ConfigError, match=r'config.json is damaged \(not a JSON object: Unterminated string.*'
                     r'\): restore it, or start a new --workdir$'):
    trainer.train(tiny_config(corpus_file, cache_dir), tmp_path)
  assert (tmp_path / 'config.json').read_text() == '{"model": {"hidden_'


def test_a_tokenizer_directory_is_no_pretraining_workdir(tmp_path, corpus_file, cache_dir):
  """`python -m electra_jax.data tokenizer --output=DIR`'s DIR given as --workdir: refused, its tokenizer kept (a new
  run saved its own over it, in silence)."""
  config = tiny_config(corpus_file, cache_dir)
  data.load_tokenizer(config_lib.from_dict(data.DataConfig, config.to_dict()['data'], where='data')).save(tmp_path)
  before = {name: (tmp_path / name).read_bytes() for name in os.listdir(tmp_path)}
  with pytest.raises(config_lib.ConfigError, match=r'holds electra_tokenizer.json, tokenizer.model, which a new '
                     r'pre-training run would write over: give another --workdir \(a tokenizer directory is given as '
                     r'--config.data.tokenizer\)$'):
    trainer.train(config, tmp_path)
  assert {name: (tmp_path / name).read_bytes() for name in os.listdir(tmp_path)} == before


def test_startup_stages_and_the_end_of_run_summary(tmp_path, corpus_file, cache_dir, capsys):
  """The compile is announced and timed before the progress bar; the run ends with its summary on stdout."""
  trainer.train(tiny_config(corpus_file, cache_dir), tmp_path, stop_after=2)
  out, err = capsys.readouterr()
  compiling, compiled = err.index('compiling the train step...\n'), err.index('compiled the train step in ')
  assert compiling < compiled < err.index('| 0/8 [')  # the bar starts after the compile: its ETA excludes it
  assert out.startswith('pre-training stopped at step 2 of 8 (2 steps in ')
  assert f'  newest checkpoint: {tmp_path}/checkpoints/2\n' in out and os.path.isdir(tmp_path / 'checkpoints' / '2')
  assert f'python -m electra_jax.detect --checkpoint {tmp_path} ' in out
  assert f'--config.init_checkpoint={tmp_path} ' in out
