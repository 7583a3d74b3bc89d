"""Token batching for training (specdec.training.data): determinism, coverage, resume."""

import numpy as np
import pytest

from specdec.training import data


def stream(n=1000):
  return np.arange(n, dtype=np.uint16)


def take(it, n):
  return [next(it) for _ in range(n)]


def test_windows_are_contiguous_slices_of_the_stream():
  it = data.TokenWindows(stream(), batch_size=4, seq_len=16, seed=0)
  for batch_BT in take(it, 30):
    assert batch_BT.shape == (4, 16) and batch_BT.dtype == np.int32
    assert (np.diff(batch_BT, axis=1) == 1).all()
    assert batch_BT.max() < 1000


def test_same_seed_same_batches_other_seed_other_batches():
  a = take(data.TokenWindows(stream(), 4, 16, seed=3), 40)
  b = take(data.TokenWindows(stream(), 4, 16, seed=3), 40)
  c = take(data.TokenWindows(stream(), 4, 16, seed=4), 40)
  assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
  assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


def test_an_epoch_uses_disjoint_windows_and_the_next_epoch_shifts_them():
  it = data.TokenWindows(stream(), batch_size=4, seq_len=16, seed=0)
  assert it.windows == 61 and it.batches_per_epoch == 15
  epochs = [np.concatenate(take(it, it.batches_per_epoch)) for _ in range(3)]
  for rows in epochs:
    starts = np.sort(rows[:, 0])
    assert len(starts) == 60 and (np.diff(starts) >= 16).all()  # no overlap
  offsets = {int(rows[0, 0]) % 16 for rows in epochs}
  assert len(offsets) > 1  # window boundaries move between epochs


def test_resume_from_saved_state_continues_identically_across_epochs():
  ref = data.TokenWindows(stream(), 4, 16, seed=1)
  expected = take(ref, 50)  # crosses three epoch boundaries
  for stop in (0, 7, 15, 16, 33):
    first = data.TokenWindows(stream(), 4, 16, seed=1)
    take(first, stop)
    state = first.get_state()
    resumed = data.TokenWindows(stream(), 4, 16, seed=1)
    resumed.set_state(state)
    rest = take(resumed, 50 - stop)
    assert all(np.array_equal(x, y) for x, y in zip(rest, expected[stop:], strict=True)), stop
  assert ref.tokens_seen == 50 * 4 * 16


def test_state_from_another_stream_is_refused():
  state = data.TokenWindows(stream(), 4, 16, seed=1).get_state()
  for other in (
    data.TokenWindows(stream(), 4, 16, seed=2),
    data.TokenWindows(stream(), 8, 16, seed=1),
    data.TokenWindows(stream(999), 4, 16, seed=1),
  ):
    with pytest.raises(data.DataStateError):
      other.set_state(state)


def test_too_short_a_stream_is_an_error():
  with pytest.raises(ValueError, match="not one batch"):
    data.TokenWindows(stream(60), batch_size=4, seq_len=16)


def test_heldout_covers_consecutive_windows_with_padded_last_batch():
  held = data.HeldOut(stream(1000), batch_size=8, seq_len=64)
  batches = list(held)
  assert len(batches) == len(held) == 2 and held.num_tokens == 15 * 64
  rows = np.concatenate([t for t, w in batches])[np.concatenate([w for t, w in batches]) > 0]
  np.testing.assert_array_equal(rows.reshape(-1), np.arange(15 * 64))
  assert all(t.shape == (8, 64) for t, _ in batches)
  np.testing.assert_array_equal(batches[1][1], [1] * 7 + [0])
  assert len(data.HeldOut(stream(1000), 8, 64, max_batches=1)) == 1


def test_load_tokens_maps_the_file_and_keeps_a_prefix(tmp_path):
  np.save(tmp_path / "t.npy", stream(500))
  full = data.load_tokens(str(tmp_path / "t.npy"))
  assert isinstance(full, np.memmap) and len(full) == 500
  np.testing.assert_array_equal(data.load_tokens(str(tmp_path / "t.npy"), limit=100), stream(100))
