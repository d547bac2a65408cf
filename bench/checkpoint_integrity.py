"""What the checkpoint checksums cost: a checkpoint's save and wait, and its read back, with and without them.

  python bench/checkpoint_integrity.py --config=configs/small.py [--repeats=3]

The full TrainState of the config (parameters and Adam's two moments, initialised on one device) is written with
`electra_jax.checkpoint.Checkpointer` (orbax, then the sha256 of every file into electra_checksums.json) and read
back (checksums verified, then orbax's restore). The same is timed with orbax alone (the checksum steps skipped).
Prints one JSON line per measurement, seconds as the median of --repeats.
"""

import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags
import jax
from ml_collections import config_flags

from electra_jax import checkpoint, config as config_lib, sharding
from electra_jax.masking import TRAINED_TOKENIZER_IDS
from electra_jax.train_step import Pretraining

_CONFIG = config_flags.DEFINE_config_file('config', 'configs/small.py', 'Model config.')
_REPEATS = flags.DEFINE_integer('repeats', 3, 'Timed saves and restores of each kind.')


def _timed(fn) -> float:
  start = time.perf_counter()
  fn()
  return time.perf_counter() - start


def main(argv):
  del argv
  cfg = _CONFIG.value
  cfg.mesh.shape = (1, 1, 1)
  c = config_lib.load(cfg, vocab_size=cfg.model.vocab_size or cfg.data.vocab_size)
  run = Pretraining(c, TRAINED_TOKENIZER_IDS, sharding.make_mesh(c.mesh))
  state = run.init_state(jax.random.PRNGKey(0))
  abstract = run.abstract_state()
  size = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state))
  for checksums in (False, True):
    saves, restores = [], []
    for repeat in range(_REPEATS.value):
      with tempfile.TemporaryDirectory() as workdir:
        checkpointer = checkpoint.Checkpointer(workdir)
        if not checksums:  # orbax alone: no checksums recorded, so none verified either
          checkpointer._finish = checkpointer.manager.wait_until_finished  # pylint: disable=protected-access
        saves.append(_timed(lambda: (checkpointer.save(repeat, state, {}), checkpointer.wait())))
        restores.append(_timed(lambda: jax.block_until_ready(checkpointer.restore(repeat, abstract))))
        checkpointer.close()
    print(json.dumps({'config': config_flags.get_config_filename(flags.FLAGS['config']), 'state_bytes': size,
                      'checksums': checksums, 'save_and_wait_s': statistics.median(saves),
                      'restore_s': statistics.median(restores)}))


if __name__ == '__main__':
  app.run(main)
