"""Pallas GPU kernels, one per file: tuning config, kernel, `reference()`, benchmark `main()`.

The weight-only GEMV kernels share kernels_pallas/gemv_common.py (and bench_util.py for their
benchmarks); specdec.ops.qmatmul decides when the model runs them. Kernels import jax, numpy and
specdec.quant only; experiments/bench_kernel.py runs every benchmark.
"""
