"""On a GPU: one Pallas kernel's check and benchmark (kernels_pallas/*.py `main`), against XLA.

  python -m experiments.bench_kernel --kernel=nvfp4 [--mode=bench] [--shapes=8192x28672] ...
  python -m experiments.bench_kernel --kernel=fp8 | --kernel=exl3 [--bits=4] | --kernel=attention

A flag left unset takes the kernel's own default (its `main`'s); a flag the kernel does not take
is an error. The GEMV kernels (nvfp4, fp8, exl3) take --mode, --check_ms, --shapes (K x N list),
--ms, --copies (weight sets cycled to defeat L2), --iterations, --stages, --split_k and a tile
sweep (--tile_n; exl3: --tiles_n, --tiles_k; empty: the heuristic's config); nvfp4 also --orders
and --lines; exl3 --check_bits, --check_codebooks, --bits, --codebook, --op_bits. The attention
kernel takes --shape (kv heads, groups, head dim), --batches, --widths, --slots, --layers,
--configs (block_s/splits/stages list) and --iterations, and is timed against
specdec.ops.attention.attend_xla. Timings are CUPTI kernel time summed over a chain of independent
calls, so concurrent CUDA-graph regions are turned off first (xla_env.serialize_graphs). Each
figure's command and conditions: docs/benchmarks.md.
"""

import jax
from absl import app, flags

from kernels_pallas import decode_attention, exl3_gemv, fp8_gemv, nvfp4_gemv
from specdec import xla_env
from specdec.ops.attention import attend_xla

MODULES = {"nvfp4": nvfp4_gemv, "fp8": fp8_gemv, "exl3": exl3_gemv, "attention": decode_attention}
_KERNEL = flags.DEFINE_enum("kernel", None, list(MODULES), "the kernel to check and time")
flags.mark_flag_as_required("kernel")


def _ints(values):
  return tuple(int(v) for v in values)


def _shapes(values):
  return tuple(tuple(int(d) for d in v.split("x")) for v in values)


def _slashed(values):
  return tuple(tuple(int(d) for d in v.split("/")) for v in values)


flags.DEFINE_enum("mode", None, ["check", "bench", "all"], "GPU check, benchmark, or both")
flags.DEFINE_list("check_ms", None, "M values of the GPU check")
flags.DEFINE_list("shapes", None, "K x N list (exl3: in x out)")
flags.DEFINE_list("ms", None, "M values to time")
flags.DEFINE_integer("copies", None, "weight sets cycled to defeat L2")
flags.DEFINE_integer("iterations", None, "timed runs per case")
flags.DEFINE_list("stages", None, "pipeline depths to sweep")
flags.DEFINE_list("split_k", None, "K splits to sweep")
flags.DEFINE_list("tile_n", None, "rows per CTA to sweep (empty: the heuristic's)")
flags.DEFINE_list("orders", None, "bit orders of the NVFP4 codes to sweep")
flags.DEFINE_list("lines", None, "code lines per pipeline step to sweep")
flags.DEFINE_list("check_bits", None, "K bits of the EXL3 GPU check")
flags.DEFINE_list("check_codebooks", None, "codebooks of the EXL3 GPU check")
flags.DEFINE_list("bits", None, "EXL3 K bits to time")
flags.DEFINE_string("codebook", None, "EXL3 codebook to time")
flags.DEFINE_list("op_bits", None, "EXL3 K for which the whole op is timed too")
flags.DEFINE_list("tiles_n", None, "EXL3 n-tiles per CTA to sweep (empty: the heuristic's)")
flags.DEFINE_list("tiles_k", None, "EXL3 k-tiles per pipeline step to sweep")
flags.DEFINE_list("shape", None, "attention K,G,H: kv heads, groups, head dim")
flags.DEFINE_list("batches", None, "attention batch sizes")
flags.DEFINE_list("widths", None, "attention query tokens per row")
flags.DEFINE_list("slots", None, "attention cache lengths")
flags.DEFINE_integer("layers", None, "attention caches cycled so K/V come from HBM")
flags.DEFINE_list("configs", None, "attention block_s/splits/stages list (beside the heuristic's)")

GEMV = ("nvfp4", "fp8", "exl3")
# flag -> (its value as the kernel's `main` takes it, the kernels whose `main` takes it)
TAKES = {
  "mode": (str, GEMV),
  "check_ms": (_ints, GEMV),
  "shapes": (_shapes, GEMV),
  "ms": (_ints, GEMV),
  "copies": (int, GEMV),
  "iterations": (int, (*GEMV, "attention")),
  "stages": (_ints, GEMV),
  "split_k": (_ints, GEMV),
  "tile_n": (_ints, ("nvfp4", "fp8")),
  "orders": (tuple, ("nvfp4",)),
  "lines": (_ints, ("nvfp4",)),
  "check_bits": (_ints, ("exl3",)),
  "check_codebooks": (tuple, ("exl3",)),
  "bits": (_ints, ("exl3",)),
  "codebook": (str, ("exl3",)),
  "op_bits": (_ints, ("exl3",)),
  "tiles_n": (_ints, ("exl3",)),
  "tiles_k": (_ints, ("exl3",)),
  "shape": (_ints, ("attention",)),
  "batches": (_ints, ("attention",)),
  "widths": (_ints, ("attention",)),
  "slots": (_ints, ("attention",)),
  "layers": (int, ("attention",)),
  "configs": (_slashed, ("attention",)),
}


def options(kernel: str) -> dict:
  """The flags set, as keyword arguments of the kernel's `main` (one it does not take: an error)."""
  kwargs = {}
  for name, (convert, takers) in TAKES.items():
    value = flags.FLAGS[name].value
    if value is None:
      continue
    if kernel not in takers:
      raise app.UsageError(f"--{name} does not apply to --kernel={kernel}")
    kwargs[name] = convert(value)
  return kwargs


def main(argv):
  del argv
  xla_env.apply_defaults()  # the project's flags, then the kernel benchmarks' one exception:
  xla_env.serialize_graphs()  # CUPTI sums over a chain need the calls to run one after another
  kwargs = options(_KERNEL.value)
  print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}", flush=True)
  module = MODULES[_KERNEL.value]
  if module is decode_attention:
    module.main(attend_xla, **kwargs)
  else:
    module.main(**kwargs)


if __name__ == "__main__":
  app.run(main)
