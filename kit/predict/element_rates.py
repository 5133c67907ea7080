"""Elementwise kinds whose speed is set by their elements, not their bytes (NVIDIA; pow on AMD too).

PyTorch computes a 16-bit elementwise op in fp32 registers (its opmath type), so an op whose
per-element work is heavy costs the same per element in bf16 as in fp32: halving the bytes
does not halve the time. On the project's H200 (measurements/h200-2026-12-04, the vector
sweeps' kernel times, rows over 20 us) pow with a general exponent (powf: a log, a multiply and
an exp) never ran faster than 1.30 elements per SM per clock in either dtype, and the erf GELU
2.80 in bf16, where a bf16 add streams at 2.7 and a unary op at 4.0 (fp32 GELU is bound by its
bytes there first). The tile-MLP learned these kinds from FP32 rows, where the bytes bind first
on every training GPU, so in bf16 it had pow 2.4x and GELU 1.7x fast. A prediction of these
kinds is never faster than its elements at that rate, on the GPU's SMs and boost clock. The
rates are the fastest measured (benchmarks/element_rates.py reads them off the sweeps), measured
on one GPU and applied on NVIDIA's only. pow with a cheap exponent (2, 3, 0.5, ...) is mapped to
the cheap kernel PyTorch runs (kit.workload.mapping.POW_FAST) and is not bound here.

AMD's pow runs ROCm's own powf, and has its own rate (CDNA_ELEMS_PER_CU_CLOCK, elements per CU per
clock). NeuSight's AMD rows (PyTorch 2.4.1, fp32, a tensor or a scalar exponent) never ran faster
than 0.428 on the MI100 and 0.418 on the MI210 (medians 0.389 and 0.350; read over the dispatch
floor of the shipped weights, so retrained weights move them: 0.425 and 0.402 before the power
share), about a third of an
NVIDIA SM's rate per clock, where their add and mul stream at their bytes. The tile-MLP had them
1.6x (MI100) and 2.2x (MI210) fast. The kit ships the faster of the two GPUs' fastest rates;
benchmarks/cdna_pow_rate.py reads them, and scores each GPU's fastest rate on the other's rows:
16.3% MAPE on the MI210 from the MI100's rate (geometric bias 1.20: the MI210 runs slower per CU
and clock), 7.2% on the MI100 from the MI210's (16.6% and 4.3% before the power share), against
the tile-MLP's 53.5% and 38.5% before the rate. Carried
to other CDNA GPUs by their CUs and clock (untested there), and to 16-bit as in fp32 (PyTorch
computes it in fp32 registers; not measured on AMD).

Softmax's persistent warp kernel (PyTorch's softmax_warp_forward: one warp per row, the row held
in registers, for rows of up to 2,048 elements) is bound the same way, at a rate that falls as its
rows grow (more registers per thread, fewer warps to hide the loads). On the H200 (the attention
softmax of 24 whole-model inference passes, 0.05-2.9 ms a call, and the vector sweeps' softmax
rows of 20 us or more) it never ran faster than 2.64 elements per SM per clock on rows of 257-512,
1.84 on 513-1,024 and 1.64 on 1,025-2,048, in either dtype (fp32 rows of 512 are bound by their
bytes first and are left out; bf16 rows of 2,048 ran 1.40). The tile-MLP learned softmax from FP32
rows on GPUs whose bytes bind first, and halved the time in bf16: it had the H200's bf16 attention
softmax 2.2-2.5x fast on rows of 1,024 and 2,048 (1.5-1.7x on rows of 512). A row of more than 2,048 (a block per row: another kernel) is bound as a
row of 2,048, as a longer row is never faster; that kernel's own rate is not bound: the H200's
sweep rows of 2,049-4,096 ran at most 1.11, but NeuSight's A100 80GB ran rows that long at 1.23.
On NeuSight's GPUs no softmax row ran faster than its band's rate (the A100 80GB's fastest: 1.34
at 513-1,024, 1.25 at 1,025-2,048), but those rows are fp32 and their bytes bind first there, so
that only checks consistency. An op under the dispatch floor is lifted only by what the bound
exceeds its roofline by, unless the bound exceeds its roofline plus a kernel's start: then to the
bound plus the floor, so the stream keeps it (kit.predict.small_op_bounds).

With few rows no other warp hides a row's latency, and the warp kernel's time is one row's:
on the H200's sweep rows with at most one row per SM (181 rows of 1-2,048 columns, kernel time)
it took 2,534 + 9.45 x cols clocks in bf16 and 2,678 + 5.68 x cols in fp32 (a row of 1,537
bf16 elements: 8.8 us, against 2 us for the kit's smallest kernel; fitted on the even rows, the
line scores the odd ones at 8.7% and 5.5% MAPE). Those rows' kernel times sit under the dispatch
floor a learned predictor carries, so the tile-MLP could not see them: in the stream they came
out at its 2 us minimum, the H200's softmax kernels of 3-20 us 2.3x fast in bf16. A softmax is
never faster than one row's latency (softmax_row_ms; it is a least-squares line, so 8% of the
rows with more rows than SMs ran up to 15% under it), in isolation that plus the dispatch floor
(kit.predict.small_op_bounds, after the one-wave cap). PyTorch 2.1, which kit.tiling describes, ran
the warp kernel on rows up to 1,024 elements and 4 KiB; torch 2.11 on the H200 up to 2,048.
"""
from __future__ import annotations

import numpy as np

ELEMS_PER_SM_CLOCK = {"pow": 1.30, "gelu": 2.80}
# AMD CDNA's, per CU per clock: the fastest of NeuSight's MI100 and MI210 rows (benchmarks/cdna_pow_rate.py)
CDNA_ELEMS_PER_CU_CLOCK = {"pow": 0.428}
# softmax's warp kernel, by the longest row of each band (rows of 256 or fewer: not measured, no bound)
SOFTMAX_ELEMS_PER_SM_CLOCK = {512: 2.64, 1024: 1.84, 2048: 1.64}
SOFTMAX_UNBOUND_COLS = 256
# One row's latency in the warp kernel, in clocks: a + b x cols, by dtype (16-bit: bf16's; fp16
# and bf16 both convert to fp32 registers). benchmarks/element_rates.py fits it (`softmax_row_latency`)
# on the H200's sweep rows with at most one row per SM, where no other warp hides it. See the module doc.
SOFTMAX_ROW_CLOCKS = {"fp32": (2678.0, 5.68), "16bit": (2534.0, 9.45)}
SOFTMAX_WARP_MAX_COLS = 2048  # torch 2.11's warp kernel (a longer row: a block per row, another kernel)
# the dtypes each rate above was read in (any other takes it carried: kit op's source says so)
RATE_DTYPES = {("nvidia", "pow"): ("fp32", "bf16"), ("nvidia", "gelu"): ("bf16",), ("amd", "pow"): ("fp32",)}
SOFTMAX_DTYPES = ("fp32", "bf16")  # the warp kernel's rates and its row latency
SOFTMAX_BF16_ONLY_COLS = 512  # rows up to this: the rate was read in bf16 alone (fp32's bytes bind first)


def elements_per_s(gpu, per_sm_clock):
    """A rate in elements per SM per clock, measured on the H200, on gpu's SMs and boost clock
    (0 off NVIDIA). Also the generic elementwise loop's (kit.workload.iteration)."""
    rate = np.asarray(per_sm_clock, dtype=float)
    if getattr(gpu, "vendor", None) != "nvidia":
        return rate * 0.0
    return rate * gpu.sm_count * gpu.boost_clock_mhz * 1e6


def element_bound_ms(kinds, numel, gpu) -> np.ndarray:
    """Per op, the least time its elements take at its kind's rate on the GPU's vendor
    (ELEMS_PER_SM_CLOCK on NVIDIA, CDNA_ELEMS_PER_CU_CLOCK on AMD; 0: no rate for the kind there,
    or another vendor)."""
    if getattr(gpu, "vendor", None) == "amd":
        rate = np.array([CDNA_ELEMS_PER_CU_CLOCK.get(k, 0.0) for k in kinds], dtype=float)
        per_s = rate * gpu.sm_count * gpu.boost_clock_mhz * 1e6
    else:
        per_s = elements_per_s(gpu, [ELEMS_PER_SM_CLOCK.get(k, 0.0) for k in kinds])
    return np.asarray(numel, dtype=float) / np.where(per_s > 0, per_s, np.inf) * 1e3


def softmax_bound_ms(rows, cols, gpu) -> np.ndarray:
    """Per softmax op (rows x cols, over cols), the least time its elements take in the warp
    kernel at its row band's rate (SOFTMAX_ELEMS_PER_SM_CLOCK); a row past the last band counts
    as a row of that band's length. 0 for rows of SOFTMAX_UNBOUND_COLS or fewer, and off NVIDIA."""
    rows, cols = np.asarray(rows, dtype=float), np.asarray(cols, dtype=float)
    bands = sorted(SOFTMAX_ELEMS_PER_SM_CLOCK)
    rate = np.full(cols.shape, SOFTMAX_ELEMS_PER_SM_CLOCK[bands[-1]])
    for top in reversed(bands[:-1]):
        rate = np.where(cols <= top, SOFTMAX_ELEMS_PER_SM_CLOCK[top], rate)
    rate = np.where(cols <= SOFTMAX_UNBOUND_COLS, 0.0, rate)
    per_s = elements_per_s(gpu, rate)
    elems = rows * np.minimum(cols, bands[-1])
    return elems / np.where(per_s > 0, per_s, np.inf) * 1e3


def softmax_row_ms(cols, gpu, dtype: str) -> np.ndarray:
    """Per softmax row length, one row's latency in the warp kernel (SOFTMAX_ROW_CLOCKS at gpu's
    boost clock): what a softmax of that row takes at least, however few its rows. 0 past
    SOFTMAX_WARP_MAX_COLS and off NVIDIA."""
    cols = np.asarray(cols, dtype=float)
    if getattr(gpu, "vendor", None) != "nvidia":
        return cols * 0.0
    a, b = SOFTMAX_ROW_CLOCKS["fp32" if dtype == "fp32" else "16bit"]
    clocks = np.where(cols <= SOFTMAX_WARP_MAX_COLS, a + b * cols, 0.0)
    return clocks / (gpu.boost_clock_mhz * 1e6) * 1e3
