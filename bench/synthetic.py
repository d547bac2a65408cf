"""The batch the step benchmarks time, the same for the JAX step and the PyTorch one (bench/torch_step.py): random
ids of a vocabulary, [CLS] first, [SEP] in the middle and last, the second half in segment 1, no padding."""

import numpy as np

from electra_jax.masking import TRAINED_TOKENIZER_IDS as SPECIAL


def random_batch(batch: int, length: int, vocab: int, seed: int = 0) -> dict[str, np.ndarray]:
  rng = np.random.default_rng(seed)
  ids = rng.integers(SPECIAL.mask + 1, vocab, (batch, length)).astype(np.int32)  # no special id by chance
  ids[:, 0], ids[:, length // 2], ids[:, -1] = SPECIAL.cls, SPECIAL.sep, SPECIAL.sep
  segments = np.zeros_like(ids)
  segments[:, length // 2 + 1:] = 1
  return {'input_ids': ids, 'segment_ids': segments, 'input_mask': np.ones_like(ids)}
