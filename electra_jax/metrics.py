"""Where training metrics go: WORKDIR/metrics.jsonl (one JSON object per log step) and TensorBoard events."""

import json
import os

import jax


def summarize(accumulated) -> dict[str, float]:
  """{name: (sum of numerators, sum of denominators)} -> {name: ratio}, fetched from the device once."""
  host = jax.device_get(accumulated)
  return {name: float(num / den) if den > 0 else 0.0 for name, (num, den) in host.items()}


def accumulate(total, metrics):
  """Adds one step's on-device metrics to the running sums (stays on the device: no host sync)."""
  return metrics if total is None else jax.tree.map(lambda a, b: a + b, total, metrics)


class MetricsWriter:
  """Appends to metrics.jsonl and writes TensorBoard scalars; does nothing on processes other than 0."""

  def __init__(self, workdir: str):
    self.active = jax.process_index() == 0
    if not self.active:
      return
    from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
    self.jsonl = open(os.path.join(workdir, 'metrics.jsonl'), 'a', encoding='utf-8')
    self.tensorboard = SummaryWriter(os.path.join(workdir, 'tensorboard'))

  def write(self, step: int, scalars: dict[str, float]):
    if not self.active:
      return
    self.jsonl.write(json.dumps({'step': step, **scalars}) + '\n')
    self.jsonl.flush()
    for name, value in scalars.items():
      self.tensorboard.add_scalar(name, value, step)
    self.tensorboard.flush()

  def close(self):
    if self.active:
      self.jsonl.close()
      self.tensorboard.close()
