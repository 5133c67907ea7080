"""kit evaluate on rows of other dtypes: the FP32-only baselines (li, mlp) refuse bf16 ops, so
they score the FP32 rows only, or are left out where there are none (unless named)."""
from pathlib import Path

import pandas as pd
import pytest

from kit.errors import KitError
from kit.predict.evaluate import evaluate

ROOT = Path(__file__).resolve().parents[1]


SWEEPS = ROOT / "measurements" / "h200-2026-12-04" / "sweeps"


def _rows(dtypes):
    """The project's own H200 rows (kit collect), a few of each dtype asked for, in that order."""
    from kit.predict.evaluate import load_test

    files = {"bf16": "random_linear_bf16_b.csv.gz", "fp32": "random_bmm_fp32_c.csv.gz"}
    frames, used = [], {}
    for d in dtypes:
        rows = load_test(SWEEPS / files[d])
        frames.append(rows.iloc[[used.get(d, 0)]])
        used[d] = used.get(d, 0) + 1
    return pd.concat(frames, ignore_index=True)


def test_default_predictors_score_bf16_rows_without_the_fp32_only_baselines():
    with pytest.warns(UserWarning, match="li, mlp left out"):
        out = evaluate(_rows(["bf16", "bf16"]))
    names = {r["predictor"] for r in out}
    assert "tile" in names and not names & {"li", "mlp"}


def test_mixed_rows_score_the_baselines_on_the_fp32_rows_only():
    with pytest.warns(UserWarning, match="score the FP32 rows only"):
        out = evaluate(_rows(["fp32", "bf16", "fp32"]))
    n = {}
    for r in out:
        n[r["predictor"]] = n.get(r["predictor"], 0) + r["n"]
    assert n["li"] == n["mlp"] == 2 and n["tile"] == 3


def test_naming_a_baseline_for_bf16_rows_alone_is_one_error():
    with pytest.raises(KitError, match="fitted on FP32 kernels only"):
        evaluate(_rows(["bf16"]), predictors="mlp")


def test_evaluate_reads_the_weights_kit_weights_names(monkeypatch, tmp_path):
    """KIT_WEIGHTS chooses the weights of every verb, evaluate's too (it had read the shipped ones)."""
    monkeypatch.setenv("KIT_WEIGHTS", str(tmp_path / "nowhere"))
    with pytest.raises(KitError, match="KIT_WEIGHTS=.*no such weights folder"):
        evaluate(_rows(["fp32"]), predictors="tile")
    assert evaluate(_rows(["fp32"]), predictors="roofline")  # reads no weights: unaffected
