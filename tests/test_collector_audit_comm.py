"""`kit collect-comm` after the collector audit: the rows a stopped sweep kept are never lost and
--resume finishes them (B1), one writer at a time (B5), a collective named twice is measured once
(B6), and each "#  Rank" line carries its own rank's pid (B14). gloo ranks, forked."""
import json
import os

import pytest

from kit.cli import main
from kit.comm import measure
from kit.comm.measure import collect, read_rows, rows_path
from kit.comm.parsers import parse_nccl_tests
from kit.data.records import Lock
from kit.errors import KitError

FAST = dict(backend="gloo", ranks=2, kinds=["allreduce"], iters=2, warmup=0, repeats=1, start_method="fork")


def test_a_rerun_keeps_the_rows_a_stopped_sweep_measured_and_resume_finishes_them(tmp_path, monkeypatch, capsys):
    real = measure._op

    def dies_at_8k(kind, count, n, rank, dev):
        if count * 4 >= 8192:
            raise RuntimeError("cannot allocate memory")
        return real(kind, count, n, rank, dev)

    monkeypatch.setattr(measure, "_op", dies_at_8k)  # forked ranks inherit both
    monkeypatch.setattr(measure, "INTERLEAVE_BYTES", 1)  # each size on its own, as 300G was
    out = tmp_path / "cf.txt"
    with pytest.raises(KitError, match=r"2 row\(s\) measured before .*--resume"):
        collect(sizes=[1024, 2048, 8192], out=out, **FAST)
    kept = read_rows(rows_path(out))
    assert [r["size_bytes"] for r in kept] == [1024, 2048]
    # the auditor's rerun: refused in one line, the rows untouched
    capsys.readouterr()
    assert main(["collect-comm", "--out", str(out), "--sizes", "1K", "--iters", "2", "--repeats", "1"]) == 2
    err = capsys.readouterr().err
    assert "holds 2 row(s)" in err and "--resume" in err and len(err.strip().splitlines()) == 1
    assert read_rows(rows_path(out)) == kept
    with pytest.raises(KitError, match="iters 2 then, 3 now"):  # measured another way: no mixing
        collect(sizes=[1024, 4096], out=out, resume=True, **{**FAST, "iters": 3})
    monkeypatch.setattr(measure, "_op", real)
    text, table = collect(sizes=[1024, 2048, 4096], out=out, resume=True, **FAST)
    assert list(table.size_bytes) == [1024, 2048, 4096]
    assert list(table.time_us[:2]) == [r["time_us"] for r in kept]  # kept, not measured again
    assert list(parse_nccl_tests(out).size_bytes) == [1024, 2048, 4096]
    assert not rows_path(out).exists()


def test_force_discards_the_kept_rows(tmp_path):
    out = tmp_path / "cf.txt"
    rows_path(out).write_text('{"kind": "allreduce", "size_bytes": 1024, "count": 256, "dtype": "float", '
                              '"time_us": 1.0, "wrong": 0}\n')
    with pytest.raises(KitError, match="--force to discard"):
        collect(sizes=[1024], out=out, **FAST)
    with pytest.raises(KitError, match="does not say how its rows were measured"):  # an older kit's
        collect(sizes=[1024], out=out, resume=True, **FAST)
    _, table = collect(sizes=[1024], out=out, force=True, **FAST)
    assert table.time_us[0] != 1.0 and out.is_file()


def test_a_collective_named_twice_is_measured_once_with_each_ranks_pid(tmp_path):
    text, table = collect(sizes=[1024], out=tmp_path / "d.txt", **{**FAST, "kinds": ["allreduce", "all_reduce"]})
    assert list(table.kind) == ["allreduce"] and text.count("# Collective test starting") == 1
    pids = [int(line.split("Pid")[1].split()[0]) for line in text.splitlines() if line.startswith("#  Rank")]
    assert len(pids) == 2 and len(set(pids)) == 2 and os.getpid() not in pids


def test_a_second_sweep_into_the_same_file_is_refused(tmp_path):
    out = tmp_path / "cf.txt"
    with Lock(out):
        with pytest.raises(KitError, match="being written by another run"):
            collect(sizes=[1024], out=out, **FAST)
    assert not out.exists() and not rows_path(out).exists()


def test_the_cli_resumes_over_an_earlier_file_when_a_stopped_sweep_kept_rows(tmp_path, monkeypatch, capsys):
    """FILE from an earlier, finished sweep and rows a later --force rerun kept before it stopped:
    --resume had been refused ("already exists; pass --force"), and --force would discard them."""
    real = measure._op

    def dies_at_8k(kind, count, n, rank, dev):
        if count * 4 >= 8192:
            raise RuntimeError("cannot allocate memory")
        return real(kind, count, n, rank, dev)

    out = tmp_path / "cf.txt"
    out.write_text("an earlier sweep\n")
    monkeypatch.setattr(measure, "_op", dies_at_8k)
    monkeypatch.setattr(measure, "INTERLEAVE_BYTES", 1)
    with pytest.raises(KitError, match="--resume"):  # the stopped rerun (forked: the patch holds)
        collect(sizes=[1024, 8192], out=out, force=True, **FAST)
    kept = read_rows(rows_path(out))
    assert [r["size_bytes"] for r in kept] == [1024]
    monkeypatch.setattr(measure, "_op", real)
    capsys.readouterr()
    args = ["collect-comm", "--out", str(out), "--iters", "2", "--repeats", "1", "--warmup", "0"]
    assert main(args + ["--sizes", "1K,2K", "--resume"]) == 0, capsys.readouterr().err
    assert list(parse_nccl_tests(out).size_bytes) == [1024, 2048]
    assert not rows_path(out).exists()


def test_resume_over_an_older_kits_rows_writes_one_count_convention(tmp_path):
    """An older kit kept the total count in a stopped sweep's rows (2048 for an 8 KiB all-gather
    on 2 ranks, where nccl-tests prints a rank's 1024); resumed by this kit, the file had held
    both conventions, one row each."""
    out = tmp_path / "ag.txt"
    settings = {"backend": "gloo", "ranks": 2, "iters": 2, "repeats": 1, "stat": "p10", "timing": "call",
                "pinned": True}
    rows_path(out).write_text(json.dumps({"settings": settings}) + "\n" + json.dumps(
        {"kind": "allgather", "size_bytes": 8192, "count": 2048, "dtype": "float", "time_us": 50.0, "wrong": 0}) + "\n")
    collect(sizes=[8192, 16384], out=out, resume=True, **{**FAST, "kinds": ["allgather"]})
    t = parse_nccl_tests(out)
    assert list(t.size_bytes) == [8192, 16384] and t.time_us[0] == 50.0  # the kept row, not remeasured
    assert (t["count"] * 4 * 2 == t.size_bytes).all()
