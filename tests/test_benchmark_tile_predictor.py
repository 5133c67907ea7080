"""benchmarks/tile_predictor.py's leave-one-GPU-out folds: each fold's power share is counted at
the rate its own training GPUs' rows give, never one read off the GPU it leaves out."""
import os
from pathlib import Path

import pandas as pd
import pytest

from benchmark_modules import load_benchmark

tp = load_benchmark("tile_predictor")
sp = load_benchmark("sustained_power")
NEUSIGHT = Path(os.environ.get("KIT_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"
                               / "neusight"))


def _rows(gpu, tflops, split="train", m=4096):
    gflop = 2 * m**3 / 1e9
    return pd.DataFrame({"op_class": "gemm", "gpu": gpu, "b": 1, "m": m, "n": m, "k": m,
                         "latency_ms": [gflop / t for t in tflops], "split": split})


def test_fold_rate_leaves_out_the_left_out_gpu_and_test_rows():
    frame = pd.concat([_rows("a100-pcie-40gb", [16.0] * 10),  # 0.064 per W at 250 W
                       _rows("t4", [3.5] * 10),  # 0.05 per W at 70 W
                       _rows("v100-pcie-32gb", [13.0] * 10, split="test")])  # 0.052: a test row
    assert sp.frontier_of(frame) == pytest.approx(0.064)
    # the A100's fold: its rows do not set the rate its model is fitted and scored with
    assert tp.fold_power_rate(frame, ["t4", "v100-pcie-32gb"]) == pytest.approx(0.05)
    assert tp.fold_power_rate(frame, ["a100-pcie-40gb", "t4"]) == pytest.approx(0.064)


def test_power_rate_sets_the_share_within_and_restores_it():
    import kit.predict.features as features

    shipped = features.SUSTAINED_TFLOPS_PER_W
    before = features.power_share("a100-pcie-40gb")
    with tp.power_rate(0.049):
        assert features.power_share("a100-pcie-40gb") == pytest.approx(0.049 * 250 / 19.5)
    assert features.SUSTAINED_TFLOPS_PER_W == shipped
    assert features.power_share("a100-pcie-40gb") == before
    with pytest.raises(RuntimeError), tp.power_rate(0.03):
        raise RuntimeError("a fold failed")
    assert features.SUSTAINED_TFLOPS_PER_W == shipped


@pytest.mark.skipif(not (NEUSIGHT / "data").is_dir(), reason="needs NeuSight's data (KIT_DATA)")
def test_only_the_a100_fold_moves_off_the_shipped_rate(monkeypatch, tmp_path):
    from kit.predict.features import SUSTAINED_TFLOPS_PER_W
    from kit.predict.training import DEFAULT_TRAIN_GPUS, training_frame

    monkeypatch.setenv("KIT_CACHE", str(tmp_path))
    frame = training_frame(NEUSIGHT, DEFAULT_TRAIN_GPUS)
    rates = {g: tp.fold_power_rate(frame, [o for o in DEFAULT_TRAIN_GPUS if o != g])
             for g in DEFAULT_TRAIN_GPUS}
    assert rates.pop("a100-pcie-40gb") < SUSTAINED_TFLOPS_PER_W
    assert set(rates.values()) == {SUSTAINED_TFLOPS_PER_W}
