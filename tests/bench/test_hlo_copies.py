"""specdec.bench.hlo_copies: the copy census of optimized HLO text, and what it finds in the empty
timing loop."""

import jax.numpy as jnp

from configs import bench_decode as bench_config
from specdec.bench import random_models, timing
from specdec.bench.hlo_copies import hlo_copies


def _tiny():
  return random_models.model_config(bench_config.TINY)


_HLO = """HloModule m

%body (p: (s32[], f32[4,8])) -> (s32[], f32[4,8]) {
  %p = (s32[], f32[4,8]{1,0}) parameter(0)
  %c = f32[4,8]{1,0} copy(%x)
  %s = (f32[4,8]{1,0}, f32[4,8]{1,0}, u32[]) copy-start(%c)
}

%fused (a: bf16[2]) -> bf16[2] {
  %k = bf16[2]{0} copy(%a)
}

ENTRY %main (a: f32[4,8]) -> f32[4,8] {
  %w = (s32[], f32[4,8]{1,0}) while(%t), condition=%cond, body=%body
  %f = bf16[2]{0} fusion(%z), kind=kLoop, calls=%fused
  ROOT %o = bf16[16,2]{1,0} copy(%y)
}
"""


def test_hlo_copies_splits_while_body_from_the_rest_and_skips_fusions():
  assert hlo_copies(_HLO) == {
    "body": {"n": 2, "bytes": 2 * 4 * 8 * 4},
    "elsewhere": {"n": 1, "bytes": 16 * 2 * 2},
  }


def test_empty_loop_copies_its_state_once_not_per_iteration():
  st = random_models.synthetic_state(_tiny(), 1, 64, 8, 4, jnp.float32)
  copies = hlo_copies(timing.empty_loop.lower(st, 8).compile().as_text())
  # The state is not donated: its cache is copied into fresh output buffers once per call.
  cache_bytes = sum(x.nbytes for x in st.cache.k + st.cache.v)
  assert copies["body"]["n"] == 0
  assert copies["elsewhere"]["bytes"] >= cache_bytes
