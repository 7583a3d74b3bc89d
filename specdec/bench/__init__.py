"""Benchmarks: step and decode timing, random targets of any shape, peers, GPU profiles."""
