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


@pytest.mark.parametrize("edit, needle", [
    (lambda m: m.__setitem__("train_gpus", [*m["train_gpus"], "foo-gpu"]), "train_gpus names GPU 'foo-gpu'"),
    (lambda m: m["parts"]["li"]["coefs"]["gemm"].__setitem__("foo-gpu", [1.0, 1.0, 0.01]),
     "parts.li.coefs.gemm names GPU 'foo-gpu'"),
    (lambda m: m["parts"]["tile"]["band"]["sigma_at_0"].__setitem__("gemm", 11.0), "numbers from 0 to 10"),
])
def test_more_weights_values_that_cannot_predict(tmp_path, capsys, edit, needle):
    assert needle in _err(capsys, [*OP, _weights(tmp_path, edit)])


def test_weights_naming_a_gpu_of_a_gpu_file_load_with_that_file(tmp_path, capsys):
    # the weights were checked before --gpu-file was read: "names GPU ... which the catalog does
    # not know (load its file with --gpu-file first)", with --gpu-file given
    from kit.cli import main
    from kit.hardware import unregister_gpu
    from kit.hardware.catalog import _builtin_entries

    entry = {**_builtin_entries()["t4"], "key": "weights-t4", "name": "Weights T4", "aliases": []}
    (tmp_path / "gpu.json").write_text(json.dumps(entry))
    w = _weights(tmp_path, lambda m: m.__setitem__("train_gpus", [*m["train_gpus"], "weights-t4"]))
    try:
        assert main(["op", "gemm", "--gpu", "weights-t4", "--m", "1024", "--n", "1024", "--k", "1024",
                     "--gpu-file", str(tmp_path / "gpu.json"), "--weights", w, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["latency_ms"] > 0
    finally:
        unregister_gpu("weights-t4")


def test_a_measurement_csv_with_a_column_twice_is_refused(tmp_path, capsys):
    f = tmp_path / "t.csv"
    f.write_text("op,gpu,dtype,b,m,n,k,latency_ms,latency_ms\nbmm,t4,fp32,1,64,64,64,0.5,0.7\n")
    assert "column(s) latency_ms appear twice" in _err(capsys, ["evaluate", "--test", str(f)])


def test_kit_train_records_the_folder_it_read(tmp_path, monkeypatch):
    import argparse

    from kit.cli import cmd_train

    seen = {}
    monkeypatch.setattr("kit.api.train_predictors", lambda *a, **kw: seen.update(kw) or {})
    monkeypatch.setenv("KIT_DATA", "data")  # relative: recorded as the folder it names
    (tmp_path / "data" / "data").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    args = argparse.Namespace(out=str(tmp_path / "w"), threads=1, data=None, train_gpus="T4", seed=0,
                              quick=True, no_direct=False, no_test_rows=False, replace_shipped=False,
                              keep_suspect_rows=False, extra=None, json=True)
    cmd_train.run(args)  # the command had named no --data when KIT_DATA chose the folder
    assert f"--data {(tmp_path / 'data').resolve()} --train-gpus T4" in seen["command"]


@pytest.mark.parametrize("flags", [["--part", "test"], ["--data", "/nowhere"]])
def test_data_summary_of_a_file_refuses_options_of_a_part(tmp_path, capsys, flags):
    # --part and --data were ignored beside --file, the file summarised as if they were not given
    from kit.cli import main

    f = tmp_path / "t.csv"
    f.write_text("OPName,Latency,Device,B,M,N,K\nbmm,0.5,NVIDIA L4,1,512,512,512\n")
    assert "--file summarises one CSV" in _err(capsys, ["data", "summary", "--file", str(f), *flags])
    assert main(["data", "summary", "--file", str(f), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["total"] == 1
