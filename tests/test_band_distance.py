"""The band's transfer σ as a function of distance to the training set: σ_0 (in distribution,
shapes held out of every training GPU) at d = 0, the leave-one-GPU-out σ from d_near on, and the
nested leave-one-GPU-out coverage that says how the band does on a GPU it was not calibrated on."""
import math

import numpy as np
import pandas as pd
import pytest

from kit.ops import Gemm
from kit.predict.features import gpu_distance
from kit.predict.tile_ensemble import Z80, combine, sigma_at_distance
from kit.predict.tile_mlp import TilePredictor
from kit.predict.training import (band_coverage, conformal_sigma, nested_coverage, shape_blocks,
                                  train_bundle)
from kit.predict.weights import load_bundle, save_bundle
from predict_synthetic import synthetic_frame

TINY = {"members": 2, "epochs": 1, "hidden": 8, "chooser_epochs": 1, "min_steps": 10}


def test_sigma_grows_from_the_in_distribution_anchor_to_the_transfer_one():
    s0, far, near = 0.05, 0.3, 0.4
    assert sigma_at_distance(s0, far, 0.0, near) == s0
    assert sigma_at_distance(s0, far, near, near) == pytest.approx(far)
    assert sigma_at_distance(s0, far, 5.0, near) == pytest.approx(far)
    # a quarter of the way: 0.05 + 0.25 * 0.25
    assert sigma_at_distance(s0, far, 0.1, near) == pytest.approx(0.1125)
    grid = [sigma_at_distance(s0, far, d, near) for d in np.linspace(0, 2, 81)]
    assert all(b >= a for a, b in zip(grid, grid[1:]))
    # a transfer σ below the in-distribution one never makes σ shrink with distance
    assert sigma_at_distance(0.2, 0.1, 1.0, near) == 0.2


def _tile(band, sigma):
    return TilePredictor(None, {}, sigma, band=band)


def test_class_sigma_follows_distance_and_old_weights_keep_their_band():
    train = ["a100-pcie-40gb", "t4"]
    near = 0.5
    band = {"near_distance": near, "train_gpus": train, "sigma_at_0": {"gemm": 0.04}}
    tile = _tile(band, {"gemm": 0.3, "softmax": 0.2})
    assert tile.class_sigma("gemm", "t4") == pytest.approx(0.04)  # a training GPU
    d80 = math.log(1935 / 1555)  # A100 80GB: its bandwidth gap to the 40GB
    assert tile.class_sigma("gemm", "a100-pcie-80gb") == pytest.approx(0.04 + 0.26 * d80 / near)
    assert tile.class_sigma("gemm", "h100-sxm") == pytest.approx(0.3)
    # a class without σ_0 (weights calibrated before it): 0 on a training GPU
    assert tile.class_sigma("softmax", "t4") == 0.0
    assert tile.class_sigma("softmax", "a100-pcie-80gb") == pytest.approx(0.2 * d80 / near)
    # no band settings at all: every GPU gets the whole σ
    assert _tile({}, {"gemm": 0.3}).class_sigma("gemm", "t4") == 0.3


def test_coverage_matches_a_hand_computed_band():
    # two members: medians 0 and 0.2 (centre 0.1, spread 0.1), heads ±0.1 around each
    logq = np.array([[[-0.1, 0.0, 0.1]], [[0.1, 0.2, 0.3]]]).repeat(3, axis=1)
    sigma = 0.2
    half = math.sqrt(0.1 ** 2 + (Z80 * 0.1) ** 2 + (Z80 * sigma) ** 2)
    centre, lo, hi = combine(logq, sigma)
    assert centre[0] == pytest.approx(0.1) and hi[0] == pytest.approx(0.1 + half)
    y = np.array([0.1 + half * 0.99, 0.1 - half * 1.01, 0.1 + half * 1.01])
    assert band_coverage(logq, np.full(3, -9.0), y, sigma).tolist() == [True, False, False]


def _zero_heads(r):
    n = len(r)
    return np.zeros((1, n, 3)), np.full(n, -9.0), np.asarray(r, float)


def test_nested_coverage_against_a_hand_computation():
    # zero-width heads, so the band is ±Z80·σ. Every GPU's left-out residuals are Z80·(0.1 ...
    # 1.0): 80% of them lie within ±Z80·0.8, so σ from any other GPUs is 0.8; in distribution
    # the residuals are 0, so σ_0 = 0
    r = Z80 * np.linspace(0.1, 1.0, 10)
    gpus = ["p4", "t4", "v100-pcie-32gb"]
    logo = {"gemm": {g: _zero_heads(r) for g in gpus}}
    inside = {"gemm": {g: _zero_heads(np.zeros(5)) for g in gpus}}
    assert conformal_sigma(list(logo["gemm"].values())) == pytest.approx(0.8, abs=1e-6)
    got = nested_coverage(logo, inside)["gemm"]
    for g in gpus:
        rest = [o for o in gpus if o != g]
        near = gpu_distance(rest[0], [rest[1]])  # the other two: the closest measured transfer
        s = 0.8 * min(1.0, gpu_distance(g, rest) / near)
        want = float(np.mean(r <= Z80 * s + 1e-9))
        assert got[g] == pytest.approx(want, abs=1e-3), g
    assert set(got.values()) != {0.8}  # the distances differ, so the coverages do
    # two GPUs are too few to leave one out and still measure a transfer
    assert nested_coverage({"gemm": {g: _zero_heads(r) for g in gpus[:2]}}, inside) == {}


def test_shape_blocks_hold_a_shape_out_of_every_gpu():
    rng = np.random.default_rng(1)
    shapes = pd.DataFrame({"op": "bmm", "dtype": "fp32", "b": rng.integers(1, 9, 500),
                           "m": rng.integers(1, 4096, 500), "n": rng.integers(1, 4096, 500),
                           "k": rng.integers(1, 4096, 500)}).astype({c: "Int64" for c in "bmnk"})
    shapes["rows"] = shapes["cols"] = pd.array([pd.NA] * 500, dtype="Int64")
    frame = pd.concat([shapes.assign(gpu=g) for g in ("p4", "t4")], ignore_index=True)
    blocks = shape_blocks(frame)
    assert (blocks[:500] == blocks[500:]).all()  # the same shape: the same block on each GPU
    assert set(blocks) == {0, 1, 2, 3, 4}
    assert 0.12 < (blocks == 0).mean() < 0.28
    assert (shape_blocks(frame.iloc[::-1].reset_index(drop=True))[::-1] == blocks).all()


@pytest.fixture(scope="module")
def calibrated():
    gpus = ["t4", "p4", "v100-pcie-32gb"]
    return train_bundle(synthetic_frame(gpus, n=12), gpus, seed=0, threads=1, settings=TINY,
                        direct=False, calibrate=True)


def test_calibration_records_both_anchors_and_survives_a_round_trip(calibrated, tmp_path):
    tile = calibrated.tile
    band = tile.band
    classes = {"gemm", "elementwise", "softmax", "layernorm"}
    assert set(band["sigma_at_0"]) == classes
    for cls in classes:
        assert 0 <= band["sigma_at_0"][cls] <= tile.transfer_sigma[cls]
        assert 0 <= band["heads_coverage_at_0"][cls] <= 1
        assert set(band["nested_coverage"][cls]) == {"p4", "t4", "v100-pcie-32gb"}
    assert band["fold_settings"]["members"] == TINY["members"]  # folds: the shipped kind
    for g, fold in band["logo"].items():
        assert fold["distance"] == pytest.approx(
            gpu_distance(g, [o for o in band["train_gpus"] if o != g]), abs=1e-4)
    save_bundle(calibrated, tmp_path)
    again = load_bundle(tmp_path).tile
    assert again.band == band
    ops = [Gemm(m=256, n=512, k=128)]
    for gpu in ("t4", "l4"):
        assert again.class_sigma("gemm", gpu) == tile.class_sigma("gemm", gpu)
        a, b = tile.predict(ops, gpu), again.predict(ops, gpu)
        assert np.allclose(a.latency_p90_ms, b.latency_p90_ms)
    # on a training GPU the band carries σ_0, far off the whole σ
    assert tile.class_sigma("gemm", "t4") == pytest.approx(band["sigma_at_0"]["gemm"])
    assert tile.class_sigma("gemm", "l4") == pytest.approx(tile.transfer_sigma["gemm"])
