"""Progress lines that tell the truth: the ETA comes from measured unit times (compile kept apart),
not from tqdm's rate, which counts a first call's compile as work."""

BAR_FORMAT = "{desc}{n_fmt}/{total_fmt} {unit} |{bar}| {elapsed} elapsed{postfix}"


def clock(seconds: float) -> str:
  """m:ss, or h:mm:ss from an hour up."""
  s = max(0, round(seconds))
  h, m = divmod(s // 60, 60)
  return f"{h}:{m:02d}:{s % 60:02d}" if h else f"{m}:{s % 60:02d}"


def eta(remaining: int, seconds_per_unit: float) -> str:
  """'ETA m:ss' for `remaining` more units at the measured seconds per unit."""
  return f"ETA {clock(remaining * seconds_per_unit)}"
