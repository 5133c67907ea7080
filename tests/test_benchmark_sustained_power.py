"""benchmarks/sustained_power.py: the frontier is the most TFLOP/s per watt of any GPU's large
GEMMs, and the shipped constant is what it derives from the training GPUs' rows."""
import os
from pathlib import Path

import pandas as pd
import pytest

from benchmark_modules import load_benchmark

sp = load_benchmark("sustained_power")
NEUSIGHT = Path(os.environ.get("KIT_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"
                               / "neusight"))


def _rows(gpu, ms, m=4096):
    return pd.DataFrame({"op_class": "gemm", "gpu": gpu, "b": 1, "m": m, "n": m, "k": m,
                         "latency_ms": ms})


def test_frontier_rows_skip_small_gemms_and_read_each_gpus_rate_per_watt():
    flop = 2 * 4096**3 / 1e9  # 137 GFLOP
    frame = pd.concat([_rows("a100-pcie-40gb", [flop / 16.0] * 9 + [flop / 8.0]),  # 16 TFLOP/s
                       _rows("t4", [flop / 3.5] * 10),
                       _rows("t4", [1e-6] * 10, m=128)])  # 4 MFLOP each: too small to count
    rates = sp.gemm_rates(frame)
    assert len(rates) == 20
    rows = {r["gpu"]: r for r in sp.per_gpu(rates)}
    assert rows["a100-pcie-40gb"]["tflops_per_w"] == pytest.approx(16.0 / 250, abs=1e-4)
    assert rows["t4"]["tflops_per_w"] == pytest.approx(3.5 / 70, abs=1e-4)
    assert rows["a100-pcie-40gb"]["share_of_peak"] == pytest.approx(16.0 / 19.5, abs=1e-3)


@pytest.mark.skipif(not (NEUSIGHT / "data").is_dir(), reason="needs NeuSight's data (KIT_DATA)")
def test_shipped_constant_is_the_training_gpus_frontier(capsys, monkeypatch, tmp_path):
    import json

    monkeypatch.setenv("KIT_CACHE", str(tmp_path))
    sp.main(["--data", str(NEUSIGHT)])
    out = json.loads(capsys.readouterr().out)
    assert out["matches_shipped"], out["frontier_tflops_per_w"]
    assert {r["gpu"] for r in out["by_gpu"]} == {"p4", "p100-pcie-16gb", "t4", "v100-pcie-32gb",
                                                "a100-pcie-40gb"}
    assert not {r["gpu"] for r in out["held_out_check"]} & {r["gpu"] for r in out["by_gpu"]}
