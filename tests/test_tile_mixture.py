"""The tile chooser's probabilities and the GEMM prediction mixed over the tiles it is unsure of
(kit.predict.tile_mlp.TilePredictor._tile_mixture)."""
import copy

import numpy as np
import pytest

from kit.hardware import get_gpu
from kit.ops import Gemm, linear
from kit.predict.features import arrays_from_ops
from kit.predict.tile_choice import SLICED_TILE, TileChooser
from kit.predict.tile_mlp import TilePredictor


@pytest.fixture(scope="module")
def shipped():
    return TilePredictor.shipped()


class FixedChooser(TileChooser):
    """The shipped chooser's vocabulary with the probabilities a test sets."""

    def __init__(self, vocab, prob):
        super().__init__(vocab, None)
        self.prob = np.asarray(prob, dtype=float)

    def probabilities(self, a, gpu, dtype="fp32"):
        return np.tile(self.prob, (len(a["m"]), 1))


def with_chooser(model, prob, margin):
    twin = copy.copy(model)
    twin.chooser = FixedChooser(model.chooser.vocab, prob)
    twin.soft_tile_margin = margin
    return twin


OPS = [Gemm(m=300, n=700, k=900, b=3), linear(2048, 1024, 4096), Gemm(m=65, n=129, k=4000)]


def test_probabilities_are_a_distribution_whose_argmax_is_the_choice(shipped):
    ops = OPS + [linear(14, 17348, 55), Gemm(m=8, n=8, k=8, b=64)]
    a = arrays_from_ops("gemm", ops)
    for gpu in ("l4", "h200", "mi300x"):
        prob = shipped.chooser.probabilities(a, gpu)
        assert prob.shape == (len(ops), len(shipped.chooser.vocab))
        assert np.allclose(prob.sum(1), 1.0) and (prob >= 0).all()
        assert (prob.argmax(1) == shipped.chooser.choose_index(a, gpu)).all()


def test_the_sliced_rule_sets_its_tile_with_certainty(shipped):
    # cuBLAS's sliced SGEMM kernel for a small output over a long k is a rule, not a guess
    a = arrays_from_ops("gemm", [linear(14, 17348, 55)])
    prob = shipped.chooser.probabilities(a, "a100-pcie-40gb")
    sliced = [i for i, v in enumerate(shipped.chooser.vocab) if (v[0], v[1]) == SLICED_TILE][0]
    assert prob[0, sliced] == 1.0 and prob.sum() == 1.0


def test_the_mixture_is_the_weighted_geometric_mean_of_the_single_tile_predictions(shipped):
    v = len(shipped.chooser.vocab)
    prob = np.full(v, 0.1 / (v - 2))
    prob[[2, 5]] = [0.5, 0.4]  # within 0.25 of the top: weights 0.25 and 0.15, the rest 0
    one = []
    for t in (2, 5):
        hot = np.eye(v)[t]
        one.append(with_chooser(shipped, hot, 0.25)._predict_class("gemm", OPS, get_gpu("l4")))
    mixed = with_chooser(shipped, prob, 0.25)._predict_class("gemm", OPS, get_gpu("l4"))
    w = np.array([0.25, 0.15]) / 0.4
    lat = [o.latency_ms.to_numpy(float) for o in one]
    assert np.allclose(mixed.latency_ms.to_numpy(float), np.exp(w[0] * np.log(lat[0]) + w[1] * np.log(lat[1])),
                       rtol=1e-9)
    assert not np.allclose(lat[0], lat[1])  # two tiles that differ, so the weights matter
    # the band's ends are mixed too, then clipped as always (p10 at the chosen tile's bound)
    assert (mixed.latency_p10_ms <= mixed.latency_ms).all() and (mixed.latency_p90_ms >= mixed.latency_ms).all()
    # the tile, tiles and waves shown are the most likely tile's
    assert (mixed.tile == one[0].tile).all() and (mixed.tiles == one[0].tiles).all()


def test_a_confident_choice_is_not_mixed(shipped):
    v = len(shipped.chooser.vocab)
    prob = np.full(v, 0.3 / (v - 1))
    prob[3] = 0.7  # every other tile more than 0.25 below it
    soft = with_chooser(shipped, prob, 0.25)._predict_class("gemm", OPS, get_gpu("h200"))
    hard = with_chooser(shipped, prob, 0.0)._predict_class("gemm", OPS, get_gpu("h200"))
    assert np.array_equal(soft.latency_ms.to_numpy(float), hard.latency_ms.to_numpy(float))


@pytest.mark.parametrize("m,n,ks", [(9461, 802, range(12024, 12424, 4)),
                                    (799, 7696, range(4280, 4680, 4))])
def test_no_cliff_where_the_chosen_tile_flips(shipped, m, n, ks):
    # an H200 FP32 Linear whose chooser flips 128x64 -> 128x128 as k grows had run 16% faster
    # for 0.7% more work; the mixture passes from one tile's time to the other's. The shapes are
    # where the shipped chooser flips (found by scanning; a retrained chooser moves them: the
    # one before the P4's Linear training rows were left out flipped 2,482 x 6,997 at k ~ 9,000,
    # the one before the power share 4,010 x 12,438 at k ~ 13,050)
    ops = [Gemm(m=m, n=n, k=k, kind="linear", shared_rhs=True) for k in ks]
    out = shipped.predict(ops, "h200")
    assert out.tile.nunique() > 1  # the series does cross the flip
    step = out.latency_ms.to_numpy(float)[1:] / out.latency_ms.to_numpy(float)[:-1]
    assert step.min() > 0.995 and step.max() < 1.01
    hard = copy.copy(shipped)
    hard.soft_tile_margin = 0.0
    hard_step = hard.predict(ops, "h200").latency_ms.to_numpy(float)
    assert (hard_step[1:] / hard_step[:-1]).min() < 0.95  # what the mixture took away


def test_predict_op_reports_the_tile_choice_it_mixed():
    from kit.api import predict_op
    from kit.cli.cmd_op import text

    out = predict_op(Gemm(m=4096, n=4096, k=4096), "a100-pcie-40gb", "tile")
    choice = out["tile_choice"]
    assert choice[0]["tile"] == out["tile"]  # unsplit: the likeliest tile is the one shown
    assert [c["p"] for c in choice] == sorted((c["p"] for c in choice), reverse=True)
    assert abs(sum(c["weight"] for c in choice) - 1) < 1e-3 and len(choice) >= 3
    mixed = [c for c in choice if c["weight"] > 0]
    # the weights are the mixture's: p - p_max + margin over the tiles inside the margin
    raw = [c["p"] - choice[0]["p"] + TilePredictor.soft_tile_margin for c in mixed]
    assert np.allclose([c["weight"] for c in mixed], np.array(raw) / sum(raw), atol=2e-3)
    line = [ln for ln in text(out).splitlines() if ln.strip().startswith("choice")]
    assert len(line) == 1 and all(c["tile"] in line[0] for c in mixed)
    # a GEMM on a measured curve, or a GEMV, is no tile-MLP mixture: no such line
    assert "tile_choice" not in predict_op(Gemm(m=4096, n=4096, k=4096, dtype="bf16"), "h200", "tile")
    assert "tile_choice" not in predict_op(Gemm(m=1, n=4096, k=4096), "h200", "tile")


def test_the_choice_line_is_the_split_batchs_and_yields_to_a_bound():
    from kit.api import predict_op
    from kit.cli.cmd_op import text

    split = predict_op(Gemm(m=128, n=256, k=30000), "a100-pcie-40gb", "tile")
    assert split["split_k"] > 1 and split["tile_choice"][0]["tile"] == split["tile"]
    line = [ln for ln in text(split).splitlines() if ln.strip().startswith("choice")][0]
    assert f"split GEMM ({split['split_k']} ways)" in line
    capped = predict_op(Gemm(m=8, n=1024, k=256), "a100-sxm4-80gb", "tile")
    assert capped.get("source")  # a bound set its time
    line = [ln for ln in text(capped).splitlines() if ln.strip().startswith("choice")][0]
    assert "bound set the time" in line


def test_choose_and_accuracy_choose_each_gemm_for_its_own_dtype(shipped):
    """The sliced rule is FP32's alone: choose() and accuracy() take the tile the predictor
    prices for each GEMM's dtype (choose_index with that dtype), in the caller's order."""
    import itertools

    import pandas as pd

    chooser, gpu = shipped.chooser, "rtx-3090"
    gemms = [Gemm(m=m, n=n, k=k, dtype=dt, kind="linear", shared_rhs=True)
             for m, n, k, dt in itertools.product([1, 14, 64], [8, 55, 64], [1024, 17348],
                                                  ["fp16", "fp32", "bf16"])]
    got = chooser.choose(gemms, gpu)
    want = [chooser.vocab[chooser.choose_index(arrays_from_ops("gemm", [g]), gpu, g.dtype)[0]]
            for g in gemms]
    assert got == want
    # the case that tells them apart: the rule's tile in fp32, another in fp16
    assert any(w[:2] != SLICED_TILE for g, w in zip(gemms, want) if g.dtype == "fp16")
    # accuracy: a table of those GEMMs labelled with the tile chosen for their dtype scores 1
    rows = pd.DataFrame({"op_class": "gemm", "op": "linear", "gpu": gpu,
                         "dtype": [g.dtype for g in gemms], "m": [g.m for g in gemms],
                         "n": [g.n for g in gemms], "k": [g.k for g in gemms], "b": 1,
                         "tile_m": [w[0] for w in want], "tile_n": [w[1] for w in want]})
    assert chooser.accuracy(rows) == 1.0
