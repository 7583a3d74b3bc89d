"""Pallas GPU kernels, one per file: tuning config, kernel, `reference()`, benchmark `main()`."""
