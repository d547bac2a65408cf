"""Where the training loop's time per step goes on the host: `electra_jax.trainer.train` on the GPU quickstart's
run (configs/small.py:quickstart: batch 128 x 128, the built-in corpus), its parts timed: reading and assembling the
batch, putting it on the devices, calling the train step, the metrics' sums and the loss check (which waits for
the step before: the loop keeps one step in flight), writing the metrics (every log_every steps), the checkpoint
(the last step's), and the rest.

  python bench/loop_overhead.py WORKDIR [--steps=400] [--real] [--steps_per_call=1]

By default the train step is replaced by one that returns at once (the first step's state and metrics, computed
for real) and the model is shrunk to one tiny layer, so that what is timed is the loop alone: on a GPU a step the
device finishes faster than this cannot be kept busy by it. `--real` runs the quickstart's own model and step: on
a GPU the loss check then holds the time the loop waits for the device, and calling the step the host's launching
of its kernels and CUDA graphs (XLA launches a step's work from the calling thread: 20-23 ms of a 28-32 ms step on
an H200 with one step a call, 2026-11-27). The steps run as the quickstart runs them, 5 in each call of the step
(--steps_per_call to change it).
"""

import argparse
import collections
import functools
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax

from configs import small
from electra_jax import checkpoint, data, train_step, trainer

PARTS = {  # part of the loop: (class, method), ... (a step one a call, or config.steps_per_call a call)
    'batch': ((data.BatchIterator, '__next__'),),
    'put on devices': ((train_step.Pretraining, 'put_batch'), (train_step.Pretraining, 'put_batches')),
    'train step call': ((train_step.Pretraining, 'step_fn'), (train_step.Pretraining, 'steps_fn')),
    'metrics sums and loss check': ((trainer._Log, 'add'),),  # pylint: disable=protected-access
    'metrics written': ((trainer._Log, 'write'),),  # pylint: disable=protected-access
    'checkpoint': ((checkpoint.Checkpointer, 'save'),),
}


def timed(seconds: collections.Counter, part: str, method):
  @functools.wraps(method)
  def wrapper(*args, **kwargs):
    start = time.perf_counter()
    try:
      return method(*args, **kwargs)
    finally:
      seconds[part] += time.perf_counter() - start
  return wrapper


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('workdir', help='A new directory for the run (its checkpoint and metrics).')
  parser.add_argument('--steps', type=int, default=400)
  parser.add_argument('--real', action='store_true', help='The quickstart\'s own model and train step.')
  parser.add_argument('--steps_per_call', type=int, default=0, help='config.steps_per_call (0: the quickstart\'s).')
  args = parser.parse_args()
  config = small.get_config('quickstart')
  config.update(train_steps=args.steps, eval_every=0, checkpoint_every=args.steps,
                steps_per_call=args.steps_per_call or config.steps_per_call)
  if args.steps < 2 * config.steps_per_call:  # the first call (compile, warm-up) is not timed
    parser.error(f'--steps={args.steps}: give at least two calls\' steps, {2 * config.steps_per_call}')
  seconds, timer = collections.Counter(), {'calls': 0, 'steps': 0}
  if not args.real:
    config.model.update(num_layers=1, hidden_size=32, num_heads=1, intermediate_size=64, embedding_size=32)
    for name in ('step_fn', 'steps_fn'):
      setattr(train_step.Pretraining, name, returns_at_once(getattr(train_step.Pretraining, name)))
  for part, methods in PARTS.items():
    for cls, name in methods:
      setattr(cls, name, timed(seconds, part, getattr(cls, name)))

  def counting(*args, call=trainer._call):  # pylint: disable=protected-access
    timer['calls'] += 1
    if timer['calls'] == 2:  # from the end of the first call (compile, warm-up) on
      timer['start'] = time.perf_counter()
      seconds.clear()
    state, metrics, steps = call(*args)
    timer['steps'] += steps if timer['calls'] > 1 else 0
    return state, metrics, steps
  trainer._call = counting  # pylint: disable=protected-access
  trainer.train(config, args.workdir)
  total = time.perf_counter() - timer['start']
  steps = timer['steps']
  ms = lambda s: f'{1e3 * s / steps:.2f} ms'
  parts = ', '.join(f'{part} {ms(seconds[part])}' for part in PARTS)
  print(f'the loop{" with the real step" if args.real else ""}: {ms(total)} per step on the host over {steps} steps '
        f'({parts}, the rest {ms(total - sum(seconds.values()))}; {config.steps_per_call} step(s) a call; batch '
        f'{config.batch_size} x {config.data.max_seq_length}; {os.cpu_count()} CPUs; '
        f'{jax.devices()[0].device_kind})', flush=True)


def returns_at_once(real):
  """The train step `real` (step_fn or steps_fn) made to return its first call's outputs at once from then on: the
  first runs for real (its compile and run are not the loop's)."""
  outputs = {}

  def step(self, state, batch, rng):
    if 'first' not in outputs:
      outputs['first'] = jax.block_until_ready(real(self, state, batch, rng))
    return outputs['first']
  return step


if __name__ == '__main__':
  main()
