"""The sweeps a session lent a GPU runs (benchmarks/attention_sweep.py, benchmarks/gemm_layouts.py,
the aligned shape grids), run here on the CPU with tiny draws."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from kit.data.records import read_jsonl
from kit.data.shapes import resolve_shapes
from kit.errors import KitError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import attention_sweep  # noqa: E402
import gemm_layouts  # noqa: E402


@pytest.mark.parametrize("grid, mult, dims", [("aligned-linear", 64, (2, 3)), ("aligned-bmm", 16, (1, 2, 3))])
def test_aligned_grids_are_aligned_seeded_and_bounded(grid, mult, dims):
    shapes = resolve_shapes(f"{grid}:200:7")
    assert len(shapes) == len(set(shapes)) == 200
    a = np.array(shapes)
    assert (a[:, list(dims)] % mult == 0).all()
    assert (4 * a[:, 0] * (a[:, 1] * a[:, 2] + a[:, 2] * a[:, 3] + a[:, 1] * a[:, 3]) <= 2 ** 30).all()
    assert resolve_shapes(f"{grid}:200:7") == shapes and resolve_shapes(f"{grid}:200:8") != shapes
    if grid == "aligned-linear":
        assert (a[:, 0] == 1).all() and a[:, 1].min() < 64 < a[:, 1].max()  # M is any size


def test_attention_draw_is_seeded_and_bounded():
    s = attention_sweep.draw_shapes(50, 3)
    assert len(set(s)) == 50 and s == attention_sweep.draw_shapes(50, 3)
    assert all(b * h * q * q <= attention_sweep.MAX_SCORES for b, h, q, _, _ in s)
    assert all(q <= 256 for _, _, q, _, _ in attention_sweep.draw_shapes(10, 3, max_seq=256))
    with pytest.raises(KitError, match="seq <= 64"):
        attention_sweep.draw_shapes(5, 1, max_seq=64)


def test_attention_sweep_on_cpu_writes_rows_and_resumes(tmp_path, capsys):
    out = tmp_path / "att.jsonl"
    args = ["--device", "cpu", "--count", "2", "--max-seq", "128", "--repeats", "2", "--jsonl", str(out)]
    assert attention_sweep.main(args) == 0
    first = json.loads(capsys.readouterr().out)
    rows = read_jsonl(out)
    assert len(rows) == len(first["rows"]) == 2
    for r in rows:
        assert r["fwd_ms"] > 0 and r["train_ms"] > 0 and r["seq"] == 128
    assert attention_sweep.main(args) == 0  # a rerun skips what is there
    assert json.loads(capsys.readouterr().out)["rows"] == [] and len(read_jsonl(out)) == 2


def test_attention_sweep_refuses_bad_counts(capsys):
    assert attention_sweep.main(["--device", "cpu", "--count", "0"]) == 2
    assert "--count" in capsys.readouterr().err


def test_gemm_layouts_dims_follow_the_kit_orientation():
    assert gemm_layouts.kit_dims("fwd", 10, 20, 30) == {"m": 10, "n": 30, "k": 20}
    assert gemm_layouts.kit_dims("dgrad", 10, 20, 30) == {"m": 10, "n": 20, "k": 30}
    assert gemm_layouts.kit_dims("wgrad", 10, 20, 30) == {"m": 30, "n": 20, "k": 10}
    s = gemm_layouts.draw_shapes(40, 5)
    assert len(set(s)) == 40 and all(d % 64 == 0 and o % 64 == 0 for _, d, o in s)


def test_gemm_layouts_on_cpu_measures_each_layout(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gemm_layouts, "draw_shapes", lambda count, seed: [(64, 128, 64)][:count])
    out = tmp_path / "gl.jsonl"
    assert gemm_layouts.main(["--device", "cpu", "--count", "1", "--repeats", "2", "--jsonl", str(out)]) == 0
    rows = read_jsonl(out)
    assert [r["layout"] for r in rows] == list(gemm_layouts.LAYOUTS)
    assert all(r["latency_ms"] > 0 and "error" not in r for r in rows)
    assert {(r["m"], r["n"], r["k"]) for r in rows} == {(64, 64, 128), (64, 128, 64), (64, 128, 64)}
    assert gemm_layouts.main(["--device", "cpu", "--dtype", "tf32"]) == 2
    assert "tf32" in capsys.readouterr().err
