"""`kit replay`'s text table: an error column only where the replay has an error to give.

Under --on the measured step ran on the trace's GPU and the prediction is for another, so every
rank's error_pct is None; the table had still printed an `error` header over an empty column."""
from kit.cli.cmd_replay import text


def result(on, errors):
    ranks = [{"rank": r, "measured_ms": 10.0 + r, "predicted_ms": 9.0 + r, "error_pct": e}
             for r, e in enumerate(errors)]
    cp = {"rank": 0, "total_ms": 9.0, "compute": 9.0, "communication": 0.0, "memcpy": 0.0,
          "cpu": 0.0, "wait": 0.0, "idle": 0.0}
    return {"trace": "t.json", "gpu": "Tesla V100-SXM2-32GB", "on": on, "ranks": ranks,
            "mean_abs_error_pct": None, "critical_path": cp, "notes": []}


def test_a_replay_on_another_gpu_prints_no_empty_error_column():
    lines = text(result("h100-sxm", [None, None])).splitlines()
    assert lines[1].split() == ["rank", "measured", "ms", "predicted", "ms"]
    assert lines[2].split() == ["0", "10.000", "9.000"]
    assert "measured on Tesla V100-SXM2-32GB, predicted on h100-sxm: no error to give" in lines[4]


def test_a_replay_on_its_own_gpu_keeps_the_error_column():
    # hand arithmetic: (9 - 10) / 10 = -10%, (10 - 11) / 11 = -9.09%
    r = result(None, [-10.0, -100 / 11])
    r["mean_abs_error_pct"], r["max_abs_error_pct"] = 9.545, 10.0
    lines = text(r).splitlines()
    assert lines[1].split()[-1] == "error"
    assert lines[2].split() == ["0", "10.000", "9.000", "-10.00%"]
    assert lines[3].split() == ["1", "11.000", "10.000", "-9.09%"]
    assert "no error to give" not in text(r)
