"""The baselines' own formulas, on small hand-worked examples: Habitat's γ (Yu et al., ATC'21),
Li's bandwidth line to an unseen GPU, tiling's occupancy against the CUDA occupancy calculator."""
from __future__ import annotations

import numpy as np
import pytest

from kit.hardware import get_gpu
from kit.predict.habitat import gamma
from kit.predict.linear_li import LiPredictor


@pytest.mark.parametrize("ratio, want", [(0.0, 1.0), (0.25, 0.875), (0.5, 0.75), (1.0, 0.5),
                                         (2.0, 0.25), (4.0, 0.125)])
def test_habitat_gamma_is_the_papers_piecewise_function(ratio, want):
    # Habitat: γ = -0.5/R · I + 1 below the ridge R, R / (2I) at or above it
    for ridge in (5.0, 60.0):
        assert gamma(ratio * ridge, ridge) == pytest.approx(want)


def test_habitat_gamma_falls_with_intensity_and_weighs_bandwidth_for_memory_bound_ops():
    g = [gamma(i, 10.0) for i in np.linspace(0, 100, 201)]
    assert all(a >= b for a, b in zip(g, g[1:]))
    assert g[0] == 1.0 and gamma(float("inf"), 10.0) == 0.0


def _li(values: dict[str, float]) -> LiPredictor:
    """A Li predictor whose elementwise FLOP term is values[gpu] (its byte and launch terms 1e-3
    and 0.02 ms on every GPU)."""
    return LiPredictor({"elementwise": {g: [v, 1e-3, 0.02] for g, v in values.items()}})


def test_li_line_skips_a_gpu_whose_fit_dropped_the_term():
    # four GPUs give the term 0.03-0.09 ms/GFLOP; the P100's fit dropped it (0). An unseen GPU
    # inside their bandwidth range gets a value among theirs, not one pulled toward log(0)
    li = _li({"p4": 0.03, "t4": 0.06, "p100-pcie-16gb": 0.0, "v100-pcie-32gb": 0.045,
              "a100-pcie-40gb": 0.09})
    for gpu in ("l4", "a10", "v100-pcie-16gb"):
        a = li.coefficients("elementwise", get_gpu(gpu))[0]
        assert 0.03 * 0.8 <= a <= 0.09 * 1.2, (gpu, a)


def test_li_term_most_gpus_dropped_stays_zero_and_kept_terms_follow_bandwidth():
    li = _li({"p4": 0.0, "t4": 0.0, "p100-pcie-16gb": 0.0, "v100-pcie-32gb": 0.05,
              "a100-pcie-40gb": 0.0})
    assert li.coefficients("elementwise", get_gpu("l4"))[0] == 0.0
    # the byte term, equal on every GPU, extrapolates to itself
    assert li.coefficients("elementwise", get_gpu("h100-sxm"))[1] == pytest.approx(1e-3)


@pytest.mark.parametrize("gpu, threads, regs, smem_bytes, want", [
    # the CUDA occupancy calculator, with its 1 KiB of runtime shared memory per block from
    # compute capability 8.0 on: A100 (8.0) 167,936 B per SM / (32,768 + 1,024) = 4 blocks
    ("a100-pcie-40gb", 128, 64, 32 * 1024, 4),
    # L4 (8.9), the 64x32 sgemm tile (2 stages x 96 x 8 x 4 B = 6 KiB): 102,400 / 7,168 = 14
    ("l4", 64, 64, 6 * 1024, 14),
    # H100 (9.0): 233,472 / (48 KiB + 1 KiB) = 4
    ("h100-sxm", 128, 32, 48 * 1024, 4),
    # V100 (7.0) keeps none: 98,304 / 32,768 = 3 exactly
    ("v100-pcie-32gb", 128, 32, 32 * 1024, 3),
    ("t4", 128, 32, 16 * 1024, 4),  # T4 (7.5): 65,536 / 16,384
])
def test_occupancy_counts_the_runtimes_shared_memory_per_block(gpu, threads, regs, smem_bytes, want):
    from kit.tiling import occupancy

    occ = occupancy(get_gpu(gpu), threads, regs, smem_bytes)
    assert (occ.blocks_per_sm, occ.limiter) == (want, "smem")


def test_amd_lds_keeps_no_runtime_reservation():
    from kit.tiling import occupancy

    # an MI250X CU's 64 KiB LDS holds two 32 KiB blocks: the 1 KiB the CUDA runtime keeps per
    # block on sm_80+ is NVIDIA's (cudaDevAttrReservedSharedMemoryPerBlock), not ROCm's
    occ = occupancy(get_gpu("mi250x"), 256, 32, 32 * 1024)
    assert (occ.blocks_per_sm, occ.limiter) == (65536 // (32 * 1024), "smem")


@pytest.mark.parametrize("gpu", ["v100-pcie-32gb", "p100-pcie-16gb", "t4", "a100-pcie-40gb", "mi250x"])
def test_a_block_without_shared_memory_is_not_limited_by_it(gpu):
    from kit.tiling import occupancy

    g = get_gpu(gpu)
    occ = occupancy(g, 32, 32, 0)  # 32-thread blocks: only the block slots bind
    assert occ.blocks_per_sm == g.max_blocks_per_sm and occ.limiter == "blocks"
