"""The embedding collector after the audit: refusals up front (B7), every row read back checked
(B8), the op collector's rule for an unfinished last line (B9/B13), its file guards (B3, B4, B5),
SIGTERM recorded (B11), duplicates in the grid (B14), and the op collector's warm-up and provenance
(M4). (The backward timed after the flush, M3: test_collect_methodology.py.)"""
import builtins
import json
import os
import signal
from pathlib import Path

import pytest

from kit.cli import main
from kit.data.records import Lock
from kit.embedding import collect as E
from kit.embedding.correction import main as correction_main
from kit.errors import KitError


def tiny(**kw):
    args = dict(batch=[16], rows=[500], dim=[8], pooling=[3], distributions=["uniform", "zipf:1.2"])
    args.update(kw)
    return E.grid(**args)


CLI = ["collect-embedding", "--rows", "300", "--dim", "4", "--pooling", "2", "--batch", "8",
       "--dist", "uniform", "--repeats", "1", "--warmup", "0"]


def test_an_optimizer_torch_cannot_run_is_refused_before_anything_is_written(tmp_path, capsys):
    out = tmp_path / "e.csv"
    rc = main([*CLI, "--out", str(out), "--backward", "--optimizer", "rowwise_adagrad", "--backend", "torch"])
    err = capsys.readouterr().err
    assert rc == 2 and "needs the fbgemm backend" in err and len(err.strip().splitlines()) == 1
    assert not out.exists() and not (tmp_path / "e.meta.json").exists()


def test_every_row_read_back_is_checked(tmp_path, capsys):
    out = tmp_path / "e.csv"
    E.collect(tiny(), out, repeats=1, warmup=0)
    good = out.read_text()
    bad = good.splitlines()[2].split(",")
    bad[E.COLUMNS.index("latency_ms")] = "fast"
    out.write_text(good + ",".join(bad) + "\n")
    with pytest.raises(KitError, match=r"e.csv:4: latency_ms must be a positive number, got 'fast'"):
        E.collect(tiny(rows=[700]), out, repeats=1, warmup=0, resume=True)
    with pytest.raises(KitError, match=r"e.csv:4: latency_ms"):
        E.load(out)
    rc = correction_main([str(out), "--gpu", "h100-sxm", "--out", str(tmp_path / "c.json")])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("kit: error: ") and "e.csv:4: latency_ms" in err
    assert len(err.strip().splitlines()) == 1
    out.unlink()  # the module's own refusal: CPU rows without --gpu, one line too
    E.collect(tiny(batch=[8, 16, 32]), out, repeats=1, warmup=0)
    capsys.readouterr()
    assert correction_main([str(out), "--out", str(tmp_path / "c.json")]) == 2
    err = capsys.readouterr().err
    assert "pass the GPU" in err and len(err.strip().splitlines()) == 1


def test_a_last_row_without_its_newline_is_measured_again_and_a_cut_header_rewritten(tmp_path):
    out = tmp_path / "e.csv"
    E.collect(tiny(), out, repeats=1, warmup=0)
    out.write_bytes(out.read_bytes().rstrip(b"\n"))  # every field there: it may still be cut short
    with pytest.warns(UserWarning, match="dropped an unfinished last line"):
        r = E.collect(tiny(), out, repeats=1, warmup=0, resume=True)
    assert (r["written"], r["skipped"]) == (1, 1) and len(E.load(out)) == 2
    cut = tmp_path / "h.csv"
    cut.write_text(",".join(E.COLUMNS)[:20])  # killed while writing the header
    with pytest.warns(UserWarning, match="dropped an unfinished"):
        assert E.collect(tiny(), cut, repeats=1, warmup=0, resume=True)["written"] == 2
    assert list(E.load(cut).columns) == E.COLUMNS


def test_read_only_gzip_and_locked_outputs_are_one_clear_error(tmp_path, monkeypatch):
    with pytest.raises(KitError, match="cannot write gzip"):
        E.collect(tiny(), tmp_path / "e.csv.gz", repeats=1, warmup=0)
    out = tmp_path / "e.csv"
    E.collect(tiny(), out, repeats=1, warmup=0)
    with Lock(out):
        with pytest.raises(KitError, match="being written by another run"):
            E.collect(tiny(rows=[700]), out, repeats=1, warmup=0, resume=True)
    real = builtins.open
    out.chmod(0o444)

    def read_only(file, mode="r", *a, **k):  # as the file is for a user other than root
        if isinstance(file, (str, Path)) and Path(file) == out and any(c in mode for c in "wa+"):
            raise PermissionError(13, "Permission denied", str(file))
        return real(file, mode, *a, **k)

    monkeypatch.setattr(builtins, "open", read_only)
    with pytest.raises(KitError, match=f"cannot write {out}: Permission denied"):
        E.collect(tiny(rows=[700]), out, repeats=1, warmup=0, resume=True)


def test_sigterm_is_recorded_as_an_interruption(tmp_path):
    got = []
    def mine(*a):
        got.append("term")

    old = signal.signal(signal.SIGTERM, mine)  # without the fix: no death
    try:
        out = tmp_path / "e.csv"
        with pytest.raises(KeyboardInterrupt):
            E.collect(tiny(rows=[500, 600, 700]), out, repeats=1, warmup=0,
                      progress=lambda row: os.kill(os.getpid(), signal.SIGTERM))
        run = json.loads((tmp_path / "e.meta.json").read_text())["runs"][0]
        assert run["status"] == "interrupted: SIGTERM" and run["written"] == 1 and not got
        assert signal.getsignal(signal.SIGTERM) is mine  # the caller's is back
    finally:
        signal.signal(signal.SIGTERM, old)


def test_duplicates_in_the_grid_are_not_called_already_there(tmp_path, capsys):
    assert main([*CLI, "--rows", "100,100", "--out", str(tmp_path / "e.csv")]) == 0
    out = capsys.readouterr().out
    assert "1 rows written, 0 already there, 1 repeated in the grid" in out


def test_warm_up_and_provenance_as_the_op_collector(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(E, "warm_for", lambda call, seconds, sync=None: seen.append(seconds) or call())
    E.collect(tiny(batch=[8, 32]), tmp_path / "e.csv", repeats=1, warmup=0, warmup_ms=50)
    assert seen == [0.05]  # once, before the first measurement
    run = json.loads((tmp_path / "e.meta.json").read_text())["runs"][0]
    assert run["settings"]["warmup_ms"] == 50 and run["host"] and run["argv"]
    assert run["torch"]["num_threads"] >= 1 and "nvidia_smi_before" in run
    seen.clear()
    E.collect(tiny(), tmp_path / "f.csv", repeats=1, warmup=0)
    assert seen == []  # 0 ms by default on the CPU
