"""Aligned tensor-core GEMMs on Hopper: a kernel time from the roofline, measured, not learned.

The tile-MLP learned each tile's utilisation from FP32 SIMT kernels, the only kind in NeuSight's
data. Hopper's 16-bit and TF32 GEMMs with 16-byte-aligned operands run cuBLAS's TMA/wgmma kernels
(nvjet, sm90_xmma) under a persistent tile scheduler, and the learned utilisation does not carry
over to them: on the H200's aligned bf16 GEMMs over 20 us the tile-MLP was 46% off (2x slow
where it predicted a low utilisation, 20% fast where it predicted a high one), while the
measured share of the roofline stayed between 0.55 and 0.82 whatever the shape. Such a GEMM's
kernel time is therefore a curve in its roofline time alone,

    kernel_ms = max(a * roofline_ms ** beta, roofline_ms / eff_max) + c0_us / 1e3

(beta < 1: bigger GEMMs reach a bigger share of the peak, up to eff_max, the best share any
fitting row reached), with a p10-p90 band from the fitting rows' residuals (one for kernels
the curve puts under 20 us, one for the rest).

Provenance: fitted by benchmarks/tensor_core_fit.py on the project's own H200 sweeps
(measurements/h200-2026-12-04-b): for bf16, also used for fp16, 2,000 aligned bf16 GEMMs (Linear,
bmm, and a Linear layer's forward, input-gradient and weight-gradient GEMMs); for tf32 the even
half of the aligned tf32 shapes. Each is checked there on shapes it never saw (bf16: 2,000 more;
fp16; the odd tf32 half); tests/test_tensor_core.py refits and compares. Measured on one Hopper
GPU, the H200, and applied to every Hopper GPU in the catalog (kit.hardware arch "hopper"). It
applies to GEMMs whose leading dimensions are 16-byte aligned; unaligned ones stay on the
tile-MLP with kit.predict.features.unaligned_peak_share. Such a GEMM is never split by the
kit's split-K rule (kit.predict.split_k), since its curve already holds cuBLAS's own splits.
Attention takes its curve on every GPU and dtype (carried over, with a wider band, where it was not
measured: CARRIED_ATTENTION) from ATTENTION_MIN_SEQ_Q queries on, the prefill shapes it was fitted
on; under that, a blend of the curve and the roofline (one query, a decode step: the roofline).
AMD's 16-bit and FP8 GEMMs, never timed, take a curve of the same form fitted on AMD's FP32
matrix-core GEMMs in NeuSight's MI100 and MI210 rows (CDNA_GEMM, benchmarks/cdna_matrix_fit.py).
The curve gives a kernel's own time. The tile predictor adds its dispatch floor
(kit.workload.kernel_times.isolation_floor_ms), so its isolated latencies stay comparable with its
other classes', and a whole model takes the floor out again.
"""
from __future__ import annotations

import numpy as np

from kit.ops import DTYPE_BYTES, MAX_ALIGN_ELEMS

# benchmarks/tensor_core_fit.py's output, as printed ("fits" -> dtype -> "fit")
_BF16 = {"a": 1.0904, "beta": 0.9112, "c0_us": 2.871, "eff_max": 0.7716, "band_log": [-0.1323, 0.1583], "band_log_short": [-0.2144, 0.304]}
_TF32 = {"a": 1.1882, "beta": 0.8562, "c0_us": 3.875, "eff_max": 0.6511, "band_log": [-0.2567, 0.3075], "band_log_short": [-0.343, 0.3178]}
TENSOR_CORE_GEMM = {"hopper": {"bf16": _BF16, "fp16": _BF16, "tf32": _TF32}}
# fused attention's forward (cuDNN's sm90 flash kernels, what torch's SDPA ran on the H200),
# fitted on the even rows of the attention sweep (benchmarks/attention_sweep.py: prefill and training
# shapes, 128..8192 queries over as many keys), also used for fp16
_ATTENTION = {"a": 1.6979, "beta": 1.014, "c0_us": 5.281, "eff_max": 0.6374, "causal_factor": 1.2361, "small_head_factor": 1.2206, "band_log": [-0.097, 0.2395], "band_log_short": [-0.2394, 0.2797]}
FUSED_ATTENTION = {"hopper": {"bf16": _ATTENTION, "fp16": _ATTENTION}}
# Every other GPU and dtype has no measured attention kernel here. There the same curve is carried
# over as a share of that GPU's own peak for the dtype (kit.predict.roofline), which is what the
# wave model's bare roofline (100% of the peak, no launch cost) had stood for. The H200's curve
# sits at 0.59-0.64 of the peak for large shapes; FlashAttention-2's forward reaches "50-73% of the
# theoretical maximum FLOPs/s on A100" (T. Dao, "FlashAttention-2: Faster Attention with Better
# Parallelism and Work Partitioning", ICLR 2024, abstract), the range the carried curve falls in.
# The band widens by CARRIED_SIGMA_LOG in quadrature: half that range's width in log terms
# (ln(0.73 / 0.50) / 2 = 0.19), rounded up, for a GPU, kernel library and dtype never measured.
CARRIED_SIGMA_LOG = 0.25


def _carried(params: dict, source: str) -> dict:
    wide = {k: [-float(np.hypot(lo, CARRIED_SIGMA_LOG)), float(np.hypot(hi, CARRIED_SIGMA_LOG))]
            for k, (lo, hi) in ((k, params[k]) for k in ("band_log", "band_log_short"))}
    return {**params, **wide, "carried_from": source}


CARRIED_ATTENTION = _carried(_ATTENTION, "h200 bf16 attention")


# NVIDIA architectures with tensor cores, where cuBLAS runs 16-bit (and, from Ampere, TF32) GEMMs
# on them. Off Hopper no tensor-core GEMM has been timed here; there the H200's curve is carried
# over as a share of the GPU's own peak, its band widened (CARRIED_GEMM), as for attention. The
# tile-MLP it replaces there had learned its utilisation from FP32 SIMT kernels, and on Hopper,
# where tensor-core kernels were measured, that utilisation was 46% off (module doc); off Hopper
# it put large GEMMs at 91-98% of the tensor peak (A100, V100), a 64-tile 1024^3 GEMM on an A100's
# 108 SMs at 91% in the stream, and a 2x2x2 one 8x faster than a 1x1x1 one.
TENSOR_CORE_ARCHS = ("volta", "turing", "ampere", "ada", "hopper", "blackwell")
# each dtype from the curve fitted for it (fp16 took bf16's there too)
CARRIED_GEMM = {dtype: _carried(params, "h200 " + ("tf32" if dtype == "tf32" else "bf16"))
                for dtype, params in TENSOR_CORE_GEMM["hopper"].items()}
# FP8 GEMMs (Ada, Hopper and Blackwell tensor cores: the GPUs with an fp8 peak) take the bf16 curve
# carried over as a share of the fp8 peak, as other architectures take it: no FP8 kernel has been
# timed here. The tile-MLP had priced them alone: no dispatch floor (a 1x1x1 FP8 GEMM on an H100 at
# 0.7 us, a bf16 one at 16 us), a GEMV split 128 ways at 30x its roofline, and 84% of the H100's
# fp8 peak for 8192^3.
FP8_ARCHS = ("ada", "hopper", "blackwell")
CARRIED_GEMM["fp8"] = _carried(_BF16, "h200 bf16")


# AMD's matrix cores (CDNA: MI100, MI200, MI300). No AMD 16-bit or FP8 GEMM has been timed here;
# the tile-MLP had put an MI300X's bf16 GEMMs under 2,048 rows at 1-6% of their roofline, faster
# with more rows. They take the curve of the AMD matrix-core kernels that were measured, rocBLAS's
# FP32 MFMA GEMMs in NeuSight's MI100 and MI210 Linear rows, fitted by
# benchmarks/cdna_matrix_fit.py (their dispatch floor and the bias copy each row also ran taken
# out; c0, which rows of 10 us and more do not tell apart, is the H200 bf16 curve's), carried as a
# share of the GPU's peak for the dtype, band widened. Fitted on one of the two GPUs, it scored
# the other's FP32 Linear rows at 16.8-21.5% MAPE (the tile-MLP 14.1-14.9%) and their bmm rows at
# 24.7-32.9% (tile-MLP 32.0-45.0%). FP32 GEMMs on CDNA stay the tile-MLP's.
_CDNA = {"a": 1.4373, "beta": 1.0802, "c0_us": 2.871, "eff_max": 0.6269, "band_log": [-0.2806, 0.4318], "band_log_short": [-0.2806, 0.4318]}
# Any alignment, an assumption: no AMD 16-bit GEMM aligned to 2 or 4 bytes was timed. In those FP32
# rows the 207 on each GPU whose leading dimensions were only 8-byte aligned (2 elements) ran as
# its 833 32-byte aligned ones did (median log residual -0.11 against -0.07 on the MI100, -0.05
# against -0.06 on the MI210), and the tile-MLP had made unaligned ones faster with more rows
# (1001 x 768 weights: 90 us at 64 rows, 67 us at 2,048). NVIDIA's unaligned penalty
# (kit.predict.features.unaligned_peak_share) is cuBLAS's legacy kernels, measured on the H200.
# Not GEMVs either: it was fitted on GEMMs of 10 us and more, and rocBLAS runs m or n of 1 on its
# gemv kernels, which kit.predict.gemv's stream prices ("covers_gemv").
CDNA_GEMM = {dtype: {**_carried(_CDNA, "amd fp32 matrix-core"), "any_alignment": True, "covers_gemv": False}
             for dtype in ("bf16", "fp16", "fp8")}


def params_for(gpu, dtype: str) -> dict | None:
    """The curve for GEMMs of `dtype` on `gpu`: measured (TENSOR_CORE_GEMM), carried from the
    H200 (CARRIED_GEMM, marked "carried_from") on NVIDIA's other tensor-core architectures,
    carried from AMD's FP32 matrix-core GEMMs (CDNA_GEMM) for 16-bit and FP8 on AMD's (any "cdna"
    arch, a GPU file's CDNA 4 too; a GPU without FP8 refuses it before), or None (the tile-MLP's:
    FP32, TF32 on AMD, FP8 off FP8_ARCHS)."""
    arch = getattr(gpu, "arch", None)
    measured = TENSOR_CORE_GEMM.get(arch, {}).get(dtype)
    if measured is None and getattr(gpu, "vendor", None) == "amd" and str(arch).startswith("cdna"):
        return CDNA_GEMM.get(dtype)
    if measured is not None or getattr(gpu, "vendor", None) != "nvidia" or arch not in TENSOR_CORE_ARCHS:
        return measured
    if dtype == "fp8" and arch not in FP8_ARCHS:
        return None
    return CARRIED_GEMM.get(dtype)


def attention_params_for(gpu, dtype: str) -> dict:
    """The forward curve of fused attention in `dtype` on `gpu`: measured (FUSED_ATTENTION), else
    the H200's carried over with a wider band (CARRIED_ATTENTION, marked "carried_from")."""
    return FUSED_ATTENTION.get(getattr(gpu, "arch", None), {}).get(dtype) or CARRIED_ATTENTION


def applies(gpu, dtype: str, align) -> np.ndarray:
    """Which GEMMs (by their leading alignment in elements) take the curve on gpu: a fitted
    dtype whose leading dimensions are 16-byte aligned (AMD's curve: any). FP8 at the most alignment the kit
    tracks (MAX_ALIGN_ELEMS: 8 bytes of it): cuBLASLt's FP8 kernels take only 16-byte aligned
    operands (torch._scaled_mm refuses others), so an FP8 GEMM that runs at all is aligned."""
    align = np.asarray(align, dtype=float)
    params = params_for(gpu, dtype)
    if params is None:
        return np.zeros(align.shape, dtype=bool)
    if params.get("any_alignment"):  # AMD's (CDNA_GEMM)
        return np.ones(align.shape, dtype=bool)
    return (align * DTYPE_BYTES[dtype] >= 16) | (align >= MAX_ALIGN_ELEMS)


SHORT_MS = 0.02  # kernels the curve puts under 20 us take their own, wider band (band_log_short)


def curve_gemm(gpu, op) -> bool:
    """Whether a kit Gemm takes the measured curve on gpu (Hopper, a fitted dtype, aligned)."""
    return bool(applies(gpu, op.dtype, [op.lead_align])[0])


# the fitted attention shapes were prefills and training steps: 128..8192 queries over as many
# keys (benchmarks/attention_sweep.py). A decode step's attention (one query over a longer cache)
# is memory-bound and ran other kernels (sm80_flash_fprop); it keeps its roofline in the stream
# (plus one kernel's start, kit.workload.kernel_times.KERNEL_MIN_US).
# Under this many queries an attention takes a blend of the two (TilePredictor._fused_attention).
ATTENTION_MIN_SEQ_Q = 128


def curve_attention(gpu, op) -> bool:
    """Whether a kit op is a fused attention that takes the whole curve on gpu (measured or
    carried: attention_params_for): ATTENTION_MIN_SEQ_Q queries or more. Fewer take a blend of
    the curve and the roofline."""
    from kit.ops import Attention

    return isinstance(op, Attention) and op.seq_q >= ATTENTION_MIN_SEQ_Q


def attention_curve_weight(seq_q) -> np.ndarray:
    """The weight of the curve against the roofline in an attention's log-linear blend:
    log2(queries) / log2(ATTENTION_MIN_SEQ_Q), 0 for one query, 1 from ATTENTION_MIN_SEQ_Q on
    (TilePredictor._fused_attention prices by it; kit.workload.carried counts that share)."""
    q = np.maximum(np.asarray(seq_q, dtype=float), 1.0)
    return np.minimum(1.0, np.log2(q) / np.log2(ATTENTION_MIN_SEQ_Q))


def kernel_ms_of(roofline_ms, params: dict, causal=None, small_head=None, causal_scale=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(kernel time, p10, p90) in ms from roofline times, by the curve in the module doc; for
    attention, `causal` and `small_head` (head size under 128) scale the curve by the params'
    causal_factor and small_head_factor; `causal_scale`, each op's multiplier in place of
    `causal` (ops.Attention.causal_scale: a sliding window's band takes the factor on its
    causal triangle alone)."""
    r = np.asarray(roofline_ms, dtype=float)
    t = np.maximum(params["a"] * r ** params["beta"], r / params["eff_max"])
    if causal_scale is not None:
        t = t * np.asarray(causal_scale, dtype=float)
    elif causal is not None:
        t = t * np.where(np.asarray(causal, dtype=bool), params.get("causal_factor", 1.0), 1.0)
    if small_head is not None:
        t = t * np.where(np.asarray(small_head, dtype=bool), params.get("small_head_factor", 1.0), 1.0)
    t = t + params["c0_us"] / 1e3
    short = t < SHORT_MS
    lo, hi = (np.where(short, s, b) for s, b in zip(params.get("band_log_short", params["band_log"]),
                                                     params["band_log"]))
    return t, np.maximum(t * np.exp(lo), r), t * np.exp(hi)
