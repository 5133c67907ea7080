"""A shape the collector cannot get past does not block --resume: a CUDA error that loses the
context (faked here: the collector is tested without a GPU) or a process that dies on the shape
twice is recorded in FILE.failed.jsonl, and a resume skips it, says so, and measures the rest;
--retry-failed measures it again. Before: every resume measured the failed shape first, stopped
at it again, and the shapes after it were never reached."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kit.cli.cmd_collect import text
from kit.data import collect as C
from kit.data import load_measurements
from kit.errors import KitError

SHAPES = [(1, 2, 3, 4), (1, 3, 3, 3), (1, 4, 4, 4)]
BAD = (1, 3, 3, 3)
ILLEGAL = "CUDA error: an illegal memory access was encountered"


def _fake_cuda(monkeypatch, tried, error=ILLEGAL):
    """A fake CUDA device whose timer raises RuntimeError(error) on BAD (calls return their
    shape)."""
    env = {"device_name": "NVIDIA H200", "gpu": "h200", "torch_version": "x", "cuda_version": "12",
           "cudnn_version": None}
    monkeypatch.setattr(C, "environment", lambda device: env)
    monkeypatch.setattr(C, "build_call", lambda op, shape, *a, **k: (lambda: shape))
    monkeypatch.setattr(C, "gpu_snapshot", lambda *a, **k: {"error": "none here"})
    monkeypatch.setattr(C, "run_record", lambda device: {"status": "running", "torch": {"num_threads": 1}})
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)

    def timer(call, warmup, repeats, flush=None, before=None):
        tried.append(call())
        if call() == BAD:
            raise RuntimeError(error)
        return [0.01] * repeats

    monkeypatch.setattr(C, "time_cuda", timer)


def _sweep(out, **kw):
    return C.collect("bmm", SHAPES, out, device="cuda", warmup=0, repeats=2, profile=False,
                     l2_flush=False, warmup_ms=0, progress=False, **kw)


def test_a_shape_that_lost_the_cuda_context_is_skipped_by_resume_and_listed(tmp_path, monkeypatch):
    tried, out = [], tmp_path / "m.csv"
    _fake_cuda(monkeypatch, tried)
    first = _sweep(out)
    assert (first["measured"], tried) == (1, [(1, 2, 3, 4), BAD]) and "CUDA error" in first["stopped"]

    tried.clear()
    again = _sweep(out, resume=True)
    assert tried == [(1, 4, 4, 4)]  # before: [BAD], stopped there again, (1, 4, 4, 4) never reached
    line = json.loads((tmp_path / "m.failed.jsonl").read_text().splitlines()[0])
    assert line["fatal"] is True and line["shape"] == list(BAD) and "illegal memory" in line["error"]
    assert again["stopped"] is None and again["measured"] == 1 and again["rows_in_file"] == 2
    assert [(f["op"], f["shape"]) for f in again["skipped_failed"]] == [("bmm", list(BAD))]
    assert "illegal memory" in again["skipped_failed"][0]["error"]
    said = text(again)
    assert "1 skipped" in said and "--retry-failed" in said and "illegal memory" in said
    assert len(load_measurements(out)) == 2  # the rows measured before are all there

    tried.clear()
    third = _sweep(out, resume=True, retry_failed=True)
    assert tried == [BAD] and "CUDA error" in third["stopped"] and not third["skipped_failed"]


def test_a_line_from_before_the_fatal_flag_is_read_by_its_error(tmp_path, monkeypatch):
    tried, out = [], tmp_path / "m.csv"
    _fake_cuda(monkeypatch, tried)
    _sweep(out)
    lines = [json.loads(x) for x in (tmp_path / "m.failed.jsonl").read_text().splitlines()]
    for x in lines:
        x.pop("fatal", None)
    (tmp_path / "m.failed.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    tried.clear()
    assert _sweep(out, resume=True)["measured"] == 1 and tried == [(1, 4, 4, 4)]


def test_an_out_of_memory_shape_is_measured_again_by_resume(tmp_path, monkeypatch):
    tried, out = [], tmp_path / "m.csv"
    _fake_cuda(monkeypatch, tried, "CUDA error: out of memory")
    first = _sweep(out)
    assert first["stopped"] is None and first["measured"] == 2
    tried.clear()
    with pytest.raises(KitError, match="every measurement failed.*out of memory"):
        _sweep(out, resume=True)
    assert tried == [BAD]  # it did not stop the run: tried again (and fails again here)


CRASH = """
import os, signal, sys
from kit.data import collect as C
real = C.build_call
def build(op, shape, *a, **k):
    if tuple(shape) == (1, 3, 3, 3):
        os.kill(os.getpid(), signal.SIGSEGV)  # a crash in a library: no Python error, no finally
    return real(op, shape, *a, **k)
C.build_call = build
r = C.collect("bmm", [(1, 2, 3, 4), (1, 3, 3, 3), (1, 4, 4, 4)], sys.argv[1], device="cpu",
              warmup=0, repeats=1, progress=False, resume=sys.argv[2] == "resume")
print(__import__("json").dumps({k: r[k] for k in ("measured", "skipped_failed", "died_earlier")}))
"""


def test_a_shape_the_process_dies_on_twice_is_skipped(tmp_path):
    out = tmp_path / "m.csv"
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(Path(__file__).resolve().parents[1])}

    def run(mode):
        return subprocess.run([sys.executable, "-c", CRASH, str(out), mode], env=env,
                              capture_output=True, text=True, timeout=300)

    first = run("fresh")
    assert first.returncode == -signal.SIGSEGV, first.stderr[-2000:]
    marker = json.loads((tmp_path / "m.measuring.json").read_text())
    assert (marker["op"], marker["shape"]) == ("bmm", list(BAD))
    second = run("resume")  # one death may be a kill by hand: measured once more, and dies again
    assert second.returncode == -signal.SIGSEGV, second.stderr[-2000:]
    deaths = [json.loads(x) for x in (tmp_path / "m.failed.jsonl").read_text().splitlines()]
    assert [(d["shape"], d["died"]) for d in deaths] == [(list(BAD), True)]
    third = run("resume")
    assert third.returncode == 0, third.stderr[-2000:]
    r = json.loads(third.stdout)
    assert r["measured"] == 1 and r["died_earlier"]["shape"] == list(BAD)
    assert [f["shape"] for f in r["skipped_failed"]] == [list(BAD)] and "died" in r["skipped_failed"][0]["error"]
    assert sorted(zip(*[load_measurements(out)[c] for c in ("m", "k", "n")])) == [(2, 3, 4), (4, 4, 4)]
    assert not (tmp_path / "m.measuring.json").exists()


def test_a_kit_csv_whose_last_field_was_cut_is_not_read_as_a_shorter_number(tmp_path):
    # the collector writes each line whole with its newline; a kill mid-write can leave the last
    # line with every field but the last one cut short. Before: read as that shorter number
    out = tmp_path / "m.csv"
    C.collect("bmm", [(1, 2, 3, 4), (1, 8, 8, 8)], out, device="cpu", warmup=0, repeats=3,
              progress=False)
    whole = out.read_bytes()
    assert whole.endswith(b"\n") and not whole.endswith(b",\n")  # the last field has a value
    out.write_bytes(whole[:-3])
    with pytest.warns(UserWarning, match="ignored an unfinished last line"):
        assert load_measurements(out).m.tolist() == [2]
    with pytest.warns(UserWarning, match="dropped an unfinished last line"):  # and a resume measures it again
        r = C.collect("bmm", [(1, 2, 3, 4), (1, 8, 8, 8)], out, device="cpu", warmup=0, repeats=3,
                      progress=False, resume=True)
    assert (r["skipped"], r["measured"]) == (1, 1) and sorted(load_measurements(out).m) == [2, 8]


def test_retry_failed_without_resume_is_one_clear_error(tmp_path, capsys):
    # a fresh run skips nothing, so --retry-failed alone had done nothing, without a word
    from kit.cli import main
    out = tmp_path / "m.csv"
    with pytest.raises(KitError, match="--retry-failed needs --resume"):
        C.collect("bmm", SHAPES, out, device="cpu", warmup=0, repeats=1, progress=False,
                  retry_failed=True)
    assert main(["collect", "--ops", "bmm", "--shapes", "tiny-gemm:2", "--device", "cpu",
                 "--out", str(out), "--retry-failed"]) != 0
    err = capsys.readouterr().err
    assert "--retry-failed needs --resume" in err and "Traceback" not in err
    assert not out.exists()  # refused before anything was written


def test_a_run_stopped_by_sigterm_leaves_no_marker_and_is_not_read_as_a_death(tmp_path, monkeypatch):
    # device_session.sh stops a step with TERM; the collector records an interruption, and the
    # shape it was measuring must not count as one the process died on (two such stops would
    # have skipped it)
    out, real = tmp_path / "m.csv", C.build_call

    def build(op, shape, *a, **k):
        if tuple(shape) == BAD:
            os.kill(os.getpid(), signal.SIGTERM)  # sigterm_interrupts raises KeyboardInterrupt
        return real(op, shape, *a, **k)

    monkeypatch.setattr(C, "build_call", build)
    for _ in range(2):
        with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
            C.collect("bmm", SHAPES, out, device="cpu", warmup=0, repeats=1, progress=False, resume=True)
        assert not (tmp_path / "m.measuring.json").exists()
    monkeypatch.setattr(C, "build_call", real)
    r = C.collect("bmm", SHAPES, out, device="cpu", warmup=0, repeats=1, progress=False, resume=True)
    assert (r["died_earlier"], r["skipped_failed"], r["measured"], r["rows_in_file"]) == (None, [], 2, 3)
    assert not (tmp_path / "m.failed.jsonl").exists()


def test_no_shape_is_named_in_progress_once_its_row_is_written(tmp_path, monkeypatch):
    # a process killed in the cooldown after a row had left the marker naming that shape: the
    # resume said "the last run died while measuring" a shape in the file, and logged a death
    out, seen = tmp_path / "m.csv", []
    monkeypatch.setattr(C.time, "sleep", lambda s: seen.append(
        ((tmp_path / "m.measuring.json").exists(), len(out.read_text().splitlines()) - 1)))
    C.collect("bmm", SHAPES, out, device="cpu", warmup=0, repeats=1, progress=False, cooldown_ms=5)
    assert seen == [(False, 1), (False, 2), (False, 3)]  # one cooldown after each of the 3 rows


@pytest.mark.parametrize("marker", [{"op": "bmm", "shape": 5}, {"op": None, "shape": [1, 3, 3, 3]}])
def test_a_marker_that_names_no_shape_is_ignored(tmp_path, marker):
    # FILE.measuring.json edited by hand: a shape of 5 was a TypeError traceback on resume, and an
    # op of null a death "while measuring None [1, 3, 3, 3]"
    out = tmp_path / "m.csv"
    C.collect("bmm", SHAPES[:1], out, device="cpu", warmup=0, repeats=1, progress=False)
    device = json.loads((tmp_path / "m.meta.json").read_text())["runs"][0]["device_name"]
    (tmp_path / "m.measuring.json").write_text(json.dumps({**marker, "dtype": "fp32", "device": device}))
    r = C.collect("bmm", SHAPES, out, device="cpu", warmup=0, repeats=1, progress=False, resume=True)
    assert (r["died_earlier"], r["measured"], r["rows_in_file"]) == (None, 2, 3)
    assert not (tmp_path / "m.measuring.json").exists() and not (tmp_path / "m.failed.jsonl").exists()


def test_a_folder_where_the_marker_goes_does_not_stop_the_run(tmp_path):
    # the side files never stop a run (a failure's line is not written on a full disk either);
    # removing the marker was the one that raised: IsADirectoryError, a traceback, no row kept
    (tmp_path / "m.measuring.json").mkdir()
    out = tmp_path / "m.csv"
    r = C.collect("bmm", SHAPES, out, device="cpu", warmup=0, repeats=1, progress=False)
    assert r["measured"] == 3 and len(load_measurements(out)) == 3


def test_force_without_resume_is_one_clear_error(tmp_path, capsys):
    # --force only lets a resume adopt rows without a meta.json: on a fresh run it had done
    # nothing, without a word, as --retry-failed alone had
    from kit.cli import main
    out = tmp_path / "m.csv"
    with pytest.raises(KitError, match="--force needs --resume"):
        C.collect("bmm", SHAPES, out, device="cpu", warmup=0, repeats=1, progress=False, force=True)
    assert main(["collect", "--ops", "bmm", "--shapes", "tiny-gemm:2", "--device", "cpu",
                 "--out", str(out), "--force"]) != 0
    err = capsys.readouterr().err
    assert "--force needs --resume" in err and "Traceback" not in err
    assert not out.exists()  # refused before anything was written
