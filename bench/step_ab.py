"""The pre-training step against itself with one lever changed, in one process:

  python bench/step_ab.py --lever=sampler --config=configs/small.py --batch=32 --rounds=6 --steps=3
  python bench/step_ab.py --lever=dropout --config=configs/small.py --batch=32 --rounds=6 --steps=3
  python bench/step_ab.py --lever=qkv --config=configs/small.py --batch=32 --rounds=6 --steps=3

--lever=sampler: the official Gumbel-argmax sampler against ours (objective.sampling gumbel / inverse_cdf).
--lever=dropout: dropout masks from one uniform float per element against 16 random bits per element
(model.dropout_draw uniform / bits16).
--lever=qkv: the query, key and value projections as three matmuls against one (model.fused_qkv false / true).
Both steps are compiled first; then each round times `--steps` steps of one and then of the other, so a machine
whose speed drifts (shared, throttled) slows both alike. Prints the median, mean and fastest step of each.
"""

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from absl import app, flags
import jax

from electra_jax import config as config_lib, sharding
from electra_jax.train_step import Pretraining
import step_throughput
import synthetic

# --config, --batch, --vocab and --steps (here: timed steps of each variant per round) are step_throughput's flags.
_CONFIG, _BATCH, _VOCAB, _STEPS = (step_throughput._CONFIG, step_throughput._BATCH,  # pylint: disable=protected-access
                                   step_throughput._VOCAB, step_throughput._STEPS)  # pylint: disable=protected-access
_ROUNDS = flags.DEFINE_integer('rounds', 6, 'Rounds of (steps of one, steps of the other).')
_LEVER = flags.DEFINE_enum('lever', 'sampler', ['sampler', 'dropout', 'qkv'], 'What the two steps differ in.')


# Each lever: the config section and key, and the two values.
LEVERS = {'sampler': ('objective', 'sampling', ('gumbel', 'inverse_cdf')),
          'dropout': ('model', 'dropout_draw', ('uniform', 'bits16')),
          'qkv': ('model', 'fused_qkv', ('false', 'true'))}


def main(argv):
  del argv
  cfg = _CONFIG.value
  cfg.batch_size = _BATCH.value
  section, key, values = LEVERS[_LEVER.value]
  variants = []
  for value in values:
    cfg[section][key] = value
    variants.append((value, config_lib.load(cfg, vocab_size=_VOCAB.value)))
  batch = synthetic.random_batch(_BATCH.value, variants[0][1].data.max_seq_length, _VOCAB.value)
  runs = {}
  for name, c in variants:
    run = Pretraining(c, synthetic.SPECIAL, sharding.make_mesh(c.mesh))
    run.compile()
    state = run.step_layout(run.init_state(jax.random.PRNGKey(0)))
    rng = jax.device_put(jax.random.key_data(jax.random.PRNGKey(1)), sharding.replicated(run.mesh))
    device_batch = sharding.global_batch(batch, run.batch_sharding)
    state, metrics = run.step_fn(state, device_batch, rng)  # warm-up
    jax.block_until_ready(metrics)
    runs[name] = {'run': run, 'state': state, 'batch': device_batch, 'rng': rng, 'seconds': []}
  for _ in range(_ROUNDS.value):
    for r in runs.values():
      for _ in range(_STEPS.value):
        start = time.perf_counter()
        r['state'], metrics = r['run'].step_fn(r['state'], r['batch'], r['rng'])
        jax.block_until_ready(metrics)
        r['seconds'].append(time.perf_counter() - start)
  print(f'{c.model.num_layers} layers H={c.model.hidden_size} vocab={_VOCAB.value}; batch {_BATCH.value} x '
        f'{c.data.max_seq_length}; {_ROUNDS.value} rounds of {_STEPS.value} steps each')
  for name, r in runs.items():
    ms = [1000 * s for s in r['seconds']]
    print(f'{str(name):14s} median {statistics.median(ms):7.0f} ms  mean {statistics.mean(ms):7.0f} ms  '
          f'fastest {min(ms):7.0f} ms')


if __name__ == '__main__':
  app.run(main)
