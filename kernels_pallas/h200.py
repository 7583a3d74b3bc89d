"""The device the kernels are tuned for (NVIDIA H200), as numbers the kernels and benchmarks share.

COPY_CEILING_TBS is measured, not the spec sheet's 4.8 TB/s: a device-to-device copy on the H200
(docs/benchmarks.md, "Ceilings"); every "% of 4.24" figure divides by it.
"""

NUM_SMS = 132
COPY_CEILING_TBS = 4.24
SMEM_BYTES = 227 * 1024  # the most shared memory one CTA may take (Hopper)
