"""The collector killed with SIGKILL partway through 200 tiny GEMMs, then resumed: nothing lost,
nothing measured twice (real subprocesses, CPU only)."""
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from kit.cli import main
from kit.data import load_measurements


def tiny_gemm_dims(count=200):
    """count distinct NeuSight-order B;M;N;K shapes with every dim <= 12."""
    grid = itertools.product((1, 2), (1, 3, 5, 8, 12), (2, 4, 7, 11), (1, 6, 9, 10, 12))
    return list(itertools.islice(grid, count))


def write_dims(path, shapes):
    path.write_text("".join(";".join(map(str, s)) + "\n" for s in shapes))
    return path


def _data_lines(path: Path) -> int:
    return max(0, path.read_bytes().count(b"\n") - 1) if path.exists() else 0


def test_kill_9_then_resume_measures_every_shape_exactly_once(tmp_path, capsys):
    shapes = tiny_gemm_dims(200)
    assert len(set(shapes)) == 200
    dims = write_dims(tmp_path / "dims.csv", shapes)
    out = tmp_path / "m.csv"
    cmd = [sys.executable, "-m", "kit", "collect", "--ops", "bmm", "--shapes", str(dims),
           "--device", "cpu", "--warmup", "1", "--repeats", "3", "--threads", "1", "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    log = open(tmp_path / "stderr.txt", "wb")
    proc = subprocess.Popen(cmd + ["--cooldown-ms", "20"], env=env, stdout=subprocess.DEVNULL,
                            stderr=log)
    deadline = time.monotonic() + 120
    while _data_lines(out) < 25 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    log.close()
    assert proc.returncode == -signal.SIGKILL, (tmp_path / "stderr.txt").read_text()[-500:]
    before = out.read_bytes()
    finished = before[:before.rfind(b"\n") + 1]
    done = finished.count(b"\n") - 1
    assert 25 <= done < 200  # killed partway
    done_rows = load_measurements(out)
    assert len(done_rows) == done

    # the resumed run, through the same CLI (in this process: one torch start-up fewer)
    assert main(cmd[3:] + ["--resume", "--json"]) == 0, capsys.readouterr().err
    r = json.loads(capsys.readouterr().out)
    assert (r["skipped"], r["measured"], r["rows_in_file"]) == (done, 200 - done, 200)
    assert out.read_bytes().startswith(finished)  # nothing finished was lost or rewritten
    d = load_measurements(out)
    assert len(d) == 200 and (d.latency_ms > 0).all()
    measured = sorted(zip(d.b, d.m, d.k, d.n))
    assert measured == sorted(shapes)  # NeuSight B;M;N;K -> kit b, m, k, n: each exactly once
    assert d.drop_duplicates(["b", "m", "n", "k"]).shape[0] == 200
