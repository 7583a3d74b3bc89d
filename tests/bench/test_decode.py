"""bench_decode: random weights and state, byte counts, HLO copy census, config checks, and the
whole experiment on the tiny preset (timings themselves are not asserted)."""

import json
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from configs import bench_decode as bench_config
from specdec.bench import decode, random_models, timing
from specdec.quant.exl3 import EXL3Weight
from specdec.quant.nvfp4 import NVFP4Weight
from specdec.xla_env import with_defaults

ROOT = Path(__file__).resolve().parents[2]


def _tiny():
  return random_models.model_config(bench_config.TINY)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32, jnp.float16])
def test_float_fill_is_bounded_varied_and_seeded(dtype):
  x = random_models.fill((64, 64), dtype, seed=3, scale=0.5).astype(jnp.float32)
  assert float(jnp.max(jnp.abs(x))) <= 0.5
  assert float(jnp.std(x)) > 0.2  # uniform on [-0.5, 0.5) has std 0.29; zeros would give 0
  assert not jnp.array_equal(x, random_models.fill((64, 64), dtype, seed=4, scale=0.5))


def test_integer_and_e4m3_fills():
  i16 = random_models.fill((4096,), jnp.int16, 0)
  assert int(i16.min()) < -16000 and int(i16.max()) > 16000
  scales = random_models.fill((4096,), jnp.float8_e4m3fn, 0).astype(jnp.float32)
  assert bool(jnp.all(jnp.isfinite(scales))) and float(scales.min()) >= 0.5
  assert float(scales.max()) < 1.0


@pytest.mark.parametrize("fmt", decode.FORMATS)
def test_random_params_types_and_bytes(fmt):
  config, batch, slots = _tiny(), 2, 16
  params = random_models.random_params(config, fmt)
  p = params["params"]
  kernel = p["layer_0"]["mlp"]["down_proj"]["kernel"]
  want = {"bf16": jax.Array, "nvfp4": NVFP4Weight, "exl3_4": EXL3Weight}[fmt]
  assert isinstance(kernel, want) and kernel.shape == (256, 128)
  assert isinstance(p["lm_head"]["kernel"], jax.Array)  # the LM head stays dense

  D, F, V, H, N, K = 128, 256, 256, 64, 4, 2
  linear = [(D, N * H), (D, K * H), (D, K * H), (N * H, D), (D, F), (D, F), (F, D)]
  per_weight = {
    "bf16": lambda i, o: 2 * i * o,
    "nvfp4": lambda i, o: i * o // 2 + i * o // 16 + 4 * o,  # codes, E4M3 scales, f32 global
    "exl3_4": lambda i, o: i * o // 2 + 2 * i + 2 * o,  # 4-bit trellis, f16 suh and svh
  }[fmt]
  norms = 2 * (3 * D + 2 * H)  # attn, mlp, final; q and k
  want_weights = sum(per_weight(i, o) for i, o in linear) + 2 * D * V + norms + 2 * batch * D
  nbytes = random_models.step_bytes(params, config, batch, slots, jnp.bfloat16)
  assert nbytes == {"weight_bytes": want_weights, "kv_bytes": 2 * 1 * batch * slots * K * H * 2}

  model = random_models.random_model(config, fmt)
  logits = model.logits(jnp.ones((1, 4), jnp.int32))
  assert bool(jnp.all(jnp.isfinite(logits)))


def test_check_format_names_the_layer_that_does_not_fit():
  config = random_models.model_config({**bench_config.TINY, "intermediate_size": 208})
  with pytest.raises(decode.BenchConfigError, match="layer_0/mlp/down_proj.*exl3_4.*128"):
    random_models.check_format(config, "exl3_4")
  random_models.check_format(config, "nvfp4")  # 208 is a multiple of NVFP4's 16


def test_synthetic_state_is_a_decodable_state():
  config = _tiny()
  st = random_models.synthetic_state(config, 2, 32, 20, 0, jnp.bfloat16)
  assert st.cache.k[0].shape == (2, 32, 2, 64) and int(st.lengths[0]) == 20
  assert not jnp.array_equal(st.cache.k[0], st.cache.v[0])
  assert int(st.tokens.max()) < config.vocab_size and int(st.tokens.min()) >= 0


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
  assert decode.hlo_copies(_HLO) == {
    "body": {"n": 2, "bytes": 2 * 4 * 8 * 4},
    "elsewhere": {"n": 1, "bytes": 16 * 2 * 2},
  }


def test_empty_loop_copies_its_state_once_not_per_iteration():
  st = random_models.synthetic_state(_tiny(), 1, 64, 8, 4, jnp.float32)
  copies = decode.hlo_copies(timing.empty_loop.lower(st, 8).compile().as_text())
  # The state is not donated: its cache is copied into fresh output buffers once per call.
  cache_bytes = sum(x.nbytes for x in st.cache.k + st.cache.v)
  assert copies["body"]["n"] == 0
  assert copies["elsewhere"]["bytes"] >= cache_bytes


@pytest.mark.parametrize(
  "override, match",
  [
    (dict(parts=("copy", "decode.fp16")), "unknown format 'fp16'"),
    (dict(parts=("copy", "prefill")), "unknown part 'prefill'"),
    (dict(formats=("bf16", "int3")), "unknown format 'int3'"),
    (dict(shape_names=("tiny", "huge")), "unknown shape 'huge'"),
    (dict(contexts=(4,)), "decode: context 4 is too small; it needs >= 8"),
    (dict(attention=dict(impls=("xla", "cudnn"))), r"\['cudnn'\] need a GPU"),
    (dict(loop=dict(xla_flags=("xla_gpu_enable_command_buffer=",))), "must start with '--'"),
    (dict(loop=dict(slope_n=(8, 4))), "two increasing trip counts"),
    (dict(flags=dict(arms=(("", True), ("xla_gpu_enable_triton_gemm=", False)))), "flags.arms"),
    (dict(flags=dict(arms=(("", True, "cudnn"),))), r"attention in \('auto', 'xla'\)"),
    (dict(flags=dict(legs=0)), "flags.legs"),
    (dict(flags=dict(context=4)), "flags: context 4 is too small"),
    (dict(kv_dtypes=("model", "int8")), "kv_dtypes: unknown 'int8'"),
  ],
)
def test_validate_refuses_bad_configs_before_compiling(override, match):
  cfg = bench_config.get_config("tiny")
  for key, value in override.items():
    if isinstance(value, dict):
      cfg[key].update(value)
    else:
      cfg[key] = value
  with pytest.raises(decode.BenchConfigError, match=match):
    decode.validate(cfg)


def test_spent_budget_records_skips_without_measuring(tmp_path):
  cfg = bench_config.get_config("tiny")
  cfg.budget_s = 1e-9
  rows = decode.Runner(cfg, str(tmp_path)).run()
  assert rows and all(r["skipped"] == "time budget spent" for r in rows)
  assert "skipped: time budget spent" in decode.markdown(rows)


def test_experiment_runs_every_part_on_the_tiny_preset(tmp_path):
  cmd = [sys.executable, "-m", "experiments.bench_decode", "--config=configs/decode.py:tiny"]
  proc = subprocess.run(
    [*cmd, f"--out={tmp_path}"], cwd=ROOT, capture_output=True, text=True, timeout=600
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
  assert not [r for r in rows if "error" in r or "skipped" in r]
  parts = [r["part"] for r in rows]
  assert parts == ["copy"] + ["decode"] * 6 + ["verify"] * 2 + ["attention"] * 2 + ["loop"] + [
    "flags"
  ] * 2 + ["compile"] * 2 + ["profile"]

  arms = [(r["xla_flags"], r["fused"], r["attention"]) for r in rows if r["part"] == "flags"]
  # Each arm's flags as its process ran them: the arm's, then specdec's defaults.
  assert arms == [
    (with_defaults(""), True, "xla"),
    (with_defaults("--xla_gpu_enable_triton_gemm=false"), False, "auto"),
  ]
  assert "concurrent_region=true" in arms[1][0]

  decode = [r for r in rows if r["part"] == "decode"]
  assert [(r["format"], r["kv_dtype"]) for r in decode] == [
    (f, kv) for f in decode.FORMATS for kv in ("model", "float8_e4m3fn")
  ]
  for r in decode:
    assert r["tok_s"] == pytest.approx(r["batch"] / (r["us"] * 1e-6))
    assert r["us_min"] <= r["us"] <= r["us_max"]
    assert r["pct_of_measured_copy"] > 0
  assert decode[2]["weight_bytes"] < decode[0]["weight_bytes"]  # NVFP4 stores less than bf16
  assert decode[1]["kv_bytes"] * 2 == decode[0]["kv_bytes"]  # FP8 codes: half of bf16's

  for r in (r for r in rows if r["part"] == "attention"):
    assert r["rel_err_vs_f32"] < 1e-2  # bf16 inputs, f32 accumulation

  (loop,) = (r for r in rows if r["part"] == "loop")
  assert loop["xla_flags"] == with_defaults("--xla_gpu_enable_command_buffer=")
  assert loop["hlo_copies"]["body"]["n"] == 0
  assert (tmp_path / loop["hlo_file"]).read_text().startswith("HloModule")

  cold, cached = (r for r in rows if r["part"] == "compile")
  assert (cold["cache_hits"], cached["cache_hits"]) == (0, 1)

  (prof,) = (r for r in rows if r["part"] == "profile")
  assert prof["kernels_per_step"] > 0 and 0 < prof["busy_fraction"] <= 1
  assert sum(g["share"] for g in prof["by_op"]) <= 1 + 1e-9
  assert (tmp_path / prof["hlo_file"]).read_text().startswith("HloModule")

  table = (tmp_path / "table.md").read_text()
  assert "| tiny | nvfp4 | yes | float8_e4m3fn | 2 | 16 |" in table
  assert "### Compile of the decode chunk" in table
  assert "### Profile: tiny bf16, fused projections B = 1 ctx 16" in table
  assert table.strip() in proc.stdout
