"""The tile-MLP's p10–p90 band: split-conformal calibration on left-out training GPUs, and the
share of the transfer σ a GPU gets by its distance to the nearest training GPU."""
import math

import numpy as np
import pytest

from kit.ops import Gemm, Softmax
from kit.predict.features import gpu_distance
from kit.predict.tile_ensemble import Z80
from kit.predict.training import band_coverage, conformal_sigma, train_bundle
from kit.predict.weights import load_bundle, save_bundle
from predict_synthetic import synthetic_frame

TINY = {"members": 1, "epochs": 1, "hidden": 8, "chooser_epochs": 1, "min_steps": 10}
GPUS = ["t4", "p4"]


def test_distance_is_the_largest_feature_gap_to_the_nearest_gpu():
    assert gpu_distance("t4", ["p4", "t4"]) == 0.0
    # the A100 80GB differs from the 40GB in bandwidth (1935 vs 1555 GB/s, same SMs) and TDP
    # (300 vs 250 W); the largest log gap is the bandwidth's
    assert gpu_distance("a100-pcie-80gb", ["a100-pcie-40gb", "p4"]) == pytest.approx(
        math.log(1935 / 1555), rel=1e-9)
    assert gpu_distance("t4", []) == math.inf


def test_conformal_sigma_recovers_a_normal_error():
    # heads of zero width and log errors ~ N(0, 0.2): the band ±Z80·σ holds 80% at σ = 0.2
    rng = np.random.default_rng(0)
    parts = []
    for _ in range(2):  # two left-out GPUs, weighted alike
        n = 20000
        logq = np.zeros((1, n, 3))
        parts.append((logq, np.full(n, -5.0), rng.normal(0.0, 0.2, n)))
    assert conformal_sigma(parts) == pytest.approx(0.2, rel=0.03)
    # heads already wide enough: no transfer σ is added
    wide = [(np.stack([np.full((1, 100), -1.0), np.zeros((1, 100)), np.full((1, 100), 1.0)], 2),
             np.full(100, -5.0), np.linspace(-0.5, 0.5, 100))]
    assert conformal_sigma(wide) == 0.0


def test_band_coverage_counts_the_band_as_the_predictor_clips_it():
    logq = np.array([[[-0.1, 0.0, 0.1], [-0.1, 0.0, 0.1]]])
    # second row: p10 (-0.1) would fall below the base (-0.05), so it is lifted to the base
    # and a measurement at -0.08 lies outside
    cov = band_coverage(logq, np.array([-9.0, -0.05]), np.array([-0.08, -0.08]), 0.0)
    assert cov.tolist() == [True, False]
    sigma = 0.3
    half = math.hypot(0.1, Z80 * sigma)
    assert band_coverage(logq[:, :1], np.array([-9.0]), np.array([half * 0.99]), sigma)[0]
    assert not band_coverage(logq[:, :1], np.array([-9.0]), np.array([half * 1.01]), sigma)[0]


@pytest.fixture(scope="module")
def calibrated():
    return train_bundle(synthetic_frame(GPUS, n=10), GPUS, seed=0, threads=1, settings=TINY,
                        direct=False, calibrate=True)


def test_calibration_is_recorded_and_survives_a_round_trip(calibrated, tmp_path):
    tile = calibrated.tile
    assert set(tile.transfer_sigma) == {"gemm", "elementwise", "softmax", "layernorm"}
    assert all(s >= 0 for s in tile.transfer_sigma.values())
    keys = sorted(GPUS)
    near = min(gpu_distance(g, [o for o in keys if o != g]) for g in keys)
    assert tile.band["train_gpus"] == keys
    assert tile.band["near_distance"] == pytest.approx(near, abs=1e-4)
    assert calibrated.manifest["band_calibration"] == tile.band
    save_bundle(calibrated, tmp_path)
    again = load_bundle(tmp_path).tile
    assert again.band == tile.band and again.transfer_sigma == tile.transfer_sigma
    ops = [Gemm(m=512, n=512, k=512), Softmax(4096, 1000)]
    a, b = tile.predict(ops, "l4"), again.predict(ops, "l4")
    assert np.allclose(a.latency_p90_ms, b.latency_p90_ms)


def test_transfer_share_grows_with_distance_to_a_training_gpu(calibrated):
    tile = calibrated.tile
    near = tile.band["near_distance"]
    assert tile.transfer_scale("t4") == 0.0
    assert tile.transfer_scale("p4") == 0.0
    d = gpu_distance("v100-pcie-32gb", sorted(GPUS))
    assert 0 < d < near  # nearer T4 than P4 is to T4
    assert tile.transfer_scale("v100-pcie-32gb") == pytest.approx(d / near)
    assert tile.transfer_scale("h100-sxm") == 1.0
    # without band settings (older weights) every GPU gets the whole σ
    tile_old = type(tile)(tile.chooser, tile.models, tile.transfer_sigma)
    assert tile_old.transfer_scale("t4") == 1.0
    # on a training GPU the band is the heads' alone, so it is no wider than with full σ
    ops = [Gemm(m=1024, n=1024, k=1024)]
    own = tile.predict(ops, "t4")
    full = tile_old.predict(ops, "t4")
    assert (own.latency_p90_ms <= full.latency_p90_ms * (1 + 1e-12)).all()
    assert (own.latency_p10_ms >= full.latency_p10_ms * (1 - 1e-12)).all()
