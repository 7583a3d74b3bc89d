"""Drafters, one file each; all follow the protocol in `base.py`."""

from specdec.drafters.base import Context, Drafter
from specdec.drafters.draft_lm import draft_lm
from specdec.drafters.ngram import ngram
from specdec.drafters.null import null

__all__ = ["Context", "Drafter", "draft_lm", "ngram", "null"]
