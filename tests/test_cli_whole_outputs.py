"""Output files are written whole or not at all: a --trace (kit predict, kit replay) or a `kit comm
fit --out` calibration whose write fails part-way (a full disk; here a file-size limit,
RLIMIT_FSIZE, makes the write fail with EFBIG after `limit` bytes) is one error line, and the file
an earlier run wrote there is left as it was. Written in place, it had been truncated to the
first `limit` bytes of the new output: the earlier file lost, and no valid new one."""
import contextlib
import json
import resource
import signal

import pytest

from kit.cli import main
from kit.comm import BandwidthCurve
from kit.comm.parsers import format_nccl_tests
from kit.whole_file import replace_file
from tests.cli_support import one_error_line
from tests.test_trace import rank_trace, write

EARLIER = '{"an earlier run": "its whole output"}\n'


@contextlib.contextmanager
def file_size_limit(limit_bytes):
    """Writes past limit_bytes into any regular file fail with EFBIG (SIGXFSZ ignored)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old_handler)


def _left_as_it_was(folder, out):
    assert out.read_text() == EARLIER
    assert [p.name for p in folder.iterdir() if "partial" in p.name] == []  # no part-written file


@pytest.mark.parametrize("name", ["replayed.json", "replayed.json.gz"])
def test_a_replay_trace_that_cannot_be_written_leaves_the_earlier_one(tmp_path, capsys, name):
    trace = write(tmp_path, "r0.json", rank_trace(0, work=1000))
    out = tmp_path / "out" / name
    assert main(["replay", str(trace), "--trace", str(out)]) == 0
    whole = out.stat().st_size  # the size this trace takes
    capsys.readouterr()
    out.write_text(EARLIER)
    with file_size_limit(whole // 2):  # half of it can be written
        line = one_error_line(capsys, ["replay", str(trace), "--trace", str(out)])
    assert "cannot write the trace" in line and name in line
    _left_as_it_was(out.parent, out)
    assert main(["replay", str(trace), "--trace", str(out)]) == 0  # and with room, it is written
    assert out.stat().st_size == whole


def test_a_predict_trace_that_cannot_be_written_leaves_the_earlier_one(tmp_path, capsys):
    out = tmp_path / "step.json"
    out.write_text(EARLIER)
    # gpt2's training step at 16 tokens has thousands of events: far past 4 KiB
    with file_size_limit(4096):
        line = one_error_line(capsys, ["predict", "gpt2", "--gpu", "h100-sxm", "--seq", "16",
                                       "--predictor", "roofline", "--trace", str(out)])
    assert "cannot write the trace" in line
    _left_as_it_was(tmp_path, out)


def test_a_calibration_that_cannot_be_written_leaves_the_earlier_one(tmp_path, capsys):
    truth = BandwidthCurve("allreduce", 8, 25.0, 150.0, 3e6, 1.0)
    rows = [{"size_bytes": s, "count": s // 4, "dtype": "float", "time_us": float(truth.time_us(s)),
             "wrong": 0} for s in (2**i for i in range(12, 30, 2))]
    bench = tmp_path / "ar.txt"
    bench.write_text(format_nccl_tests(rows, "allreduce", 8, [f"gpu {i}" for i in range(8)]))
    out = tmp_path / "cal.json"
    out.write_text(EARLIER)
    argv = ["comm", "fit", str(bench), "--system", "dgx-a100", "--out", str(out)]
    with file_size_limit(100):  # a calibration with one curve is several hundred bytes
        line = one_error_line(capsys, argv)
    assert "cannot write the calibration" in line
    _left_as_it_was(tmp_path, out)
    assert main(argv) == 0 and json.loads(out.read_text())["curves"][0]["kind"] == "allreduce"


def test_replace_file_writes_the_whole_content_with_the_umask_permissions(tmp_path):
    import os

    out = tmp_path / "new" / "file.txt"  # its folder is made
    replace_file(out, b"abc")
    assert out.read_bytes() == b"abc"
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~umask


def test_collect_comm_measurements_that_cannot_be_written_leave_the_earlier_file(tmp_path, capsys,
                                                                                  monkeypatch):
    out = tmp_path / "ar.txt"
    out.write_text(EARLIER)
    argv = ["collect-comm", "--out", str(out), "--force", "--sizes", "1K:2K", "--ranks", "2",
            "--iters", "1", "--warmup", "0", "--repeats", "1"]
    # the rows file beside --out holds 2 rows in under 700 bytes; the nccl-tests text, with its
    # header and device lines, is over 1 KiB
    with file_size_limit(700):
        line = one_error_line(capsys, argv)
    assert "cannot write the measurements" in line
    assert out.read_text() == EARLIER
    assert (tmp_path / "ar.txt.rows.jsonl").is_file()  # the rows measured are kept for --resume
    assert [p.name for p in tmp_path.iterdir() if "partial" in p.name] == []
    # the error says so (it had not: a rerun was told only that ar.txt exists, "pass --force",
    # which discards the rows), and --resume writes them with no rank started again
    assert "2 row(s) measured are kept in" in line and "--resume" in line
    import kit.comm.measure

    spawned = []
    monkeypatch.setattr(kit.comm.measure, "_spawn", lambda *a, **k: spawned.append(a))
    assert main(argv[:3] + argv[4:] + ["--resume"]) == 0 and spawned == []
    assert out.read_text().count("\n") > 2 and not (tmp_path / "ar.txt.rows.jsonl").exists()


def test_an_embedding_correction_that_cannot_be_written_leaves_the_earlier_one(tmp_path):
    # python -m kit.embedding.correction CSV --out FILE saves with Correction.save
    from kit.embedding.correction import FEATURES, Correction

    out = tmp_path / "corr.json"
    out.write_text(EARLIER)
    c = Correction(tuple(0.0 for _ in FEATURES), gpu="h100-sxm", trained_on={"rows": 1})
    with file_size_limit(64), pytest.raises(OSError):  # the file takes about 300 bytes
        c.save(out)
    _left_as_it_was(tmp_path, out)
    c.save(out)
    assert Correction.load(out).weights == c.weights


# what replacing must not change, as writing in place did not (kit.whole_file's docstring)

def test_replace_file_replaces_a_symlinks_target_and_keeps_the_link(tmp_path):
    real = tmp_path / "runs" / "today.json"
    real.parent.mkdir()
    real.write_text(EARLIER)
    link = tmp_path / "latest.json"
    link.symlink_to(real)
    replace_file(link, b"new")
    # the link had been replaced by a regular file, the file it named left with the earlier run
    assert link.is_symlink() and real.read_bytes() == b"new"
    assert [p.name for p in real.parent.iterdir()] == ["today.json"]


def test_replace_file_keeps_an_earlier_files_permissions(tmp_path):
    import os

    out = tmp_path / "private.json"
    out.write_text(EARLIER)
    out.chmod(0o600)
    umask = os.umask(0o022)
    try:
        replace_file(out, b"new")
    finally:
        os.umask(umask)
    assert out.read_bytes() == b"new" and out.stat().st_mode & 0o7777 == 0o600  # had become 0644


def test_replace_file_writes_into_a_fifo_rather_than_replacing_it(tmp_path):
    import os
    import stat

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader there, so a writer's open returns
    try:
        replace_file(fifo, b"through the pipe")
        got = os.read(reader, 100)
    finally:
        os.close(reader)
    # it had become a regular file holding the data, and the reader got nothing
    assert got == b"through the pipe" and stat.S_ISFIFO(fifo.stat().st_mode)


@pytest.mark.skipif(not hasattr(__import__("os"), "geteuid") or __import__("os").geteuid() != 0,
                    reason="making a device node needs root")
def test_replace_file_as_root_leaves_a_device_node_a_device(tmp_path):
    # `kit predict ... --trace /dev/null` run as root (a CI container) had replaced /dev/null itself
    # with a regular file holding the trace; here a private node of the same device (char 1:3)
    import os
    import stat

    null = tmp_path / "null"
    os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    replace_file(null, b"x" * 1000)
    assert stat.S_ISCHR(null.stat().st_mode) and null.read_bytes() == b""


def test_replace_file_never_writes_through_a_file_planted_at_its_temporary_name(tmp_path):
    # the temporary name had been .NAME.PID.partial, opened with truncation: a symlink left there
    # (by another user in a shared folder, or a run killed mid-write) took the write to its target,
    # and os.replace then put the link itself at the output
    import os

    victim = tmp_path / "victim.txt"
    victim.write_text("not yours")
    out = tmp_path / "out.json"
    (tmp_path / f".out.json.{os.getpid()}.partial").symlink_to(victim)
    replace_file(out, b"new")
    assert victim.read_text() == "not yours"
    assert not out.is_symlink() and out.read_bytes() == b"new"


def test_replace_file_refuses_a_link_planted_at_its_very_temporary_name(tmp_path, monkeypatch):
    # the test above plants at the old name (.NAME.PID.partial), which the random token now
    # misses whatever the open does; here the name is the one replace_file picks, so only the
    # O_EXCL open keeps the write from following the link (an OSError, nothing written)
    import os

    import kit.whole_file

    monkeypatch.setattr(kit.whole_file.secrets, "token_hex", lambda n: "feedbeef")
    victim = tmp_path / "victim.txt"
    victim.write_text("not yours")
    out = tmp_path / "out.json"
    (tmp_path / f".out.json.{os.getpid()}.feedbeef.partial").symlink_to(victim)
    with pytest.raises(FileExistsError):
        replace_file(out, b"new")
    assert victim.read_text() == "not yours" and not out.exists()


def test_replace_file_interrupted_leaves_the_earlier_file_and_no_temporary(tmp_path, monkeypatch):
    import kit.whole_file

    out = tmp_path / "out.json"
    out.write_text(EARLIER)

    def interrupted(fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(kit.whole_file.os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        replace_file(out, b"new")
    _left_as_it_was(tmp_path, out)


def _temporaries(folder):
    return sorted(p.name for p in folder.rglob("*") if "tmp" in p.name or "partial" in p.name)


def test_a_collect_meta_that_cannot_be_written_leaves_the_earlier_runs_and_no_temporary(tmp_path):
    # kit collect's FILE.meta.json had its own temporary file + rename, which a failed write left
    # behind as FILE.meta.json.tmp; it now goes through replace_file
    from kit.data.provenance import Meta, recorded_runs
    from kit.errors import KitError

    out = tmp_path / "m.csv"
    Meta(out, {"status": "done", "note": "an earlier run"}, resume=False).write()
    meta = Meta(out, {"status": "running", "note": "x" * 4000}, resume=True)
    with file_size_limit(1000), pytest.raises(KitError, match="cannot write"):
        meta.write()
    assert [r["note"] for r in recorded_runs(out)] == ["an earlier run"]
    assert _temporaries(tmp_path) == []


def test_caches_that_cannot_be_written_leave_no_temporary_file(tmp_path, monkeypatch):
    # under the file-size limit of the tests above, `kit predict` had left KEY.PID.tmp (its capture)
    # and KEY.PID.tmp.npz (its latencies) in KIT_CACHE, two more each run; and a table's .tmpPID
    import numpy as np
    import pandas as pd

    from kit.data.cache import cached_table
    from kit.workload import latency_cache, zoo

    monkeypatch.setenv("KIT_CACHE", str(tmp_path))
    source = tmp_path / "source.csv"
    source.write_text("a\n1\n")
    lat = np.linspace(1.0, 2.0, 2000)
    with file_size_limit(1000), pytest.warns(UserWarning, match="could not write cache"):
        zoo._write(zoo.cache_dir() / "capture.pkl", list(range(2000)))
        latency_cache.save("key", lat, lat, lat, "roofline", {})
        cached_table("table", [source], lambda: pd.DataFrame({"x": np.arange(2000.0)}))
    assert _temporaries(tmp_path) == []


def test_replace_file_writes_in_place_where_no_file_may_be_made_beside_it(tmp_path, monkeypatch):
    # a writable file in a folder we may not add to (root ignores folder permissions, so the
    # refusal is made here): it had been written in place before replace_file, and then refused
    import kit.whole_file

    out = tmp_path / "shared.json"
    out.write_text(EARLIER)
    real_open = kit.whole_file.os.open

    def no_new_files(name, flags, *args):
        if flags & kit.whole_file.os.O_CREAT:
            raise PermissionError(13, "Permission denied", str(name))
        return real_open(name, flags, *args)

    monkeypatch.setattr(kit.whole_file.os, "open", no_new_files)
    replace_file(out, b"new")
    assert out.read_bytes() == b"new"
    with pytest.raises(PermissionError):  # and a new file there is still refused
        replace_file(tmp_path / "absent.json", b"new")
