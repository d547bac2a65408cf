"""Stopping on SIGTERM/SIGINT at one step on every host: the training loop checkpoints there and exits.

One process: a Python handler records the signal; the loop stops after the step it arrives in.

Several processes (`jax.distributed`): every host must save the same step, or one host enters the checkpoint's
collectives while another runs the next train step's, and both wait for each other forever. A signal reaches the
hosts one at a time (a TPU maintenance event, a Spot preemption, a SLURM `scancel` or node drain), or only one of
them (a `kill`, a Ctrl-C). JAX's preemption sync manager solves exactly this, and `jax.distributed.initialize`
starts it (jax_enable_preemption_service, on by default, CPU included):

- it installs a C++ SIGTERM handler in every process; the process that gets the signal posts a notice to the
  coordination service (process 0), which hands it to every process;
- each process then posts the last step count it passed to `reached_sync_point`, waits at a barrier for all the
  others (its `reached_sync_point` calls block meanwhile, so no host runs past), and all take max + 1 as the stop
  step: `reached_preemption_sync_point(n)` is True on every host for the same n, and for no other.

Orbax's `CheckpointManager.reached_preemption` is the same call; orbax also makes it itself, from the thread that
finishes a write, with that write's step, which would record a step some hosts have passed (checkpoint._Manager
keeps orbax out of it). A hand-made alternative, an all-gather of a stop flag every step, would also be correct,
but it is a collective the host waits for after every step, behind the step itself (one scalar, but the host
could not dispatch the next step ahead); the sync manager costs nothing until a notice arrives. Its protocol
counts the calls of this process (the steps it has run since it started, the same on every host, across
fine-tuning's seeds): a notice that arrives before the loop (loading data, restoring, the first compile) sets the
stop at call 1, i.e. after the first step, which a global step number would never match; one that arrives between
two seeds sets it at the next seed's first step, which a count restarted for each seed would never reach (the run
would go on to its end).

A Python SIGTERM handler would replace the C++ one (and could not put it back), so with several processes SIGTERM
is left to jax; SIGINT is re-raised as a SIGTERM so that it goes the same way.

How long a stop takes: jax's notifier thread looks for the signal once a second; the barrier takes milliseconds;
then every host runs the step it is in and one more (the host is at most one step ahead of its device: the trainer
reads the previous step's loss every step). So the stop checkpoint starts within about 1 s plus two steps of the
signal, whatever the step time (bench/stop_latency.py measures it; docs/faults.md).

A host that dies outright (kill -9, a crash) sends no notice: its heartbeats stop, and after
ELECTRA_JAX_HEARTBEAT_TIMEOUT seconds (sharding.initialize_distributed; jax's default 100) the coordination service
fails every other process: they print "Terminating process because the JAX distributed service detected fatal
errors ... another task died" and abort (status 134) instead of waiting for the dead host forever. Process 0 gone,
or a host that stops with an error, ends the others at once with one line (hosts.Watch, entered by cli.run).
"""

import itertools
import signal

import jax
from jax.experimental import multihost_utils

_calls = itertools.count(1)  # should_stop's calls in this process: jax's sync point counts them (module docstring)


class StopSignal:
  """Turns SIGTERM/SIGINT on any host into one step at which every host stops (`should_stop`).

  Use as a context manager around the loop, and call `should_stop()` once after every step on every host.
  """

  def __init__(self):
    self.received = None  # the name of the signal this process got, if any
    self.previous = {}
    self.multihost = jax.process_count() > 1

  def __enter__(self):
    # With several processes, SIGTERM stays with jax's preemption notifier (see the module docstring).
    for sig in (signal.SIGINT,) if self.multihost else (signal.SIGTERM, signal.SIGINT):
      self.previous[sig] = signal.signal(sig, self._handle)
    return self

  def _handle(self, signum, frame):
    del frame
    self.received = self.received or signal.Signals(signum).name
    if self.multihost:
      signal.raise_signal(signal.SIGTERM)  # to jax's notifier, which tells the other hosts

  def should_stop(self) -> bool:
    """True on every host after the same step, once a stop signal reached any of them."""
    if self.multihost:
      return multihost_utils.reached_preemption_sync_point(next(_calls))
    return self.received is not None

  def reason(self) -> str:
    """What stopped the run, for the 'checkpoint saved' line."""
    if self.received:
      return f'{self.received} received'
    if self.multihost:
      return 'a stop signal (SIGTERM or SIGINT) reached this or another process'
    return 'stopped'

  def __exit__(self, *exc):
    for sig, handler in self.previous.items():
      signal.signal(sig, handler)
