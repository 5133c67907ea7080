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
    # the A100's TFLOP/s: 1..20 in steps of 1, so its median (10.5), 90th percentile (18.1) and
    # highest (20) all differ
    a100 = [flop / t for t in range(1, 21)]
    frame = pd.concat([_rows("a100-pcie-40gb", a100),
                       _rows("t4", [flop / 3.5] * 10),
                       _rows("t4", [1e-6] * 10, m=128)])  # 4 MFLOP each: too small to count
    rates = sp.gemm_rates(frame)
    assert len(rates) == 30
    rows = {r["gpu"]: r for r in sp.per_gpu(rates)}
    assert rows["a100-pcie-40gb"]["sustained_tflops"] == pytest.approx(18.1, abs=0.01)
    assert rows["a100-pcie-40gb"]["tflops_per_w"] == pytest.approx(18.1 / 250, abs=1e-4)
    assert rows["a100-pcie-40gb"]["share_of_peak"] == pytest.approx(18.1 / 19.5, abs=1e-3)
    assert rows["t4"]["tflops_per_w"] == pytest.approx(3.5 / 70, abs=1e-4)
    # the share the features give, against the vector peak
    from kit.predict.features import SUSTAINED_TFLOPS_PER_W

    assert rows["a100-pcie-40gb"]["power_share"] == pytest.approx(min(1.0, SUSTAINED_TFLOPS_PER_W * 250 / 19.5),
                                                                  abs=1e-3)


@pytest.mark.skipif(not (NEUSIGHT / "data").is_dir(), reason="needs NeuSight's data (KIT_DATA)")
def test_shipped_constant_is_the_training_gpus_frontier(capsys, monkeypatch, tmp_path):
    import json

    monkeypatch.setenv("KIT_CACHE", str(tmp_path))
    sp.main(["--data", str(NEUSIGHT)])
    out = json.loads(capsys.readouterr().out)
    assert out["matches_shipped"], out["frontier_tflops_per_w"]
    assert {r["gpu"] for r in out["by_gpu"]} == {"p4", "p100-pcie-16gb", "t4", "v100-pcie-32gb",
                                                "a100-pcie-40gb"}
    # every GPU of the test files, the held-out ones marked as such
    check = {r["gpu"]: r["trained_on"] for r in out["test_file_check"]}
    assert check["a100-pcie-80gb"] is False and check["l4"] is False and check["t4"] is True
