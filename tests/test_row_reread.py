"""Re-read traffic of multi-pass row kernels (kit.predict.row_reread) and its place in the base time."""
import numpy as np
import pytest

from kit.hardware import get_gpu
from kit.predict.features import waves, work
from kit.predict.row_reread import PASSES, miss_fraction, reread_bytes, resident_rows
from kit.tiling import occupancy, row_launch


def test_resident_rows_follow_pytorchs_launch():
    a100 = get_gpu("a100-pcie-40gb")
    for op, cols in (("softmax", 4096), ("softmax", 512), ("layernorm", 2048)):
        rpb, threads = row_launch(op, cols, 4, a100.vendor)
        bps = occupancy(a100, threads, 32, 256).blocks_per_sm
        per_sm, passes = resident_rows(op, np.array([cols]), a100, 4)
        assert per_sm[0] == bps * rpb
        assert passes[0] == (1.0 if op == "softmax" and cols <= 1024 else PASSES[op])


def test_no_reread_while_the_rows_fit_a_cache():
    a100 = get_gpu("a100-pcie-40gb")
    # the warp softmax holds its row in registers; narrow rows fit the L1 and the L2
    assert reread_bytes("softmax", np.array([1 << 20]), np.array([1024.0]), a100, 4)[0] == 0
    assert reread_bytes("layernorm", np.array([1 << 16]), np.array([1024.0]), a100, 4)[0] == 0
    # the L4's 48 MiB L2 holds 58 SMs x 3 softmax rows of 64 KiB: no spill, as its rows measure
    assert reread_bytes("softmax", np.array([8192.0]), np.array([16384.0]), get_gpu("l4"), 4)[0] == 0
    # elementwise and GEMM rows are not row kernels
    assert reread_bytes("elementwise", np.array([10.0]), np.array([10.0]), a100, 4).tolist() == [0]


def test_spill_grows_with_the_row_and_is_bounded_by_the_passes():
    v100 = get_gpu("v100-pcie-32gb")
    cols = np.array([2048.0, 4096, 6400, 8192, 16384, 65536])
    for op in ("softmax", "layernorm"):
        miss, passes = miss_fraction(op, cols, v100, 4)
        assert np.all(np.diff(miss) >= 0) and miss[0] < miss[-1] == 1.0
        rows = np.full(len(cols), 4096.0)
        extra = reread_bytes(op, rows, cols, v100, 4)
        assert np.all(extra <= 4 * rows * cols * (passes - 1) + 1e-9)
        assert extra[-1] == pytest.approx(4 * rows[-1] * cols[-1] * (PASSES[op] - 1))


def test_half_precision_rows_spill_later():
    a100 = get_gpu("a100-pcie-40gb")
    cols = np.array([12288.0])
    assert miss_fraction("softmax", cols, a100, 2)[0][0] < miss_fraction("softmax", cols, a100, 4)[0][0]


@pytest.mark.parametrize("op, factor", [("softmax", 2.0), ("layernorm", 1.5)])
def test_base_time_carries_the_rereads_and_the_roofline_does_not(op, factor):
    # rows far past every cache: softmax moves 3 reads + 1 write, layer norm 2 + 1, against the
    # compulsory read + write (weights and bias are a rounding error at this size)
    a100 = get_gpu("a100-pcie-40gb")
    a = {"rows": np.array([8192.0, 8192.0]), "cols": np.array([65536.0, 768.0])}
    w = waves(op, a, a100)
    flops, nbytes = work(op, a)
    roof = np.maximum(flops / a100.peak_flops_per_s("fp32"), nbytes / a100.mem_bw_bytes_per_s) * 1e3
    assert w["roofline_ms"] == pytest.approx(roof)  # compulsory bytes only
    assert w["base_ms"][0] == pytest.approx(factor * w["roofline_ms"][0], rel=1e-3)
    assert np.all(w["base_ms"] >= w["roofline_ms"])
    # narrow rows: the base is the wave time, untouched
    assert reread_bytes(op, a["rows"][1:], a["cols"][1:], a100, 4)[0] == 0
