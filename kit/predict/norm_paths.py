"""PyTorch's two-kernel layer norm on NVIDIA.

PyTorch runs a layer norm's forward on its vectorised kernel (vectorized_layer_norm_kernel, one
row a warp x 4) only when the row's width is a multiple of its vector size, 4 elements (and the
pointers are aligned). Any other width runs two kernels, one block a row each:
RowwiseMomentsCUDAKernel (512 threads: the mean and variance) then LayerNormForwardCUDAKernel (256
threads: normalise, scale, shift). On the project's H200 (measurements/h200-2026-12-04, the vector
sweeps' 410 layer-norm rows) every one of the 317 rows whose width was not a multiple of 4 ran the
two kernels and every one of the 93 others the vectorised one. The tile-MLP learned layer norm from
NeuSight's rows, whose widths are all multiples of 4, and had the two-kernel rows 2-4x fast (56%
MAPE in the stream, against 38% on the vectorised rows of the same sweeps).

Their kernel time (both kernels) fits

    FIXED + ceil(rows / SMs) x (ROW + cols x ELEM)   clocks,

with FIXED 6,614, ROW 1,277 and ELEM 1.48 (benchmarks/layernorm_paths.py; 10.3% MAPE on the 317
rows, median 7.0%). bf16 and fp32 rows fit alike (fitted on one dtype, the other scores 9.4% and
10.9%): the kernels are bound by their instructions, a block's reductions and a few per element,
not by their bytes. A LayerNorm of such a width is never faster than that, plus the dispatch floor
(kit.predict.small_op_bounds). The constants are carried to other NVIDIA GPUs on their SMs and boost
clock, untested there. ROCm builds PyTorch's same layer-norm source, so AMD GPUs likely take the two
kernels too, but no AMD row of such a width was measured (NeuSight's are all multiples of 4) and
its per-clock costs would differ: AMD is not bound. A tensor-parallel share of a vectorisable row
is kept vectorisable (kit.parallel.opgraph rounds its width up to a multiple of 4).
"""
from __future__ import annotations

import numpy as np

VECTOR_ELEMS = 4  # PyTorch's layer norm vector size: a width not a multiple of it runs two kernels
TWO_KERNEL_FIXED_CLOCKS = 6614.0
TWO_KERNEL_ROW_CLOCKS = 1277.0  # per row an SM runs
TWO_KERNEL_ELEM_CLOCKS = 1.48  # per element an SM runs


def two_kernel_mask(ops, gpu) -> np.ndarray:
    """Which ops are layer norms PyTorch runs on its two kernels on gpu (NVIDIA)."""
    from kit.ops import LayerNorm

    if getattr(gpu, "vendor", None) != "nvidia":
        return np.zeros(len(ops), dtype=bool)
    return np.array([type(op) is LayerNorm and op.cols % VECTOR_ELEMS != 0 for op in ops], dtype=bool)


def two_kernel_ms(rows, cols, gpu) -> np.ndarray:
    """The two kernels' time (no dispatch floor), on gpu's SMs and boost clock."""
    per_sm = np.ceil(np.asarray(rows, dtype=float) / gpu.sm_count)
    clocks = TWO_KERNEL_FIXED_CLOCKS + per_sm * (TWO_KERNEL_ROW_CLOCKS
                                                 + np.asarray(cols, dtype=float) * TWO_KERNEL_ELEM_CLOCKS)
    return clocks / (gpu.boost_clock_mhz * 1e6) * 1e3
