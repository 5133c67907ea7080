"""Re-read traffic of multi-pass row kernels (kit.predict.row_reread) and its place in the base time."""
import dataclasses

import numpy as np
import pytest

from kit.api import predict_op
from kit.hardware import get_gpu
from kit.ops import LayerNorm, RMSNorm, Softmax
from kit.predict.features import waves, work
from kit.predict.row_reread import PASSES, miss_fraction, passes_of, reread_bytes, resident_rows
from kit.predict.tile_mlp import TilePredictor

MANY = np.array([1 << 20], dtype=float)  # rows enough to fill every SM's slots


def _rr(op, rows, cols, gpu, elem=4):
    return reread_bytes(op, np.array([rows], dtype=float), np.array([cols], dtype=float),
                        get_gpu(gpu) if isinstance(gpu, str) else gpu, elem)[0]


def test_no_more_rows_resident_than_the_op_has():
    v100 = get_gpu("v100-pcie-32gb")  # 80 SMs, four 512-thread softmax blocks each
    per_sm, on_gpu, _ = resident_rows("softmax", np.array([4.0, 200.0, 1e6]),
                                      np.array([8192.0] * 3), v100, 4)
    assert per_sm.tolist() == [1, 3, 4] and on_gpu.tolist() == [4, 200, 320]
    # four rows of 32 KiB fit any cache: nothing to re-read from DRAM, however wide the row
    assert _rr("softmax", 4, 8192, v100) == 0
    assert _rr("softmax", 1e6, 8192, v100) > 0


def test_no_reread_while_the_rows_fit_a_cache():
    a100 = get_gpu("a100-pcie-40gb")
    # the warp softmax holds its row in registers
    assert passes_of("softmax", 1024, a100, 4) == 1 and _rr("softmax", 1e6, 1024, a100) == 0
    # long rows that fit: 108 SMs x 4 softmax rows of 8 KiB (3.4 MiB of a 40 MiB L2); layer
    # norm's 16 rows of 4 KiB
    assert passes_of("softmax", 2048, a100, 4) == 3 and _rr("softmax", 1e6, 2048, a100) == 0
    assert _rr("layernorm", 1e6, 1024, a100) == 0
    # the L4's 48 MiB L2 holds 58 SMs x 3 softmax rows of 64 KiB
    assert _rr("softmax", 1e6, 16384, "l4") == 0
    # with a tiny L2 the same rows spill: the answer comes from the caches, not the row width
    small = dataclasses.replace(a100, l2_cache_mib=1.0, l1_cache_kib_per_sm=8.0)
    assert _rr("softmax", 1e6, 2048, small) > 0 and _rr("layernorm", 1e6, 1024, small) > 0
    assert reread_bytes("elementwise", np.array([10.0]), np.array([10.0]), a100, 4).tolist() == [0]


def test_spill_grows_with_the_row_and_is_bounded_by_the_passes():
    v100 = get_gpu("v100-pcie-32gb")
    cols = np.array([2048.0, 4096, 6400, 8192, 16384, 65536])
    rows = np.full(len(cols), 1e5)
    for op in ("softmax", "layernorm"):
        miss, passes = miss_fraction(op, rows, cols, v100, 4)
        assert np.all(np.diff(miss) >= 0) and miss[0] < miss[-1] == 1.0
        extra = reread_bytes(op, rows, cols, v100, 4)
        assert np.all(extra <= 4 * rows * cols * (passes - 1) + 1e-9)
        assert extra[-1] == pytest.approx(4 * rows[-1] * cols[-1] * (PASSES[op] - 1))


def test_half_precision_rows_spill_later():
    a100 = get_gpu("a100-pcie-40gb")
    assert (miss_fraction("softmax", MANY, np.array([12288.0]), a100, 2)[0][0]
            < miss_fraction("softmax", MANY, np.array([12288.0]), a100, 4)[0][0])


def test_rocm_runs_aligned_rows_that_fit_shared_memory_in_one_read():
    mi210 = get_gpu("mi210")
    assert passes_of("softmax", 8192, mi210, 4) == 1  # 32 KiB row, 16-byte vectors: the smem kernel
    assert passes_of("softmax", 8190, mi210, 4) == 3  # not whole vectors
    assert passes_of("softmax", 16384, mi210, 4) == 3  # 64 KiB: no room for the partial sums
    assert passes_of("softmax", 16384, mi210, 2) == 1
    assert passes_of("softmax", 8192, get_gpu("a100-pcie-40gb"), 4) == 3  # CUDA rows: PyTorch 2.1
    assert _rr("softmax", 1e6, 8192, mi210) == 0 and _rr("softmax", 1e6, 8190, mi210) > 0


@pytest.mark.parametrize("op, factor", [("softmax", 2.0), ("layernorm", 1.5)])
def test_base_time_carries_the_rereads_and_the_roofline_does_not(op, factor):
    # rows far past every cache: softmax moves 3 reads + 1 write, layer norm 2 + 1, against the
    # compulsory read + write (weights and bias are a rounding error at this size)
    a100 = get_gpu("a100-pcie-40gb")
    a = {"rows": np.array([8192.0, 8192.0]), "cols": np.array([65536.0, 2048.0])}
    w = waves(op, a, a100)
    flops, nbytes = work(op, a)
    roof = np.maximum(flops / a100.peak_flops_per_s("fp32"), nbytes / a100.mem_bw_bytes_per_s) * 1e3
    assert w["roofline_ms"] == pytest.approx(roof)  # compulsory bytes only
    assert w["base_ms"][0] == pytest.approx(factor * w["roofline_ms"][0], rel=1e-3)
    # narrow rows fit the caches: the base is the wave time, as without re-reads
    assert _rr(op, 8192, 2048, a100) == 0
    nore = waves(op, {"rows": a["rows"][1:], "cols": a["cols"][1:]},
                 dataclasses.replace(a100, l2_cache_mib=4096.0))
    assert w["base_ms"][1] == pytest.approx(nore["base_ms"][0])


def test_predictions_stay_above_the_roofline_in_every_dtype_and_vendor():
    tile = TilePredictor.shipped()
    ops = [Softmax(rows=r, cols=c, dtype=d) for r in (4, 65536) for c in (512, 4096, 16384)
           for d in ("fp32", "fp16")]
    ops += [LayerNorm(rows=r, cols=c, dtype=d) for r in (4, 65536) for c in (768, 8192)
            for d in ("fp32", "bf16")]
    ops += [RMSNorm(rows=65536, cols=8192, dtype="bf16")]
    for gpu in ("a100-pcie-40gb", "mi210", "l4"):
        ok = [o for o in ops if o.dtype in get_gpu(gpu).dtypes]
        p = tile.predict(ok, gpu)
        assert np.all(p.latency_ms >= p.roofline_ms * (1 - 1e-9)), gpu
        assert np.all((p.utilisation > 0) & (p.utilisation <= 1 + 1e-9)), gpu


def test_op_report_names_the_rereads():
    r = predict_op(LayerNorm(rows=65536, cols=8192), "a100-pcie-40gb", "tile")
    assert r["reread_bytes"] == pytest.approx(_rr("layernorm", 65536, 8192, "a100-pcie-40gb"))
    assert r["reread_bytes"] > 0
    from kit.cli.cmd_op import text

    assert "re-reads reach DRAM" in text(r)
    narrow = predict_op(LayerNorm(rows=64, cols=768), "a100-pcie-40gb", "tile")
    assert narrow["reread_bytes"] == 0 and "re-reads" not in text(narrow)
