"""The vectorised tile/wave arithmetic agrees with kit.tiling and kit.ops, op by op."""
import numpy as np
import pytest

from kit.hardware import get_gpu
from kit.ops import Elementwise, Gemm, LayerNorm, Softmax, linear
from kit.predict.features import (arrays_from_ops, feature_matrix, feature_names, lib_tile,
                                  waves)
from kit.predict.roofline import roofline
from kit.tiling import TileShape, gemm_tiling_for, vector_tiling

GEMMS = [Gemm(m=96, n=196, k=196, b=192), Gemm(m=4096, n=1024, k=1024), Gemm(m=7, n=3, k=5, b=2),
         linear(2048, 768, 3072), Gemm(m=1000, n=130, k=77, b=3)]
VECTORS = {
    "elementwise": [Elementwise("add", 10**6), Elementwise("gelu", 3 * 2**20),
                    Elementwise("mul", 777, inputs=1)],
    "softmax": [Softmax(4096, 512), Softmax(100, 5000), Softmax(1, 1)],
    "layernorm": [LayerNorm(8192, 1024), LayerNorm(33, 2049)],
}


@pytest.mark.parametrize("gpu", ["t4", "a100-pcie-40gb", "l4"])
def test_gemm_waves_match_kit_tiling(gpu):
    g = get_gpu(gpu)
    a = arrays_from_ops("gemm", GEMMS)
    # library tile 128x64 (cuBLAS m = PyTorch n) with 128 threads: the kit's TileShape(64, 128)
    a.update(lib_tile([128] * len(GEMMS), [64] * len(GEMMS), [128] * len(GEMMS)))
    w = waves("gemm", a, g)
    for i, op in enumerate(GEMMS):
        t = gemm_tiling_for(op, g, TileShape(64, 128, 8, 128))
        assert w["tiles"][i] == t.tiles
        assert w["waves"][i] == t.waves
        assert w["blocks_per_sm"][i] == t.blocks_per_sm
        assert w["last_wave_fill"][i] == pytest.approx(t.last_wave_fill)
        assert w["flops"][i] == op.flops and w["bytes"][i] == op.bytes
        assert w["roofline_ms"][i] == pytest.approx(roofline(op, g).time_ms)
        assert w["base_ms"][i] >= w["roofline_ms"][i]


@pytest.mark.parametrize("cls", sorted(VECTORS))
def test_vector_waves_match_kit_tiling(cls):
    g = get_gpu("v100-pcie-32gb")
    ops = VECTORS[cls]
    w = waves(cls, arrays_from_ops(cls, ops), g, launch=True)
    for i, op in enumerate(ops):
        t = vector_tiling(op, g)
        assert (w["tiles"][i], w["waves"][i], w["blocks_per_sm"][i]) == (t.tiles, t.waves,
                                                                          t.blocks_per_sm)
        assert w["threads"][i] == t.threads_per_block
        assert w["flops"][i] == op.flops and w["bytes"][i] == pytest.approx(op.bytes)
        assert w["roofline_ms"][i] == pytest.approx(roofline(op, g).time_ms)


def test_feature_matrix_has_named_finite_columns():
    g = get_gpu("l4")
    for cls, ops in [("gemm", GEMMS), *VECTORS.items()]:
        a = arrays_from_ops(cls, ops)
        if cls == "gemm":
            a.update(lib_tile([128] * len(ops), [128] * len(ops), [256] * len(ops)))
        x = feature_matrix(cls, a, g)
        assert x.shape == (len(ops), len(feature_names(cls)))
        assert np.isfinite(x).all()


def test_features_differ_between_gpus_only_in_gpu_terms_for_identical_specs():
    # A100 PCIe 40GB and 80GB differ in bandwidth and TDP only: the tile columns that do not
    # involve either are identical
    a = arrays_from_ops("softmax", VECTORS["softmax"])
    x40 = feature_matrix("softmax", a, "a100-pcie-40gb")
    x80 = feature_matrix("softmax", a, "a100-pcie-80gb")
    names = feature_names("softmax")
    same = [names.index(c) for c in ("log_rows", "log_cols", "log_tiles", "log_waves")]
    assert np.array_equal(x40[:, same], x80[:, same])
    assert x40[0, names.index("log_sm_bw_gbs")] < x80[0, names.index("log_sm_bw_gbs")]


def test_power_share_is_the_peak_a_tdp_sustains_at_most_all_of_it():
    from kit.predict.features import GPU_FEATURES, SUSTAINED_TFLOPS_PER_W, gpu_vector, power_share

    col = GPU_FEATURES.index("log_power_share")
    for key in ("a100-pcie-40gb", "a100-pcie-80gb", "t4", "l4", "v100-pcie-32gb", "p100-pcie-16gb"):
        g = get_gpu(key)
        want = min(1.0, SUSTAINED_TFLOPS_PER_W * g.tdp_w / g.fp32_tflops)
        assert power_share(g) == pytest.approx(want)
        assert gpu_vector(g)[col] == pytest.approx(np.log(want))
    # the same chip and peak: the card allowed more watts keeps more of it
    assert power_share("a100-pcie-80gb") > power_share("a100-pcie-40gb")
    # cards with watts to spare look alike, however many spare
    assert power_share("v100-pcie-32gb") == power_share("p100-pcie-16gb") == 1.0
    assert power_share("l4") < power_share("t4") < power_share("a100-pcie-40gb")
