"""One row's latency in PyTorch's block softmax on AMD CDNA GPUs, which sets the kernel's time.

On ROCm, PyTorch runs a softmax row of more than 1,024 elements (or 4 KiB: past the warp
kernel, kit.tiling.warp_softmax) as cunn_SoftMaxForward, one block of up to 1,024 threads per
row (kit.tiling.row_launch). It reads the row for its maximum, again for its sum of exponentials
and a third time to write it, and each pass ends in a block-wide reduction. Where the row is a
whole number of 16-byte vectors that fits the block's shared memory, cunn_SoftMaxForwardSmem
reads it once into LDS (kit.predict.row_reread.passes_of). A CU holds two such blocks (2,048 or
2,560 threads), so nothing hides a block's latency, and the kernel takes

    rounds x (a + b x cols) clocks,   rounds = ceil(rows / (CUs x blocks per CU))

at the boost clock. NeuSight's AMD softmax rows (data/dataset_amd/train/softmax.csv: PyTorch
2.4.1 on ROCm, fp32, 4,000-16,000 rows of 1,025-4,096 elements) follow it within 2-3% (MAPE) on
either GPU, once the tile predictor's dispatch floor is taken off their latency. The line, in
clocks, is nearly the same on CDNA (MI100, 1,502 MHz) and CDNA 2 (MI210, 1,700 MHz): about
5,900 + 3.6 x cols for the three-pass kernel and 5,500 + 2.0 x cols for the shared-memory one.
The tile-MLP learned softmax from NVIDIA's kernels (blocks of 256-512 threads, four to eight per
SM). It had put these kernels 1.9-2.5x fast on the MI210 and 1.5-2.0x on the MI100, while the
warp kernel's rows stayed within 7%.

benchmarks/cdna_softmax_fit.py fits the constants on both GPUs' rows. It also scores a fit on
one GPU against the other GPU's rows, which it never saw. A softmax on an AMD GPU is no faster
than this latency plus the dispatch floor (kit.predict.small_op_bounds); in the stream, which
sheds the floor, the latency holds. Untested: 16-bit rows (none was measured; they take the fp32
line per element), rows over 4,096 elements (the line extrapolates), and CDNA 3 (the MI300X,
carried by its clock and CUs).
"""
from __future__ import annotations

import numpy as np

from kit.tiling import ROW_REGS_PER_THREAD, ROW_SMEM_BYTES, occupancy, row_launch, warp_softmax

# a + b x cols clocks per round of resident blocks, by kernel (benchmarks/cdna_softmax_fit.py)
CDNA_SOFTMAX_ROW_CLOCKS = {"three_pass": (5947.0, 3.59), "smem": (5516.0, 1.99)}


def kernel_of(cols: int, gpu, elem_bytes: int) -> str | None:
    """Which block kernel PyTorch runs a softmax row of `cols` on an AMD GPU: "three_pass",
    "smem", or None (the warp kernel, or not an AMD GPU)."""
    from kit.predict.row_reread import passes_of

    if getattr(gpu, "vendor", None) != "amd" or warp_softmax(int(cols), elem_bytes):
        return None
    return "smem" if passes_of("softmax", cols, gpu, elem_bytes) == 1.0 else "three_pass"


def slots(cols: int, gpu, elem_bytes: int) -> int:
    """Blocks of a row of `cols` the whole GPU holds at once (CUs x blocks per CU)."""
    threads = row_launch("softmax", int(cols), elem_bytes, gpu.vendor)[1]
    return gpu.sm_count * occupancy(gpu, threads, ROW_REGS_PER_THREAD, ROW_SMEM_BYTES).blocks_per_sm


def block_softmax_ms(rows, cols, gpu, elem_bytes: int, constants: dict | None = None) -> np.ndarray:
    """Per softmax op (rows x cols, over cols), the block kernel's time on an AMD GPU: rounds of
    resident blocks times one row's latency (module doc). 0 for the warp kernel's rows and off
    AMD. constants: CDNA_SOFTMAX_ROW_CLOCKS's form (the fit script passes its own)."""
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
        out[at] = rounds * (a + b * c) / hz * 1e3
    return out
