"""The tile predictor's per-call memo (kit.predict.call_memo) answers a repeated batch of twins
with the numbers it would have computed: bit for bit the un-memoised predictor, on each GPU, with
the bounds' re-entry flags, and never past the call that made it."""
import numpy as np
import pytest

from kit.errors import KitError
from kit.hardware import register_gpu, unregister_gpu
from kit.hardware.catalog import _builtin_entries
from kit.ops import Elementwise, Gemm, LayerNorm, Softmax
from kit.predict import get_predictor
from kit.predict.tile_mlp import TilePredictor

# thin, batched, long-k and GEMV GEMMs: every GEMM bound predicts twins of these (few rows, few
# batches, the long reduction, the two-row cap, the padding ladder), twins of twins too
OPS = [Gemm(3, 4096, 1024, kind="linear"), Gemm(1, 4096, 4096, kind="linear"),
       Gemm(24, 8, 16384, b=2, kind="mm"), Gemm(128, 128, 4096, b=4, kind="bmm"),
       Gemm(5, 768, 16, b=3, dtype="fp16", kind="bmm"), Elementwise("gelu", 37),
       Softmax(13, 1025), LayerNorm(4, 768)]
DOMINATING = "a100-sxm4-80gb"  # bounded by the A100-PCIe-40GB, a training GPU: two GPUs a call


@pytest.fixture
def tile():
    return get_predictor("tile")


def _no_memo(monkeypatch):
    """The predictor as it was before the memo: every batch computed."""
    monkeypatch.setattr(TilePredictor, "_memoised", lambda self, what, gpu, split_k, ops, compute: compute())
    monkeypatch.setattr(TilePredictor, "memoised_value", lambda self, what, key, compute: compute())


def _same(a, b):
    assert list(a.columns) == list(b.columns)
    for c in a.columns:
        x, y = a[c].to_numpy(), b[c].to_numpy()
        assert x.dtype == y.dtype, c
        assert np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), c


@pytest.mark.parametrize("split_k", [True, False])
def test_memoised_predictions_are_the_unmemoised_ones_bit_for_bit(tile, monkeypatch, split_k):
    # one call predicts the same twins on the A100-SXM4-80GB and on the training GPU bounding it,
    # nested at several depths (the padding ladder skips itself inside a twin): a key without
    # the GPU, split_k or the re-entry flags would hand one's answer to the other
    got = {g: tile.predict(OPS, g, split_k) for g in (DOMINATING, "h100-sxm")}
    assert tile._memo is None  # dropped with the call that made it
    with monkeypatch.context() as m:
        _no_memo(m)
        for g, frame in got.items():
            _same(frame, tile.predict(OPS, g, split_k))


def test_a_gpu_redefined_under_its_name_is_predicted_afresh(tile, monkeypatch):
    # a --gpu-file may replace the spec behind a name between calls: the memo is keyed on the
    # spec's values and lives for one call, so the new spec's numbers are its own
    entry = {**_builtin_entries()["l4"], "key": "memo-test-l4", "name": "Memo Test L4", "aliases": []}
    try:
        register_gpu(entry)
        first = tile.predict(OPS, "memo-test-l4")
        register_gpu({**entry, "mem_bw_gbs": entry["mem_bw_gbs"] * 2})
        second = tile.predict(OPS, "memo-test-l4")
        assert not np.array_equal(first.latency_ms.to_numpy(), second.latency_ms.to_numpy())
        with monkeypatch.context() as m:
            _no_memo(m)
            _same(second, tile.predict(OPS, "memo-test-l4"))
    finally:
        unregister_gpu("memo-test-l4")


def test_the_memo_is_dropped_when_a_call_raises(tile):
    with pytest.raises(KitError):
        tile.predict([Gemm(64, 64, 64), Gemm(8, 8, 8, dtype="bf16")], "t4")  # no bf16 on a T4
    assert tile._memo is None


def test_the_memo_spares_repeated_batches(tile, monkeypatch):
    """Each distinct batch (GPU, split, ops, flags) is computed once a call, where without the
    memo the same twins were predicted again and again."""
    seen = []
    inner = TilePredictor._predict_unbounded

    def counted(self, ops, gpu, split_k):
        seen.append((gpu, bool(split_k), tuple(ops), self._state_key()))
        return inner(self, ops, gpu, split_k)

    monkeypatch.setattr(TilePredictor, "_predict_unbounded", counted)
    tile.predict(OPS, DOMINATING)
    memoised = list(seen)
    assert len(set(memoised)) == len(memoised)  # none computed twice
    seen.clear()
    _no_memo(monkeypatch)
    tile.predict(OPS, DOMINATING)
    assert set(seen) == set(memoised)  # the same batches, each computed at least as often
    assert len(seen) >= 1.5 * len(memoised), (len(seen), len(memoised))


def test_a_batch_as_a_twin_is_not_the_batch_itself(tile, monkeypatch):
    # inside a bound's twins the padding ladder skips itself (_twin_depth): on a T4 a Linear
    # 8192 -> 2048 of 2 rows is 0.496 ms as itself (its 3-row twin binds) and 0.587 ms as a twin.
    # Met both ways in one call, the two answers must stay apart (the key holds the flags)
    op = Gemm(2, 2048, 8192, kind="linear")
    with monkeypatch.context() as m:
        _no_memo(m)
        own = tile.predict([op], "t4")
        with tile.as_twins():
            twin = tile.predict([op], "t4")
    assert own.latency_ms[0] < twin.latency_ms[0]
    with tile._call_scope():
        with tile.as_twins():
            _same(tile.predict([op], "t4"), twin)
        _same(tile.predict([op], "t4"), own)
    assert tile._memo is None


def test_dominated_gpus_are_memoised_per_gpu_within_a_call(tile):
    with tile._call_scope():
        for _ in range(2):
            assert [g.key for g in tile.dominated_training_gpus(DOMINATING)] == ["a100-pcie-40gb"]
            assert tile.dominated_training_gpus("a100-pcie-40gb") == []
            assert tile.dominated_training_gpus("l4") == []


def test_split_and_unsplit_stay_apart(tile, monkeypatch):
    op = Gemm(128, 256, 16384, kind="linear")  # few output tiles over a long k: it splits
    with monkeypatch.context() as m:
        _no_memo(m)
        split, whole = (tile.predict([op], "l4", s) for s in (True, False))
    assert split.split_k[0] > 1 and whole.split_k[0] == 1
    with tile._call_scope():
        _same(tile.predict([op], "l4", True), split)
        _same(tile.predict([op], "l4", False), whole)


def test_a_fresh_predictors_first_call_computes_each_batch_once(monkeypatch):
    """A flag the bounds set and put back (as_twins' depth, the probes' flags) leaves the state
    the call began in: keyed apart from the flag never set, a fresh predictor's first call had
    computed 62 batches here for 44 distinct ones."""
    shipped = TilePredictor.shipped()
    fresh = TilePredictor(shipped.chooser, shipped.models, shipped.transfer_sigma,
                          shipped.manifest, shipped.band)  # no call has set a flag on it yet
    flags = ("_twin_depth", "_in_two_row_twin", "_probing_floor", "_raw_ladder", "_raw_rows",
             "_raw_waves", "_gemv_rule", "soft_tile_margin")
    seen = []
    inner = TilePredictor._predict_unbounded

    def counted(self, ops, gpu, split_k):
        # the state as the bounds read it (getattr, a flag's default False or 0), set or not
        state = tuple(getattr(self, f, False) for f in flags)
        seen.append((gpu, bool(split_k), tuple(ops), state))
        return inner(self, ops, gpu, split_k)

    monkeypatch.setattr(TilePredictor, "_predict_unbounded", counted)
    fresh.predict(OPS, DOMINATING)
    assert len(seen) == len(set(seen)), (len(seen), len(set(seen)))
