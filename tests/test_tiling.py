"""Tiles, occupancy and waves against hand calculations, and the roofline's bound."""
import math
import os
from pathlib import Path

import pytest

from kit.errors import KitError
from kit.hardware import get_gpu
from kit.ops import Elementwise, Gemm, LayerNorm, Softmax
from kit.predict import RooflinePredictor, WavePredictor, roofline
from kit.tiling import (SIMT_TILES, TileShape, gemm_tiling, gemm_tiling_for, gemm_tilings,
                        occupancy, row_launch, vector_tiling, waves_for)

REPO = Path(__file__).resolve().parents[1]
NEUSIGHT = Path(os.environ.get("KIT_DATA", REPO.parent / "shared" / "data" / "neusight"))


def test_waves_staircase():
    assert waves_for(1, 100) == (1, 0.01)
    assert waves_for(100, 100) == (1, 1.0)
    assert waves_for(101, 100) == (2, 0.01)


def test_occupancy_limits_by_hand():
    a100 = get_gpu("a100-pcie-40gb")
    # 256 threads × 96 registers = 24,576 registers per block; 65,536 / 24,576 -> 2 blocks
    occ = occupancy(a100, threads=256, regs_per_thread=96, smem_per_block_bytes=16 * 1024)
    assert occ.blocks_per_sm == a100.registers_per_sm // (96 * 256) and occ.limiter == "registers"
    # 1024-thread blocks: the thread limit decides
    occ = occupancy(a100, threads=1024, regs_per_thread=16, smem_per_block_bytes=0)
    assert occ.blocks_per_sm == a100.max_threads_per_sm // 1024 and occ.limiter == "threads"
    # huge shared memory: one block at most
    occ = occupancy(a100, threads=64, regs_per_thread=16, smem_per_block_bytes=100 * 1024)
    assert occ.blocks_per_sm == 1 and occ.limiter == "smem"


def test_gemm_tiles_and_waves_by_hand():
    gpu = get_gpu("v100-pcie-32gb")
    tile = TileShape(128, 64, 8, 128)
    g = Gemm(m=1000, n=1000, k=512, b=2)
    t = gemm_tiling_for(g, gpu, tile)
    assert t.tiles == 2 * math.ceil(1000 / 128) * math.ceil(1000 / 64)
    assert t.slots == gpu.sm_count * t.blocks_per_sm
    assert t.waves == math.ceil(t.tiles / t.slots)
    assert 0 < t.last_wave_fill <= 1


def test_wave_quantisation_is_a_staircase():
    """One tile more than a full wave costs a step: that lone tile gets a whole SM, so it takes
    a full wave's time divided by the blocks an SM shares in a full wave."""
    gpu = get_gpu("a100-pcie-40gb")
    tile = SIMT_TILES[0]
    t = gemm_tiling_for(Gemm(m=128, n=128, k=4096), gpu, tile)
    slots = t.slots
    full = gemm_tiling_for(Gemm(m=128, n=128 * slots, k=4096), gpu, tile)
    plus_one = gemm_tiling_for(Gemm(m=128, n=128 * (slots + 1), k=4096), gpu, tile)
    assert full.waves == 1 and plus_one.waves == 2
    step = full.wave_time_ms / full.blocks_per_sm
    assert plus_one.wave_model_ms == pytest.approx(full.wave_model_ms + step, rel=1e-6)


@pytest.mark.parametrize("gpu", ["p4", "t4", "a100-sxm4-80gb", "h100-sxm", "mi300x"])
@pytest.mark.parametrize("shape", [(64, 64, 64, 1), (4096, 4096, 4096, 1), (197, 3072, 768, 8),
                                   (1, 50257, 768, 1)])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_wave_model_never_beats_the_roofline(gpu, shape, dtype):
    m, n, k, b = shape
    g = Gemm(m=m, n=n, k=k, b=b, dtype=dtype)
    if get_gpu(gpu).peak_tflops(dtype) is None:
        pytest.skip("dtype unsupported")
    r = roofline(g, gpu)
    for t in gemm_tilings(g, gpu):
        assert t.wave_model_ms >= r.time_ms * (1 - 1e-9)
    row = WavePredictor().predict([g], gpu).iloc[0]
    assert row.latency_ms >= row.roofline_ms and 0 < row.utilisation <= 1


def test_roofline_by_hand_h100_bf16():
    g = Gemm(m=8192, n=8192, k=8192, dtype="bf16")
    gpu = get_gpu("h100-sxm")
    r = roofline(g, gpu)
    assert r.bound == "compute"
    assert r.time_ms == pytest.approx(2 * 8192**3 / (gpu.bf16_tflops * 1e12) * 1e3, rel=1e-9)
    assert r.ridge_flops_per_byte == pytest.approx(gpu.bf16_tflops * 1e12 / (gpu.mem_bw_gbs * 1e9))


def test_elementwise_is_memory_bound_and_tiled_in_512s():
    gpu = get_gpu("t4")
    op = Elementwise("add", 10_000_000)
    r = roofline(op, gpu)
    assert r.bound == "memory"
    assert r.time_ms == pytest.approx(12 * 10_000_000 / (gpu.mem_bw_gbs * 1e9) * 1e3)
    t = vector_tiling(op, gpu)
    assert t.tiles == math.ceil(10_000_000 / 512)


def test_row_ops_one_warp_or_one_block_per_row():
    gpu = get_gpu("a10")
    assert vector_tiling(Softmax(rows=1000, cols=512), gpu).tiles == 250  # 4 rows per block
    assert vector_tiling(LayerNorm(rows=1000, cols=4096), gpu).tiles == 1000  # one row per block


@pytest.mark.parametrize("op_class, cols, elem_bytes, expected", [
    # warp softmax: 128 threads; 32 lanes per row (fewer for short rows), 2 rows a warp <= 128
    ("softmax", 512, 4, (4, 128)), ("softmax", 1024, 4, (4, 128)), ("softmax", 100, 4, (8, 128)),
    ("softmax", 16, 4, (16, 128)), ("softmax", 1, 4, (256, 128)),
    # block softmax: next power of two of min(cols / 4, 1024) / 2, at least a warp
    ("softmax", 1025, 4, (1, 128)), ("softmax", 2048, 4, (1, 256)), ("softmax", 4096, 4, (1, 512)),
    ("softmax", 100_000, 4, (1, 512)), ("softmax", 2048, 2, (1, 128)),
    # layer / RMS norm: one row per 32x4 block
    ("layernorm", 512, 4, (1, 128)), ("layernorm", 16384, 4, (1, 128)), ("rmsnorm", 4096, 2, (1, 128)),
])
def test_row_launch_by_hand(op_class, cols, elem_bytes, expected):
    assert row_launch(op_class, cols, elem_bytes) == expected


@pytest.mark.parametrize("op_class, cols, expected", [
    # a 64-lane wavefront: one row a wavefront from 64 columns up, two rows per 128 threads
    ("softmax", 512, (2, 128)), ("softmax", 1024, (2, 128)), ("softmax", 100, (4, 128)),
    ("softmax", 16, (16, 128)),
    # ROCm's block softmax: 1024 threads a row (fewer only for rows under 1024, never launched)
    ("softmax", 1025, (1, 1024)), ("softmax", 4096, (1, 1024)),
    ("layernorm", 768, (1, 256)), ("rmsnorm", 4096, (1, 256)),
])
def test_row_launch_on_amd_by_hand(op_class, cols, expected):
    assert row_launch(op_class, cols, 4, "amd") == expected
    gpu = get_gpu("mi210")
    op = (Softmax if op_class == "softmax" else LayerNorm)(rows=10_000, cols=cols)
    if op_class != "rmsnorm":
        t = vector_tiling(op, gpu)
        assert (t.threads_per_block, t.tiles) == (expected[1], math.ceil(10_000 / expected[0]))
    assert row_launch(op_class, cols, 4, "AMD") == expected  # a user's GPU file may say so
    assert row_launch(op_class, cols, 4, "intel") == row_launch(op_class, cols, 4)  # CUDA's rules


def test_row_launch_rejects_other_ops():
    with pytest.raises(KitError, match="not a row op"):
        row_launch("gemm", 64)


def test_vector_tiling_uses_the_launch():
    gpu = get_gpu("a100-pcie-40gb")
    t = vector_tiling(LayerNorm(rows=1000, cols=512), gpu)
    assert (t.tiles, t.threads_per_block, t.tile_dims) == (1000, 128, (1, 512))
    t = vector_tiling(Softmax(rows=10, cols=4096), gpu)
    assert (t.tiles, t.threads_per_block) == (10, 512)
    assert t.blocks_per_sm == gpu.max_threads_per_sm // 512


@pytest.mark.skipif(not (NEUSIGHT / "data" / "dataset").is_dir(), reason="NeuSight data absent")
@pytest.mark.parametrize("split, name", [("train", "softmax"), ("train", "ln"),
                                         ("test", "softmax"), ("test", "ln"),
                                         ("amd", "softmax"), ("amd", "ln")])
def test_row_launch_matches_the_launches_in_the_data(split, name):
    """Every measured softmax / layer-norm row records its kernel's block and grid: the launch
    rule must give that block size, and that grid (PyTorch runs the warp softmax in chunks of
    2^30 elements; the first chunk's launch is recorded). dataset_amd: MI100 and MI210 rows,
    PyTorch 2.4.1 on ROCm."""
    from kit.data import load_measurements
    from kit.hardware import get_gpu

    folder = "dataset_amd" if split == "amd" else "dataset"
    rows = load_measurements(NEUSIGHT / "data" / folder / ("train" if split == "amd" else split)
                             / f"{name}.csv")
    assert len(rows) > 100
    wrong = []
    for r in rows.itertuples():
        per_block, threads = row_launch(r.op_class, int(r.cols), 4, get_gpu(r.gpu).vendor)
        warp = r.op_class == "softmax" and per_block > 1
        first = min(int(r.rows), (1 << 30) // int(r.cols)) if warp else r.rows
        grid = r.grid_x * r.grid_y * r.grid_z
        if (r.block_x * r.block_y * r.block_z, grid) != (threads, math.ceil(first / per_block)):
            wrong.append((r.gpu, r.rows, r.cols, r.block_x, r.block_y, grid))
    assert not wrong, wrong[:5]


def test_predictors_dedupe_and_keep_order():
    ops = [Gemm(m=64, n=64, k=64), Elementwise("relu", 4096), Gemm(m=64, n=64, k=64)]
    df = RooflinePredictor().predict(ops, "t4")
    assert len(df) == 3 and df.latency_ms[0] == df.latency_ms[2]
    assert df.tile[1] == "512"


def test_chosen_tile_is_a_candidate():
    g = Gemm(m=3000, n=2000, k=1000)
    t = gemm_tiling(g, "l4")
    assert t.tile in {s.name for s in SIMT_TILES}


@pytest.mark.skipif(not (NEUSIGHT / "data" / "dataset").is_dir(), reason="NeuSight data absent")
def test_simt_tiles_launch_the_threads_cublas_sgemm_kernels_launch():
    """Each row that ran a cuBLAS {maxwell,volta,ampere}_sgemm_<m>x<n> kernel records its block:
    the SIMT tile of that shape (library m x n is the kit's TileShape(n, m)) has that many
    threads, so its occupancy is the kernel's."""
    from kit.data.neusight import load_neusight

    rows = load_neusight("train-collect", data_dir=NEUSIGHT, ops=["gemm"])
    rows = rows[rows.kernel_name.str.match(r"(maxwell|volta|ampere)_sgemm_\d+x\d+", na=False)]
    assert len(rows) > 10_000
    threads = {(s.tn, s.tm): s.threads for s in SIMT_TILES}  # library orientation
    launched = (rows.block_x * rows.block_y * rows.block_z).astype(int)
    wrong = {}
    for (m, n), got in zip(zip(rows.tile_m.astype(int), rows.tile_n.astype(int)), launched):
        if (m, n) in threads and threads[(m, n)] != got:
            wrong[(m, n)] = (threads[(m, n)], got)
    assert not wrong, f"tile: (SIMT_TILES threads, launched) {wrong}"


def test_a_reported_gemm_tiling_is_the_one_the_tile_predictor_priced():
    """kit op reports threads and blocks per SM for the tile the predictor chose: they are the
    occupancy the tile-MLP's features used, not another block size of the same tile shape."""
    from kit.api import predict_op
    from kit.ops import linear
    from kit.predict.features import arrays_from_ops, waves
    from kit.predict.weights import has_shipped, shipped_tile

    if not has_shipped():
        pytest.skip("no shipped weights")
    chooser = shipped_tile().chooser
    gpu = get_gpu("a100-pcie-80gb")
    seen = set()
    for op in [linear(m, 1024, n) for m in (64, 256, 4096) for n in (32, 96, 768, 3072)]:
        r = predict_op(op, gpu, "tile")
        a = arrays_from_ops("gemm", [op])
        tile, names = chooser.tile_arrays(a, gpu)
        if r["split_k"] != 1 or names[0] != r["tile"]:
            continue  # a split or mixed answer reports another GEMM's tile
        a.update(tile)
        w = waves("gemm", a, gpu)
        seen.add(r["tile"])
        assert (r["threads_per_block"], r["blocks_per_sm"], r["waves"]) == (
            int(a["threads"][0]), int(w["blocks_per_sm"][0]), int(w["waves"][0])), (op, r["tile"])
    assert {"32x32", "128x32"} <= seen  # the tiles whose threads the guesses had wrong
