"""Dynamic masking: how many positions, which ones, and what the generator is shown there."""

import functools

import jax
import numpy as np
import pytest

from electra_jax import masking
from electra_jax.config import ObjectiveConfig
from helpers import SPECIAL  # pylint: disable=g-bad-import-order

VOCAB = 50
FIRST_WORD = 5  # ids 0..4 are special; 5.. are ordinary tokens


@functools.cache
def _jitted(**kwargs):
  return jax.jit(functools.partial(masking.mask_tokens, special=SPECIAL, vocab_size=VOCAB, **kwargs))


def _mask(rng, ids, input_mask, **kwargs):
  """mask_tokens as numpy arrays; one compilation per distinct set of options and shapes."""
  return jax.tree.map(np.asarray, _jitted(**kwargs)(rng, ids, input_mask))


def _random_batch(seed, batch, length, lengths=None):
  """[CLS] words... [SEP] then padding; `lengths` (real tokens per row) drawn in [3, length] if not given."""
  r = np.random.RandomState(seed)
  if lengths is None:
    lengths = r.randint(3, length + 1, size=batch)
  ids = np.zeros((batch, length), np.int32)
  for i, n in enumerate(lengths):
    ids[i, :n] = r.randint(FIRST_WORD, VOCAB, size=n)
    ids[i, 0], ids[i, n - 1] = SPECIAL.cls, SPECIAL.sep
  return ids, (ids != SPECIAL.pad).astype(np.int32)


def _selected(out):
  """The selected positions of each row, as a list of int arrays (slots with weight 0 dropped)."""
  return [p[w > 0] for p, w in zip(out.positions, out.weights)]


@pytest.mark.parametrize('mask_prob, length, expected', [
    (0.15, 128, 19),  # int(0.155 * 128) = int(19.84)
    (0.15, 512, 79),  # int(0.155 * 512) = int(79.36)
    (0.25, 512, 130),  # int(0.255 * 512) = int(130.56)
    (0.15, 32, 4),  # int(0.155 * 32) = int(4.96)
])
def test_num_predictions(mask_prob, length, expected):
  assert ObjectiveConfig(mask_prob=mask_prob).num_predictions(length) == expected


def test_num_predictions_override():
  assert ObjectiveConfig(mask_prob=0.15, max_predictions=7).num_predictions(128) == 7


def test_count_per_sequence():
  # L = 32, P = int(0.155 * 32) = 4. n = max(1, min(4, round(N * 0.15))) for N real tokens:
  #   N=1 (a lone ordinary token)  -> round(0.15) = 0 -> max(1, .) = 1
  #   N=6  -> round(0.9)  = 1;  N=10 -> round(1.5) = 2;  N=20 -> round(3.0) = 3
  #   N=27 -> round(4.05) = 4;  N=32 -> round(4.8) = 5 -> min(4, .) = 4
  # (No N with N * 0.15 at an exact .5 other than 10, where float32 and float64 both round to 2.)
  lengths = [1, 6, 10, 20, 27, 32]
  expected = [1, 1, 2, 3, 4, 4]
  length = 32
  ids = np.zeros((len(lengths), length), np.int32)
  r = np.random.RandomState(0)
  for i, n in enumerate(lengths):
    ids[i, :n] = r.randint(FIRST_WORD, VOCAB, size=n)
    if n > 2:
      ids[i, 0], ids[i, n - 1] = SPECIAL.cls, SPECIAL.sep
  input_mask = (ids != SPECIAL.pad).astype(np.int32)
  max_predictions = ObjectiveConfig(mask_prob=0.15).num_predictions(length)
  assert max_predictions == 4
  for seed in range(3):
    out = _mask(jax.random.PRNGKey(seed), ids, input_mask, mask_prob=0.15, max_predictions=max_predictions)
    assert out.positions.shape == out.weights.shape == out.targets.shape == (len(lengths), 4)
    np.testing.assert_array_equal(out.weights.sum(-1), expected)
    assert set(np.unique(out.weights)) <= {0.0, 1.0}
    # The row with one real token: that token is the only candidate, so it is the selection.
    assert _selected(out)[0].tolist() == [0]


def test_no_candidates_selects_nothing():
  # Rows made only of [CLS]/[SEP]/[MASK] and padding: n = max(1, ...) = 1 by the formula, but nothing qualifies.
  ids = np.array([[2, 0, 0, 0, 0, 0, 0, 0], [2, 4, 4, 3, 0, 0, 0, 0]], np.int32)
  input_mask = (ids != 0).astype(np.int32)
  out = _mask(jax.random.PRNGKey(0), ids, input_mask, mask_prob=0.15, max_predictions=2)
  np.testing.assert_array_equal(out.weights, 0)
  np.testing.assert_array_equal(out.input_ids, ids)


@pytest.mark.parametrize('with_replacement', [True, False])
def test_selection_properties_over_many_draws(with_replacement):
  """Specials and padding never selected; positions unique without replacement; targets are the originals; the rest
  untouched."""
  length, batch = 24, 16
  ids, input_mask = _random_batch(1, batch, length)
  # Sprinkle [MASK] tokens among the words, and a padding-id token inside real text is impossible by
  # construction (pad = 0 only after the [SEP]); put garbage ids under the padding mask to check the mask is used.
  ids[:, 3] = SPECIAL.mask
  ids[:, 7] = SPECIAL.sep
  garbage = np.where(input_mask == 0, np.random.RandomState(2).randint(FIRST_WORD, VOCAB, ids.shape), ids)
  p = ObjectiveConfig(mask_prob=0.3).num_predictions(length)  # int(0.305 * 24) = 7
  for seed in range(10):
    out = _mask(jax.random.PRNGKey(seed), garbage, input_mask, mask_prob=0.3, max_predictions=p,
                with_replacement=with_replacement)
    for row, sel in enumerate(_selected(out)):
      if not with_replacement:
        assert len(set(sel.tolist())) == len(sel), 'a position was selected twice'
      assert np.all(input_mask[row, sel] == 1), 'padding selected'
      assert not set(ids[row, sel].tolist()) & {SPECIAL.cls, SPECIAL.sep, SPECIAL.mask, SPECIAL.pad}
      # targets are the original tokens at the selected positions
      w = out.weights[row] > 0
      np.testing.assert_array_equal(out.targets[row, w], garbage[row, sel])
      # what the generator sees: [MASK] or the original at selected positions, the input everywhere else
      shown = out.input_ids[row, sel]
      assert np.all((shown == SPECIAL.mask) | (shown == garbage[row, sel]))
      untouched = np.ones(length, bool)
      untouched[sel] = False
      np.testing.assert_array_equal(out.input_ids[row, untouched], garbage[row, untouched])


def test_padding_slots_have_zero_weight():
  # One row of N = 6 real tokens at L = 32, P = 4: n = round(0.9) = 1, so slots 1..3 are padding of the P slots.
  ids = np.zeros((1, 32), np.int32)
  ids[0, :6] = [2, 10, 11, 12, 13, 3]
  out = _mask(jax.random.PRNGKey(3), ids, (ids > 0).astype(np.int32), mask_prob=0.15, max_predictions=4)
  np.testing.assert_array_equal(out.weights, [[1, 0, 0, 0]])
  # The padding slots must not write anything: only the one selected position may differ from the input.
  changed = np.flatnonzero(out.input_ids[0] != ids[0])
  assert set(changed.tolist()) <= {int(out.positions[0, 0])}


def test_selection_is_uniform_over_candidates():
  # One row [CLS] w1..w8 [SEP], mask_prob 0.15 and P = 1 -> exactly one of the 8 words per draw.
  # Over D = 4000 independent draws each word is chosen with p = 1/8: count ~ Binomial(4000, 1/8), mean 500,
  # sd = sqrt(4000 * 1/8 * 7/8) = 20.9. A 5-sd band (+-105) fails by chance with probability < 1e-5 per word.
  draws = 4000
  row = np.array([2, 5, 6, 7, 8, 9, 10, 11, 12, 3], np.int32)
  ids = np.tile(row, (draws, 1))
  out = _mask(jax.random.PRNGKey(4), ids, np.ones_like(ids), mask_prob=0.15, max_predictions=1)
  assert np.all(out.weights == 1)
  counts = np.bincount(out.positions[:, 0], minlength=10)
  assert counts[0] == counts[9] == 0
  assert np.all(np.abs(counts[1:9] - 500) < 105), counts


def _replacement_counts(mask_token_prob, random_token_prob):
  """(#[MASK], #kept original, #other token, #selected) over a large batch of draws."""
  length, batch = 64, 512
  ids, input_mask = _random_batch(5, batch, length, lengths=np.full(batch, length))
  p = ObjectiveConfig(mask_prob=0.15).num_predictions(length)  # int(0.155 * 64) = 9; n = min(9, round(9.6) = 10) = 9
  # Distinct positions, so that each selection's shown token is its own draw.
  out = _mask(jax.random.PRNGKey(6), ids, input_mask, mask_prob=0.15, max_predictions=p,
              mask_token_prob=mask_token_prob, random_token_prob=random_token_prob, with_replacement=False)
  w = out.weights > 0
  shown = np.take_along_axis(out.input_ids, out.positions, axis=1)[w]
  original = out.targets[w]
  assert np.all((shown >= 0) & (shown < VOCAB))
  is_mask = shown == SPECIAL.mask
  kept = shown == original
  return is_mask.sum(), kept.sum(), (~is_mask & ~kept).sum(), w.sum()


def test_mask_85_keep_15():
  # 512 rows x 9 selections = 4608 selections. #[MASK] ~ Binomial(4608, 0.85): sd of the fraction
  # = sqrt(0.85 * 0.15 / 4608) = 0.0053; a 5-sd tolerance is 0.026. No random replacement at all (exact).
  n_mask, n_kept, n_other, n = _replacement_counts(0.85, 0.0)
  assert n == 512 * 9
  assert n_other == 0
  assert n_mask + n_kept == n
  assert abs(n_mask / n - 0.85) < 0.026
  assert abs(n_kept / n - 0.15) < 0.026


def test_random_token_path():
  # BERT-style 80/10/10 with V = 50. A random token is uniform over [0, 50): it is [MASK] with p 1/50 and the
  # original with p 1/50 (originals are never [MASK]). So
  #   P(shown = [MASK])   = 0.8 + 0.1/50 = 0.802
  #   P(shown = original) = 0.1 + 0.1/50 = 0.102
  #   P(other)            = 0.1 * 48/50  = 0.096
  # Each within 5 of its standard deviations, sqrt(p (1 - p) / n) over n = 4608 selections: 0.029, 0.022, 0.022.
  n_mask, n_kept, n_other, n = _replacement_counts(0.8, 0.1)
  for count, p in ((n_mask, 0.802), (n_kept, 0.102), (n_other, 0.096)):
    assert abs(count / n - p) < 5 * np.sqrt(p * (1 - p) / n)


def test_different_keys_give_different_masks():
  ids, input_mask = _random_batch(7, 8, 32)
  a = _mask(jax.random.PRNGKey(0), ids, input_mask, mask_prob=0.15, max_predictions=4)
  b = _mask(jax.random.PRNGKey(1), ids, input_mask, mask_prob=0.15, max_predictions=4)
  c = _mask(jax.random.PRNGKey(0), ids, input_mask, mask_prob=0.15, max_predictions=4)
  assert not np.array_equal(a.positions, b.positions)
  np.testing.assert_array_equal(a.positions, c.positions)
  np.testing.assert_array_equal(a.input_ids, c.input_ids)


@pytest.mark.slow
def test_official_draw_with_replacement():
  # Rows of L = 64 real tokens: 62 candidates (all but [CLS] and [SEP]), n = min(P = 9, round(64 * 0.15) = 10) = 9
  # draws with replacement. Distinct positions D: E[D] = 62 (1 - (61/62)^9) = 8.4407, and
  # Var[D] = 62 * 61 * (60/62)^9 + 62 (61/62)^9 - 62^2 (61/62)^18 = 0.4725 (sd 0.6874).
  # P(some position drawn twice) = 1 - (62 * 61 * ... * 54) / 62^9 = 0.4562.
  # Over 1024 rows: the mean's standard error is 0.6874 / 32 = 0.0215 (tolerance 0.107, 5 se); the duplicate
  # fraction's is sqrt(0.4562 * 0.5438 / 1024) = 0.0156 (tolerance 0.078). Without replacement D = 9 exactly.
  rows, length = 1024, 64
  ids, input_mask = _random_batch(8, rows, length, lengths=np.full(rows, length))
  p = ObjectiveConfig(mask_prob=0.15).num_predictions(length)
  assert p == 9
  out = _mask(jax.random.PRNGKey(9), ids, input_mask, mask_prob=0.15, max_predictions=p)
  np.testing.assert_array_equal(out.weights, 1)  # every draw keeps its weight, duplicates included
  distinct = np.array([len(set(sel.tolist())) for sel in _selected(out)])
  assert abs(distinct.mean() - 8.4407) < 0.107, distinct.mean()
  assert abs(np.mean(distinct < 9) - 0.4562) < 0.078, np.mean(distinct < 9)
  for row in range(rows):
    sel = _selected(out)[row]
    np.testing.assert_array_equal(out.targets[row], ids[row, sel])
    changed = np.flatnonzero(out.input_ids[row] != ids[row])
    assert set(changed.tolist()) <= set(sel.tolist())
    assert np.all(out.input_ids[row, changed] == SPECIAL.mask)
  without = _mask(jax.random.PRNGKey(9), ids, input_mask, mask_prob=0.15, max_predictions=p, with_replacement=False)
  assert all(len(set(sel.tolist())) == 9 for sel in _selected(without))


def test_a_twice_drawn_position_is_masked_if_any_draw_is():
  # One row, P = 2 slots both forced onto the only candidate (position 1): the position is [MASK] unless both
  # draws keep it, P = 0.15^2 = 0.0225 per row, against 0.15 if only one draw counted. Over 2000 rows: kept
  # ~ Binomial(2000, 0.0225), mean 45, sd 6.6; band 45 +- 33 (5 sd) excludes 300 (one draw deciding).
  rows = 2000
  ids = np.tile(np.array([2, 7, 3], np.int32), (rows, 1))
  out = _mask(jax.random.PRNGKey(10), ids, np.ones_like(ids), mask_prob=0.9, max_predictions=2)
  np.testing.assert_array_equal(out.positions, 1)
  np.testing.assert_array_equal(out.weights, 1)
  kept = np.sum(out.input_ids[:, 1] == 7)
  assert np.all((out.input_ids[:, 1] == 7) | (out.input_ids[:, 1] == SPECIAL.mask))
  assert abs(kept - 45) < 33, kept


def test_scatter_first_listing_wins():
  ids = np.array([[10, 11, 12, 13]], np.int32)
  positions = np.array([[2, 1, 2, 2]], np.int32)
  values = np.array([[20, 21, 22, 23]], np.int32)
  out = np.asarray(masking.scatter(jax.numpy.asarray(ids), positions, values))
  np.testing.assert_array_equal(out, [[10, 21, 20, 13]])


def test_merge_duplicates_writes_the_floor_mean():
  # Row 0: position 3 drawn by slots 0 and 1 (slot 3 also lists it, but with weight 0: a padding slot takes no
  # part) -> floor((10 + 21) / 2) = 15 in both slots; position 5 drawn once keeps 7; the padding slot keeps 30.
  # Row 1: position 1 drawn three times -> floor((5 + 6 + 8) / 3) = 6, as the official integer scatter_update.
  values = np.array([[10, 21, 7, 30], [5, 6, 8, 9]], np.int32)
  positions = np.array([[3, 3, 5, 3], [1, 1, 1, 0]], np.int32)
  weights = np.array([[1, 1, 1, 0], [1, 1, 1, 0]], np.float32)
  out = np.asarray(masking.merge_duplicates(values, positions, weights))
  np.testing.assert_array_equal(out, [[15, 15, 7, 30], [6, 6, 6, 9]])
  assert out.dtype == np.int32
