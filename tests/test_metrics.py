"""metrics.MetricsWriter: what a run and its resumptions leave in WORKDIR."""

import json
import os
import subprocess
import sys
import types

from tensorboardX import event_file_writer

from electra_jax import metrics


def test_a_resume_within_the_same_second_keeps_the_first_events_file(tmp_path, monkeypatch):
  """tensorboardX names an events file by the second it opens it and opens it from the start: without a suffix of
  our own, a resumption that starts in the same second (as in the tests, where a stopped run resumes at once)
  writes over the first invocation's events."""
  monkeypatch.setattr(event_file_writer, 'time', types.SimpleNamespace(time=lambda: 1_800_000_000.25))
  events = tmp_path / 'tensorboard'
  first = metrics.MetricsWriter(tmp_path)
  first.write(1, {'loss': 2.0})
  first.write(2, {'loss': 1.75})
  first.close()
  (name,) = os.listdir(events)
  written = (events / name).read_bytes()
  second = metrics.MetricsWriter(tmp_path, resumed_at=1)  # step 2 is trained again
  second.write(2, {'loss': 1.5})
  second.close()
  names = sorted(os.listdir(events))
  assert len(names) == 2 and names[0] == name  # the first invocation's file sorts first
  assert (events / name).read_bytes() == written
  with open(tmp_path / 'metrics.jsonl', encoding='utf-8') as f:
    assert [json.loads(line) for line in f] == [{'step': 1, 'loss': 2.0}, {'step': 2, 'loss': 1.5}]


def test_the_writer_loads_tensorboardx_without_torch(tmp_path):
  """tensorboardX imports torch when it can; the writer keeps it from doing so (seconds of a run's start where torch
  is installed, as on GPU machines), and torch still imports afterwards. A fresh interpreter: this one may hold
  torch already."""
  script = ('import sys\nfrom electra_jax import metrics\n'
            f'w = metrics.MetricsWriter({str(tmp_path)!r})\nw.write(1, {{"loss": 2.0}})\nw.close()\n'
            'print("torch" in sys.modules)\n'
            'import torch\nprint(torch.ones(2).sum().item())\n')
  done = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True, check=False)
  assert done.returncode == 0, done.stderr[-2000:]
  assert done.stdout.split() == ['False', '2.0']
  assert os.listdir(tmp_path / 'tensorboard') and metrics.read(tmp_path / 'metrics.jsonl') == [{'step': 1, 'loss': 2.0}]
