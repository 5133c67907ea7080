"""One row's latency in PyTorch's block softmax on AMD CDNA GPUs, which sets the kernel's time.

On ROCm, PyTorch runs a softmax row of more than 1,024 elements (or 4 KiB: past the warp
kernel, kit.tiling.warp_softmax) as cunn_SoftMaxForward, one block of up to 1,024 threads per
row (kit.tiling.row_launch). It reads the row for its maximum, again for its sum of exponentials
and a third time to write it, and each pass ends in a block-wide reduction. Where the row is a
whole number of 16-byte vectors that fits the block's shared memory, cunn_SoftMaxForwardSmem
reads it once into LDS (kit.predict.row_reread.passes_of). A CU holds two such blocks (2,048 or
2,560 threads; one where a shared-memory row takes more than half the CU's 64 KiB), so nothing
hides a block's latency, and the kernel takes

    rounds x (a + b x cols) clocks,   rounds = ceil(rows / (CUs x blocks per CU))

at the boost clock. NeuSight's AMD softmax rows (data/dataset_amd/train/softmax.csv: PyTorch
2.4.1 on ROCm, fp32; 200 block-kernel rows a GPU, 4,000-16,000 rows of 1,033-4,081 elements)
follow it within 2-3% (MAPE) on either GPU, once the tile predictor's dispatch floor is taken off
their latency. The line, in clocks, is nearly the same on CDNA (MI100, 1,502 MHz) and CDNA 2
(MI210, 1,700 MHz): about 5,900 + 3.6 x cols for the three-pass kernel and 5,500 + 2.0 x cols for
the shared-memory one. The slope is a CU's traffic: two blocks' three fp32 reads of a column in
3.6 clocks is 6.7 bytes a clock a CU, so a 16-bit row takes it per byte (b x elem_bytes / 4);
the start (a: the reductions and barriers) is the same. The tile-MLP learned softmax from
NVIDIA's kernels (blocks of 256-512 threads, four to eight per SM) and had these rows fast by
1.6-2.8x on the MI210 and 1.2-2.2x on the MI100 (10th-90th percentile), while the warp kernel's
rows stayed within 7%.

benchmarks/cdna_softmax_fit.py fits the constants on both GPUs' rows. It also scores a fit on
one GPU against the other GPU's rows, which it never saw, and the 10th and 90th percentiles of
those held-out log residuals are the band (CDNA_SOFTMAX_BAND_LOG). A softmax on an AMD GPU is no
faster than this latency plus the dispatch floor (kit.predict.small_op_bounds); in the stream,
which sheds the floor, the latency holds. Where the line is carried, not measured (16-bit rows,
rows over MEASURED_MAX_COLS, GPUs other than the MI100 and MI210: CDNA 3's MI300X, CDNA 2's
MI250 and MI250X) the band widens by kit.predict.tensor_core.CARRIED_SIGMA_LOG in quadrature.
"""
from __future__ import annotations

import numpy as np

from kit.tiling import ROW_REGS_PER_THREAD, ROW_SMEM_BYTES, occupancy, row_launch, warp_lanes, warp_softmax

# a + b x cols clocks per round of resident blocks, by kernel (benchmarks/cdna_softmax_fit.py)
CDNA_SOFTMAX_ROW_CLOCKS = {"three_pass": (5884.0, 3.59), "smem": (5443.0, 2.0)}
# the 10th and 90th percentiles of log(measured / line), fitted on one GPU, on the other's rows
CDNA_SOFTMAX_BAND_LOG = (-0.0316, 0.0316)
MEASURED_GPUS = ("mi100", "mi210")
MEASURED_MAX_COLS = 4096


def kernel_of(cols: int, gpu, elem_bytes: int) -> str | None:
    """Which block kernel PyTorch runs a softmax row of `cols` on an AMD GPU: "three_pass",
    "smem", or None (the warp kernel, or not an AMD GPU)."""
    from kit.predict.row_reread import passes_of

    if getattr(gpu, "vendor", None) != "amd" or warp_softmax(int(cols), elem_bytes):
        return None
    return "smem" if passes_of("softmax", cols, gpu, elem_bytes) == 1.0 else "three_pass"


def slots(cols: int, gpu, elem_bytes: int) -> int:
    """Blocks of a row of `cols` the whole GPU holds at once (CUs x blocks per CU). The
    shared-memory kernel's block holds its row there too (as passes_of counts it)."""
    threads = row_launch("softmax", int(cols), elem_bytes, gpu.vendor)[1]
    smem = ROW_SMEM_BYTES
    if kernel_of(cols, gpu, elem_bytes) == "smem":
        smem = int(cols) * elem_bytes + threads // warp_lanes(gpu.vendor) * 4
    return gpu.sm_count * occupancy(gpu, threads, ROW_REGS_PER_THREAD, smem).blocks_per_sm


def block_softmax_ms(rows, cols, gpu, elem_bytes: int, constants: dict | None = None) -> np.ndarray:
    """Per softmax op (rows x cols, over cols), the block kernel's time on an AMD GPU: rounds of
    resident blocks times one row's latency, its slope per byte (module doc). 0 for the warp
    kernel's rows and off AMD. constants: CDNA_SOFTMAX_ROW_CLOCKS's form (the fit script passes
    its own)."""
    constants = constants or CDNA_SOFTMAX_ROW_CLOCKS
    rows = np.atleast_1d(np.asarray(rows, dtype=float))
    cols = np.atleast_1d(np.asarray(cols, dtype=float))
    out = np.zeros(len(cols))
    if getattr(gpu, "vendor", None) != "amd":
        return out
    hz = gpu.boost_clock_mhz * 1e6
    for c in np.unique(cols):
        kernel = kernel_of(int(c), gpu, elem_bytes)
        if kernel is None:
            continue
        at = cols == c
        a, b = constants[kernel]
        rounds = np.ceil(rows[at] / slots(int(c), gpu, elem_bytes))
        out[at] = rounds * (a + b * c * elem_bytes / 4) / hz * 1e3
    return out


def band_log(cols, gpu, elem_bytes: int) -> tuple[np.ndarray, np.ndarray]:
    """Per op, the (low, high) log band around the block latency: CDNA_SOFTMAX_BAND_LOG where it
    was measured (fp32, up to MEASURED_MAX_COLS, the MI100 and MI210), widened in quadrature by
    kit.predict.tensor_core.CARRIED_SIGMA_LOG elsewhere."""
    from kit.predict.tensor_core import CARRIED_SIGMA_LOG

    cols = np.atleast_1d(np.asarray(cols, dtype=float))
    lo, hi = CDNA_SOFTMAX_BAND_LOG
    carried = (cols > MEASURED_MAX_COLS) | (elem_bytes != 4) | (getattr(gpu, "key", None) not in MEASURED_GPUS)
    return (np.where(carried, -np.hypot(lo, CARRIED_SIGMA_LOG), lo),
            np.where(carried, np.hypot(hi, CARRIED_SIGMA_LOG), hi))
