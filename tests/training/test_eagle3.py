"""specdec.training.eagle3: sizing the draft vocabulary by held-out coverage."""

import numpy as np
import pytest

from specdec.training.eagle3 import vocab_size_for_coverage


def test_coverage_picks_the_fewest_frequent_ids_that_cover_the_heldout_share():
  train = np.array([5] * 50 + [3] * 30 + [7] * 15 + [1] * 5)  # ranks: 5, 3, 7, 1
  held = np.array([5] * 6 + [3] * 2 + [7] * 1 + [9] * 1)  # 9 never seen in training
  assert vocab_size_for_coverage(train, held, 0.6, 10) == 1
  assert vocab_size_for_coverage(train, held, 0.8, 10) == 2
  assert vocab_size_for_coverage(train, held, 0.9, 10) == 3
  # 9 ranks after every seen id and, among the unseen, last (ties go to the lower id)
  assert vocab_size_for_coverage(train, held, 1.0, 10) == 10
  with pytest.raises(ValueError, match="draft_vocab_coverage=0"):
    vocab_size_for_coverage(train, held, 0.0, 10)
