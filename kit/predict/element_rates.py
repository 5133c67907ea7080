"""Elementwise kinds whose speed is set by their elements, not their bytes, on NVIDIA GPUs.

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
on one GPU and applied on NVIDIA's only (AMD's pow runs another library's code). pow with a
cheap exponent (2, 3, 0.5, ...) is mapped to the cheap kernel PyTorch runs
(kit.workload.mapping.POW_FAST) and is not bound here.
"""
from __future__ import annotations

import numpy as np

ELEMS_PER_SM_CLOCK = {"pow": 1.30, "gelu": 2.80}


def elements_per_s(gpu, per_sm_clock):
    """A rate in elements per SM per clock, measured on the H200, on gpu's SMs and boost clock
    (0 off NVIDIA). Also the generic elementwise loop's (kit.workload.iteration)."""
    rate = np.asarray(per_sm_clock, dtype=float)
    if getattr(gpu, "vendor", None) != "nvidia":
        return rate * 0.0
    return rate * gpu.sm_count * gpu.boost_clock_mhz * 1e6


def element_bound_ms(kinds, numel, gpu) -> np.ndarray:
    """Per op, the least time its elements take at its kind's rate (0: no rate for the kind, or
    not an NVIDIA GPU)."""
    per_s = elements_per_s(gpu, [ELEMS_PER_SM_CLOCK.get(k, 0.0) for k in kinds])
    return np.asarray(numel, dtype=float) / np.where(per_s > 0, per_s, np.inf) * 1e3
