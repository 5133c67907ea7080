"""A GEMM of r rows (r = min(m, n), 1 <= r < PAD_ROWS_MAX) may run padded to more rows, so it is
never predicted slower than any twin of r + 1 .. PAD_ROWS_MAX rows (kit.predict.gemm_bounds
padded_rows_ms): no thin GEMM gets faster for more rows."""
import numpy as np
import pytest

from kit.ops import Gemm
from kit.predict.gemm_bounds import PAD_ROWS_MAX


@pytest.mark.parametrize("gpu, dtype", [("t4", "fp32"), ("mi300x", "fp16"), ("mi300x", "fp32"), ("mi210", "fp32"),
                                        ("a100-pcie-40gb", "fp32"), ("l4", "fp32"), ("v100-pcie-32gb", "fp16"),
                                        ("h100-sxm", "bf16")])
def test_a_thin_gemm_is_never_faster_for_more_rows(gpu, dtype):
    """On a T4 a Linear 8192 -> 2048 had taken 0.361 ms at 2 tokens and 0.309 at 3; on an MI300X
    an fp16 GEMM of 5000 x 4096 weights 0.132 ms at 16 rows and 0.102 at 32 (the tile-MLP's then;
    AMD's 16-bit GEMMs take kit.predict.tensor_core.CDNA_GEMM now, and FP32 keeps the tile-MLP)."""
    from kit.predict.tile_mlp import TilePredictor

    tp = TilePredictor.shipped()
    for n, k, kind in ((2048, 8192, "linear"), (5000, 4096, "linear"), (4096, 4096, "linear"),
                       (1024, 256, "linear"), (128, 4096, "bmm")):
        ops = [Gemm(m, n, k, b=1 if kind == "linear" else 8, dtype=dtype, kind=kind,
                    shared_rhs=kind == "linear") for m in range(1, PAD_ROWS_MAX + 1)]
        lat = tp.predict(ops, gpu).latency_ms.to_numpy()
        ladder = [m - 1 for m in range(1, PAD_ROWS_MAX + 1) if m <= 16 or m % 8 == 0]  # padded_rows
        assert (np.diff(lat[ladder]) >= -1e-12 * lat[ladder][1:]).all(), (n, k, kind, np.round(lat * 1e3, 1).tolist())


def test_the_twin_that_sets_the_bound_is_shown():
    """Where the cap binds the op runs as its padded twin does: that twin's tile and split."""
    from kit.predict.tile_mlp import TilePredictor

    tp = TilePredictor.shipped()
    two, three = tp.predict([Gemm(2, 2048, 8192, kind="linear", shared_rhs=True),
                             Gemm(3, 2048, 8192, kind="linear", shared_rhs=True)], "t4").to_dict("records")
    assert two["latency_ms"] <= three["latency_ms"] * (1 + 1e-12)
    bound, twin = tp.padded_rows_ms([Gemm(2, 2048, 8192, kind="linear", shared_rhs=True)], tp_gpu("t4"))
    assert np.isfinite(bound[0]) and twin is not None
    if two["latency_ms"] == pytest.approx(bound[0], rel=1e-12):  # the cap bound it
        assert (two["tile"], two["split_k"]) == (twin.tile.iloc[0], twin.split_k.iloc[0])


def tp_gpu(name):
    from kit.hardware import get_gpu

    return get_gpu(name)
