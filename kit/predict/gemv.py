"""Matrix-vector products: a GEMM with m or n of 1 streams its matrix.

cuBLAS runs such a GEMM on its gemv and dot kernels (gemv2T_kernel_val, internal::gemvx,
dot_kernel on an H200), not on a GEMM tile: the tile-MLP, which prices it as a 32-128-row tile
that is nearly all padding (and never saw one: NeuSight's thinnest GEMMs have m or n of 2), was
2.3-5x slow on the H200's FP32 rows. So its kernel time is a stream of its bytes:

    kernel_ms = (c0_us + bytes / (eff x DRAM bandwidth) x 1e6) / 1e3,  band: exp(band_log) x that

with c0 and eff fitted on the H200's random FP32 sweeps by benchmarks/gemv_fit.py and checked on
its aligned FP32 and TF32 sweeps of other shapes (16% MAPE there; the tile-MLP 100-440%). A
DRAM-bound kernel's share of the bandwidth is what carries over between GPUs; the constants are
the H200's alone (measurements/h200-2026-12-04 and -b). They are carried to every other GPU,
AMD's too (rocBLAS's gemv kernels are streams as well), as a share of its bandwidth: no GEMV
off the H200 has been timed. On AMD the tile-MLP had priced a GEMV as padded tiles split up to
32 ways: 1x1x2^31 in bf16 on an MI300X at 132 ms, 160x its roofline.

16-bit GEMVs stream too where no tensor-core curve covers them (unaligned ones, and GPUs
without tensor cores): the tile-MLP had them as a padded tile at the unaligned 16-bit share of the
peak, so a bf16 GEMV on an A100 came out slower than the same fp32 one (62 against 37 us for
1x512x4096). On the H200's 16-bit GEMV rows off the curve (its random bf16 and fp16 sweeps,
mostly unaligned) this rule, with the FP32 constants, scores the MAPE that benchmarks/gemv_fit.py
prints as check_16bit (31% over 387 rows, against 80% for the tile-MLP); it leans fast there (those
small kernels reach less of the bandwidth than FP32's), so its band is the FP32 fit's. Aligned
16-bit GEMVs take the tensor-core curve (kit.predict.tensor_core: measured on Hopper, carried to
NVIDIA's other tensor-core GPUs), which fits them better on the H200 (9-15% on the decode
sweeps); at this rule's 51% of the bandwidth, a batch-1 decode step on an A100 had come out
slower than a batch-2 one, whose m = 2 GEMMs stream at the roofline in the stream.
"""
from __future__ import annotations

import numpy as np

from kit.predict.features import TENSOR_16BIT

# the BLAS library that runs a GPU's GEMVs, by vendor (PyTorch on ROCm calls rocBLAS's gemv)
BLAS_LIBRARY = {"nvidia": "cuBLAS", "amd": "rocBLAS"}


def blas_library(gpu) -> str:
    """The vendor's BLAS library for gpu, as text names it: "cuBLAS", "rocBLAS", or "the BLAS
    library" for a user's GPU of another vendor."""
    return BLAS_LIBRARY.get(gpu.vendor, "the BLAS library")


# benchmarks/gemv_fit.py on the H200's FP32 random sweeps (tests/test_gemv.py refits them)
PARAMS = {"c0_us": 3.0, "eff": 0.51, "band_log": [-0.4728, 0.3862]}
DTYPES = ("fp32", "tf32", *TENSOR_16BIT, "fp8")
# the dtypes whose aligned GEMVs keep a tensor-core curve where one covers them
CURVE_FIRST = (*TENSOR_16BIT, "fp8")


def applies(gpu, ops) -> np.ndarray:
    """Per op: a GEMM with m or n of 1, in FP32, TF32 (the rule was checked on
    the H200's aligned TF32 GEMVs: it keeps them) or a 16-bit or FP8 dtype that no curve
    covers (kit.predict.tensor_core: NVIDIA's aligned ones; a curve marked covers_gemv False,
    AMD's, fitted on GEMMs of 10 us and more, leaves them to this rule), and not a grouped
    convolution's implicit GEMM (kind "linear", one per group, b = groups, no shared weight: a
    depthwise convolution has n = 1 forward and m = 1 in its weight gradient, and cuDNN runs it
    on its own kernels over the activations, not cuBLAS's gemv over an im2col matrix)."""
    from kit.predict.tensor_core import curve_gemm, params_for

    return np.array([getattr(o, "dtype", None) in DTYPES and min(o.m, o.n) == 1
                     and not (o.kind == "linear" and o.b > 1 and not o.shared_rhs)
                     and not (o.dtype in CURVE_FIRST and curve_gemm(gpu, o)
                              and params_for(gpu, o.dtype).get("covers_gemv", True))
                     for o in ops], dtype=bool)


# The largest share of the DRAM bandwidth any GEMM kernel reached on the H200 (kernel time, the
# operands' and output's bytes once; measurements/h200-2026-12-04 and -b, 10,147 GEMM rows): 0.73
# in FP32 (1,724 rows; SIMT gemmSN/sgemm and gemv kernels), 0.81 in TF32 (700), 0.93 in bf16 and
# 0.92 in fp16 (7,723; LM-head GEMMs of 1-8 rows over 2 GB of weights). No GEMM streams faster than
# that (TilePredictor._stream_bound), carried to other GPUs as a share of their bandwidth, as the
# GEMV rule is; fp8, never timed, takes the 16-bit share.
STREAM_SHARE_MAX = {"fp32": 0.73, "tf32": 0.81, "fp16": 0.92, "bf16": 0.93, "fp8": 0.93}
STREAM_SHARE_DEFAULT = 0.93
MEASURED_STREAM = ("fp32", "tf32", "fp16", "bf16")  # the dtypes whose share was measured


def stream_bound_ms(ops, bw_gbs: float) -> np.ndarray:
    """Per GEMM, its bytes at the largest share of bw_gbs a GEMM of its dtype was measured at (ms)."""
    share = np.array([STREAM_SHARE_MAX.get(o.dtype, STREAM_SHARE_DEFAULT) for o in ops], dtype=float)
    return np.array([o.bytes for o in ops], dtype=float) / (share * bw_gbs * 1e9) * 1e3


def kernel_ms_of(nbytes, bw_gbs: float, params: dict = PARAMS):
    """(kernel_ms, p10, p90) of gemv kernels moving nbytes at bw_gbs of DRAM bandwidth."""
    t = (params["c0_us"] + np.asarray(nbytes, dtype=float) / (params["eff"] * bw_gbs * 1e9) * 1e6) / 1e3
    lo, hi = params["band_log"]
    return t, t * np.exp(lo), t * np.exp(hi)
