"""Speed of a hybrid (Gated DeltaNet + gated attention + routed experts) target, random weights.

  python -m experiments.bench_hybrid --out=$OUT            # Qwen3-Next-like shape, bf16, B = 1
  python -m experiments.bench_hybrid --shape=dense27b --out=$OUT   # dense-MLP hybrid, 27B-like
  python -m experiments.bench_hybrid --shape=tiny --contexts=64,256 --out=/tmp/h   # runs on a CPU

Writes OUT/bench_hybrid.json with, per context length: the decode step (a width-1 target forward
and its state commit) in microseconds and as a % of the bytes-read roofline; the verify forward
at widths 1/4/8/16 relative to that step; and per MoE implementation the routed-expert block's
time for M tokens against the time to read only the experts those tokens are routed to. Every
time is a slope over an on-device loop (specdec.bench.timing.per_iteration), so dispatch cancels.

The default shape is Qwen3-Next-80B-A3B's per-layer shape with 128 experts instead of 512 (so it
fits one H200); the bytes a token reads are the same, since it reads only its top-10 experts.
`dense27b` is the dense-MLP hybrid of the Qwen3.5/3.8-27B family (64 layers, hidden 5120), the
shape of the published verify-cost figure; it has no MoE rows.
"""

import json
import os

import jax
import jax.numpy as jnp
from absl import app, flags
from flax.traverse_util import flatten_dict, unflatten_dict

from specdec import xla_env
from specdec.bench import timing
from specdec.bench.random_models import fill
from specdec.models import stack
from specdec.models.config import HybridConfig, from_hf_dict
from specdec.models.hybrid import HybridCache
from specdec.ops import moe

_OUT = flags.DEFINE_string("out", os.environ.get("OUT", "runs/bench_hybrid"), "output directory")
_SHAPE = flags.DEFINE_enum(
  "shape",
  "qwen3_next",
  ["qwen3_next", "dense27b", "tiny"],
  "model shape: MoE hybrid, dense-MLP hybrid, or a small MoE hybrid that runs on a CPU (float32)",
)
_CONTEXTS = flags.DEFINE_list("contexts", ["1024", "8192"], "committed tokens before the step")
_WIDTHS = flags.DEFINE_list("widths", ["1", "4", "8", "16"], "verify widths (k + 1)")
_MOE_TOKENS = flags.DEFINE_list("moe_tokens", ["1", "4", "8", "16", "64"], "MoE block rows M")
_STEPS = flags.DEFINE_integer("n_steps", 16, "iterations of the shorter timed loop")
_REPS = flags.DEFINE_integer("reps", 5, "repetitions per timing (median)")
_BANDWIDTH = flags.DEFINE_float(
  "bandwidth_gbs", 4240.0, "roofline bandwidth, GB/s (H200 device copy, docs/benchmarks.md)"
)

QWEN3_NEXT_LIKE = dict(
  vocab_size=151936, hidden_size=2048, intermediate_size=5120, num_hidden_layers=48,
  num_attention_heads=16, num_key_value_heads=2, head_dim=256, linear_num_key_heads=16,
  linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128,
  num_experts=128, num_experts_per_tok=10, moe_intermediate_size=512,
  shared_expert_intermediate_size=512,
)  # fmt: skip
DENSE_27B_LIKE = dict(
  vocab_size=248320, hidden_size=5120, intermediate_size=17408, num_hidden_layers=64,
  num_attention_heads=24, num_key_value_heads=4, head_dim=256, linear_num_key_heads=16,
  linear_num_value_heads=48, linear_key_head_dim=128, linear_value_head_dim=128,
)  # fmt: skip
TINY = dict(
  vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
  num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_num_key_heads=2,
  linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16, num_experts=8,
  num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32,
)  # fmt: skip
SHAPES = dict(qwen3_next=QWEN3_NEXT_LIKE, dense27b=DENSE_27B_LIKE, tiny=TINY)


def hybrid_config(shape: dict) -> HybridConfig:
  return from_hf_dict(
    {"model_type": "qwen3_next", "max_position_embeddings": 1 << 20, **shape},
    source="bench_hybrid shape",
  )


def random_params(c: HybridConfig, dtype, seed: int = 0) -> dict:
  """Every leaf a device-side fill in `dtype` (norm and decay parameters included: speed does not
  depend on the values)."""
  tok = jnp.zeros((1, 1), jnp.int32)
  cache = jax.eval_shape(lambda: stack.empty_cache(c, 1, 1, dtype))
  tree = jax.eval_shape(stack.decoder(c, dtype).init, jax.random.key(0), tok, tok, cache)
  leaves = sorted(flatten_dict(tree["params"]).items())
  flat = {path: fill(leaf.shape, dtype, seed + 8 * i) for i, (path, leaf) in enumerate(leaves)}
  return {"params": unflatten_dict(flat)}


def filled_cache(c: HybridConfig, slots: int, dtype) -> HybridCache:
  empty = stack.empty_cache(c, 1, slots, dtype)
  return jax.tree.map(lambda a: fill(a.shape, a.dtype, a.size % 9973, scale=1.0), empty)


def step_bytes(params, c: HybridConfig, ctx: int, width: int, dtype) -> dict:
  """Bytes a width-`width` forward at B = 1 reads: the weights it touches (the embedding's rows,
  at most width x e experts per MoE layer), the attention layers' K/V up to ctx, and each linear
  layer's recurrent and conv state."""
  item = jnp.dtype(dtype).itemsize
  flat = flatten_dict(params["params"])
  weights = sum(a.nbytes for path, a in flat.items() if "experts" not in path)
  embed = flat[("embed", "embedding")]
  weights += width * embed.nbytes // embed.shape[0] - embed.nbytes
  expert = 3 * c.hidden_size * c.moe_intermediate_size * item
  routed = sum(c.moe_layers) * min(c.num_experts, width * c.num_experts_per_tok) * expert
  kv = len(c.attention_layers) * 2 * ctx * c.num_kv_heads * c.head_dim * item
  rec = c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim * 4
  conv = (c.linear_conv_kernel - 1) * c.conv_dim * item
  state = len(c.linear_layers) * (rec + conv)
  return dict(weights=weights, routed_experts=routed, kv=kv, recurrent_state=state)


RUNS: dict = {}  # width -> its jitted loop, shared by the contexts


def forward_loop(module, width: int):
  """n forwards of `width` tokens at the committed end, each committing all of them: the state
  settles at `width` and the cache carries on, as the decode step's does."""

  @jax.jit
  def run(params, cache, tokens_BT, positions_BT, n):
    def body(i, carry):
      cache, acc = carry
      out = module.apply(params, tokens_BT, positions_BT, cache)
      full_B = jnp.full((tokens_BT.shape[0],), width, jnp.int32)
      return out.cache.settle(full_B), acc + jnp.argmax(out.logits, -1).sum()

    return jax.lax.fori_loop(0, n, body, (cache, jnp.int32(0)))

  return run


def time_widths(params, c: HybridConfig, dtype, ctx: int, widths, slots: int, n, reps) -> dict:
  """Seconds per forward of each width at context ctx (one cache size for every context, so the
  contexts share each width's executable)."""
  module = stack.decoder(c, dtype)
  cache = filled_cache(c, slots, dtype)
  out = {}
  for w in widths:
    run = RUNS.setdefault(w, forward_loop(module, w))
    positions_BT = ctx - 1 + jnp.arange(w, dtype=jnp.int32)[None]
    tokens_BT = (positions_BT * 7919) % c.vocab_size
    per, _ = timing.per_iteration(
      lambda m, run=run, p=positions_BT, t=tokens_BT: run(params, cache, t, p, m), n, 2 * n, reps
    )
    out[w] = per
  return out


def time_moe(c: HybridConfig, dtype, tokens, n: int, reps: int, bandwidth: float) -> list[dict]:
  """One MoE layer's routed experts for M rows, per implementation, and the roofline of reading
  only the distinct experts routed to (random routing)."""
  I, D, F, e = c.num_experts, c.hidden_size, c.moe_intermediate_size, c.num_experts_per_tok
  gate, up, down = (fill(s, dtype, i) for i, s in enumerate([(I, D, F), (I, D, F), (I, F, D)]))
  rows = []
  for M in tokens:
    x_MD = fill((M, D), dtype, 11, scale=1.0)
    logits_MI = fill((M, I), jnp.float32, 12, scale=4.0)
    w_Me, ids_Me = moe.route(logits_MI, e, True)
    hit = int(jnp.unique(ids_Me).size)
    read = hit * 3 * D * F * jnp.dtype(dtype).itemsize
    # Gather materializes M x e expert copies: past 2 I of them it is never the choice.
    for impl in ("gather", "ragged") if M * e <= 2 * I else ("ragged",):
      # Weights and routing are arguments: as constants XLA would fold the gathers at compile.
      @jax.jit
      def run(x_MD, w_Me, ids_Me, gate, up, down, n, impl=impl):
        def body(i, acc):
          y = moe.experts(x_MD + acc[None, :1], w_Me, ids_Me, gate, up, down, impl)
          return acc + y.sum(0)

        return jax.lax.fori_loop(0, n, body, jnp.zeros((D,), x_MD.dtype))

      args = (x_MD, w_Me, ids_Me, gate, up, down)
      per, _ = timing.per_iteration(lambda m, run=run, a=args: run(*a, m), n, 2 * n, reps)
      rows.append(
        dict(
          tokens=M, implementation=impl, us=1e6 * per, experts_hit=hit,
          routed_bytes=read, roofline_us=1e6 * read / (bandwidth * 1e9),
          pct_of_roofline=100 * read / (bandwidth * 1e9) / per,
        )
      )  # fmt: skip
  return rows


def main(argv):
  del argv
  xla_env.apply_defaults()
  tiny = _SHAPE.value == "tiny"
  shape = SHAPES[_SHAPE.value]
  c = hybrid_config(shape)
  dtype = jnp.float32 if tiny and jax.default_backend() == "cpu" else jnp.bfloat16
  contexts = [int(x) for x in _CONTEXTS.value]
  widths = sorted({1, *(int(x) for x in _WIDTHS.value)})  # width 1 is the decode step
  n, reps, bw = _STEPS.value, _REPS.value, _BANDWIDTH.value
  params = random_params(c, dtype)
  result = dict(
    device=jax.devices()[0].device_kind, backend=jax.default_backend(), jax=jax.__version__,
    dtype=jnp.dtype(dtype).name, batch=1, shape_name=_SHAPE.value, shape=shape,
    layer_types=list(c.layer_types), bandwidth_gbs=bw, n_steps=n, reps=reps, contexts=[],
  )  # fmt: skip
  slots = max(contexts) + max(widths) + 1
  for ctx in contexts:
    per = time_widths(params, c, dtype, ctx, widths, slots, n, reps)
    base = per[1]
    b = step_bytes(params, c, ctx, 1, dtype)
    total = sum(b.values())
    result["contexts"].append(
      dict(
        context=ctx, decode_step_us=1e6 * base, bytes_read=b, bytes_read_total=total,
        roofline_us=1e6 * total / (bw * 1e9), pct_of_roofline=100 * total / (bw * 1e9) / base,
        verify={str(w): dict(us=1e6 * t, vs_decode_step=t / base) for w, t in per.items()},
      )
    )  # fmt: skip
  moe_tokens = [int(x) for x in _MOE_TOKENS.value] if any(c.moe_layers) else []
  result["moe"] = time_moe(c, dtype, moe_tokens, n, reps, bw)
  os.makedirs(_OUT.value, exist_ok=True)
  path = os.path.join(_OUT.value, "bench_hybrid.json")
  with open(path, "w") as f:
    json.dump(result, f, indent=2)
  for row in result["contexts"]:
    widths_txt = ", ".join(f"w{w} {v['vs_decode_step']:.2f}x" for w, v in row["verify"].items())
    print(
      f"ctx {row['context']}: decode step {row['decode_step_us']:.0f} us "
      f"({row['pct_of_roofline']:.0f}% of {row['roofline_us']:.0f} us roofline); {widths_txt}"
    )
  for r in result["moe"]:
    print(
      f"moe M={r['tokens']:3d} {r['implementation']:6s} {r['us']:8.1f} us, {r['experts_hit']} "
      f"experts hit, {r['pct_of_roofline']:.0f}% of their read"
    )
  print(f"wrote {path}")


if __name__ == "__main__":
  app.run(main)
