"""The compare experiment: steps for a FLOPs budget by hand, and a tiny end-to-end run (electra and mlm at two
budgets on the grammar corpus, a generated TSV task): its outputs, FLOPs matching, and a re-run that trains
nothing."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import ml_collections
import pytest

from configs.experiments import compare_cpu, compare_gpu
from electra_jax import checkpoint, config_files, objective
from electra_jax import config as config_lib
from electra_jax.config import ConfigError
from electra_jax.experiments import compare
from helpers import TINY_FINETUNE_MODEL, make_conll_task, make_tsv_task  # pylint: disable=g-bad-import-order

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# The five fine-tunings build the same programs: they compile once (halves the test's time).
pytestmark = pytest.mark.usefixtures('compile_once')


def test_steps_for_budget_by_hand():
  # 1e12 / 3e9 = 333.3 -> 333 steps (999e9 FLOPs); 1e12 / 2.4e9 = 416.7 -> 417 (1.0008e12): each within half a
  # step of the budget, so two objectives' runs differ by less than one step of the costlier one.
  assert compare.steps_for_budget(1e12, 3e9) == 333
  assert compare.steps_for_budget(1e12, 2.4e9) == 417
  assert compare.steps_for_budget(7e9, 4e9) == 2  # 1.75
  assert compare.steps_for_budget(2.1e9, 4e9) == 1  # 0.525: more than half a step still trains one
  # With 5 steps a call (steps_per_call): the nearest multiple of 5. 333.3 -> 335; 416.7 -> 415; 2.6 -> 5.
  assert [compare.steps_for_budget(1e12, f, multiple=5) for f in (3e9, 2.4e9)] == [335, 415]
  assert compare.steps_for_budget(1.05e10, 4e9, multiple=5) == 5
  with pytest.raises(ConfigError, match=r'less than half of 5 steps \(steps_per_call\) of electra'):
    compare.steps_for_budget(9e9, 4e9, 'electra', multiple=5)  # 2.25 steps
  with pytest.raises(ConfigError, match='less than half a step of mlm'):
    compare.steps_for_budget(1.9e9, 4e9, 'mlm')  # 0.475
  assert [compare.budget_name(b) for b in (5e12, 1.5e13, 4.5e13, 3e9)] == ['5e12', '1.5e13', '4.5e13', '3e09']


@pytest.mark.parametrize('budgets', [('abc',), (0,), ()])
def test_budgets_must_be_positive_numbers(budgets):
  config = compare_cpu.get_config()
  config.flops_budgets = budgets  # 'abc' was a TypeError traceback from `<=`
  with pytest.raises(ConfigError, match=r'^flops_budgets must be positive FLOPs counts, got '):
    compare._check(config)  # pylint: disable=protected-access


def test_the_plan_announced_is_the_finetune_budgets_one():
  """With finetune_budgets, `describe` states what `run` does: each pre-training stops at its largest fine-tuned
  budget's step (stop_step) and only those budgets are fine-tuned (finetuned)."""
  config = compare_cpu.get_config()  # budgets 5e12, 1.5e13, 4.5e13; 3 runs, 3 tasks, 3 seeds
  config.finetune_budgets = (5e12,)
  # compare_cpu's FLOPs per step (its docstring): electra 1.24e10, mlm 1.14e10. By hand, round(budget / per step):
  # electra 403.2, 1209.7, 3629.0 -> 403, 1210, 3629 steps; mlm 438.6, 1315.8, 3947.4 -> 439, 1316, 3947.
  electra, mlm = (1.24e10, (403, 1210, 3629)), (1.14e10, (439, 1316, 3947))
  for per_step, steps in (electra, mlm):
    assert tuple(compare.steps_for_budget(b, per_step) for b in config.flops_budgets) == steps
  plans = [compare.Plan(name, ml_collections.ConfigDict({'objective': {'name': objective_name}}), per_step, steps)
           for name, objective_name, (per_step, steps) in (('electra', 'electra', electra),
                                                           ('electra_t2', 'electra', electra), ('mlm', 'mlm', mlm))]
  assert [compare.stop_step(config, p) for p in plans] == [403, 403, 439]
  lines = compare.describe(config, plans).splitlines()
  assert lines[0] == 'compare: 3 runs x 3 FLOPs budgets (fine-tuned: 5e+12); fine-tuning on 3 tasks x 3 seeds'
  # 403 x 1.24e10 = 4.9972e12; 439 x 1.14e10 = 5.0046e12; in all 2 x 4.9972e12 + 5.0046e12 = 1.4999e13.
  assert lines[1].endswith('; one run of 403 steps (of its 3629-step schedule) = 4.997e+12 FLOPs')
  assert lines[3].endswith('; one run of 439 steps (of its 3947-step schedule) = 5.005e+12 FLOPs')
  # 3 runs x 1 budget + the from-scratch model = 4 initialisations, x 3 tasks = 12 fine-tunings.
  assert lines[4] == ('  pre-training in all: 1.5e+13 FLOPs; fine-tuning: 4 initialisations (from scratch included) '
                      'x 3 tasks = 12 runs of 3 seeds')


def tiny_config(grammar_corpus, cache_dir, task_dir):
  config = compare_cpu.get_config()
  pretrain = config.pretrain
  pretrain.model.update(TINY_FINETUNE_MODEL)
  pretrain.data.update(source=grammar_corpus, vocab_size=48, max_seq_length=32, cache_dir=cache_dir)
  pretrain.update(batch_size=8, log_every=1, checkpoint_every=100, keep_checkpoints=1)
  pretrain.optimizer.warmup_steps = 1
  pretrain.mesh.shape = (1, 1, 1)
  config.finetune.update(batch_size=16, eval_batch_size=32, epochs=1.0, max_seq_length=32, max_train_examples=48)
  config.finetune.mesh.shape = (1, 1, 1)
  config.objectives = ('electra', 'mlm')
  config.tasks = (task_dir,)
  config.seeds = 2
  return config


def test_override_of_an_unknown_key_is_a_config_error(grammar_corpus, cache_dir, tmp_path):
  config = tiny_config(grammar_corpus, cache_dir, str(tmp_path))
  config.overrides.mlm.objective.temprature = 2.0
  with pytest.raises(ConfigError, match='overrides.mlm.objective.temprature'):
    compare.plan(config)


@pytest.mark.parametrize('name', sorted(compare_cpu.get_config().overrides))
def test_every_shipped_variant_loads(name):
  # A typo or an invalid value in compare_cpu's overrides would otherwise surface only when that run starts,
  # possibly hours into an experiment. (plan() does the same, but trains a tokenizer on the corpus first.)
  config = compare_cpu.get_config()
  run = config.pretrain.to_dict()
  run['objective']['name'] = name
  run = ml_collections.ConfigDict(run)
  compare._override(run, config.overrides[name], f'overrides.{name}')  # pylint: disable=protected-access
  c = config_lib.load(run, vocab_size=4000)
  # What docs/experiments.md and BENCHMARKS.md report them as: (mask_prob, initial_temperature, temperature,
  # temperature_decay_fraction, disc_weight_warmup_fraction, generator layers).
  reported = {'electra_curriculum': (0.25, 2.0, 1.0, 0.5, 0.0, 4),
              'electra_floor': (0.25, 2.0, 1.5, 0.5, 0.0, 4), 'electra_mask25': (0.25, 0.0, 1.0, 0.0, 0.0, 4),
              'electra_lambda': (0.15, 0.0, 1.0, 0.0, 0.2, 4), 'electra_gen1': (0.15, 0.0, 1.0, 0.0, 0.0, 1),
              'electra_floor_gdes': (0.25, 2.0, 1.5, 0.5, 0.0, 4),
              'electra_floor_frozen': (0.25, 2.0, 1.5, 0.5, 0.0, 4)}
  # Issue #28's levers on top of electra_floor: GDES, and a generator frozen from this experiment's mlm run.
  assert c.model.tying == ('gdes' if name == 'electra_floor_gdes' else 'embeddings')
  assert c.objective.generator_checkpoint == ('WORKDIR/pretrain/mlm' if name == 'electra_floor_frozen' else '')
  if name in reported:
    o = c.objective
    assert o.name == ('electra_frozen' if name == 'electra_floor_frozen' else 'electra')
    assert (o.mask_prob, o.initial_temperature, o.temperature, o.temperature_decay_fraction,
            o.disc_weight_warmup_fraction, c.model.tower(True).num_layers) == reported[name]


def test_comma_lists_and_a_stopped_pretraining(grammar_corpus, cache_dir, tmp_path, monkeypatch):
  config = tiny_config(grammar_corpus, cache_dir, str(tmp_path))
  config.objectives = ('electra,mlm',)  # what --config.objectives=electra,mlm gives
  config.flops_budgets = (1e9,)
  plans = compare.plan(config)
  assert [p.name for p in plans] == ['electra', 'mlm'] and config.objectives == ('electra', 'mlm')
  # trainer.train returns early when SIGTERM/SIGINT stops it: the experiment must stop too, not fine-tune.
  monkeypatch.setattr(compare.trainer, 'train', lambda config, workdir, stop_after=None: None)
  with pytest.raises(compare.trainer.TrainingError, match='run the same command again'):
    compare.pretrain(plans[0], str(tmp_path / 'pre'))


def test_budgets_at_several_steps_a_call_are_multiples_of_it(grammar_corpus, cache_dir, tmp_path):
  """pretrain.steps_per_call=5: each budget's step (a checkpoint the loop writes between calls) is the nearest
  multiple of 5, and a log period that is not one is refused before anything trains."""
  config = tiny_config(grammar_corpus, cache_dir, str(tmp_path))
  config.pretrain.update(steps_per_call=5, log_every=5)
  per_step = compare.plan(config)[0].flops_per_step  # electra's
  config.flops_budgets = (7.4 * per_step, 13 * per_step)
  electra = compare.plan(config)[0]
  assert electra.steps == (5, 15) and electra.config.save_steps == (5, 15) and electra.config.train_steps == 15
  config.pretrain.log_every = 1
  with pytest.raises(ConfigError, match='make these multiples of 5: log_every=1;'):
    compare.plan(config)


def test_cli_unknown_config_key_is_one_line(tmp_path):
  result = subprocess.run(
      [sys.executable, '-m', 'electra_jax.experiments.compare', '--config=configs/experiments/compare_cpu.py',
       f'--workdir={tmp_path}', '--config.taks=x'], cwd=REPO, capture_output=True, text=True, timeout=120,
      check=False)
  assert result.returncode == 2 and 'Traceback' not in result.stderr
  assert result.stderr == ('error: configs/experiments/compare_cpu.py has no key taks (did you mean tasks?); '
                           '--config=configs/experiments/compare_cpu.py --show_config lists every key\n')


@pytest.mark.e2e  # the whole experiment in this process (about 20 s on 2 cores)
def test_end_to_end_flops_matched_resumable(tmp_path, grammar_corpus, cache_dir, monkeypatch):
  task_dir = make_tsv_task(tmp_path / 'keyword', sizes=(48, 24))
  config = tiny_config(grammar_corpus, cache_dir, task_dir)
  per_step = {p.name: p.flops_per_step for p in compare.plan(config)}
  assert per_step['mlm'] < per_step['electra']  # no generator
  config.flops_budgets = (2.2 * per_step['electra'], 4.2 * per_step['electra'])  # electra: 2 and 4 steps
  workdir = str(tmp_path / 'cmp')
  results = compare.run(config, workdir)

  electra, mlm = results['objectives']['electra'], results['objectives']['mlm']
  assert [e['steps'] for e in electra['budgets']] == [2, 4]
  assert mlm['objective'] == 'mlm' and electra['flops_per_step'] == per_step['electra']
  for a, b in zip(electra['budgets'], mlm['budgets']):
    assert abs(a['train_flops'] - b['train_flops']) <= max(per_step.values())
    assert a['train_flops'] == a['steps'] * per_step['electra'] and b['train_flops'] == b['steps'] * per_step['mlm']
  # One pre-training run per objective, with a checkpoint at each budget's step (keep_checkpoints=1 deletes none).
  for name, run in results['objectives'].items():
    steps = [e['steps'] for e in run['budgets']]
    assert sorted(os.listdir(os.path.join(workdir, 'pretrain', name, 'checkpoints')), key=int) == [str(s) for s in
                                                                                                   steps]
    saved = config_files.load_config(os.path.join(workdir, 'pretrain', name))
    assert saved.train_steps == max(steps) and saved.objective.name == name
    masking = (saved.objective.mask_token_prob, saved.objective.random_token_prob)
    assert masking == ((0.8, 0.1) if name == 'mlm' else (0.85, 0.0))  # mlm's overrides: BERT's 80/10/10
  # The trainer counted the same FLOPs: its last train_flops is the largest budget's.
  with open(os.path.join(workdir, 'pretrain', 'mlm', 'metrics.jsonl'), encoding='utf-8') as f:
    assert json.loads(f.readlines()[-1])['train_flops'] == mlm['budgets'][-1]['train_flops']

  with open(os.path.join(workdir, 'results.json'), encoding='utf-8') as f:
    assert json.load(f) == json.loads(json.dumps(results))
  summaries = [e['tasks']['keyword'] for run in results['objectives'].values() for e in run['budgets']]
  summaries.append(results['scratch']['keyword'])
  for summary in summaries:
    assert summary['metric'] == 'dev/accuracy' and summary['seeds'] == [0, 1] and len(summary['scores']) == 2
    assert min(summary['scores']) <= summary['median'] <= max(summary['scores'])
  finetuned = os.path.join(workdir, 'finetune', 'electra', compare.budget_name(config.flops_budgets[0]), 'keyword')
  with open(os.path.join(finetuned, 'results.json'), encoding='utf-8') as f:
    assert json.load(f)['init_step'] == 2
  table = open(os.path.join(workdir, 'results.md'), encoding='utf-8').read()
  assert '| keyword (dev/accuracy) |' in table and '| from scratch | 0 | 0 |' in table
  scores, pretraining = table.split('### Pre-training')
  assert sum(line.startswith('| electra |') or line.startswith('| mlm |') for line in scores.splitlines()) == 4
  assert '| mlm |' in pretraining and '| - (no discriminator) | 6 |' in pretraining  # one row per run
  with open(os.path.join(workdir, 'compare.png'), 'rb') as f:
    assert f.read(8) == b'\x89PNG\r\n\x1a\n'
  from PIL import Image  # noqa: PLC0415  (matplotlib's dependency)
  with Image.open(os.path.join(workdir, 'compare.png')) as image:
    image.verify()

  # Again: everything is found done, nothing trains, the same results come back.
  def fail(*args, **kwargs):
    raise AssertionError('a finished run was trained again')
  monkeypatch.setattr(compare.trainer, 'train', fail)
  monkeypatch.setattr(compare.finetune, 'run', fail)
  assert compare.run(config, workdir) == results

  # A finished run with other settings is refused rather than reused.
  config.finetune.epochs = 2.0
  with pytest.raises(ConfigError, match='other settings.*epochs'):
    compare.run(config, workdir)


def test_gpu_preset_is_the_papers_small_at_1e16():
  # What the preset's docstring and docs/experiments.md state: ELECTRA-Small with the paper's objective settings
  # against BERT-Small on the same encoder, one budget of 1e16 FLOPs, held-out evaluation, checkpoints only at the
  # budgets, and its step counts.
  config = compare_gpu.get_config()
  assert config.objectives == ('electra', 'mlm') and config.flops_budgets == (1e16,) and config.seeds == 3
  assert [os.path.basename(t) for t in config.tasks] == ['polarity', 'hedge', 'pos']
  electra, mlm = _gpu_preset_runs(config, vocab_size=30522)
  assert electra.model == mlm.model and electra.model.tower(False).num_layers == 12
  assert (electra.model.hidden_size, electra.model.embedding_size, electra.model.tower(True).hidden_size) == (256, 128,
                                                                                                               64)
  assert (electra.objective.temperature, electra.objective.mask_prob, electra.objective.disc_weight) == (1.0, 0.15, 50)
  assert (electra.batch_size, electra.data.max_seq_length, electra.optimizer.learning_rate) == (128, 128, 5e-4)
  assert (mlm.objective.mask_token_prob, mlm.objective.random_token_prob) == (0.8, 0.1)
  assert electra.eval_every and electra.data.eval_fraction and electra.checkpoint_every > 10**6
  # By hand (matmul FLOPs, 3 x forward, per sequence of L=128 with P=round(0.15 x 128)=19 predictions; V=30522):
  # a discriminator layer per token 2(4 H^2 + 2 H F) + 4 L H = 1,703,936 (H=256, F=1024), x 12 + the E->H projection
  # 2 E H (E=128) = 20,512,768; the RTD head 2(H^2 + H) = 131,584; a generator layer (H=64, F=256) 131,072, x 12 +
  # 2 E H = 1,589,248; its MLM head 2(H E + E V) = 7,830,016 per prediction. ELECTRA: 128 (20,512,768 + 131,584 +
  # 1,589,248) + 19 x 7,830,016 = 2,994,671,104; MLM (the discriminator-sized tower and head, 2(256 E + E V) =
  # 7,879,168): 128 x 20,512,768 + 19 x 7,879,168 = 2,775,338,496. Times 3 x 128 sequences: 1.14995e12 and
  # 1.06573e12 FLOPs per step, so 1e16 FLOPs are 8696.0 and 9383.2 steps.
  assert [objective.train_flops_per_step(c) for c in (electra, mlm)] == [3 * 128 * 2_994_671_104,
                                                                          3 * 128 * 2_775_338_496]
  assert [compare.steps_for_budget(1e16, objective.train_flops_per_step(c)) for c in (electra, mlm)] == [8696, 9383]


def _gpu_preset_runs(config, vocab_size):
  """The electra and mlm pre-training configs the runner makes of a compare_gpu preset."""
  runs = []
  for name in config.objectives:
    run = ml_collections.ConfigDict(config.pretrain.to_dict())
    run.objective.name = name
    compare._override(run, config.overrides.get(name, {}), name)  # pylint: disable=protected-access
    runs.append(config_lib.load(run, vocab_size=vocab_size))
  return runs


def test_gpu_preset_tiny_step_counts_by_hand():
  # The :tiny variant's budget in steps, which the end-to-end test below and the preset's docstring state.
  # By hand (as above, L=32, P=int(0.155 x 32)=4, V=64, E=32, 1 layer): the discriminator (H=32, F=64) per token
  # 2(4 H^2 + 2 H F) + 4 L H = 20,480 (E = H: no projection); the RTD head 2(H^2 + H) = 2,112; the generator
  # (H=16, F=64) 2(4 x 256 + 2 x 16 x 64) + 4 x 32 x 16 = 8,192, plus its E->H projection 2 x 32 x 16 = 1,024;
  # its MLM head 2(16 x 32 + 32 x 64) = 5,120 per prediction. ELECTRA: 32 (20,480 + 2,112 + 9,216) + 4 x 5,120 =
  # 1,038,336 per sequence; MLM (the discriminator-sized tower, head 2(32 x 32 + 32 x 64) = 6,144): 32 x 20,480 +
  # 4 x 6,144 = 679,936. Times 3 x 8 sequences, 4e9 FLOPs are 4e9 / 24,920,064 = 160.5 and 4e9 / 16,318,464 =
  # 245.1 steps.
  config = compare_gpu.get_config('tiny')
  assert config.flops_budgets == (4e9,)
  electra, mlm = _gpu_preset_runs(config, vocab_size=64)
  assert [objective.train_flops_per_step(c) for c in (electra, mlm)] == [24 * 1_038_336, 24 * 679_936]
  assert [compare.steps_for_budget(4e9, objective.train_flops_per_step(c)) for c in (electra, mlm)] == [161, 245]
  # ELECTRA-Small's 5 steps a call (configs/small.py), kept at this size: the nearest multiples of 5.
  assert electra.steps_per_call == mlm.steps_per_call == 5
  assert ([compare.steps_for_budget(4e9, objective.train_flops_per_step(c), multiple=5) for c in (electra, mlm)]
          == [160, 245])


@pytest.mark.e2e  # about a minute on 2 cores
def test_gpu_preset_tiny_end_to_end_interrupted_and_resumed(tmp_path, grammar_corpus, cache_dir):
  # The GPU preset's :tiny variant through the command line, on generated text and three generated tasks named as
  # the real ones: interrupted (SIGTERM) during the electra pre-training, then the same command again finishes it
  # from the checkpoint the signal wrote, and the rest of the experiment.
  tasks = [make_tsv_task(tmp_path / 'polarity', sizes=(48, 32)), make_tsv_task(tmp_path / 'hedge', seed=1,
                                                                                   sizes=(48, 32)),
           make_conll_task(tmp_path / 'pos', sizes=(48, 32))]
  workdir = tmp_path / 'cmp'
  command = [sys.executable, '-m', 'electra_jax.experiments.compare',
             '--config=configs/experiments/compare_gpu.py:tiny', f'--workdir={workdir}',
             f'--config.pretrain.data.source={grammar_corpus}',
             '--config.tasks=' + ','.join(f"'{t}'" for t in tasks)]
  metrics = workdir / 'pretrain' / 'electra' / 'metrics.jsonl'
  with subprocess.Popen(command, cwd=REPO, stderr=subprocess.PIPE, text=True) as first:
    while not (metrics.is_file() and metrics.read_text().count('\n') >= 2) and first.poll() is None:
      time.sleep(0.05)
    first.send_signal(signal.SIGTERM)  # 20 of its 160 steps done (worked out by hand above)
    stderr = first.communicate(timeout=300)[1]
  assert first.returncode == 1 and 'run the same command again' in stderr.splitlines()[-1], stderr[-2000:]
  # compare_gpu's precompile: both runs' steps and every task's fine-tuning steps compiled before electra trained.
  assert re.search(r'^mlm: compiled the train step in [0-9.]+ s.*; compiled the evaluation step in ', stderr, re.M)
  assert re.search(r'^fine-tuning pos: compiled the pos fine-tuning step in .*; compiled the pos evaluation step in ',
                   stderr, re.M)
  stopped = int(checkpoint.Checkpointer(str(workdir / 'pretrain' / 'electra'), read_only=True).latest_step())
  assert 20 <= stopped < 160 and stopped % 5 == 0 and not (workdir / 'pretrain' / 'mlm').exists()
  # What finished before the signal is in the table already: the from-scratch baseline, fine-tuned first.
  cut_short = json.loads((workdir / 'results.json').read_text())
  assert set(cut_short['scratch']) == {'polarity', 'hedge', 'pos'} and cut_short['objectives'] == {}
  assert '| from scratch |' in (workdir / 'results.md').read_text()

  second = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
  assert second.returncode == 0, second.stderr[-3000:]
  assert f'resuming from checkpoint {stopped}' in second.stderr
  steps = [json.loads(line)['step'] for line in metrics.read_text().splitlines()]
  assert steps == sorted(set(steps)) and steps[-1] == 160  # each step logged once: resumed, not restarted
  # Checkpoints at the budget (and where the signal stopped electra) only.
  assert sorted(os.listdir(workdir / 'pretrain' / 'electra' / 'checkpoints'), key=int) == [str(stopped), '160']
  assert os.listdir(workdir / 'pretrain' / 'mlm' / 'checkpoints') == ['245']

  results = json.loads((workdir / 'results.json').read_text())
  assert list(results['tasks']) == ['polarity', 'hedge', 'pos'] and results['seeds'] == 3
  for name, steps in (('electra', 160), ('mlm', 245)):
    (entry,) = results['objectives'][name]['budgets']
    assert entry['steps'] == steps and set(entry['tasks']) == {'polarity', 'hedge', 'pos'}
    summary = results['objectives'][name]['pretraining']
    assert summary['last_eval']['step'] == steps and summary['tokens_per_second'] > 0
  assert 'left_prior_step' in results['objectives']['electra']['pretraining']
  assert 'left_prior_step' not in results['objectives']['mlm']['pretraining']  # no discriminator
  assert results['scratch']['pos']['metric'] == 'dev/token_accuracy'
  table = (workdir / 'results.md').read_text()
  assert '| polarity (dev/accuracy) | hedge (dev/accuracy) | pos (dev/token_accuracy) |' in table
  assert '| mlm | 4e+09 | 245 |' in table and '| - (no discriminator) | 245 | - | - |' in table
  assert (workdir / 'compare.png').read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


def test_pretraining_summary_by_hand(tmp_path):
  # Logged rows and held-out evaluations as the trainer writes them: the median speed, the first evaluation at
  # eval_disc_recall >= 0.02 with a precision twice the share replaced (step 15: a fresh discriminator flagging at
  # chance, 0.16 where 0.13 are replaced), the last evaluation's numbers. A last line cut short is not a row.
  rows = [{'step': 10, 'tokens_per_second': 300.0}, {'step': 20, 'tokens_per_second': 100.0},
          {'step': 15, 'eval_disc_recall': 0.21, 'eval_disc_precision': 0.16, 'eval_replaced_fraction': 0.13},
          {'step': 20, 'eval_disc_recall': 0.0, 'eval_disc_auc': 0.8, 'eval_gen_accuracy': 0.1},
          {'step': 30, 'tokens_per_second': 200.0, 'eval_disc_recall': 0.019, 'eval_disc_auc': 0.85},
          {'step': 40, 'eval_disc_recall': 0.02, 'eval_disc_precision': 0.26, 'eval_replaced_fraction': 0.13,
           'eval_disc_auc': 0.9, 'eval_gen_accuracy': 0.3},
          {'step': 50, 'eval_disc_recall': 0.5, 'eval_disc_auc': 0.95, 'eval_gen_accuracy': 0.4, 'eval_loss': 9.0}]
  (tmp_path / 'metrics.jsonl').write_text(''.join(json.dumps(row) + '\n' for row in rows) + '{"step": 60, "tokens_p')
  summary = compare.pretraining_summary(str(tmp_path))
  assert summary == {'tokens_per_second': 200.0, 'left_prior_step': 40, 'last_eval': {
      'step': 50, 'eval_disc_recall': 0.5, 'eval_disc_auc': 0.95, 'eval_gen_accuracy': 0.4}}
  results = {'objectives': {'electra': {'flops_per_step': 1e9, 'pretraining': summary},
                            'mlm': {'flops_per_step': 1e9, 'pretraining': {
                                'tokens_per_second': 1500.0, 'last_eval': {'step': 60, 'eval_mlm_accuracy': 0.25}}},
                            'never': {'flops_per_step': 1e9, 'pretraining': {
                                'left_prior_step': None, 'last_eval': {'step': 70, 'eval_disc_recall': 0.0}}}}}
  assert compare._pretraining_table(results)[-3:] == [  # pylint: disable=protected-access
      '| electra | 200 | step 40 (4e+10 FLOPs) | 50 | 0.500 | 0.950 | 0.400 (generator) |',
      '| mlm | 1,500 | - (no discriminator) | 60 | - | - | 0.250 |',
      '| never | - | not by step 70 | 70 | 0.000 | - | - |']
  assert compare.pretraining_summary(str(tmp_path / 'none')) == {}


def fake_finetune(c, workdir):
  """Stands in for finetune.run: scores that name the checkpoint step, for two seeds."""
  del workdir
  scores = [0.5 + 0.01 * c.init_step, 0.6 + 0.01 * c.init_step]
  return {'main_metric': 'dev/accuracy', 'seeds': [{'seed': i, 'dev/accuracy': x} for i, x in enumerate(scores)],
          'median': {'dev/accuracy': sum(scores) / 2}}


@pytest.mark.e2e  # a whole experiment (the README suite's 5-minute bound)
def test_finetune_budgets_stop_early_and_a_frozen_generator_from_the_experiment(tmp_path, grammar_corpus, cache_dir,
                                                                                monkeypatch):
  config = tiny_config(grammar_corpus, cache_dir, str(tmp_path / 'task'))
  config.objectives = ('mlm', 'electra_floor_frozen')
  workdir = tmp_path / 'cmp'
  per_step = {p.name: p for p in compare.plan(config, str(workdir))}
  frozen_plan = per_step['electra_floor_frozen']
  assert frozen_plan.config.objective.generator_checkpoint == str(workdir / 'pretrain' / 'mlm')
  config.flops_budgets = (2.2 * frozen_plan.flops_per_step, 4.2 * frozen_plan.flops_per_step)
  config.finetune_budgets = (config.flops_budgets[0],)
  monkeypatch.setattr(compare.finetune, 'run', fake_finetune)
  monkeypatch.setattr(compare.tasks_lib, 'get_task', lambda task: type('Task', (), {'name': 'keyword'}))

  results = compare.run(config, str(workdir))
  plans = {p.name: p for p in compare.plan(config, str(workdir))}
  mlm_steps, frozen_steps = plans['mlm'].steps, plans['electra_floor_frozen'].steps
  assert frozen_steps == (2, 4) and mlm_steps[0] < mlm_steps[1]
  # Only the first budget is fine-tuned, and each pre-training stopped there, on the schedule of the last budget.
  for name, steps in (('mlm', mlm_steps), ('electra_floor_frozen', frozen_steps)):
    assert [e['steps'] for e in results['objectives'][name]['budgets']] == [steps[0]]
    assert os.listdir(workdir / 'pretrain' / name / 'checkpoints') == [str(steps[0])]
    assert config_files.load_config(str(workdir / 'pretrain' / name)).train_steps == steps[1]
  # The frozen generator is the mlm run at its first budget; its training cost is stated apart.
  saved = config_files.load_config(str(workdir / 'pretrain' / 'electra_floor_frozen'))
  assert saved.objective.generator_step == mlm_steps[0]
  generator_cost = mlm_steps[0] * plans['mlm'].flops_per_step
  assert results['objectives']['electra_floor_frozen']['generator_train_flops'] == pytest.approx(generator_cost)
  assert f'its frozen generator cost {generator_cost:.3g} FLOPs to train' in (workdir / 'results.md').read_text()
  # The trainer counts the frozen generator's forward passes as the plan does.
  with open(workdir / 'pretrain' / 'electra_floor_frozen' / 'metrics.jsonl', encoding='utf-8') as f:
    assert json.loads(f.readlines()[-1])['train_flops'] == pytest.approx(2 * frozen_plan.flops_per_step)

  # Every budget now: the same runs resume to the last budget; nothing restarts.
  config.finetune_budgets = ()
  results = compare.run(config, str(workdir))
  for name, steps in (('mlm', mlm_steps), ('electra_floor_frozen', frozen_steps)):
    assert [e['steps'] for e in results['objectives'][name]['budgets']] == list(steps)
    assert sorted(os.listdir(workdir / 'pretrain' / name / 'checkpoints'), key=int) == [str(s) for s in steps]
    with open(workdir / 'pretrain' / name / 'metrics.jsonl', encoding='utf-8') as f:
      assert [json.loads(line)['step'] for line in f] == list(range(1, steps[1] + 1))

  config.finetune_budgets = (1e9,)
  with pytest.raises(ConfigError, match='finetune_budgets'):
    compare.plan(config, str(workdir))


def test_task_overrides_change_one_tasks_finetuning(tmp_path, grammar_corpus, cache_dir, monkeypatch, capsys):
  config = tiny_config(grammar_corpus, cache_dir, 'keyword_dir')
  config.tasks = ('keyword_dir', 'other_dir')
  config.objectives = ('mlm',)
  config.flops_budgets = (2.2 * compare.plan(config)[0].flops_per_step,)
  config.task_overrides.keyword = {'epochs': 7.0, 'optimizer': {'learning_rate': 3e-4}}
  seen = []
  def record(c, workdir):
    seen.append((os.path.relpath(workdir, tmp_path), c.epochs, c.optimizer.learning_rate))
    return fake_finetune(c, workdir)
  monkeypatch.setattr(compare.finetune, 'run', record)
  # Task 'keyword_dir' is named 'keyword', 'other_dir' 'other'.
  monkeypatch.setattr(compare.tasks_lib, 'get_task', lambda task: type('Task', (), {'name': task[:-4]}))
  monkeypatch.setattr(compare, 'pretrain', lambda *args: None)  # the recipes are the subject, not the checkpoints
  compare.run(config, str(tmp_path / 'cmp'))
  # keyword's recipe for the from-scratch baseline and the checkpoint alike; other keeps tiny_config's (1 epoch)
  # and compare_cpu's lr 1e-3.
  budget = f'cmp/finetune/mlm/{compare.budget_name(config.flops_budgets[0])}'
  assert sorted(seen) == [(f'{budget}/keyword', 7.0, 3e-4), (f'{budget}/other', 1.0, 1e-3),
                          ('cmp/scratch/keyword', 7.0, 3e-4), ('cmp/scratch/other', 1.0, 1e-3)]
  # compare_cpu's polarity entry names no task here: said, not an error.
  assert "task_overrides.polarity: no task is named 'polarity' (keyword, other); not used" in capsys.readouterr().err

  # A key the fine-tuning config lacks fails before any pre-training.
  config.task_overrides.keyword.optimizer.learnig_rate = 1.0
  monkeypatch.setattr(compare, 'pretrain', lambda *args: pytest.fail('pre-trained'))
  with pytest.raises(ConfigError, match=r"task_overrides.keyword.optimizer.learnig_rate: the fine-tuning config has "
                                        r"no key 'learnig_rate' \(see configs/finetune.py\)"):
    compare.run(config, str(tmp_path / 'new'))


def results_fixture(workdir, runs: dict, seeds=2, scratch=0.5):
  """A compare results.json in `workdir`: runs {name: {budget: score}} on one task 'keyword'."""
  cell = lambda x: {'metric': 'dev/accuracy', 'seeds': list(range(seeds)), 'scores': [x] * seeds, 'median': x}
  results = {'flops_budgets': sorted({b for r in runs.values() for b in r}), 'seeds': seeds,
             'tasks': {'keyword': 'DIR'}, 'scratch': {'keyword': cell(scratch)},
             'objectives': {name: {'objective': 'electra', 'flops_per_step': 1e9, 'budgets': [
                 {'budget': b, 'steps': int(b / 1e9), 'train_flops': b, 'tasks': {'keyword': cell(x)}}
                 for b, x in sorted(r.items())]} for name, r in runs.items()}}
  os.makedirs(workdir, exist_ok=True)
  compare.write_results(results, str(workdir))
  return str(workdir)


def test_a_workdir_holding_another_run_is_refused(tmp_path):
  """A fine-tuning run's workdir given as --workdir (or --output of merge): its results.json was rewritten with
  the compare's, in silence."""
  (tmp_path / 'tuned').mkdir()
  (tmp_path / 'tuned' / 'finetune.json').write_text('{}')
  (tmp_path / 'tuned' / 'results.json').write_text('{"main_metric": "accuracy"}')
  with pytest.raises(ConfigError, match=r'^--workdir=.*tuned holds another run \(finetune.json\)'):
    compare.run(compare_cpu.get_config(), str(tmp_path / 'tuned'))
  (tmp_path / 'tuned' / 'finetune.json').unlink()
  a = results_fixture(tmp_path / 'a', {'electra': {1e12: 0.6}})
  with pytest.raises(ConfigError, match=r'^--output=.*tuned holds another run \(results.json\)'):
    compare.merge([a], str(tmp_path / 'tuned'))
  assert (tmp_path / 'tuned' / 'results.json').read_text() == '{"main_metric": "accuracy"}'
  compare.merge([a], str(tmp_path / 'a'))  # a compare's own results: written again


def test_precompile_waits_for_a_frozen_generator_to_be_trained(tmp_path, monkeypatch):
  """electra_floor_frozen samples from this experiment's mlm run: preparing it before mlm had trained stopped the
  whole command ('... has no config.json'); it compiles when it trains."""
  prepared = []
  monkeypatch.setattr(compare.trainer, 'precompile', lambda c, w: prepared.append(os.path.basename(w)) or list)
  monkeypatch.setattr(compare.finetune, 'precompile', lambda c, w: list)
  config = compare_cpu.get_config()
  config.flops_budgets = (1e10,)
  frozen = {'name': 'electra_frozen', 'generator_checkpoint': str(tmp_path / 'pretrain' / 'mlm'), 'generator_step': 8}
  plans = [compare.Plan('mlm', ml_collections.ConfigDict({'objective': {'name': 'mlm'}}), 1e9, (8,)),
           compare.Plan('frozen', ml_collections.ConfigDict({'objective': frozen}), 1e9, (8,))]
  compare._precompile(config, plans, {}, tmp_path)  # pylint: disable=protected-access
  assert prepared == ['mlm']
  monkeypatch.setattr(compare, '_saved_steps', lambda w: {1000} if w.endswith('my_mlm') else set())
  outside = dict(frozen, generator_checkpoint='/runs/my_mlm', generator_step=0)  # another run's latest
  plans[1] = compare.Plan('frozen', ml_collections.ConfigDict({'objective': outside}), 1e9, (8,))
  prepared.clear()
  compare._precompile(config, plans, {}, tmp_path)  # pylint: disable=protected-access
  assert prepared == ['mlm', 'frozen']


def test_the_plot_of_one_budget_shows_each_run_at_it(tmp_path):
  """The GPU preset's case: one budget, runs whose train_flops differ by a fraction of a step. Drawn at their
  train_flops on a log axis they sat at its two edges, the axis a few ticks of 1e16's rounding."""
  results_fixture(tmp_path, {'electra': {1e16: 0.7}, 'mlm': {1e16: 0.6}})
  results = json.loads((tmp_path / 'results.json').read_text())
  results['objectives']['electra']['budgets'][0]['train_flops'] = 9.999e15
  results['objectives']['mlm']['budgets'][0]['train_flops'] = 1.0002e16
  (axis,) = compare.figure(results).axes
  lines = {bars.get_label(): bars.lines[0] for bars in axis.containers}  # each run's errorbar: its data line
  xs = [float(lines[name].get_xdata()[0]) for name in ('electra', 'mlm')]
  assert xs[0] < 1e16 < xs[1] and xs[1] / xs[0] < 1.2  # side by side at the budget
  assert axis.get_xlim()[1] / axis.get_xlim()[0] >= 9  # a decade at least
  assert [float(lines[name].get_ydata()[0]) for name in ('electra', 'mlm')] == [70.0, 60.0]


def test_merge_workdirs_into_one_table_and_plot(tmp_path, capsys):
  a = results_fixture(tmp_path / 'a', {'electra': {1e12: 0.6, 3e12: 0.7}, 'mlm': {1e12: 0.55}})
  b = results_fixture(tmp_path / 'b', {'electra_gdes': {1e12: 0.65}, 'mlm': {3e12: 0.58}}, scratch=0.51)
  merged = compare.merge([a, b], str(tmp_path / 'out'))
  assert merged['flops_budgets'] == [1e12, 3e12] and merged['merged_from'] == [a, b]
  assert list(merged['objectives']) == ['electra', 'mlm', 'electra_gdes']
  assert [(e['budget'], e['tasks']['keyword']['median']) for e in merged['objectives']['mlm']['budgets']] == [
      (1e12, 0.55), (3e12, 0.58)]  # mlm's budgets from both workdirs
  assert merged['scratch']['keyword']['median'] == 0.5  # the first workdir's
  table = (tmp_path / 'out' / 'results.md').read_text()
  assert '| mlm | 3e+12 | 3000 | 58.00 [58.00-58.00] |' in table and '| electra_gdes | 1e+12 | 1000 |' in table
  assert (tmp_path / 'out' / 'compare.png').read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
  assert json.loads((tmp_path / 'out' / 'results.json').read_text()) == json.loads(json.dumps(merged))

  with pytest.raises(ConfigError, match='same seeds'):
    compare.merge([a, results_fixture(tmp_path / 'c', {'x': {1e12: 0.5}}, seeds=3)], str(tmp_path / 'out2'))
  with pytest.raises(ConfigError, match='other scores'):
    compare.merge([a, results_fixture(tmp_path / 'd', {'electra': {1e12: 0.9}})], str(tmp_path / 'out3'))
  other = results_fixture(tmp_path / 'g', {'electra': {3e13: 0.8}})  # another model: other FLOPs a step
  results = json.loads((tmp_path / 'g' / 'results.json').read_text())
  results['objectives']['electra']['flops_per_step'] = 1.15e12
  compare.write_results(results, other)
  with pytest.raises(ConfigError, match='both hold a run electra, of other settings .electra at 1.15e.12 FLOPs'):
    compare.merge([a, other], str(tmp_path / 'out4'))
  # The command line: one table on stderr; a workdir without results is one line and exit status 1.
  result = subprocess.run([sys.executable, '-m', 'electra_jax.experiments.compare', 'merge', a, b,
                           f'--output={tmp_path / "cli"}'], cwd=REPO, capture_output=True, text=True, timeout=120,
                          check=False)
  assert result.returncode == 0 and '| electra_gdes |' in result.stderr
  assert (tmp_path / 'cli' / 'results.md').read_text() == table
  capsys.readouterr()
  with pytest.raises(SystemExit) as exited:  # the same command in this process (the first ran its __main__)
    compare.merge_main([str(tmp_path), f'--output={tmp_path / "cli2"}'])
  assert exited.value.code == 1
  assert capsys.readouterr().err == f'error: {tmp_path} has no results.json: give the --workdir of compare runs\n'
  (tmp_path / 'e').mkdir()
  (tmp_path / 'e' / 'results.json').write_text('{"seeds": 1, "tas')  # cut short
  with pytest.raises(SystemExit) as exited:
    compare.merge_main([a, str(tmp_path / 'e'), f'--output={tmp_path / "cli3"}'])
  assert exited.value.code == 1
  assert capsys.readouterr().err.startswith(f'error: {tmp_path / "e" / "results.json"} is damaged (not a JSON object')
