"""`kit comm predict|fit` and `kit systems` through the CLI entry point."""
import json

import numpy as np
import pytest

from kit.cli import main
from kit.comm import BandwidthCurve, predict_collective
from kit.comm.parsers import format_nccl_tests


def _json(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_predict_json_has_the_contract_fields(capsys):
    r = _json(capsys, ["comm", "predict", "allreduce", "--bytes", "1e9", "--system", "dgx-h100", "--ranks", "8",
                       "--json"])
    for key in ("time_ms", "algbw_gbs", "busbw_gbs", "algorithm"):
        assert key in r
    ref = predict_collective("allreduce", 1e9, "dgx-h100", ranks=8)
    assert r["time_ms"] == pytest.approx(ref.time_ms) and r["algorithm"] == ref.algorithm
    assert r["busbw_gbs"] == pytest.approx(r["algbw_gbs"] * 1.75)


def test_predict_text_subsets_sweeps_and_nodes(capsys):
    assert main(["comm", "predict", "allgather", "--bytes", "64M", "--system", "dgx-h100", "--nodes", "2",
                 "--ranks", "0,1,8,9"]) == 0
    out = capsys.readouterr().out
    assert "4 ranks, 2 node(s)" in out and "busbw" in out
    r = _json(capsys, ["comm", "predict", "broadcast", "--sizes", "1K:1M:32", "--system", "pcie8", "--json"])
    assert [row["size_bytes"] for row in r["table"]] == [1024, 32768, 1048576]


def test_systems_lists_every_preset(capsys):
    rows = _json(capsys, ["systems", "--json"])
    keys = {r["key"] for r in rows}
    assert {"dgx1-v100", "a100x4-nvlink", "dgx-a100", "dgx-h100", "hgx-h200", "pcie8"} <= keys
    assert all(r["source"] for r in rows)
    assert main(["systems"]) == 0 and "nvlink-mesh" in capsys.readouterr().out


def test_fit_then_predict_with_calibration(tmp_path, capsys):
    truth = BandwidthCurve("reducescatter", 8, 25.0, 150.0, 3e6, 1.0)
    sizes = [2**i for i in range(12, 30, 2)]
    rows = [{"size_bytes": s, "count": s // 4, "dtype": "float", "time_us": float(truth.time_us(s)), "wrong": 0}
            for s in sizes]
    bench = tmp_path / "rs.txt"
    bench.write_text(format_nccl_tests(rows, "reducescatter", 8, [f"gpu {i}" for i in range(8)]))
    cal = tmp_path / "cal.json"
    fit = _json(capsys, ["comm", "fit", str(bench), "--system", "dgx-a100", "--out", str(cal), "--json"])
    (c,) = fit["curves"]
    assert c["kind"] == "reducescatter" and c["ranks"] == 8 and c["fit_mape"] < 0.01
    r = _json(capsys, ["comm", "predict", "reducescatter", "--bytes", str(2**21), "--system", "dgx-a100",
                       "--calibration", str(cal), "--json"])
    assert r["time_ms"] * 1e3 == pytest.approx(float(truth.time_us(2**21)), rel=0.01)
    assert r["source"].startswith("calibration")
    assert np.isfinite(r["crossover_bytes"])


@pytest.mark.parametrize("argv, words", [
    (["comm", "predict", "allsum", "--bytes", "1e6"], ["unknown collective"]),
    (["comm", "predict", "allreduce", "--bytes", "1e6", "--system", "dgx-z"], ["unknown system"]),
    (["comm", "predict", "allreduce"], ["--bytes"]),
    (["comm", "predict", "allreduce", "--bytes", "1e6", "--ranks", "a,b"], ["--ranks"]),
    (["comm", "fit", "/nonexistent/x.txt", "--system", "dgx-a100"], ["not found"]),
    (["comm", "predict", "allreduce", "--bytes", "1e6", "--calibration", "/nonexistent.json"], ["not found"]),
    (["comm"], ["subcommand"]),
])
def test_user_errors_exit_2_with_one_line(argv, words, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("kit: error:")
    for w in words:
        assert w in err


def test_a_latency_bound_collective_says_its_floor_is_a_framework_calls(capsys):
    """80 us for a one-word (4-byte, the least nccl-tests runs) all-reduce on a DGX H100 is the
    host-side floor fitted on vTrain's table, 4-8x what a device-side benchmark shows; the text
    now says which it is."""
    assert main(["comm", "predict", "allreduce", "--bytes", "4", "--system", "dgx-h100"]) == 0
    out = capsys.readouterr().out
    r = predict_collective("allreduce", 4, "dgx-h100")
    assert r.bound == "latency" and r.floor_ms > r.latency_ms
    assert f"framework-level call, {r.floor_ms * 1e3:.1f} us" in out
    assert f"own latency (NCCL's fixed cost and its steps) is {r.latency_ms * 1e3:.1f} us" in out
    # latency-bound but past the floor (latency + bandwidth, 92 us at 12 MB): no such note
    for size in ("1e9", "12e6"):
        assert main(["comm", "predict", "allreduce", "--bytes", size, "--system", "dgx-h100"]) == 0
        out = capsys.readouterr().out
        r = predict_collective("allreduce", float(size), "dgx-h100")
        assert r.time_ms > r.floor_ms and "framework-level" not in out
