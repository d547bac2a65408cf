"""Traces chosen training steps with the JAX profiler, for TensorBoard's profile plugin.

`profile_steps='START,COUNT'` traces steps START to START + COUNT - 1 (as metrics.jsonl numbers them) on process 0:
the trace starts once step START - 1 is done and stops once step START + COUNT - 1 is, after blocking until the
device has finished it (JAX dispatches steps ahead of the device; stopping without waiting would cut the traced
steps short). jax.profiler writes WORKDIR/tensorboard/plugins/profile/<time>/<host>.xplane.pb, where
`tensorboard --logdir WORKDIR/tensorboard` finds it (Profile tab; pip install tensorboard-plugin-profile). A gs://
workdir's trace is written to a local directory and uploaded when the trace stops. Other processes run the same
program on their own devices and do not trace: one host's trace shows the step (MaxText does the same by default).
"""

import sys

import jax

from electra_jax import fileio


class Profiler:
  """Starts and stops the trace around steps `steps` = (START, COUNT) of a run at `first_step` going to `end`."""

  def __init__(self, steps: tuple[int, int] | None, workdir, *, first_step: int, end: int):
    self.active = steps is not None and jax.process_index() == 0
    self.tracing, self.staging = False, None
    if not self.active:
      return
    start, count = steps
    self.first, self.last = start, min(start + count - 1, end)
    if self.first > end:  # this invocation ends before the traced steps
      self.active = False
      return
    self.directory = fileio.path(workdir) / 'tensorboard'
    if first_step == start - 1:  # the next step is the first traced one
      self._start()

  def _start(self):
    self.staging = fileio.Staging(self.directory)
    jax.profiler.start_trace(str(self.staging.local))
    self.tracing = True

  def after_step(self, step: int, state):
    """Call after step `step` has been dispatched, with the state it returned."""
    if not self.active:
      return
    if step == self.first - 1 and not self.tracing:
      self._start()
    elif step == self.last and self.tracing:
      jax.block_until_ready(state)
      self.close()
      print(f'profiled steps {self.first}-{self.last} into {self.directory}/plugins/profile; view them with '
            f'tensorboard --logdir {self.directory} (Profile tab)', file=sys.stderr)

  def close(self):
    """Stops a trace still running (a run that ended or failed inside the traced steps) and uploads it."""
    if self.tracing:
      self.tracing = False
      jax.profiler.stop_trace()
      self.staging.close()
