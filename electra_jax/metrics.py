"""Where training metrics go: WORKDIR/metrics.jsonl (one JSON object per log step) and TensorBoard events."""

import json
import os
import sys
import time

import jax

from electra_jax import fileio


def summarize(accumulated) -> dict[str, float]:
  """{name: (sum of numerators, sum of denominators)} -> {name: ratio}, fetched from the device once."""
  host = jax.device_get(accumulated)
  return {name: float(num / den) if den > 0 else 0.0 for name, (num, den) in host.items()}


def accumulate(total, metrics):
  """Adds one step's on-device metrics to the running sums (stays on the device: no host sync)."""
  return metrics if total is None else jax.tree.map(lambda a, b: a + b, total, metrics)


FILE = 'metrics.jsonl'


def read(path) -> list[dict]:
  """The records of metrics.jsonl `path`, in order (a line cut short by a crash, or damaged, is skipped)."""
  records = []
  for line in fileio.path(path).read_bytes().splitlines():
    try:
      record = json.loads(line)
    except ValueError:  # UnicodeDecodeError too
      continue
    if isinstance(record, dict) and 'step' in record:
      records.append(record)
  return records


UPLOAD_SECONDS = 60.0  # how often a gs:// workdir's metrics.jsonl and TensorBoard events are brought up to date


class MetricsWriter:
  """Appends to metrics.jsonl and writes TensorBoard scalars; does nothing on processes other than 0.

  A run resumed from the checkpoint of step `resumed_at` first drops the lines of later steps (and a line cut
  short by a crash): those steps are trained again, so the file reads as one uninterrupted run. TensorBoard's
  `purge_step` does the same for the events. With a gs:// workdir both are written to a local staging directory
  (`fileio.Staging`: objects cannot be appended to) and uploaded every `UPLOAD_SECONDS` and when it closes.
  """

  def __init__(self, workdir, resumed_at: int = 0):
    self.active = jax.process_index() == 0
    self.jsonl = self.tensorboard = self.staging = None
    if not self.active:
      return
    SummaryWriter = _summary_writer()  # noqa: N806  (a class)
    self.staging = fileio.Staging(workdir, fetch=[FILE])
    path = self.staging.local / FILE
    if path.exists():
      _truncate_after(path, resumed_at)
    self.jsonl = open(path, 'a', encoding='utf-8')
    # tensorboardX names the events file by the second it opens it, and opens it from the start: a second
    # invocation within that second (a resume right after a stop) would overwrite the first's events. The
    # nanoseconds make each file its own, and order those of one second as they were written.
    self.tensorboard = SummaryWriter(os.fspath(self.staging.local / 'tensorboard'), purge_step=resumed_at + 1,
                                     filename_suffix=f'.{time.time_ns()}')

  def write(self, step: int, scalars: dict[str, float]):
    if not self.active:
      return
    self.jsonl.write(json.dumps({'step': step, **scalars}) + '\n')
    self.jsonl.flush()
    for name, value in scalars.items():
      self.tensorboard.add_scalar(name, value, step)
    self.tensorboard.flush()
    self.staging.sync(every=UPLOAD_SECONDS)

  def sync(self):
    """Uploads a gs:// workdir's files now, whenever they were last (a no-op for a local one). The trainer calls it
    when it saves a checkpoint: a run killed (SIGKILL, out of memory) then resumes from a step whose metrics lines
    are all in the bucket, where up to UPLOAD_SECONDS of them would be gone for good."""
    if self.staging is not None:
      self.staging.sync()

  def close(self):
    """Closes the files (again: a no-op)."""
    if self.jsonl is not None:
      jsonl, self.jsonl = self.jsonl, None
      jsonl.close()
    if self.tensorboard is not None:
      tensorboard, self.tensorboard = self.tensorboard, None
      tensorboard.close()
    if self.staging is not None:
      self.staging.close()  # raises (keeping the files) if it cannot upload them
      self.staging = None


def _truncate_after(path: str, step: int):
  """Rewrites metrics.jsonl `path` without the lines of steps after `step` and without an incomplete last line."""
  with open(path, encoding='utf-8', errors='replace') as f:
    lines = f.readlines()
  kept = []
  for line in lines:
    try:
      if line.endswith('\n') and json.loads(line)['step'] <= step:
        kept.append(line)
    except (ValueError, KeyError, TypeError):  # a line cut short: not a record
      pass
  if len(kept) < len(lines):
    fileio.write_text(path, ''.join(kept))


def _summary_writer():
  """tensorboardX's SummaryWriter, imported without PyTorch. tensorboardX imports torch whenever it is installed,
  only to accept torch tensors (nothing here passes one): that import was most of tensorboardX's (0.75 of 0.96 s on
  a 2-core CPU) and sat between the compiled step and the first step. While tensorboardX loads, `import torch`
  fails (a None in sys.modules), which tensorboardX expects; afterwards torch imports as usual."""
  if 'torch' in sys.modules or 'tensorboardX' in sys.modules:
    from tensorboardX import SummaryWriter  # noqa: PLC0415
    return SummaryWriter
  sys.modules['torch'] = None
  try:
    from tensorboardX import SummaryWriter  # noqa: PLC0415
  finally:
    del sys.modules['torch']
  return SummaryWriter
