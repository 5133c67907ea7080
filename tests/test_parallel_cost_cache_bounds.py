"""kit.parallel.costs caches kernel times across Costers by predictor and GPU spec; a GPU's
predictions are also bounded by the training GPUs it dominates (kit.predict.sibling_bound), so
the key holds their specs too."""
from dataclasses import replace

import numpy as np

from kit.hardware import get_gpu, get_system
from kit.hardware.catalog import register_gpu, unregister_gpu
from kit.ops import Elementwise, Gemm, LayerNorm, Softmax
from kit.parallel import Layout
from kit.parallel.costs import Coster
from kit.predict import get_predictor

OPS = [Gemm(8, 2048, 512, kind="linear", shared_rhs=True), Gemm(8, 2048, 2048, kind="linear", shared_rhs=True),
       Gemm(512, 512, 64, b=16, kind="bmm"), Elementwise("gelu", 1 << 20, "fp32"),
       Softmax(4096, 512, "fp32"), LayerNorm(512, 1024, "fp32")]


def test_a_replaced_training_gpu_is_not_served_from_the_cache_of_the_gpu_it_bounds():
    tile = get_predictor("tile")
    system = get_system("dgx-a100")  # A100-SXM4-40GB: bounded by the A100-PCIe-40GB
    assert system.gpu.key == "a100-sxm4-40gb"
    before = Coster(Layout(dp=8), system, predictor=tile)
    before.predict_ops(OPS)
    old = [before.op_ms(op) for op in OPS]
    try:
        # a slower PCIe card (150 W): still dominated, so still the bound, now a looser one
        register_gpu(replace(get_gpu("a100-pcie-40gb"), tdp_w=150.0))
        fresh = tile.predict(OPS, system.gpu).latency_ms.to_numpy(float)
        after = Coster(Layout(dp=8), get_system("dgx-a100"), predictor=tile)
        after.predict_ops(OPS)
        new = [after.op_ms(op) for op in OPS]
        assert not np.allclose(new, old, rtol=1e-9)  # the bound moved, or this tests nothing
        check = Coster(Layout(dp=8), get_system("dgx-a100"), predictor=tile, in_stream=False)
        check.predict_ops(OPS)
        assert np.allclose([check.op_ms(op) for op in OPS], fresh, rtol=1e-12)
    finally:
        unregister_gpu("a100-pcie-40gb")
