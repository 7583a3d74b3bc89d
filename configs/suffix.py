"""Suffix decoding where it shines: the default sweep on the repetitive edit-loop workload
(`edit_loop`, specdec/data/workload.py), the model-free drafters against the no-draft arm.
Earlier turns are answered by the target before any cell runs, so each prompt holds the model's
own earlier rewrites of the code it now rewrites again."""

from configs import default


def get_config():
  c = default.get_config()
  c.workloads = ("edit_loop",)
  c.methods = ("null", "ngram", "suffix")
  c.ks = (2, 4, 8)
  c.prompt_tokens = (0,)  # the loops as they are (about 600 tokens), no filler in front
  return c
