"""Weights folders whose files pass the format checks but whose values cannot predict (a zero
input spread, no members, an unknown head mode, a tile of 0 rows, an overflowing σ, GPUs the
catalog lacks): one error line naming the manifest key, never NaN with exit 0 or a traceback.
Also: kit collect --resume over a file no reader can load, and kit data fetch over one's files."""
import hashlib
import json
import shutil

import pytest

from cli_support import one_error_line as _err
from kit.predict.weights import SHIPPED_DIR

OP = ["op", "gemm", "--gpu", "a100-pcie-40gb", "--m", "1024", "--n", "1024", "--k", "1024",
      "--predictor", "tile", "--weights"]


def _weights(tmp_path, edit=None, tensors=None):
    """A copy of the shipped weights with one thing changed; the manifest's sha256 is refreshed
    so that the file check passes and the value check is what is tested."""
    from safetensors.numpy import load_file, save_file

    d = tmp_path / "w"
    shutil.copytree(SHIPPED_DIR, d, ignore=shutil.ignore_patterns("__pycache__", "*.py"))
    m = json.loads((d / "manifest.json").read_text())
    if tensors:
        t = load_file(d / "model.safetensors")
        tensors(t)
        save_file(t, d / "model.safetensors")
        m["sha256"] = {"model.safetensors": hashlib.sha256((d / "model.safetensors").read_bytes()).hexdigest()}
    if edit:
        edit(m)
    (d / "manifest.json").write_text(json.dumps(m))
    return str(d)


def _gemm(m):
    return m["parts"]["tile"]["classes"]["gemm"]


@pytest.mark.parametrize("edit, tensors, needle", [
    (None, lambda t: t.__setitem__("tile.gemm.0.x_std", 0 * t["tile.gemm.0.x_std"]),
     "x_std must be > 0"),  # NaN latency, exit 0
    (lambda m: _gemm(m).__setitem__("members", 0), None, "members must be a whole number >= 1"),
    (lambda m: _gemm(m).__setitem__("mode", "bogus"), None, "mode must be one of"),  # KeyError
    (lambda m: m["parts"]["tile_choice"].__setitem__("vocab", [[0, 0, 0, 0]] * 7), None,
     "tile_choice.vocab must be"),  # ZeroDivisionError
    (lambda m: m["parts"]["tile"]["transfer_sigma"].__setitem__("gemm", 1e308), None,
     "numbers from 0 to 10"),  # OverflowError
    (lambda m: m["parts"]["tile"]["band"].__setitem__("train_gpus", ["foo-gpu"]), None,
     "parts.tile.band.train_gpus names GPU 'foo-gpu'"),
    (lambda m: m.__setitem__("version", True), None, "weights format version True"),
])
def test_weights_that_cannot_predict_are_refused_when_loaded(tmp_path, capsys, edit, tensors, needle):
    line = _err(capsys, [*OP, _weights(tmp_path, edit, tensors)])
    assert needle in line


def test_the_shipped_weights_still_load(capsys):
    from kit.cli import main

    assert main([*OP, str(SHIPPED_DIR), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["latency_ms"] > 0


def test_collect_resume_refuses_a_file_no_reader_can_load(tmp_path, capsys):
    from kit.cli import main

    out = tmp_path / "a.csv"
    assert main(["collect", "--ops", "gemm", "--shapes", "tiny-gemm:2", "--out", str(out),
                 "--device", "cpu", "--no-l2-flush", "--repeats", "3"]) == 0
    capsys.readouterr()
    lines = out.read_text().splitlines()
    lines[2] = "garbage,,,"
    out.write_text("\n".join(lines) + "\n")
    before = out.read_text()
    line = _err(capsys, ["collect", "--ops", "gemm", "--shapes", "tiny-gemm:3", "--out", str(out),
                         "--device", "cpu", "--no-l2-flush", "--repeats", "3", "--resume"])
    assert "cannot resume" in line and "garbage" in line and out.read_text() == before
