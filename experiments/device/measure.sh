#!/usr/bin/env bash
# Device measurements one after another, each cut so the call ends inside its limit; outputs and
# logs under $OUT. JOBS names them: mesh hybrid dense budget budget4k budget_t06 budget_b32 tree
# sweep sweep_cold sweep_fast sweep_xla default.
#   device run: JOBS="budget sweep" LIMIT=570 bash experiments/device/measure.sh   (carry .whl)
set -u
T0=$(date +%s); LIMIT=${LIMIT:-570}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
run() {  # name, command...
  local name=$1; shift
  local left=$(( LIMIT - $(date +%s) + T0 ))
  [ $left -gt 60 ] || { echo "== $name skipped ($left s left)"; return; }
  echo "== $name ($left s left) $(date +%T)"
  local t=$(date +%s)
  timeout $left "$@" > "$OUT/$name.log" 2>&1; echo "rc=$? in $(( $(date +%s) - t )) s"
  tr '\r' '\n' < "$OUT/$name.log" | grep -v "^\s*$" | tail -"${TAILN:-30}" | cut -c1-240
}
# Issue 22's k-only sweep (today's default before the context axis): 74 cells, bf16.
S="python3 -m experiments.sweep --config.dtype=bfloat16 --config.n_prompts=5
   --config.max_new_tokens=128 --config.workloads=('humaneval',) --config.prompt_tokens=(0,)
   --config.ks=(1,2,4,8,12,16) --noplots"
B="python3 -m experiments.bench_budget --profiles=high,low,high_low --trees=
   --batch=${BATCH:-32} --legs=${LEGS:-3}"
for job in ${JOBS}; do
  case $job in
    mesh) run mesh python3 -m experiments.bench_mesh_overhead --out="$OUT" ;;
    hybrid) run hybrid python3 -m experiments.bench_hybrid --out="$OUT/moe" ;;
    dense) run dense python3 -m experiments.bench_hybrid --shape=dense27b --out="$OUT/dense" ;;
    budget) run budget python3 -m experiments.bench_budget --out="$OUT" ;;
    # Issue 26 item 5(b), the chains and auto only; BATCH rows (32: the verify's cost grows with
    # k there, so the best k follows acceptance), LEGS measured legs.
    budget_b32) run budget_b32 $B --out="$OUT/b32" ;;  # 1k context, greedy
    budget4k) run budget4k $B --out="$OUT/4k" --prompt_tokens=4096 ;;  # another context
    budget_t06) run budget_t06 $B --out="$OUT/t06" --temperature=0.6 ;;  # sampled, 1k
    tree) run tree python3 -m experiments.bench_tree_verify --widths=4,8,16,32 --out="$OUT" ;;
    sweep)  # issue 22 item 5: the k-only sweep cold, then again with a fresh --out (cache hits)
      export SPECDEC_COMPILE_CACHE=/tmp/cc1
      TAILN=14 run sweep_cold $S --out=/tmp/sw_a
      TAILN=14 run sweep_rerun $S --out=/tmp/sw_b ;;
    sweep_cold)  # the k-only sweep cold alone: the baseline of the two below on the same card
      TAILN=14 SPECDEC_COMPILE_CACHE=/tmp/cc0 run sweep_cold $S --out=/tmp/sw_e ;;
    sweep_fast)  # the same k-only sweep cold without GEMM autotuning: how much of compile it is
      TAILN=14 SPECDEC_COMPILE_CACHE=/tmp/cc2 XLA_FLAGS=--xla_gpu_autotune_level=0 \
        run sweep_fast $S --out=/tmp/sw_c ;;
    sweep_xla)  # the same k-only sweep cold with XLA attention: what the Pallas kernels cost
      TAILN=14 SPECDEC_COMPILE_CACHE=/tmp/cc3 SPECDEC_ATTENTION=xla \
        run sweep_xla $S --out=/tmp/sw_d ;;
    default)  # issue 22 item 5: the default sweep (k x context, every drafter) in bf16, cold
      TAILN=14 run default python3 -m experiments.sweep --config.dtype=bfloat16 --noplots \
        --out=/tmp/sw_default ;;
    *) echo "unknown job $job" ;;
  esac
done
