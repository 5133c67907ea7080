"""GPU architecture as arithmetic: tiles, thread blocks, occupancy and waves.

A kernel splits its output into tiles; each tile is one thread block. An SM holds as many blocks
at once as its threads, registers, shared memory and block slots allow (occupancy). The GPU runs
`SMs × blocks_per_SM` blocks at a time: one *wave*. Tiles beyond that wait for the next wave, so

    waves = ceil(tiles / (SMs × blocks_per_SM))

and time grows in steps of one wave ("wave quantisation"): the last wave may be nearly empty yet
costs a full wave.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from kit.errors import KitError
from kit.hardware import GPU, get_gpu
from kit.ops import Dropout, Elementwise, Gemm, LayerNorm, RMSNorm, Softmax, dtype_bytes


@dataclass(frozen=True)
class TileShape:
    """One thread block's work: an m×n output tile stepping through k in slices of depth tk."""

    tm: int
    tn: int
    tk: int
    threads: int
    stages: int = 2  # shared-memory pipeline depth (double buffering)

    @property
    def name(self) -> str:
        return f"{self.tm}x{self.tn}"


# SIMT fp32 (sgemm) tiles, the shapes cuBLAS/CUTLASS sgemm kernels are named after
# (e.g. ampere_sgemm_128x64_tn); 8-deep k slices. The threads are the blocks cuBLAS's
# {maxwell,volta,ampere}_sgemm_<tile> kernels launch in NeuSight's train-collect GEMM rows (block
# x·y·z; one count per tile on every GPU that ran it, the test rows alike): 128x128 256, 128x64
# 128, 64x64 64, 128x32 256 (8,348 rows, 775 of them *_sliced1x4), 32x128 256 (13,973 rows),
# 64x32 256 and 32x32 128 (1,343 and 2,187 rows, all *_sliced1x4: the k-sliced kernels are
# the only ones of those shapes). The guesses they replace (128, 128, 64, 64) had given a
# 128x32 tile 8 blocks an A100 SM where the launched one gets 5, a 32x32 tile 21 where it gets
# 12, unlike the tile chooser's vocabulary (kit.predict.tile_choice: the data's threads).
SIMT_TILES = (
    TileShape(128, 128, 8, 256), TileShape(128, 64, 8, 128), TileShape(64, 128, 8, 128),
    TileShape(128, 32, 8, 256), TileShape(32, 128, 8, 256), TileShape(64, 64, 8, 64),
    TileShape(64, 32, 8, 256), TileShape(32, 64, 8, 256), TileShape(32, 32, 8, 128),
)
# Tensor-core tiles (CUTLASS-style, 32-deep k slices, 3-4 stage pipelines).
TENSOR_TILES = (
    TileShape(256, 128, 32, 256, 3), TileShape(128, 256, 32, 256, 3),
    TileShape(128, 128, 32, 256, 3), TileShape(128, 64, 32, 128, 4),
    TileShape(64, 128, 32, 128, 4), TileShape(64, 64, 32, 128, 4), TileShape(64, 32, 32, 64, 4),
)
MAX_REGS_PER_THREAD = 255  # 255: NVIDIA per-thread register cap (CUDA programming guide)
TILE_SLACK = 0.05  # tiles within 5% of the best wave-model time count as equally fast
BASE_REGS_PER_THREAD = 32  # addresses, loop counters and operand fragments, beyond accumulators


def gemm_candidate_tiles(dtype: str) -> tuple[TileShape, ...]:
    """Tiles a library would consider: SIMT for fp32 (tensor cores off), tensor-core tiles else."""
    dtype_bytes(dtype)
    return SIMT_TILES if dtype == "fp32" else TENSOR_TILES


@dataclass(frozen=True)
class Occupancy:
    blocks_per_sm: int
    limiter: str  # which resource stops another block fitting: threads, registers, smem, blocks
    regs_per_thread: int
    smem_per_block_bytes: int


# Shared memory the CUDA runtime keeps per resident block on compute capability 8.0 and later
# (cudaDevAttrReservedSharedMemoryPerBlock, 1 KiB; the occupancy calculator adds it to each
# block's own): an A100 holds 4 blocks of 32 KiB (167,936 / 33,792), not 5, and an L4 14 of
# the 6 KiB 64x32 sgemm tile (102,400 / 7,168), not 16. Volta, Turing and Pascal keep none.
RESERVED_SMEM_PER_BLOCK_BYTES = 1024
RESERVED_SMEM_ARCHS = ("ampere", "ada", "hopper", "blackwell")


def reserved_smem_per_block_bytes(gpu: GPU) -> int:
    """The shared memory the runtime keeps per block on this GPU (RESERVED_SMEM_ARCHS)."""
    nvidia = str(gpu.vendor).lower() == "nvidia"
    return RESERVED_SMEM_PER_BLOCK_BYTES if nvidia and gpu.arch in RESERVED_SMEM_ARCHS else 0


def occupancy(gpu: GPU, threads: int, regs_per_thread: int, smem_per_block_bytes: int) -> Occupancy:
    """Blocks of this size that fit on one SM at once, and the resource that limits them."""
    regs = min(max(regs_per_thread, 16), MAX_REGS_PER_THREAD)
    smem = smem_per_block_bytes + reserved_smem_per_block_bytes(gpu)
    limits = {
        "threads": gpu.max_threads_per_sm // threads,
        "registers": gpu.registers_per_sm // (regs * threads),
        # a block with no shared memory (none of its own, none reserved: before sm_80, AMD) is
        # not limited by it: standing in as max_blocks_per_sm, it had taken the tie with the
        # block slots, a V100's 32-thread block "limited by smem" with 0 bytes of it
        **({"smem": int(gpu.smem_per_sm_bytes // smem)} if smem else {}),
        "blocks": gpu.max_blocks_per_sm,
    }
    limiter = min(limits, key=limits.get)
    return Occupancy(max(limits[limiter], 1), limiter, regs, smem_per_block_bytes)


@dataclass(frozen=True)
class Tiling:
    """How one op maps onto a GPU: its tile, the blocks, the occupancy and the waves."""

    op_class: str
    tile: str  # "128x64" for a GEMM, "512" (elements or rows per block) for a vector op
    tile_dims: tuple[int, ...]
    threads_per_block: int
    blocks_per_sm: int
    limiter: str
    tiles: int
    slots: int  # blocks the whole GPU runs at once = SMs × blocks_per_sm
    waves: int
    last_wave_fill: float  # fraction of the slots the last wave uses, in (0, 1]
    tile_flops: float
    tile_bytes: float  # one tile's own operand and output bytes (before any reuse in L2)
    wave_time_ms: float  # one full wave at peak compute or bandwidth (utilisation 1)
    last_wave_ms: float  # the last wave, which may hold fewer blocks per SM

    @property
    def wave_model_ms(self) -> float:
        """(waves − 1) full waves plus the last one: the time at utilisation 1."""
        return (self.waves - 1) * self.wave_time_ms + self.last_wave_ms

    def to_dict(self) -> dict:
        d = asdict(self)
        d["tile_dims"] = list(self.tile_dims)
        d["wave_model_ms"] = self.wave_model_ms
        return d


def waves_for(tiles: int, slots: int) -> tuple[int, float]:
    """(waves, last-wave fill): waves = ceil(tiles / slots)."""
    waves = max(1, math.ceil(tiles / slots))
    return waves, (tiles - (waves - 1) * slots) / slots


def _wave_ms(gpu: GPU, tiles_in_wave: int, tile_flops: float, wave_bytes: float,
             peak_flops: float) -> float:
    """One wave: the busiest SM runs ceil(tiles / SMs) blocks, each at the SM's share of the peak
    (peak / SMs); meanwhile the wave's DRAM traffic streams at full bandwidth."""
    per_sm = math.ceil(tiles_in_wave / gpu.sm_count)
    compute_s = per_sm * tile_flops / (peak_flops / gpu.sm_count)
    return max(compute_s, wave_bytes / gpu.mem_bw_bytes_per_s) * 1e3


def gemm_wave_bytes(gemm: Gemm, tile: TileShape, tiles_in_wave: int) -> float:
    """DRAM bytes one wave of GEMM tiles moves, with operand panels shared through L2.

    Blocks are launched in raster order, so a wave spans a band of the tile grid: rows of A
    (tm high) and columns of B (tn wide) that its tiles share are read once. A wave larger than
    one batch's grid covers whole batches.
    """
    d = dtype_bytes(gemm.dtype)
    grid_m, grid_n = math.ceil(gemm.m / tile.tm), math.ceil(gemm.n / tile.tn)
    per_batch = grid_m * grid_n
    out = tiles_in_wave * tile.tm * tile.tn
    if tiles_in_wave >= per_batch:
        batches = tiles_in_wave / per_batch
        return d * (batches * (grid_m * tile.tm + grid_n * tile.tn) * gemm.k + out)
    rows = min(grid_m, math.ceil(tiles_in_wave / grid_n))
    cols = min(grid_n, tiles_in_wave)
    return d * ((rows * tile.tm + cols * tile.tn) * gemm.k + out)


def gemm_tiling_for(gemm: Gemm, gpu: GPU | str, tile: TileShape) -> Tiling:
    """Tiles, occupancy and waves of a GEMM run with one given tile shape."""
    gpu = get_gpu(gpu)
    d = dtype_bytes(gemm.dtype)
    accum = tile.tm * tile.tn // tile.threads  # fp32 accumulators each thread holds
    smem = tile.stages * (tile.tm + tile.tn) * tile.tk * d
    occ = occupancy(gpu, tile.threads, accum + BASE_REGS_PER_THREAD, smem)
    tiles = gemm.b * math.ceil(gemm.m / tile.tm) * math.ceil(gemm.n / tile.tn)
    slots = gpu.sm_count * occ.blocks_per_sm
    waves, fill = waves_for(tiles, slots)
    tile_flops = 2.0 * tile.tm * tile.tn * gemm.k
    tile_bytes = float(d * ((tile.tm + tile.tn) * gemm.k + tile.tm * tile.tn))
    peak = gpu.gemm_peak_flops_per_s(gemm.dtype)  # AMD CDNA fp32: the FP32 matrix cores
    full = min(tiles, slots)
    last = tiles - (waves - 1) * slots
    wave_ms = _wave_ms(gpu, full, tile_flops, gemm_wave_bytes(gemm, tile, full), peak)
    last_ms = _wave_ms(gpu, last, tile_flops, gemm_wave_bytes(gemm, tile, last), peak)
    return Tiling("gemm", tile.name, (tile.tm, tile.tn, tile.tk), tile.threads, occ.blocks_per_sm,
                  occ.limiter, tiles, slots, waves, fill, tile_flops, tile_bytes, wave_ms, last_ms)


def gemm_tilings(gemm: Gemm, gpu: GPU | str) -> list[Tiling]:
    """Every candidate tile for this GEMM on this GPU."""
    return [gemm_tiling_for(gemm, gpu, t) for t in gemm_candidate_tiles(gemm.dtype)]


def gemm_tiling(gemm: Gemm, gpu: GPU | str) -> Tiling:
    """A stand-in for a library's heuristic (until a learned tile choice is available): the
    largest tile whose wave-model time is within TILE_SLACK of the best. Larger tiles reuse each
    operand byte more, which the utilisation-1 wave model cannot see, so libraries favour them."""
    options = gemm_tilings(gemm, gpu)
    best_ms = min(t.wave_model_ms for t in options)
    near = [t for t in options if t.wave_model_ms <= best_ms * (1 + TILE_SLACK)]
    return max(near, key=lambda t: (t.tile_dims[0] * t.tile_dims[1], -t.wave_model_ms))


# PyTorch's vectorised elementwise kernels: 128 threads, 4 elements per thread
# (aten/src/ATen/native/cuda/Loops.cuh: num_threads() = 128, thread_work_size() = 4).
ELEMENTWISE_THREADS = 128
ELEMENTWISE_ELEMS_PER_THREAD = 4


def _next_pow2(x: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1, x))))


ROW_REGS_PER_THREAD = 32  # a softmax or norm block's registers per thread, as costed here
ROW_SMEM_BYTES = 32 * 4 * 2  # its shared memory: per-warp partial sums


def warp_lanes(vendor: str) -> int:
    """Lanes of a warp: a 64-lane wavefront on AMD CDNA; 32 on NVIDIA and any other vendor (a
    user's GPU file launches as CUDA does)."""
    return 64 if str(vendor).lower() == "amd" else 32


def warp_softmax(cols: int, elem_bytes: int = 4) -> bool:
    """Whether PyTorch runs a softmax row as the persistent warp softmax (row held in registers):
    up to 1024 columns and 4 KiB."""
    return cols <= 1024 and cols * elem_bytes <= 4096


def row_launch(op_class: str, cols: int, elem_bytes: int = 4,
               vendor: str = "nvidia") -> tuple[int, int]:
    """(rows per block, threads per block) PyTorch launches for one softmax or norm over rows of
    `cols` elements of `elem_bytes` each, on a GPU of `vendor` (its warp: a 64-lane wavefront on
    AMD CDNA, any case; 32 lanes on NVIDIA and any other vendor).

    - softmax, rows up to 1024 columns (and 4 KiB): the persistent warp softmax. 128-thread
      blocks; a row gets min(warp, next_pow2(cols)) lanes, and each warp takes two rows when
      next_pow2(cols) <= 128 (aten/src/ATen/native/cuda/PersistentSoftmax.cuh);
    - softmax, longer rows, one row per block: on CUDA max(32, next_pow2(min(cols / ILP, 1024)
      / 2)) threads, ILP = 16 B / elem_bytes (SoftMax.cu, SoftMax_getBlockSize, PyTorch 2.1); on
      ROCm 1024 threads (min(cols, 1024) rounded up to whole wavefronts, as NeuSight's PyTorch
      2.4.1 rows record it);
    - layer norm and RMS norm: one row per block of warp x 4 threads (layer_norm_kernel.cu).

    NeuSight's rows record these launches, PyTorch 2.1 on CUDA and 2.4.1 on ROCm: every one of
    them matches (tests/test_tiling.py checks it against the data)."""
    cols = int(cols)
    warp = warp_lanes(vendor)
    amd = warp == 64
    if op_class == "softmax":
        if warp_softmax(cols, elem_bytes):
            p2 = _next_pow2(cols)
            lanes = min(p2, warp)
            return (128 // lanes) * (2 if p2 <= 128 else 1), 128
        if amd:
            return 1, min(1024, -(-cols // warp) * warp)
        ilp = max(1, 16 // elem_bytes)
        return 1, max(32, _next_pow2(min(cols // ilp, 1024) // 2))
    if op_class in ("layernorm", "rmsnorm"):
        return 1, warp * 4
    raise KitError(f"row_launch: {op_class!r} is not a row op (softmax, layernorm, rmsnorm)")


def vector_tiling(op, gpu: GPU | str) -> Tiling:
    """Blocks and waves of an elementwise, dropout, softmax or norm kernel.

    Elementwise: one block of 128 threads covers 512 elements. Row ops (softmax, norms): the
    blocks PyTorch launches for them (row_launch).
    """
    gpu = get_gpu(gpu)
    d = dtype_bytes(op.dtype)
    if isinstance(op, (Elementwise, Dropout)):
        per_block = ELEMENTWISE_THREADS * ELEMENTWISE_ELEMS_PER_THREAD
        threads = ELEMENTWISE_THREADS
        tiles = math.ceil(op.numel / per_block)
        tile_flops = op.flops / op.numel * per_block
        tile_bytes = op.bytes / op.numel * per_block
        dims = (per_block,)
        name = str(per_block)
        smem = 0
    elif isinstance(op, (Softmax, LayerNorm, RMSNorm)):
        rows_per_block, threads = row_launch(op.op_class, op.cols, d, gpu.vendor)
        tiles = math.ceil(op.rows / rows_per_block)
        tile_flops = op.flops / op.rows * rows_per_block
        tile_bytes = op.bytes / op.rows * rows_per_block
        dims = (rows_per_block, op.cols)
        name = f"{rows_per_block}x{op.cols}"
        smem = ROW_SMEM_BYTES
    else:
        raise KitError(f"vector_tiling: no vector tiling for {type(op).__name__}")
    occ = occupancy(gpu, threads, ROW_REGS_PER_THREAD, smem)
    slots = gpu.sm_count * occ.blocks_per_sm
    waves, fill = waves_for(tiles, slots)
    peak = gpu.peak_flops_per_s("fp32")
    full, last = min(tiles, slots), tiles - (waves - 1) * slots
    wave_ms = _wave_ms(gpu, full, tile_flops, full * tile_bytes, peak)
    last_ms = _wave_ms(gpu, last, tile_flops, last * tile_bytes, peak)
    return Tiling(op.op_class, name, dims, threads, occ.blocks_per_sm, occ.limiter, tiles, slots,
                  waves, fill, tile_flops, tile_bytes, wave_ms, last_ms)


def tiling(op, gpu: GPU | str) -> Tiling | None:
    """The tiling of any op that has one (GEMMs and vector ops); None for the others."""
    if isinstance(op, Gemm):
        return gemm_tiling(op, gpu)
    if isinstance(op, (Elementwise, Dropout, Softmax, LayerNorm, RMSNorm)):
        return vector_tiling(op, gpu)
    return None
