"""What a run tells its user: the end-of-run summary (report.py) and the training-curve plot (plot.py)."""

import json
import os

import jax
import pytest

from electra_jax import plot, report, scaffold


def test_summary_names_the_metrics_checkpoint_and_next_commands():
  text = report.pretraining_summary('runs/my run', {'loss': 21.5, 'gen_accuracy': 0.25, 'disc_recall': 0.125,
                                                    'tokens_per_second': 9999.0},
                                    start_step=0, step=1000, train_steps=1000, seconds=208.4,
                                    checkpoint='runs/my run/checkpoints/1000')
  lines = text.splitlines()
  assert lines[0] == 'pre-training finished at step 1000 of 1000 (1000 steps in 3 min 28 s with start-up)'
  assert lines[1] == '  final metrics: loss 21.5  gen_accuracy 0.25  disc_recall 0.125'
  assert '  newest checkpoint: runs/my run/checkpoints/1000' in lines
  # The next commands, with the workdir filled in (quoted: it has a space) and runnable as printed.
  commands = [line.split('   #')[0].strip() for line in lines if line.startswith('  python -m')]
  assert commands == [
      "python -m electra_jax.plot 'runs/my run' --output=curves.png",
      "python -m electra_jax.detect --checkpoint 'runs/my run' \"the chef ate the meal\"",
      "python -m electra_jax.main --config=configs/finetune.py --config.task=TASK "
      "--config.init_checkpoint='runs/my run' --workdir='runs/my run_TASK'",
      "python -m electra_jax.convert --checkpoint 'runs/my run' --to-hf 'runs/my run_hf'",
  ]
  assert 'resume' not in text


def test_summary_of_a_stopped_run_says_how_to_resume():
  text = report.pretraining_summary('/tmp/w', {}, start_step=200, step=250, train_steps=1000, seconds=3725,
                                    checkpoint='/tmp/w/checkpoints/250')
  assert text.startswith('pre-training stopped at step 250 of 1000 (50 steps in 1 h 02 min 05 s with start-up)\n')
  assert 'final metrics' not in text and 'resume: run the same command again' in text
  # An MLM run has no replaced-token head: no detect or convert command (it suggested both, which then refused).
  mlm = report.pretraining_summary('/tmp/w', {}, start_step=0, step=9, train_steps=9, seconds=1, checkpoint=None,
                                   detects=False)
  assert 'electra_jax.plot' in mlm and 'finetune.py' in mlm
  assert 'electra_jax.detect' not in mlm and 'electra_jax.convert' not in mlm  # convert refuses it too


def _write_metrics(directory, records):
  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, 'metrics.jsonl'), 'w', encoding='utf-8') as f:
    f.writelines(json.dumps(r) + '\n' for r in records)
    f.write('{"step": 9, "lo')  # a line cut short by a crash: skipped
  return str(directory)


def test_plot_overlays_runs_one_panel_per_metric(tmp_path, capsys):
  a = _write_metrics(tmp_path / 'a', [{'step': s, 'loss': 10.0 - s, 'gen_accuracy': 0.1 * s, 'disc_recall': 0.0,
                                       'tokens_per_second': 5.0} for s in (1, 2, 3)])
  b = _write_metrics(tmp_path / 'b', [{'step': s, 'loss': 9.0 - s, 'gen_accuracy': 0.05 * s} for s in (2, 4)])
  runs = {label: plot.read_metrics(path) for label, path in plot.find_runs([a, b]).items()}
  assert sorted(runs) == ['a', 'b'] and len(runs['a']) == 3
  metrics = plot.choose_metrics(runs)
  assert metrics == ['loss', 'gen_accuracy', 'disc_recall']  # DEFAULT_METRICS' order; no counters
  figure = plot.plot(runs, metrics)
  panels = [ax for ax in figure.axes if ax.get_visible()]
  assert [ax.get_title() for ax in panels] == metrics
  assert [len(ax.get_lines()) for ax in panels] == [2, 2, 1]  # b logged no disc_recall
  xs, ys = panels[0].get_lines()[1].get_data()
  assert list(xs) == [2, 4] and list(ys) == [7.0, 5.0]
  # The command line writes the PNG.
  output = tmp_path / 'curves.png'
  plot.main([a, b, f'--output={output}'])
  assert output.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
  assert capsys.readouterr().out == f'wrote {output}: 3 metrics of 2 run(s)\n'


def test_plot_draws_the_held_out_curves_dashed_beside_the_training_ones(tmp_path):
  """eval_* metrics (held-out evaluation, on the training line or a line of their own) join their metric's panel."""
  records = [{'step': s, 'loss': 10.0 - s, 'disc_recall': 0.1 * s} for s in (1, 2, 3, 4)]
  records[1].update(eval_loss=8.5, eval_disc_recall=0.0, eval_disc_auc=0.6, eval_seconds=2.0)
  records.append({'step': 4, 'eval_loss': 7.5, 'eval_disc_recall': 0.25, 'eval_disc_auc': 0.75, 'eval_seconds': 1.0})
  runs = {'a': plot.read_metrics(os.path.join(_write_metrics(tmp_path / 'a', records), 'metrics.jsonl'))}
  metrics = plot.choose_metrics(runs)
  assert metrics == ['loss', 'disc_recall', 'eval_disc_auc']  # eval_loss and eval_disc_recall: in those panels
  panels = [ax for ax in plot.plot(runs, metrics).axes if ax.get_visible()]
  (train, held_out), = [panels[0].get_lines()]
  assert list(train.get_xdata()) == [1, 2, 3, 4] and list(held_out.get_xdata()) == [2, 4]
  assert list(held_out.get_ydata()) == [8.5, 7.5] and held_out.get_linestyle() == '--'
  assert held_out.get_color() == train.get_color() and held_out.get_label() == 'a (held-out)'
  assert list(panels[2].get_lines()[0].get_ydata()) == [0.6, 0.75] and len(panels[2].get_lines()) == 1
  # Asked for by name, a held-out metric is a panel of its own.
  assert plot.choose_metrics(runs, ['eval_loss']) == ['eval_loss']
  # Both asked for: the held-out curve is drawn in its own panel only, not dashed in loss's too.
  both = [ax for ax in plot.plot(runs, ['loss', 'eval_loss']).axes if ax.get_visible()]
  assert [[list(line.get_ydata()) for line in ax.get_lines()] for ax in both] == [[[9, 8, 7, 6]], [[8.5, 7.5]]]
  # A run without training metrics of the usual names (fine-tuning): eval_M still goes to M's panel.
  tuned = {'t': [{'step': 1, 'accuracy': 0.5, 'eval_accuracy': 0.4}, {'step': 2, 'accuracy': 0.7}]}
  assert plot.choose_metrics(tuned) == ['accuracy']


def test_plot_draws_a_curve_of_one_point_as_a_dot(tmp_path):
  """A metric logged once (one held-out evaluation, a run one step in) or with one value not NaN is a line from a
  point to itself: invisible without a marker. Curves of several points stay plain lines."""
  records = [{'step': 1, 'loss': 9.0, 'disc_recall': float('nan')}, {'step': 2, 'loss': 8.0, 'eval_loss': 8.5},
             {'step': 3, 'disc_recall': 0.1}]
  panels = [ax for ax in plot.plot({'a': records}, ['loss', 'disc_recall']).axes if ax.get_visible()]
  (train, held_out), (recall,) = [ax.get_lines() for ax in panels]
  assert list(held_out.get_xdata()) == [2] and list(recall.get_xdata()) == [1, 3]
  for line in (held_out, recall):
    assert line.get_marker() not in ('None', '', ' ', None) and line.get_markersize() > 0
  assert train.get_marker() == 'None'


def test_plot_reads_a_directory_of_seeds_and_labels_runs_apart(tmp_path):
  for seed in (0, 1):
    _write_metrics(tmp_path / 'x' / 'rte' / f'seed_{seed}', [{'step': 1, 'loss': 1.0}])
  _write_metrics(tmp_path / 'y' / 'rte' / 'seed_0', [{'step': 1, 'loss': 2.0}])
  found = plot.find_runs([str(tmp_path / 'x' / 'rte'), str(tmp_path / 'y' / 'rte' / 'seed_0')])
  assert sorted(found) == ['x/rte/seed_0', 'x/rte/seed_1', 'y/rte/seed_0']


def test_plot_labels_metrics_files_of_one_directory_by_their_names(tmp_path):
  """Two metrics files side by side have the same directory: each is labelled by its file, not both by the
  directory (one run would overwrite the other); a run alone in its directory keeps the directory's name."""
  for name, loss in (('a', 1.0), ('b', 2.0)):
    (tmp_path / 'same').mkdir(exist_ok=True)
    (tmp_path / 'same' / f'{name}.jsonl').write_text(json.dumps({'step': 1, 'loss': loss}) + '\n')
  _write_metrics(tmp_path / 'run', [{'step': 1, 'loss': 3.0}])
  found = plot.find_runs([str(tmp_path / 'same' / 'a.jsonl'), str(tmp_path / 'same' / 'b.jsonl'),
                          str(tmp_path / 'run')])
  assert found == {'a.jsonl': str(tmp_path / 'same' / 'a.jsonl'), 'b.jsonl': str(tmp_path / 'same' / 'b.jsonl'),
                   'run': str(tmp_path / 'run' / 'metrics.jsonl')}


@pytest.mark.parametrize('make, args, message', [
    (lambda p: None, ['{p}/missing'], 'does not exist'),
    (lambda p: os.makedirs(p / 'empty'), ['{p}/empty'], 'holds no metrics.jsonl'),
    (lambda p: _write_metrics(p / 'r', [{'step': 1, 'loss': 1.0}]), ['{p}/r', '--metrics=gen_acc'],
     'no run logged gen_acc; they logged loss'),
])
def test_plot_errors_are_one_line(tmp_path, capsys, make, args, message):
  make(tmp_path)
  with pytest.raises(SystemExit) as exit_info:
    plot.main([a.format(p=tmp_path) for a in args] + [f'--output={tmp_path}/out.png'])
  err = capsys.readouterr().err
  assert exit_info.value.code == 1 and err.startswith('error: ') and message in err and err.count('\n') == 1
  assert not os.path.exists(tmp_path / 'out.png')


def test_compiling_says_when_the_program_came_from_the_persistent_cache(capsys, monkeypatch):
  monkeypatch.setattr(report, 'clock', iter([10.0, 12.5, 20.0, 21.5]).__next__)
  assert report.compiled('the train step', lambda: 'compiled') == ('compiled', 'compiled the train step in 2.5 s')
  # what JAX records when the cache has the program:
  assert report.compiled('the train step', lambda: jax.monitoring.record_event(report.CACHE_HIT)) == (
      None, 'compiled the train step in 1.5 s (from the compilation cache)')
  assert capsys.readouterr().err == ''  # the caller prints the line (scaffold.compile_in_thread)


def test_compiling_says_how_long_each_stage_took(monkeypatch):
  """The durations JAX records of a compile's stages: a jit traced inside another records its own trace within the
  outer one's (the longest counts); from the cache, XLA's part is the loading."""
  def compile_fn(*durations, hit=False):
    for event, seconds in durations:
      jax.monitoring.record_event_duration_secs(event, seconds)
    if hit:
      jax.monitoring.record_event(report.CACHE_HIT)
  trace, lower, xla, load = report.STAGES
  monkeypatch.setattr(report, 'clock', iter([10.0, 40.0, 50.0, 60.0]).__next__)
  assert report.compiled('the train step', lambda: compile_fn((trace, 0.5), (trace, 1.9), (lower, 0.4), (xla, 27.7)))[
      1] == 'compiled the train step in 30.0 s (tracing 1.9 s, lowering 0.4 s, XLA 27.7 s)'
  assert report.compiled('the train step', lambda: compile_fn((trace, 1.9), (lower, 0.4), (load, 7.5), (xla, 7.6),
                                                              hit=True))[1] == (
      'compiled the train step in 10.0 s (from the compilation cache: tracing 1.9 s, lowering 0.4 s, loading 7.5 s)')


def test_compiling_in_a_thread_leaves_its_done_line_to_the_caller(capsys, monkeypatch):
  """scaffold.compile_in_thread says `compiling...` before its thread starts and hands its done line back: the
  thread prints nothing, so an error the run meets meanwhile stays its last line."""
  monkeypatch.setattr(report, 'clock', iter([10.0, 12.5]).__next__)
  future = scaffold.compile_in_thread('the evaluation step', lambda: 'the executable')
  assert capsys.readouterr().err == 'compiling the evaluation step...\n'
  assert future.result() == ('the executable', 'compiled the evaluation step in 2.5 s')
  assert capsys.readouterr().err == ''


def test_is_chief_reads_jax_without_starting_a_backend():
  """report.is_chief reads jax's private jax._src.distributed.global_state (no public call gives the process id
  without starting the backend): this fails when a jax upgrade moves it, and is_chief would fall back to
  jax.process_index()."""
  from jax._src import distributed  # noqa: PLC0415
  assert distributed.global_state.process_id == 0
  assert report.is_chief()


def test_help_says_what_the_command_does_and_lists_every_config():
  """`python -m electra_jax.main --help` prints this docstring (test_config checks it is printed)."""
  from electra_jax import main  # noqa: PLC0415  (defines the flags: only this test needs them)
  usage = main.__doc__
  assert usage.splitlines()[0].startswith('Pre-train an ELECTRA text encoder, fine-tune it')
  configs = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'configs')
  runnable = sorted(f'configs/{name}' for name in os.listdir(configs)
                    if name.endswith('.py') and name not in ('__init__.py', 'gpu.py'))  # gpu.py: the :gpu presets
  assert runnable and all(name in usage for name in runnable), runnable
  assert 'NAME.py:gpu' in usage


def test_plot_chooses_what_fine_tuning_and_held_out_only_files_logged(tmp_path, capsys):
  """Fine-tuning's dev scores and a file of held-out rows alone get their panels (the usual names hid them), any
  logged key may be asked for, an x axis a run never logged is one line (it drew empty panels), and a damaged
  line is skipped (one bad byte stopped the plot)."""
  tuned = {'seed_0': [{'step': s, 'loss': 1.0 / s, 'learning_rate': 1e-4, 'tokens_per_second': 9.0} for s in (1, 2)]}
  tuned['seed_0'][-1]['dev/accuracy'] = 0.75
  assert plot.choose_metrics(tuned) == ['loss', 'learning_rate', 'dev/accuracy']
  held_out = {'e': [{'step': 5, 'train_flops': 1e12, 'eval_loss': 3.0, 'eval_disc_recall': 0.5, 'eval_disc_auc': 0.7}]}
  assert plot.choose_metrics(held_out) == ['loss', 'disc_recall', 'eval_disc_auc']
  (panel, *_), = [[ax for ax in plot.plot(held_out, ['loss']).axes if ax.get_visible()]]
  assert [line.get_linestyle() for line in panel.get_lines()] == ['--']  # eval_loss, dashed in loss's panel
  assert plot.choose_metrics(tuned, ['tokens_per_second']) == ['tokens_per_second']
  with pytest.raises(plot.PlotError, match='^seed_0 logged no train_flops'):
    plot.plot(tuned, ['loss'], x='train_flops')
  path = tmp_path / 'metrics.jsonl'
  path.write_bytes(b'{"step": 1, "loss": 2.0}\n\xff\xfe garbage\n{"step": 2, "loss": 1.0}\n')
  assert [r['step'] for r in plot.read_metrics(str(path))] == [1, 2]
