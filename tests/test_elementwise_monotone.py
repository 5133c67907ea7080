"""More elements never make an FP32 elementwise op faster (kit.predict.small_op_bounds: a one-wave
op takes the lowest of its rungs, whole tiles at powers of two from its own up to a full wave; an
op past k full waves is floored at exactly k of them)."""
from __future__ import annotations

import numpy as np
import pytest

from kit.ops import Elementwise
from kit.predict import get_predictor
from kit.predict.small_op_bounds import wave_ladder, wave_rung

SIZES = np.unique(np.round(np.logspace(0, 8, 300)).astype(int))


@pytest.mark.parametrize("gpu", ["v100-sxm2-32gb", "a100-sxm4-80gb", "h100-sxm", "t4", "mi300x", "l4"])
@pytest.mark.parametrize("kind", ["copy", "add", "gelu"])
def test_more_elements_are_never_faster(gpu, kind):
    # a copy of 533 elements had come out 13.6% under one of 512 on a V100, an add of 67 elements
    # 38% under a smaller one on a T4, and the first sizes past a wave under a full wave
    rows = get_predictor("tile").predict([Elementwise(kind, int(n), "fp32") for n in SIZES], gpu)
    lat = rows.latency_ms.to_numpy(float)  # the centre (the band's quantiles may still cross by <1%)
    worst = int(np.argmin(np.diff(lat)))
    assert (np.diff(lat) >= -1e-12).all(), (SIZES[worst], SIZES[worst + 1], lat[worst], lat[worst + 1])
    assert (rows.latency_p10_ms <= rows.latency_ms).all() and (rows.latency_ms <= rows.latency_p90_ms).all()


def test_ops_between_two_powers_of_two_of_tiles_share_their_rungs():
    a, b = Elementwise("copy", 513, "fp32"), Elementwise("copy", 1000, "fp32")  # 2 tiles each
    assert wave_rung("elementwise", a, 2, 320) == wave_rung("elementwise", b, 2, 320) == Elementwise("copy", 1024, "fp32")
    assert wave_ladder("elementwise", a, 2, 320) == wave_ladder("elementwise", b, 2, 320)
    whole = Elementwise("copy", 1024, "fp32")  # its own rung: it keeps its own answer among them
    assert wave_rung("elementwise", whole, 2, 320) == whole and whole not in wave_ladder("elementwise", whole, 2, 320)
