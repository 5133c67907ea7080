"""benchmarks/tile_seeds.py: the GEMM test rows it adds are the training GPUs' alone, a shape
already trained on keeps its training row, and the spread is taken per GPU and op."""
import pandas as pd
import pytest
from benchmark_modules import load_benchmark


@pytest.fixture(scope="module")
def seeds():
    return load_benchmark("tile_seeds")


def _rows(gpus, latency, split="train", op="bmm"):
    return pd.DataFrame({"op": op, "gpu": gpus, "dtype": "fp32", "b": 8, "m": [64 * (i + 1) for i in range(len(gpus))],
                         "n": 64, "k": 64, "rows": pd.NA, "cols": pd.NA, "latency_ms": latency,
                         "split": split})


def test_gemm_test_rows_are_the_training_gpus_and_never_replace_a_training_row(seeds):
    frame = _rows(["t4", "p4"], [1.0, 2.0])
    test = _rows(["t4", "l4", "a100-pcie-80gb", "p4"], [9.0, 9.0, 9.0, 9.0], split=None)
    test.loc[1, "m"] = 64  # the l4 row shares t4's training shape but not its GPU
    out = seeds.with_gemm_test_rows(frame, {"bmm": test}, "bmm", ["t4", "p4"])
    assert set(out.gpu) == {"t4", "p4"}  # never a held-out GPU's row
    # t4 m=64 and p4 m=128 are training shapes (kept at 1.0 and 2.0); p4 m=256 is new
    assert sorted(zip(out.gpu, out.m, out.latency_ms)) == [("p4", 128, 2.0), ("p4", 256, 9.0), ("t4", 64, 1.0)]
    assert (out[out.latency_ms == 9.0].split == "test").all()
    assert seeds.with_gemm_test_rows(frame, {}, "none", ["t4"]).equals(frame)
    with pytest.raises(SystemExit, match="unknown 'conv'"):
        seeds.with_gemm_test_rows(frame, {}, "conv", ["t4"])


def test_spread_is_per_gpu_and_op_over_the_seeds(seeds):
    runs = [{"seed": s, "gpu": "l4", "op": "linear", "n": 5, "mape": m, "median_ape": m / 2}
            for s, m in ((0, 12.0), (1, 14.0), (2, 25.0))]
    runs.append({"seed": 0, "gpu": "l4", "op": "bmm", "n": 5, "mape": 29.0, "median_ape": 23.0})
    out = {(r["gpu"], r["op"]): r for r in seeds.spread(runs)}
    lin = out["l4", "linear"]
    assert (lin["seeds"], lin["mape_min"], lin["mape_max"]) == (3, 12.0, 25.0)
    assert lin["mape_mean"] == pytest.approx((12 + 14 + 25) / 3, abs=0.01)
    assert lin["median_ape_max"] == 12.5 and out["l4", "bmm"]["seeds"] == 1
