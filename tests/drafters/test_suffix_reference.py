"""The suffix-decoding reference (tests/fixtures/suffix, from arctic-inference's simulator) is
complete and consistent with itself: every step drafted at most max_spec_tokens, accepted at most
what it drafted, and the accepted tokens plus one bonus per unfinished step rebuild the response.
It is the acceptance a suffix drafter must reproduce (chain mode)."""

import json

import numpy as np

REF = json.load(open("tests/fixtures/suffix/stream.json"))


def test_reference_stream_is_consistent():
  steps, n = REF["steps"], len(REF["request"]["response"])
  spec, acc = np.array(steps["num_spec_toks"]), np.array(steps["num_accept_toks"])
  assert len(spec) == REF["steps_total"] > 0 and acc.sum() == REF["accepted_total"]
  assert np.all(spec <= REF["settings"]["max_spec_tokens"]) and np.all(acc <= spec)
  assert acc.sum() + len(acc) in (n, n + 1)  # the last step may end on an accepted draft
  assert np.all(np.array(steps["match_len"]) < REF["settings"]["max_depth"])
