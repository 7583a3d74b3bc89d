from specdec.progress import clock, eta


def test_clock_and_eta():
  assert clock(0) == "0:00" and clock(59.6) == "1:00" and clock(754) == "12:34"
  assert clock(3600 + 62) == "1:01:02" and clock(-3) == "0:00"
  assert eta(10, 1.5) == "ETA 0:15"
