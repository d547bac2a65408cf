"""The training loop's own time per step on the host: `electra_jax.trainer.train` with the train step replaced by
one that returns at once (the first step's state and metrics, computed for real), so that what is left is the
loop: reading and assembling the batch, putting it on the devices, the metrics' sums, the loss check, logging.

  python bench/loop_overhead.py WORKDIR [--steps=400]

On a GPU a step the device finishes faster than this cannot be kept busy by the loop (it keeps one step in flight).
The run is the GPU quickstart's (configs/small.py:quickstart: batch 128 x 128, the built-in corpus) with the model
shrunk to one tiny layer: only the first step's compile depends on it.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax

from configs import small
from electra_jax import train_step, trainer


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('workdir', help='A new directory for the run (its checkpoint and metrics).')
  parser.add_argument('--steps', type=int, default=400)
  args = parser.parse_args()
  config = small.get_config('quickstart')
  config.update(train_steps=args.steps, eval_every=0, checkpoint_every=args.steps)
  config.model.update(num_layers=1, hidden_size=32, num_heads=1, intermediate_size=64, embedding_size=32)
  real, done, timed = train_step.Pretraining.step_fn, {}, {'steps': 0}

  def returns_at_once(self, state, batch, rng):
    if not done:  # the first step for real: its compile and run are not the loop's
      done['outputs'] = jax.block_until_ready(real(self, state, batch, rng))
      timed['start'] = time.perf_counter()
    else:
      timed['steps'] += 1
    return done['outputs']

  train_step.Pretraining.step_fn = returns_at_once
  trainer.train(config, args.workdir)
  seconds = time.perf_counter() - timed['start']
  print(f'the loop: {1e3 * seconds / timed["steps"]:.2f} ms per step on the host over {timed["steps"]} steps '
        f'(batch {config.batch_size} x {config.data.max_seq_length}; {os.cpu_count()} CPUs)', flush=True)


if __name__ == '__main__':
  main()
