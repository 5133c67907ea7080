"""In-stream costing of a model's kernels: thin GEMMs, the fastest way to run a node, a 3x3
convolution's backward and compiled fusion (each a bound the physics gives, not a fitted value)."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from kit.api import predict_model
from kit.workload.capture import capture
from kit.workload.mapping_vision import winograd_backward
from kit.workload.kernels import Cheapest


@pytest.mark.parametrize("gpu", ["a100-sxm4-80gb", "h100-sxm"])
@pytest.mark.parametrize("rows", [2, 4, 16])
def test_a_thin_gemm_in_a_model_is_never_over_its_rows_of_one_row_kernels(gpu, rows):
    """r rows may run as r back-to-back one-row kernels: in the stream a Linear(256, 1024) of 2
    rows had cost 8.6x its one row (each of the r isolated calls held a dispatch floor)."""
    lin = nn.Linear(256, 1024, bias=False)
    one = predict_model(lin, gpu, mode="inference", inputs=(torch.randn(1, 256),)).kernel_ms
    many = predict_model(lin, gpu, mode="inference", inputs=(torch.randn(rows, 256),)).kernel_ms
    assert many <= rows * one * (1 + 1e-9)


@pytest.mark.parametrize("gpu", ["a100-sxm4-80gb", "a100-pcie-80gb", "v100-sxm2-32gb", "h100-sxm"])
def test_a_conv_never_gets_faster_with_a_bigger_batch(gpu):
    """A 3x3 conv is the Cheapest of its implicit GEMM and Winograd; chosen on isolated times
    (Winograd's four kernels carry four dispatch floors), batch 8 had cost 91 us and batch 16
    42 us on an A100. Chosen in the stream, the time never falls as the batch grows (beyond
    the tile-MLP's wobble between neighbouring shapes: on a V100 at batch 1-2, 5.5%, the
    Winograd bmm of 36 x 64 x 64 x 64 at 14.8 us in the stream against 12.9 us for its 128-row
    twin, one row past the thin-GEMM padding cap's 1-63). On an A100-PCIe-80GB 14.79, 14.56,
    13.71 us at batch 1, 2, 4, its bmm faster at M = 256 than at 128 (33.52 -> 32.67 us) until
    every GEMM was bounded by its twin of twice the rows (gemm_bounds.doubled_rows_ms)."""
    conv = nn.Conv2d(64, 64, 3, padding=1)
    times = [predict_model(conv, gpu, mode="inference", inputs=(torch.randn(b, 64, 32, 32),)).kernel_ms
             for b in (1, 2, 4, 8, 16, 32, 64)]
    assert all(a <= b * 1.06 for a, b in zip(times, times[1:])), times


def _backward_node(model, x):
    g = capture(model, (x,), mode="train")
    return next(n for n in g.nodes if n.aten.startswith("aten.convolution_backward"))


def test_a_plain_3x3_conv_backward_may_run_as_winograd():
    """cuDNN has Winograd algorithms for both gradients; a stride-2 conv (no Winograd forward)
    gets none."""
    x = torch.randn(8, 64, 32, 32)
    # the second conv's backward (the first met): its input needs a gradient too
    node = _backward_node(nn.Sequential(nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(),
                                        nn.Conv2d(64, 64, 3, padding=1)), x)
    assert isinstance(node.op, Cheapest)
    labels = [p.label for o in node.op.options for p in o.parts if hasattr(p, "label")]
    assert any("input gradient" in s for s in labels) and any("weight gradient" in s for s in labels)
    strided = _backward_node(nn.Sequential(nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(),
                                           nn.Conv2d(64, 64, 3, stride=2, padding=1)), x)
    assert not isinstance(strided.op, Cheapest)


def test_winograd_backward_does_the_forward_transforms_multiplies():
    """Each Winograd gradient does what the forward does: F(4x4, 3x3) turns a 3x3 conv's 9
    multiplies an output into 36 per 16 outputs, so 36 / (16 x 9) of the direct FLOPs."""
    n, c, h = 4, 32, 16
    x, w, grad = torch.empty(n, c, h, h, device="meta"), torch.empty(c, c, 3, 3, device="meta"), \
        torch.empty(n, c, h, h, device="meta")
    args = [grad, x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [True, True, False]]
    dx, dw = winograd_backward(args, [True, True, False], "fp32")
    direct = 2 * n * h * h * c * c * 9  # the forward's FLOPs
    for d in (dx, dw):
        gemm = d.parts[0]
        assert gemm.flops == pytest.approx(direct * 36 / (16 * 9))
    assert winograd_backward(args, [True, False, False], "fp32")[1] is None


@pytest.mark.parametrize("gpu", ["t4", "l4", "a100-sxm4-80gb"])
def test_compiled_is_never_slower_than_eager(gpu):
    """A fused chain is one pass over its external bytes, or its members one after another;
    priced as a copy, a bias-gradient sum fused with a gelu_backward had come out 7% over the two
    kernels on a T4."""
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(512, 2048), nn.Linear(2048, 512)

        def forward(self, x):
            return self.b(torch.nn.functional.gelu(self.a(x))) + x

    m, x = Block(), torch.randn(8, 128, 512)
    eager = predict_model(m, gpu, mode="train", inputs=(x,), fusion="eager")
    compiled = predict_model(m, gpu, mode="train", inputs=(x,), fusion="compiled")
    assert compiled.kernel_ms <= eager.kernel_ms * (1 + 1e-9)
