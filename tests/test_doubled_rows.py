"""A GEMM of m rows may run padded with m rows of zeros, so below the ceiling
(kit.predict.gemm_bounds.DOUBLE_ROOF_MS) it is never predicted slower than its twin of 2m rows
(doubled_rows_ms): no GEMM past the thin-side ladder gets faster for twice the rows. Where m is
the ladder's side (m <= n, m < PAD_ROWS_MAX) the twin is the ladder's top instead
(test_padded_rows)."""
import numpy as np
import pytest

from dataclasses import replace

from kit.ops import Gemm
from kit.predict.gemm_bounds import DOUBLE_ROOF_MS, PAD_ROWS_MAX, doubled_rows
from kit.predict.roofline import roofline


def _ops(seed: int) -> list:
    """Varied GEMMs of m > PAD_ROWS_MAX / 2 rows (plain, bmm, Linear) in three dtypes."""
    rng = np.random.default_rng(seed)

    def lu(lo, hi):
        return int(np.exp(rng.uniform(np.log(lo), np.log(hi))))

    ops = []
    for i in range(60):
        dtype, kind = ["fp32", "fp16", "bf16"][i % 3], ["mm", "bmm", "linear"][(i // 3) % 3]
        if kind == "mm":
            ops.append(Gemm(lu(33, 4096), lu(1, 4096), lu(1, 4096), dtype=dtype))
        elif kind == "bmm":
            ops.append(Gemm(lu(33, 2048), lu(16, 512), lu(16, 512), b=lu(2, 128), dtype=dtype, kind="bmm"))
        else:
            ops.append(Gemm(lu(33, 8192), lu(64, 8192), lu(64, 8192), dtype=dtype, kind="linear",
                            shared_rhs=True))
    # the Winograd bmm of a 3x3 conv, 64 -> 64 channels on 32 x 32, at batch 1, 2, 4
    ops += [Gemm(m, 64, 64, b=36, kind="bmm") for m in (64, 128, 256)]
    return ops


@pytest.mark.parametrize("gpu", ["a100-pcie-80gb", "a100-sxm4-80gb", "h100-sxm", "t4"])
def test_a_gemm_is_never_faster_for_twice_the_rows(gpu):
    """On an A100-PCIe-80GB the Winograd bmm of 36 x M x 64 x 64 had taken 33.52 us at M = 128
    and 32.67 at 256, and a 3x3 conv 14.79, 14.56, 13.71 us at batch 1, 2, 4; over varied GEMMs
    t(m) > t(2m) by up to 5.6% on an H100 and 7.5% on a T4."""
    from kit.hardware import get_gpu
    from kit.predict.tile_mlp import TilePredictor

    tp = TilePredictor.shipped()
    g = get_gpu(gpu)
    ops = [op for op in _ops(7) if op.dtype in g.dtypes and roofline(op, g).time_ms < DOUBLE_ROOF_MS
           and doubled_rows(op) == 2 * op.m]
    assert len(ops) > 15 and all(2 * op.m > PAD_ROWS_MAX for op in ops)
    one = tp.predict(ops, g).latency_ms.to_numpy()
    two = tp.predict([replace(op, m=2 * op.m) for op in ops], g).latency_ms.to_numpy()
    bad = np.flatnonzero(one > two * (1 + 1e-12))
    assert not bad.size, [(ops[i], one[i] * 1e3, two[i] * 1e3) for i in bad]


def test_a_gemm_is_never_slower_than_any_twin_up_the_chain():
    """doubled_rows_ms predicts only the twins that could beat an op (kit.predict.gemm_bounds
    _doubling_chain: none where its time rises with its rows by structure, rises_with_rows, and
    none from the first whose stream floor reaches its time): every twin of 2m, 4m, ... rows up
    to the ceiling, each predicted on its own, is still no faster than the op. On an H100, whose
    aligned 16-bit GEMMs take the tensor-core curve (rises_with_rows holds for some)."""
    from kit.hardware import get_gpu
    from kit.predict.gemm_bounds import rises_with_rows
    from kit.predict.tile_mlp import TilePredictor

    tp = TilePredictor.shipped()
    g = get_gpu("h100-sxm")
    ops = [op for op in _ops(11) if op.dtype in g.dtypes and roofline(op, g).time_ms < DOUBLE_ROOF_MS
           and doubled_rows(op)]
    chains = [_full_chain(op, g) for op in ops]
    assert sum(rises_with_rows(op, g) for op in ops) > 5 and len(ops) > 30
    one = tp.predict(ops, g).latency_ms.to_numpy()
    twins = [t for c in chains for t in c]
    lat = tp.predict(twins, g).latency_ms.to_numpy()
    owner = np.repeat(np.arange(len(ops)), [len(c) for c in chains])
    bad = np.flatnonzero(one[owner] > lat * (1 + 1e-12))
    assert not bad.size, [(ops[owner[i]], twins[i].m, one[owner[i]] * 1e3, lat[i] * 1e3) for i in bad]


def _full_chain(op, g) -> list:
    """op's twins of doubled_rows(op), then twice as many rows, up to the first at the ceiling."""
    rows = doubled_rows(op)
    out = [replace(op, m=rows)] if rows else []
    while out and roofline(out[-1], g).time_ms < DOUBLE_ROOF_MS:
        out.append(replace(op, m=2 * out[-1].m))
    return out


def test_kit_op_says_when_the_row_bound_set_the_time():
    """Where a twin with more rows sets a GEMM's time (doubled_rows_ms), kit op's source line
    says so, with the time without it, and the tiling shown is the twin's (cap_as); where it
    does not bind, nothing is said of it. An H100 FP32 64 x 64 x 64 GEMM: the tile-MLP's 19.6 us
    against a twin's 14.9."""
    from kit.api import predict_op
    from kit.ops import Gemm

    r = predict_op(Gemm(m=64, n=64, k=64), "h100-sxm", "tile")
    assert r["source"].startswith("the time of a twin with more rows") and "doubled" in r["source"]
    unbound = float(r["source"].rsplit("without it ", 1)[1].split(" us")[0])
    assert unbound > 1e3 * r["latency_ms"]
    free = predict_op(Gemm(m=32, n=16, k=16), "h100-sxm", "tile")
    assert "doubled" not in str(free.get("source"))


def test_kit_op_says_when_the_row_bound_set_a_gemvs_time():
    """A GEMV (n = 1) of m > 32 rows has a twin too, itself a GEMV; where it sets the time the
    source line says so, not the GEMV rule's stream (an H100 FP32 64 x 1 x 64: 14.69 us from its
    128-row twin, 15.75 by its own stream, and the line had named the stream)."""
    from kit.api import predict_op
    from kit.hardware import get_gpu
    from kit.ops import Gemm
    from kit.predict import get_predictor

    op, gpu = Gemm(m=64, n=1, k=64), get_gpu("h100-sxm")
    r = predict_op(op, gpu, "tile")
    twin = get_predictor("tile").doubled_rows_ms([op], gpu)
    bound = float(twin.latency_ms.iloc[0])
    assert r["tile"] == "gemv" and abs(r["latency_ms"] - bound) <= 1e-9 * bound
    assert r["source"].startswith("the time of a twin with more rows (a GEMV")
    assert float(r["source"].rsplit("without it ", 1)[1].split(" us")[0]) > 1e3 * r["latency_ms"]
