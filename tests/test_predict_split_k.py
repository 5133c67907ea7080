"""kit.predict.split_k: which GEMMs may split their reduction, and the fastest choice wins."""
import numpy as np
import pandas as pd
import pytest

from kit.ops import Gemm
from kit.predict.base import COLUMNS
from kit.predict.split_k import (BLOCKS_PER_SM_SPLIT, MIN_SPLIT_K, SPLITS, apply_split_k, reduce_op,
                                 split_choices, split_limits, split_op)


def test_only_underfilled_gemms_with_a_long_reduction_are_candidates():
    ops = [Gemm(m=64, n=64, k=8 * MIN_SPLIT_K), Gemm(m=64, n=64, k=MIN_SPLIT_K),
           Gemm(m=4096, n=4096, k=1 << 16), Gemm(m=64, n=64, k=1 << 16),
           Gemm(m=64, n=64, k=1 << 16, b=4), Gemm(m=64, n=64, k=1 << 16, b=4, kind="linear")]
    tiles = np.array([2, 2, 100, 30, 8, 8])
    choices = split_choices(ops, tiles, sm_count=16)
    # op 0: k / S >= MIN_SPLIT_K -> S = 2, 4, 8; op 1: k too short; op 2: 100 tiles x 2 is over
    # 8 blocks a SM; op 3: 30 x S <= 128 -> S = 2, 4; op 4: a bmm, never split (as cuBLAS);
    # op 5: a grouped convolution's per-group GEMMs (kind linear) split: 8 x S <= 128
    assert choices == [(0, 2), (0, 4), (0, 8), (3, 2), (3, 4), (5, 2), (5, 4), (5, 8), (5, 16)]
    assert all(s in SPLITS for _, s in choices) and BLOCKS_PER_SM_SPLIT == 8
    # another vendor's library keeps the old limits: one block a SM, 256 of k a split
    amd = split_choices(ops, tiles, sm_count=16, limits=split_limits("amd"))
    assert amd == [(0, 2), (0, 4), (5, 2)]


def test_a_conv_weight_gradient_splits_as_cublas_does_beyond_one_block_a_sm(monkeypatch):
    """A 1x1 conv's weight gradient (64 x 64, k = N x H x W = 802,816, a ResNet stage-1 conv at
    batch 256) is a few output tiles: at most one block a SM it came out 2.8x its roofline on an
    A100; cuBLAS's own split rows run up to 16 blocks a SM (A100-40GB) and S up to 162, and under
    those limits it splits 128 ways into 512 blocks, 20% faster. (With the weights before the
    P4's Linear training rows were left out, a 64 x 256 one had come out 9.4 ms, 7x its roofline,
    at one block a SM; with these that shape's best split fits in one block a SM.)"""
    from kit.predict import split_k
    from kit.predict.weights import has_shipped, shipped_tile

    if not has_shipped():
        pytest.skip("no shipped weights")
    tile, op = shipped_tile(), Gemm(m=64, n=64, k=802816, kind="linear")
    r = tile.predict([op], "a100-sxm4-80gb").iloc[0]
    monkeypatch.setattr(split_k, "BLOCKS_PER_SM_SPLIT", 1)  # the limits before cuBLAS's own
    monkeypatch.setattr(split_k, "MIN_SPLIT_K", 256)
    old = tile.predict([op], "a100-sxm4-80gb").iloc[0]
    assert old.tiles <= 108 < r.tiles  # the split GEMM's blocks: one a SM at most, then several
    assert r.latency_ms < 0.85 * old.latency_ms


def test_split_and_reduce_ops_keep_the_work():
    op = Gemm(m=64, n=96, k=1000, b=2)
    s = split_op(op, 4)
    assert (s.b, s.k, s.m, s.n) == (8, 250, 64, 96) and s.flops == op.flops
    r = reduce_op(op, 4)
    assert r.numel == 2 * 64 * 96 and r.n_inputs == 4


def _frame(lat, roof, tiles, tile="128x128"):
    n = len(lat)
    return pd.DataFrame({"latency_ms": lat, "roofline_ms": roof, "bound": ["compute"] * n,
                         "tile": [tile] * n, "tiles": tiles, "waves": [1] * n,
                         "utilisation": [0.5] * n, "latency_p10_ms": [x * 0.9 for x in lat],
                         "latency_p90_ms": [x * 1.2 for x in lat], "split_k": 1}, columns=COLUMNS)


def _fake(per_op_ms):
    """A batch predictor whose latency is per_op_ms(op), its band +-10% (ways: a split batch's
    S, which apply_split_k passes to its GEMM predictor)."""
    def predict(ops, ways=None):
        lat = [per_op_ms(o) for o in ops]
        f = _frame(lat, [0.0] * len(ops), [getattr(o, "b", 1) * 2 for o in ops])
        f["latency_p10_ms"], f["latency_p90_ms"] = f.latency_ms * 0.9, f.latency_ms * 1.1
        return f
    return predict


def test_the_fastest_split_wins_and_reports_itself():
    op = Gemm(m=64, n=64, k=4096)
    frame = _frame([10.0], [0.5], [2])
    # a split GEMM takes 8 / S ms and its reduce 0.1 * S ms: S = 8 (1 + 0.8) beats S = 4 (2 + 0.4)
    out = apply_split_k(_fake(lambda o: 8.0 / o.b), _fake(lambda r: 0.1 * r.n_inputs), [op],
                        frame, sm_count=64)
    assert out.latency_ms.iloc[0] == pytest.approx(8 / 8 + 0.8)
    assert out.split_k.iloc[0] == 8 and out.tile.iloc[0] == "128x128" and out.tiles.iloc[0] == 16
    assert out.latency_p10_ms.iloc[0] == pytest.approx(0.9 * 1.8)
    assert out.latency_p90_ms.iloc[0] == pytest.approx(1.1 * 1.8)


def test_no_split_when_splitting_is_slower_or_below_the_roofline():
    op = Gemm(m=64, n=64, k=4096)
    slow = apply_split_k(_fake(lambda o: 20.0), _fake(lambda r: 1.0), [op],
                         _frame([10.0], [0.5], [2]), 64)
    assert slow.latency_ms.iloc[0] == 10.0 and slow.split_k.iloc[0] == 1
    # a split predicted below the op's roofline is held at the roofline
    floor = apply_split_k(_fake(lambda o: 0.01), _fake(lambda r: 0.01), [op],
                          _frame([10.0], [3.0], [2]), 64)
    assert floor.latency_ms.iloc[0] == pytest.approx(3.0)


def test_tile_predictor_splits_only_what_underfills():
    from kit.predict.weights import has_shipped, shipped_tile

    if not has_shipped():
        pytest.skip("no shipped weights")
    tile = shipped_tile()
    ops = [Gemm(m=64, n=576, k=100352), Gemm(m=4096, n=4096, k=4096)]
    off = tile.predict(ops, "a100-pcie-80gb", split_k=False)
    on = tile.predict(ops, "a100-pcie-80gb")
    assert on.split_k.iloc[0] > 1 and on.latency_ms.iloc[0] < off.latency_ms.iloc[0]
    assert (off.split_k == 1).all()
    assert on.latency_ms.iloc[0] >= on.roofline_ms.iloc[0]
    assert on.iloc[1].equals(off.iloc[1])  # 4096^3 fills the GPU: untouched


def test_a_gemm_only_fit_still_splits(tmp_path):
    # weights with a GEMM model alone (notebook 02's live fit) price the reduce with the waves
    from kit.predict.tile_fit import fit_tile_predictor
    from predict_synthetic import synthetic_frame

    frame = synthetic_frame(("t4", "v100-pcie-32gb"), n=20)
    tile = fit_tile_predictor(frame[frame.op_class == "gemm"], members=1, epochs=1, hidden=8,
                              min_steps=5, chooser_epochs=1)
    assert set(tile.models) == {"gemm"}
    out = tile.predict([Gemm(m=64, n=576, k=100352)], "a100-pcie-80gb")
    assert out.latency_ms.iloc[0] >= out.roofline_ms.iloc[0]  # and no KeyError for the reduce


def test_a_small_output_with_a_long_reduction_takes_cublass_sliced_tile():
    """On Volta and later cuBLAS runs an output of at most 64x64 with a long k on its 32x32
    sliced kernel (NeuSight's A100-40GB rows: 20 of 21); the classifier chose 128x128 for a
    small conv's weight gradient (32 x 27, k = 802,816), 2.4 ms on an A100, 26x its roofline.
    Its split-K batch keeps the tile; Pascal (128x32 there) and a bmm keep the classifier's."""
    from kit.predict import tile_choice
    from kit.predict.weights import has_shipped, shipped_tile

    if not has_shipped():
        pytest.skip("no shipped weights")
    tile = shipped_tile()
    wgrad = Gemm(m=32, n=27, k=802816, kind="linear")  # as kit.workload.mapping_vision gives it
    bmm = Gemm(m=16, n=16, k=4096, b=8, kind="bmm")
    r = tile.predict([wgrad, bmm], "a100-pcie-40gb")
    assert r.tile.iloc[0] == "32x32" and r.split_k.iloc[0] > 1
    saved = tile_choice.SLICED_ARCHS
    tile_choice.SLICED_ARCHS = ()  # the classifier alone
    try:
        alone = tile.predict([wgrad, bmm], "a100-pcie-40gb")
        pascal = tile.predict([wgrad], "p100-pcie-16gb")
    finally:
        tile_choice.SLICED_ARCHS = saved
    assert alone.tile.iloc[0] != "32x32" and alone.latency_ms.iloc[0] > 4 * r.latency_ms.iloc[0]
    assert r.tile.iloc[1] == alone.tile.iloc[1]  # a batched GEMM is the classifier's
    assert tile.predict([wgrad], "p100-pcie-16gb").tile.iloc[0] == pascal.tile.iloc[0]
    # a grouped conv's groups (b = 32, each reducing 288) and a 16-bit GEMM (the evidence is
    # cuBLAS's SGEMM kernel) keep the classifier's tile too
    grouped = Gemm(m=49, n=32, k=288, b=32, kind="linear")
    half = Gemm(m=32, n=27, k=802816, kind="linear", dtype="fp16")
    with_rule = tile.predict([grouped, half], "a100-pcie-40gb", split_k=False)
    tile_choice.SLICED_ARCHS = ()
    try:
        without = tile.predict([grouped, half], "a100-pcie-40gb", split_k=False)
    finally:
        tile_choice.SLICED_ARCHS = saved
    assert with_rule.tile.tolist() == without.tile.tolist()


def test_a_split_only_a_less_likely_tile_lets_in_comes_in_by_its_weight():
    # with 64 SMs and one block a SM allowed, a tile of 40 tiles lets no split in (2 x 40 > 64),
    # one of 16 lets S = 2 and 4 in; weights 0.6 / 0.4 on the two tiles
    op = Gemm(m=64, n=64, k=4096)
    frame = _frame([10.0], [0.5], [40])
    frame["tile_options"] = [(np.array([0.6, 0.4]), np.array([40, 16]))]
    lim = {"blocks_per_sm": 1, "min_split_k": 128, "max_split": 64}
    out = apply_split_k(_fake(lambda o: 8.0 / o.b), _fake(lambda r: 0.1 * r.n_inputs), [op], frame, 64, lim)
    best = 8 / 4 + 0.4  # the second tile's fastest split: S = 4
    assert out.latency_ms.iloc[0] == pytest.approx(np.exp(0.6 * np.log(10.0) + 0.4 * np.log(best)))
    assert out.latency_p90_ms.iloc[0] == pytest.approx(np.exp(0.6 * np.log(12.0) + 0.4 * np.log(1.1 * best)))
    # shown: the likeliest tile's choice, unsplit; its utilisation a share of the same bound
    assert out.split_k.iloc[0] == 1 and out.tile.iloc[0] == frame.tile.iloc[0]
    assert out.utilisation.iloc[0] == pytest.approx(0.5 * 10.0 / out.latency_ms.iloc[0])
    # all the weight on the tile that lets no split in: unsplit, as before
    frame["tile_options"] = [(np.array([1.0]), np.array([40]))]
    alone = apply_split_k(_fake(lambda o: 8.0 / o.b), _fake(lambda r: 0.1 * r.n_inputs), [op], frame, 64, lim)
    assert alone.latency_ms.iloc[0] == 10.0 and alone.split_k.iloc[0] == 1


def test_no_cliff_where_a_flip_of_tile_lets_a_split_in():
    # an L4 FP32 Linear of 100 x 10,321 ran 26% faster at k 1,226 than at 1,224: the chooser's
    # flip 128x32 -> 128x64 halved the tiles and so let a 2-way split in. The chooser retrained
    # with the power share picks 128x64 there throughout, so the flip is set here: a chooser
    # whose 128x32 -> 128x64 odds move linearly across k = 1,000-1,450 (the whole reduction, so
    # a split-K batch of the same GEMM gets the same odds)
    import copy

    from kit.predict.tile_choice import TileChooser
    from kit.predict.weights import has_shipped, shipped_tile

    if not has_shipped():
        pytest.skip("no shipped weights")
    model = copy.copy(shipped_tile())
    vocab = model.chooser.vocab
    narrow, wide = (next(i for i, v in enumerate(vocab) if (v[0], v[1]) == t) for t in ((128, 32), (128, 64)))

    class FlipAlongK(TileChooser):
        def probabilities(self, a, gpu, dtype="fp32"):
            k = np.asarray(a["k"], dtype=float) * np.asarray(a.get("split_ways", np.ones(len(a["k"]))))
            to_wide = np.clip((k - 1000.0) / 450.0, 0.0, 1.0)
            prob = np.zeros((len(k), len(self.vocab)))
            prob[:, narrow], prob[:, wide] = 1.0 - to_wide, to_wide
            return prob

    model.chooser = FlipAlongK(vocab, None)
    hard = copy.copy(model)
    hard.soft_tile_margin = 0.0
    ops = [Gemm(m=100, n=10321, k=k, kind="linear", shared_rhs=True) for k in range(1150, 1300, 2)]
    cliff = hard.predict(ops, "l4")
    assert set(cliff.tile) == {"128x32", "128x64"} and set(cliff.split_k) > {1}
    hard_lat = cliff.latency_ms.to_numpy(float)
    # the hard choice's cliff, split let in at once (9% with the shipped weights; 10%+ before the
    # P4's Linear training rows were left out)
    assert (hard_lat[1:] / hard_lat[:-1]).min() < 0.95
    out = model.predict(ops, "l4")
    assert out.tile.nunique() > 1 and (out.split_k > 1).any() and (out.split_k == 1).any()
    lat = out.latency_ms.to_numpy(float)
    assert (lat[1:] / lat[:-1]).min() > 0.99


def test_split_k_false_never_splits_a_twin(monkeypatch):
    # the as-calls caps (few_rows_ms, few_batches_ms) and the two-row cap had predicted their
    # twins with split-K on: an MI300X fp32 bmm of b = 5, 41 x 4508 x 24549, unaligned, came out
    # under 5 calls of its unbatched twin split 8 ways, with split_k=False
    from kit.predict import tile_mlp
    from kit.predict.weights import has_shipped, shipped_tile

    if not has_shipped():
        pytest.skip("no shipped weights")
    model = shipped_tile()
    ops = [Gemm(m=41, n=4508, k=24549, b=5, align=1), Gemm(m=3, n=4096, k=16384),
           Gemm(m=1, n=4096, k=16384, b=4), Gemm(m=8, n=576, k=100352)]
    on = model.predict(ops, "mi300x")

    def no_split(*args, **kwargs):
        raise AssertionError("a split was costed under split_k=False")

    monkeypatch.setattr(tile_mlp, "apply_split_k", no_split)
    off = model.predict(ops, "mi300x", split_k=False)
    assert (off.split_k == 1).all() and (off.latency_ms >= on.latency_ms * (1 - 1e-9)).all()
