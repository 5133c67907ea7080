"""Re-read traffic of the multi-pass row kernels: long-row softmax, layer norm and RMS norm.

PyTorch's long-row softmax (cunn_SoftMaxForward, rows over 1,024 columns) reads each row three
times: for its maximum, for its sum of exponentials, and for the output pass. The layer-norm
kernels read a row twice: for its moments, then to normalise it. The short-row warp softmax keeps
its row in registers and reads it once. The kernels count on the re-reads hitting a cache, and
they do while the rows resident at once fit:

- one SM holds blocks_per_sm × rows_per_block rows (PyTorch's launch, kit.tiling.row_launch): its
  L1 (GPU.l1_cache_bytes);
- the GPU holds sm_count times that: its L2.

When the resident rows spill both, each re-read comes from DRAM, and the kernel moves up to
(passes + 1)/2 times the compulsory bytes (read once, write once): twice them for softmax, 1.5
times for layer norm. NeuSight's measured rows show it. On the A100 40GB (a training GPU; 108 SMs
of four 512-thread softmax blocks, 40 MiB of L2), softmax reaches 81% of the DRAM bandwidth at
8,192 columns (14 MiB resident) and 45% at 16,384 (28 MiB): a half. Layer norm (16 rows per SM)
reaches 85% at 2,048 columns and 59% from 4,096 on: two thirds. The V100 (6 MiB L2), T4 (4 MiB)
and P100 (4 MiB) fall the same way at narrower rows. How far the spill has gone is a ramp of the
resident bytes over the cache's size:

    miss = ramp(resident_per_sm / L1, L1_START, L1_SPAN) · ramp(resident_gpu / L2, L2_START, L2_SPAN)
    ramp(x, a, b) = clip((x − a) / b, 0, 1)
    extra bytes = elem_bytes · rows · cols · (passes − 1) · miss

The ramps start well below the caches' size (other lines share them; the A100's L2 is two
halves). The four constants were chosen from a small grid by the leave-one-training-GPU-out error
of the refitted softmax and layer-norm models, on the five training GPUs alone. The tile-MLP's
base time carries the extra bytes (kit.predict.features.waves); its roofline does not, so a
prediction is still never below the compulsory-traffic roofline.
"""
from __future__ import annotations

import numpy as np

from kit.hardware import GPU
from kit.tiling import occupancy, row_launch

PASSES = {"softmax": 3.0, "layernorm": 2.0, "rmsnorm": 2.0}  # reads of each row (long rows)
L1_START, L1_SPAN = 0.6, 0.5
L2_START, L2_SPAN = 0.35, 0.45
ROW_REGS = 32  # registers per thread the features' occupancy assumes for row kernels
ROW_SMEM_BYTES = 32 * 4 * 2  # per-warp partial sums (kit.tiling.vector_tiling)


def ramp(x: np.ndarray, start: float, span: float) -> np.ndarray:
    return np.clip((np.asarray(x, dtype=float) - start) / span, 0.0, 1.0)


def resident_rows(op_class: str, cols: np.ndarray, gpu: GPU, elem_bytes: int) -> tuple:
    """(rows resident on one SM, reads of each row) per row length, as PyTorch launches the
    kernel: blocks per SM by kit.tiling.occupancy, rows per block by kit.tiling.row_launch."""
    cols = np.asarray(cols, dtype=float)
    uniq, inv = np.unique(cols, return_inverse=True)
    per_sm, passes = [], []
    for c in uniq:
        rpb, threads = row_launch(op_class, int(c), elem_bytes, gpu.vendor)
        bps = occupancy(gpu, threads, ROW_REGS, ROW_SMEM_BYTES).blocks_per_sm
        per_sm.append(bps * rpb)
        warp_softmax = op_class == "softmax" and c <= 1024 and c * elem_bytes <= 4096
        passes.append(1.0 if warp_softmax else PASSES[op_class])
    inv = inv.reshape(-1)
    return np.array(per_sm, dtype=float)[inv], np.array(passes)[inv]


def miss_fraction(op_class: str, cols: np.ndarray, gpu: GPU, elem_bytes: int) -> np.ndarray:
    """The share of a row's re-reads that reach DRAM (0: all hit a cache), and the passes."""
    per_sm, passes = resident_rows(op_class, cols, gpu, elem_bytes)
    sm_bytes = per_sm * np.asarray(cols, dtype=float) * elem_bytes
    miss = (ramp(sm_bytes / gpu.l1_cache_bytes, L1_START, L1_SPAN)
            * ramp(sm_bytes * gpu.sm_count / gpu.l2_cache_bytes, L2_START, L2_SPAN))
    return miss, passes


def reread_bytes(op_class: str, rows: np.ndarray, cols: np.ndarray, gpu: GPU,
                 elem_bytes: int) -> np.ndarray:
    """DRAM bytes a row kernel moves beyond its compulsory ones (0 where the re-reads hit)."""
    if op_class not in PASSES:
        return np.zeros(len(np.atleast_1d(rows)))
    miss, passes = miss_fraction(op_class, cols, gpu, elem_bytes)
    return elem_bytes * np.asarray(rows, dtype=float) * np.asarray(cols, dtype=float) * (passes - 1) * miss
