"""benchmarks/conv_model.py: a measured conv row becomes the op a captured model's conv is
costed as, and the scores on a small slice of NeuSight's conv rows are whole and finite."""
import math
import os
from pathlib import Path

import pandas as pd
import pytest
import torch
import torch.nn as nn
from benchmark_modules import load_benchmark

from kit.workload.capture import capture

REPO = Path(__file__).resolve().parents[1]
NEUSIGHT = Path(os.environ.get("KIT_DATA", REPO.parent / "shared" / "data" / "neusight"))
shared = pytest.mark.skipif(not (NEUSIGHT / "data" / "dataset").is_dir(),
                            reason="NeuSight data not present")


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("conv_model")


def _row(b=4, cin=16, cout=32, ks=3, size=14, stride=1, pad=1, latency_ms=0.1, gpu="t4",
         kernels="volta_sgemm_64x64_nn"):
    return {"b": b, "in_channels": cin, "out_channels": cout, "kernel_size": ks, "input_size": size,
            "stride": stride, "padding": pad, "latency_ms": latency_ms, "gpu": gpu,
            "kernels": kernels}


@pytest.mark.parametrize("stride, pad", [(1, 1), (2, 0)])
def test_a_measured_row_is_the_op_a_captured_conv_is(bench, stride, pad):
    row = pd.DataFrame([_row(stride=stride, pad=pad)]).iloc[0]
    op = bench.conv_op(row)
    layer = nn.Conv2d(16, 32, 3, stride=stride, padding=pad, bias=False)
    g = capture(layer, (torch.zeros(4, 16, 14, 14),), mode="inference")
    assert [n.op for n in g.kernels()] == [op]
    out = (14 + 2 * pad - 3) // stride + 1
    assert op.flops == 2 * 4 * out * out * 32 * 16 * 9  # 2·N·Ho·Wo·Cout·Cin·k², by hand


def test_algorithm_is_read_off_the_kernel_names(bench):
    assert bench.algorithm_of(";void cudnn::winograd_nonfused::winogradforwarddata4x4<f>") == "winograd"
    assert bench.algorithm_of("void fft2d_r2c_32x32<float>;...") == "fft"
    assert bench.algorithm_of("volta_sgemm_64x64_nn") == "implicit"


def test_scores_of_hand_made_rows(bench):
    rows = pd.DataFrame([_row(latency_ms=t, size=s) for t, s in ((0.05, 14), (0.2, 28), (1.0, 56))])
    pred = bench.predict_rows(rows, predictors=("roofline",))
    assert len(pred) == 3 and (pred.predicted_ms > 0).all()
    # APE by hand from the predictions
    ape = (100 * (pred.predicted_ms - rows.latency_ms).abs() / rows.latency_ms).tolist()
    assert pred.ape.tolist() == pytest.approx(ape)
    out = bench.score(rows, predictors=("roofline",))
    assert out["per_gpu"]["t4"]["roofline"]["mape"] == pytest.approx(sum(ape) / 3, abs=0.01)
    assert out["by_algorithm"] == {} and out["kernel_sizes"] == ["3x3"]


@shared
def test_scores_on_a_slice_of_neusights_conv_rows(bench):
    from kit.data import load_neusight

    rows = load_neusight("train-collect", data_dir=NEUSIGHT, ops=["conv"])
    rows = bench.sample_rows(rows[rows.op_class == "conv"], per_gpu=6, seed=0)
    again = bench.sample_rows(load_neusight("train-collect", data_dir=NEUSIGHT, ops=["conv"]), 6, 0)
    assert rows.latency_ms.tolist() == again.latency_ms.tolist()  # seeded
    out = bench.score(rows)
    gpus = sorted(rows.gpu.unique())
    assert len(gpus) >= 2 and sorted(out["per_gpu"]) == gpus
    for gpu in gpus:
        assert sorted(out["per_gpu"][gpu]) == ["roofline", "tile"]
        for stats in out["per_gpu"][gpu].values():
            assert stats["n"] == 6
            for key in ("mape", "median_ape", "p90_ape", "median_ratio"):
                assert math.isfinite(stats[key]) and stats[key] >= 0
            assert stats["median_ape"] <= stats["p90_ape"]
        assert sum(s["n"] for s in out["by_algorithm"][gpu].values()) == 6
