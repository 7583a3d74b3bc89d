"""specdec.checkpoint.fingerprint: same bytes, same print; any changed file, a new one."""

import shutil

from specdec.checkpoint import fingerprint as fp


def _dir(tmp_path, files: dict):
  d = tmp_path / "ckpt"
  d.mkdir()
  for name, data in files.items():
    (d / name).write_bytes(data)
  return d


def test_same_bytes_same_print_and_every_change_shows(tmp_path, monkeypatch):
  d = _dir(tmp_path, {"config.json": b"{}", "model.safetensors": bytes(range(256)) * 64})
  base = fp.fingerprint(str(d))
  twin = tmp_path / "twin"
  shutil.copytree(d, twin)
  assert fp.fingerprint(str(twin)) == base  # the path is not part of the identity
  data = bytearray((d / "model.safetensors").read_bytes())
  data[7000] ^= 1
  (twin / "model.safetensors").write_bytes(bytes(data))
  assert fp.fingerprint(str(twin)) != base
  (twin / "model.safetensors").write_bytes((d / "model.safetensors").read_bytes())
  (twin / "extra.json").write_bytes(b"")
  assert fp.fingerprint(str(twin)) != base


def test_large_files_hash_both_ends_only(tmp_path, monkeypatch):
  monkeypatch.setattr(fp, "FULL_BYTES", 1000)
  monkeypatch.setattr(fp, "EDGE_BYTES", 100)
  d = _dir(tmp_path, {"w.bin": bytes(5000)})
  base = fp.fingerprint(str(d))
  for where, changes in ((50, True), (2500, False), (4950, True)):
    data = bytearray(5000)
    data[where] = 1
    (d / "w.bin").write_bytes(bytes(data))
    assert (fp.fingerprint(str(d)) != base) == changes, where
