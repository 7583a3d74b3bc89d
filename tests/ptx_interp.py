"""A numpy interpreter for the straight-line PTX of the GEMV kernels' decodes (the CPU tests
run the very text the kernels inline)."""

import numpy as np

from kernels_pallas import gemv_common as gemv


def run_ptx(ptx: str, n_out: int, *inputs) -> list[np.ndarray]:
  """Interprets the straight-line PTX subset the GEMV decodes use, on uint32 arrays: inputs are
  $n_out.., outputs $0..$n_out-1."""
  env = {f"${n_out + i}": np.asarray(v, np.uint32) for i, v in enumerate(inputs)}
  for line in ptx.splitlines():
    line = line.strip().rstrip(";")
    if not line or line[0] in "{}.":
      continue
    op, operands = line.split(None, 1)
    dst, *srcs = (s.strip() for s in operands.split(","))
    a = [env[s] if s in env else np.uint32(int(s, 0)) for s in srcs]
    if op == "mov.b32":
      env[dst] = a[0]
    elif op == "shl.b32":
      env[dst] = a[0] << a[1]
    elif op == "shr.u32":
      env[dst] = a[0] >> a[1]
    elif op == "and.b32":
      env[dst] = a[0] & a[1]
    elif op == "lop3.b32":
      out = np.uint32(0)
      for i in range(8):  # minterm i = (a, b, c) bits (4, 2, 1) of the lookup table's index
        if int(a[3]) >> i & 1:
          terms = [x if i >> s & 1 else ~x for x, s in zip(a[:3], (2, 1, 0), strict=True)]
          out = out | (terms[0] & terms[1] & terms[2])
      env[dst] = out
    elif op == "mul.rn.bf16x2":
      halves = [
        gemv.f32_to_bf16_bits(
          gemv.bf16_bits_to_f32((a[0] >> np.uint32(s)) & np.uint32(0xFFFF))
          * gemv.bf16_bits_to_f32((a[1] >> np.uint32(s)) & np.uint32(0xFFFF))
        )
        for s in (0, 16)
      ]
      env[dst] = halves[0] | (halves[1] << np.uint32(16))
    else:
      raise NotImplementedError(op)
  return [env[f"${i}"] for i in range(n_out)]
