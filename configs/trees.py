"""Static draft trees beside chains at matched verify width: the default sweep's zoo and context
lengths, every drafter that drafts trees (ngram, draft_lm and the chained heads MTP and EAGLE-3)
against the no-draft arm. Each tree
verifies as many nodes per step as one of the chains (specdec/lab/trees.py): wide3 (4 nodes, one
level of 3 candidates) beside k = 3, binary2 and skewed3 (7 nodes) beside k = 6, so the
draft-budget table compares tau and speed at the same verify cost; "auto" (tree="auto") chooses
among nested binary trees of 2, 4, 8 and 16 drafted nodes before every step, and beside it
k="auto" among chains of 1, 2, 4 and 8 (config.budget_tree_tiers / budget_tiers change them)."""

from configs import default


def get_config():
  c = default.get_config()
  c.methods = ("null", "ngram", "draft_lm", "mtp", "eagle3")
  c.ks = (3, 6, "auto")
  c.trees = ("wide3", "binary2", "skewed3", "auto")
  return c
