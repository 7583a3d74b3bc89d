"""The zoo's hybrid target's MTP head: the zoo's MTP recipe (train_mtp.py) against the hybrid
target. Over a Qwen3-Next target the head's one layer is the family's (gated attention, the dense
MLP of the target's layer 0); exported in the Qwen3-Next `mtp.*` layout."""

from configs import train_mtp


def get_config():
  c = train_mtp.get_config()
  c.target = "zoo:hybrid"
  return c
