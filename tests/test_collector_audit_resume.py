"""`kit collect --resume` after the collector audit: one method a file (B2), clear lines for
read-only (B3) and gzip (B4) outputs, one writer at a time (B5), one rule for an unfinished last
line (B9/B13), duplicates in the plan named as such (B14)."""
import builtins
import gzip
import json
from pathlib import Path

from kit.cli import main
from kit.data import load_measurements
from kit.data.provenance import mixed_settings
from kit.data.records import Lock, side_path

ARGV = ["collect", "--device", "cpu", "--ops", "bmm", "--warmup", "0", "--repeats", "1"]


def _run(capsys, out, *extra):
    rc = main([*ARGV, "--out", str(out), *extra])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def _one_line(err):
    assert err.startswith("kit: error: ") and len(err.strip().splitlines()) == 1, err
    return err


# ---- B2: a resumed file keeps one method --------------------------------------------------------

def test_resume_refuses_other_repeats_and_allows_other_warmups(tmp_path, capsys):
    out = tmp_path / "o.csv"
    assert _run(capsys, out, "--shapes", "tiny-gemm:1")[0] == 0
    rc, _, err = _run(capsys, out, "--shapes", "tiny-gemm:2", "--resume", "--repeats", "3")
    assert rc == 2 and "--repeats (repeats 1 then, 3 now)" in _one_line(err)
    assert len(load_measurements(out)) == 1  # nothing was added
    # warm-ups only steady the clocks: they may differ (each run's are in the meta)
    rc, _, err = _run(capsys, out, "--shapes", "tiny-gemm:2", "--resume", "--warmup", "2", "--warmup-ms", "1")
    assert rc == 0, err
    runs = json.loads((tmp_path / "o.meta.json").read_text())["runs"]
    assert [r["settings"]["warmup_calls"] for r in runs] == [0, 2]


def test_resume_without_the_meta_needs_force(tmp_path, capsys):
    out = tmp_path / "o.csv"
    assert _run(capsys, out, "--shapes", "tiny-gemm:1", "--no-bias")[0] == 0  # (--ops bmm: no bias asked)
    (tmp_path / "o.meta.json").unlink()
    rc, _, err = _run(capsys, out, "--shapes", "tiny-gemm:2", "--resume")
    assert rc == 2 and "no readable o.meta.json" in _one_line(err) and "--force" in err
    assert "bias" not in err  # was: "holds linear rows measured without a bias"
    rc, _, err = _run(capsys, out, "--shapes", "tiny-gemm:2", "--resume", "--force")
    assert rc == 0, err
    run = json.loads((tmp_path / "o.meta.json").read_text())["runs"][0]
    assert run["adopted_rows"].startswith("1 rows from before")


def test_mixed_settings_names_what_changes_a_rows_meaning():
    def run(**kw):
        s = {"device": "cuda", "ops": ["bmm", "linear"], "repeats": 25, "l2_flush": True,
             "profile": True, "linear_bias": True, "warmup_calls": 5, "warmup_ms_per_op": 1000}
        return {"settings": {**s, **kw}, "torch": {"num_threads": 8}, "measured": 3}

    assert mixed_settings([run()], run(warmup_calls=0, warmup_ms_per_op=0)) == []
    got = mixed_settings([run()], run(l2_flush=False, profile=False, linear_bias=False))
    assert [g.split()[0] for g in got] == ["--no-bias", "--no-l2-flush", "--no-profile"]
    assert mixed_settings([run(ops=["bmm"])], run(linear_bias=False)) == []  # no linear rows then
    assert mixed_settings([{**run(repeats=5), "measured": 0}], run()) == []  # it wrote nothing
    assert mixed_settings([run(device="cpu", repeats=5)], run()) == []  # other rows (device_name)
    cpu = run(device="cpu")
    assert mixed_settings([cpu], {**cpu, "torch": {"num_threads": 2}}) == ["--threads (8 then, 2 now)"]
    # a file of an older kit (kernel_ms from one profiled call) is not topped up with medians of 5
    (got,) = mixed_settings([run()], run(profiled_calls=5))
    assert "kernel_ms" in got and "5 profiled calls now, 1 then" in got
    assert mixed_settings([run(profiled_calls=5)], run(profiled_calls=5)) == []


# ---- B3, B4, B5: outputs it cannot or may not write ---------------------------------------------

def _read_only(monkeypatch, path: Path):
    """path as a read-only file, even for root (who writes a 0o444 file anyway)."""
    path.chmod(0o444)
    real = builtins.open

    def guarded(file, mode="r", *a, **k):
        if isinstance(file, (str, Path)) and Path(file) == path and any(c in mode for c in "wa+"):
            raise PermissionError(13, "Permission denied", str(file))
        return real(file, mode, *a, **k)

    monkeypatch.setattr(builtins, "open", guarded)


def test_resume_on_a_read_only_file_is_one_clear_line(tmp_path, capsys, monkeypatch):
    out = tmp_path / "o.csv"
    assert _run(capsys, out, "--shapes", "tiny-gemm:1")[0] == 0
    _read_only(monkeypatch, out)
    rc, _, err = _run(capsys, out, "--shapes", "tiny-gemm:2", "--resume")
    assert rc == 2 and f"cannot write {out}: Permission denied" in _one_line(err)
    assert not side_path(out, ".lock").exists()  # the lock went with the refusal


def test_gzip_outputs_are_refused_clearly(tmp_path, capsys):
    rc, _, err = _run(capsys, tmp_path / "new.csv.gz", "--shapes", "tiny-gemm:1")
    assert rc == 2 and "cannot write gzip" in _one_line(err)
    assert not (tmp_path / "new.csv.gz").exists()
    real = tmp_path / "old.csv"  # a gzipped file under a .csv name
    assert _run(capsys, real, "--shapes", "tiny-gemm:1")[0] == 0
    real.write_bytes(gzip.compress(real.read_bytes()))
    rc, _, err = _run(capsys, real, "--shapes", "tiny-gemm:2", "--resume")
    assert rc == 2 and "gunzip" in _one_line(err)


def test_a_second_writer_of_the_same_file_is_refused(tmp_path, capsys):
    out = tmp_path / "o.csv"
    assert _run(capsys, out, "--shapes", "tiny-gemm:1")[0] == 0
    assert not side_path(out, ".lock").exists()  # released and removed after the run
    with Lock(out):  # another `kit collect ... --resume` measuring into it
        rc, _, err = _run(capsys, out, "--shapes", "tiny-gemm:2", "--resume")
    assert rc == 2 and "being written by another run" in _one_line(err)
    assert len(load_measurements(out)) == 1
    assert _run(capsys, out, "--shapes", "tiny-gemm:2", "--resume")[0] == 0  # free again


# ---- B9/B13, B14 -------------------------------------------------------------------------------

def test_a_last_line_cut_inside_its_last_field_is_measured_again(tmp_path, capsys):
    out = tmp_path / "o.csv"
    assert _run(capsys, out, "--shapes", "tiny-gemm:2")[0] == 0
    whole = out.read_bytes()
    out.write_bytes(whole[:-3])  # every field still there, the last one cut short
    rc, text, err = _run(capsys, out, "--shapes", "tiny-gemm:2", "--resume", "--json")
    assert rc == 0 and "dropped an unfinished last line" in err
    r = json.loads(text)
    assert (r["measured"], r["skipped"], r["rows_in_file"]) == (1, 1, 2)
    assert out.read_bytes().startswith(whole[:whole.rstrip(b"\n").rfind(b"\n") + 1])


def test_a_cut_header_is_written_again(tmp_path, capsys):
    out = tmp_path / "o.csv"
    out.write_text("op,op_cla")  # killed while writing the header
    rc, text, err = _run(capsys, out, "--shapes", "tiny-gemm:1", "--resume")
    assert rc == 0, err
    assert len(load_measurements(out)) == 1


def test_duplicates_in_a_fresh_plan_are_not_called_already_in_the_file(tmp_path, capsys):
    shapes = tmp_path / "s.txt"
    shapes.write_text("2;3;4;5\n1;6;4;5\n")  # linear: the same 6x4 @ 4x5 GEMM twice
    rc, text, _ = _run(capsys, tmp_path / "o.csv", "--shapes", str(shapes), "--ops", "linear")
    assert rc == 0 and "1 measured, 0 already in" in text and "1 repeated in the plan" in text
