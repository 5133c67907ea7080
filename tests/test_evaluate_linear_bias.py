"""`kit evaluate` sees a collector file's linear bias as `kit train --extra` does: linear rows a
`kit collect --no-bias` run timed (its FILE.meta.json says so) are left out with a note naming
the file, for every predictor. No predictor has a bias input and the learned ones learned
NeuSight's Linear, which has one. Before, they were scored as Linear with a bias (on the H200's
decode sweep, 133 of 699 linear rows; with a bias they ran 1.036x longer in kernel time, geomean
of the 133 pairs)."""
import json

import pytest

from kit.cli import main
from kit.data.records import HEADER
from kit.errors import KitError
from kit.predict.evaluate import evaluate, load_test

# (op, b, m, n, k): kit order, k is the reduction
ROWS = [("linear", 1, 512, 1024, 1024), ("linear", 1, 256, 1024, 4096), ("bmm", 4, 128, 128, 64)]


def collector_csv(path, bias, rows=ROWS, latency_ms=0.05):
    """A kit collector CSV of rows on an H100 SXM with its meta, timed with or without a bias."""
    lines = [",".join(HEADER)]
    for op, b, m, n, k in rows:
        row = {"op": op, "op_class": "gemm", "gpu": "h100-sxm", "device_name": "NVIDIA H100 80GB HBM3",
               "dtype": "fp32", "b": b, "m": m, "n": n, "k": k, "latency_ms": latency_ms,
               "source": "collector", "split": "train"}
        lines.append(",".join(str(row.get(c, "")) for c in HEADER))
    path.write_text("\n".join(lines) + "\n")
    ops = sorted({r[0] for r in rows})
    meta = {"csv": path.name, "runs": [{"settings": {"device": "cuda", "ops": ops, "linear_bias": bias},
                                        "measured": len(rows)}]}
    path.with_name(path.stem + ".meta.json").write_text(json.dumps(meta))
    return path


def test_linear_rows_timed_without_a_bias_are_left_out_with_a_note(tmp_path):
    collector_csv(tmp_path / "with.csv", True)
    collector_csv(tmp_path / "without.csv", False, latency_ms=0.07)
    with pytest.warns(UserWarning, match=r"left out the 2 linear row\(s\) of without.csv, timed without a bias"):
        rows = load_test(tmp_path)
    # with.csv's 3 rows and without.csv's bmm row
    assert sorted(rows.op.tolist()) == ["bmm", "bmm", "linear", "linear"]
    with pytest.warns(UserWarning, match="without a bias"):
        scores = evaluate(tmp_path, "roofline,tile")
    by = {(r["predictor"], r["op"]): r["n"] for r in scores}
    assert by == {("roofline", "linear"): 2, ("tile", "linear"): 2, ("roofline", "bmm"): 2,
                  ("tile", "bmm"): 2}  # before: 4 linear rows each


def test_a_file_of_bias_free_linear_rows_only_is_one_clear_error(tmp_path, capsys):
    path = collector_csv(tmp_path / "without.csv", False, ROWS[:2])
    with pytest.raises(KitError, match="nothing to score after leaving out the 2 linear row"):
        load_test(path)
    assert main(["evaluate", "--test", str(path), "--predictors", "roofline"]) != 0
    err = capsys.readouterr().err
    assert "kit collect --no-bias" in err and "Traceback" not in err


def test_rows_of_a_file_timed_with_a_bias_or_without_a_meta_are_all_scored(tmp_path):
    path = collector_csv(tmp_path / "with.csv", True)
    assert sorted(load_test(path).op.tolist()) == ["bmm", "linear", "linear"]
    path.with_name("with.meta.json").unlink()  # unknown counts as with, as kit train has it
    assert sorted(load_test(path).op.tolist()) == ["bmm", "linear", "linear"]


def test_the_note_counts_same_named_files_of_two_sessions_apart(tmp_path):
    # sessions name their files alike (a/session/x.csv, b/session/x.csv): keyed by name, the
    # note had said 2 rows of one file when 4 rows of two were left out
    for s in ("a", "b"):
        (tmp_path / s / "session").mkdir(parents=True)
        collector_csv(tmp_path / s / "session" / "without.csv", False)
    with pytest.warns(UserWarning, match=r"left out the 4 linear row\(s\) of a/session/without.csv, "
                                         r"b/session/without.csv"):
        rows = load_test(tmp_path)
    assert sorted(rows.op.tolist()) == ["bmm"]  # the two files' bmm rows are the same repeat, kept once
