"""Drafters, one file each; all follow the protocol in `base.py`."""

from specdec.drafters.base import Context, Drafter
from specdec.drafters.block import block
from specdec.drafters.block_io import load_block, save_block
from specdec.drafters.draft_lm import draft_lm
from specdec.drafters.ngram import ngram
from specdec.drafters.null import null

__all__ = ["Context", "Drafter", "block", "draft_lm", "load_block", "ngram", "null", "save_block"]
