"""The decode benchmark's Markdown: one table per part, every figure with its spread (min-max over
reps) and its conditions; a skipped or failed cell shows why in place of its figures.
"""

# Issue 9's bars for B = 1 decode, as a fraction of kernels_pallas.h200.COPY_CEILING_TBS (the rows'
# pct_of_4_24).
BARS = {"bf16": 0.85, "nvfp4": 0.70}


def _fmt_us(r: dict) -> str:
  return f"{r['us']:.1f} ({r['us_min']:.1f}-{r['us_max']:.1f})"


def _status(r: dict) -> str | None:
  if "skipped" in r:
    return f"skipped: {r['skipped']}"
  if "error" in r:
    return f"error: {r['error'][:200]}"
  return None


def _section(title: str, columns: str, rule: str, rows, head, body) -> list[str]:
  """A Markdown table: head(r) names the row's conditions, body(r) its figures; a skipped or failed
  row shows its status in the figures' first cell and leaves the others empty."""
  out = ["", f"### {title}", "", columns, rule]
  n_cols = rule.count("|") - 1
  for r in rows:
    h = head(r)
    status = _status(r)
    out.append(f"{h} {status} " + "|" * (n_cols - h.count("|") + 1) if status else f"{h} {body(r)}")
  return out


def _decode_figures(r: dict) -> str:
  bar = BARS.get(r["format"]) if r["batch"] == 1 else None
  bar_txt = "" if bar is None else ("met" if r["pct_of_4_24"] >= 100 * bar else "NOT met")
  bar_txt += f" (>= {100 * bar:.0f}%)" if bar else ""
  gb = (
    f"{(r['weight_bytes'] + r['kv_bytes']) / 1e9:.2f} ({r['weight_bytes'] / 1e9:.2f} + "
    f"{r['kv_bytes'] / 1e9:.2f})"
  )
  measured = r.get("pct_of_measured_copy")
  return (
    f"{_fmt_us(r)} | {r['tok_s']:.1f} | {gb} | {r['tb_s']:.2f} | "
    f"{'' if measured is None else f'{measured:.1f}%'} | {r['pct_of_4_24']:.1f}% | {bar_txt} | "
    f"{r['compile_s']:.1f} |"
  )


LOOP_KEYS = (
  "step",
  "draft",
  "verify",
  "target_fwd",
  "accept_commit",
  "loop",
  "empty_loop_slope",
  "empty_loop_fixed",
)


def _loop_figures(r: dict) -> str:
  c = r["hlo_copies"]
  copies = (
    f"{c['body']['n']} ({c['body']['bytes'] / 1e6:.1f} MB) / "
    f"{c['elsewhere']['n']} ({c['elsewhere']['bytes'] / 1e6:.1f} MB)"
  )
  return "".join(f"{r[f'{k}_us']:.1f} | " for k in LOOP_KEYS) + f"{copies} |"


def _flags_label(r: dict) -> str:
  return f"`{r['xla_flags'] or '(default)'}`"


def markdown(rows: list[dict]) -> str:
  """The run's tables: every figure with its spread (min-max over reps) and conditions."""
  by = lambda part: [r for r in rows if r.get("part") == part]  # noqa: E731
  out = []
  for r in by("copy"):
    if _status(r):
      out.append(f"copy: {_status(r)}")
    else:
      out.append(
        f"Copy ceiling (bf16 {r['gib']} GiB jitted copy x{r['iters']}, read + write): "
        f"{r['tb_s']:.2f} TB/s ({r['tb_s_min']:.2f}-{r['tb_s_max']:.2f}, {r['reps']} reps)"
      )
  if by("decode"):
    out += _section(
      "Decode (one-token greedy step, null drafter, in-jit chunks)",
      "| shape | format | fused | KV | B | ctx | step us (min-max) | tok/s | GB read/step "
      "(weights + KV) | TB/s | % of measured copy | % of 4.24 | bar | compile s |",
      "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|",
      by("decode"),
      lambda r: (
        f"| {r['shape']} | {r['format']} | {'yes' if r.get('fused') else 'no'} | "
        f"{r.get('kv_dtype', 'model')} | {r.get('batch', '')} | {r.get('context', '')} |"
      ),
      _decode_figures,
    )
  if by("verify"):
    base = {r["context"]: r["us"] for r in by("verify") if r.get("width") == 1 and "us" in r}

    def verify_figures(r):
      ratio = f"{r['us'] / base[r['context']]:.3f}" if r["context"] in base else ""
      return f"{_fmt_us(r)} | {ratio} | {r['compile_s']:.1f} |"

    out += _section(
      "Verify width (target forward over the cache, B = 1, LM head included)",
      "| shape | ctx | width | fwd us (min-max) | x width 1 | compile s |",
      "|---|---:|---:|---:|---:|---:|",
      by("verify"),
      lambda r: f"| {r['shape']} | {r['context']} | {r['width']} |",
      verify_figures,
    )
  if by("attention"):
    out += _section(
      "Attention over the cache, one layer-call (bf16, w queries per row)",
      "| shape | B | ctx | width | impl | us (min-max) | KV TB/s | rel err vs f32 |",
      "|---|---:|---:|---:|---|---:|---:|---:|",
      by("attention"),
      lambda r: f"| {r['shape']} | {r['batch']} | {r['context']} | {r['width']} | {r['impl']} |",
      lambda r: f"{_fmt_us(r)} | {r['tb_s']:.2f} | {r['rel_err_vs_f32']:.1e} |",
    )
  if by("loop"):
    out += _section(
      "Step parts and loop overhead per XLA_FLAGS arm (timing.time_step, us)",
      "| XLA_FLAGS | step | draft | verify | target fwd | accept+commit | loop (time_step) "
      "| empty loop slope | empty loop fixed | HLO copies in while body / elsewhere |",
      "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
      by("loop"),
      lambda r: f"| {_flags_label(r)} |",
      _loop_figures,
    )
  if by("flags"):
    out += _section(
      "Decode step per arm (a process per leg and arm, arms interleaved)",
      "| XLA_FLAGS | fused q/k/v, gate/up | attention | shape | format | B | ctx | leg "
      "| step us (min-max) | tok/s | % of 4.24 |",
      "|---|---|---|---|---|---:|---:|---:|---:|---:|---:|",
      by("flags"),
      lambda r: (
        f"| {_flags_label(r)} | {'yes' if r['fused'] else 'no'} | {r.get('attention', 'auto')} | "
        f"{r['shape']} | {r['format']} | {r['batch']} | {r['context']} | {r['leg']} |"
      ),
      lambda r: f"{_fmt_us(r)} | {r['tok_s']:.1f} | {r['pct_of_4_24']:.1f}% |",
    )
  if by("compile"):
    out += _section(
      "Compile of the decode chunk (fresh process each)",
      "| shape | format | B | ctx | n_steps | run | lower s | compile s | cache hits |",
      "|---|---|---:|---:|---:|---|---:|---:|---:|",
      by("compile"),
      lambda r: (
        f"| {r['shape']} | {r['format']} | {r['batch']} | {r['context']} | {r['n_steps']} "
        f"| {r['run']} |"
      ),
      lambda r: f"{r['lower_s']:.2f} | {r['compile_s']:.2f} | {r['cache_hits']} |",
    )
  for r in by("profile"):
    out += _profile_tables(r)
  return "\n".join(out)


def _profile_tables(r: dict) -> list[str]:
  fused = ", fused projections" if r.get("fused") else ""
  head = f"{r['shape']} {r['format']}{fused} B = {r['batch']} ctx {r['context']}"
  if _status(r):
    return ["", f"### Profile: {head}: {_status(r)}"]
  out = [
    "",
    f"### Profile: {head}",
    "",
    f"{r['kernels_per_step']:.0f} kernels and {r['kernel_us_per_step']:.1f} us of kernel time per "
    "step (summed: kernels that run side by side each count, so this can exceed the window); "
    f"traced window {r['window_us_per_step']:.1f} us per step, device busy "
    f"{100 * r['busy_fraction']:.1f}% of it; wall {r['traced_step_us']:.1f} us per step under the "
    f"tracer. HLO: {r['hlo_file']}.",
  ]
  for key, what in (("by_op", "HLO op stem"), ("by_kernel", "kernel")):
    out += [
      "",
      f"| {what} | per step | us per step | share of kernel time |",
      "|---|---:|---:|---:|",
    ]
    out += [
      f"| `{g['name'][:90]}` | {g['per_step']:.1f} | {g['us_per_step']:.1f} | "
      f"{100 * g['share']:.1f}% |"
      for g in r[key]
    ]
  return out
