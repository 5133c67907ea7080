"""A GEMM's time never falls as its reduction k grows under PAD_K_MAX: it could run zero-padded
to the longer k (kit.predict.gemm_bounds.padded_k). The tile-MLP's own answer had fallen all the
way on a T4 (8192 x 109 fp32: 52.1 us at k = 1, 46.9 at k = 16)."""
import numpy as np
import pytest

from kit.ops import Gemm
from kit.predict import get_predictor
from kit.predict.gemm_bounds import PAD_K_MAX, padded_k


@pytest.mark.parametrize("gpu, n, dtype, align", [("t4", 109, "fp32", None), ("t4", 109, "fp16", 1),
                                                  ("a100-pcie-80gb", 109, "fp32", None), ("l4", 8, "fp32", None)])
def test_time_does_not_fall_with_a_longer_short_reduction(gpu, n, dtype, align):
    ks = list(range(1, PAD_K_MAX + 1))
    lat = get_predictor("tile").predict([Gemm(8192, n, k, dtype=dtype, kind="linear", align=align) for k in ks],
                                        gpu).latency_ms.to_numpy()
    assert np.all(np.diff(lat) >= -1e-12 * lat[1:])


def test_the_ladder_reaches_pad_k_max_from_every_short_k():
    for k in range(1, PAD_K_MAX):
        ladder = padded_k(k)
        assert ladder[-1] == PAD_K_MAX and all(w > k for w in ladder)
    assert padded_k(PAD_K_MAX) == []
