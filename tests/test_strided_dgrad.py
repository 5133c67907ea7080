"""A strided convolution's input gradient (kit.workload.mapping_vision._dgrad): the libraries
(CUTLASS's strided dgrad, cuDNN's) split it into stride_h x stride_w phases of the input, each
an implicit GEMM with the filter taps that land on it. It had been one GEMM over the input's
pixels with K = Cout/g · kernel · (output / input pixels), rounded: a depthwise 3x3 stride-2
conv's input gradient came out 11% low (K 2.25 -> 2), a depthwise 1x1 stride-2 one 4x high,
1,459 of the 1,568 shapes swept below off (stride 1 too, where padding changes the pixels).
Each input-gradient multiply-add is one of the forward's, so the forward's FLOPs are the
reference: 2·N·P·Q·Cout·Cin/g·kernel."""
import itertools

import pytest
import torch
import torch.nn as nn

from kit.ops import Elementwise, Gemm
from kit.workload.capture import capture
from kit.workload.kernels import Cheapest, Derived, Slowest, leaf_ops
from kit.workload.mapping_vision import conv_backward, dgrad_phases

torch.set_num_threads(1)


def _dx(cin, cout, groups, kernel, stride, padding, dilation, size, n=2, dtype="fp32", width=None):
    """(input-gradient op, the forward's FLOPs) of a 2-d conv over an n x cin x size x width
    (default size + 3) input, from convolution_backward's own arguments (meta tensors)."""
    h, w = size, size + 3 if width is None else width
    p, q = ((d + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1 for d in (h, w))
    x = torch.empty(n, cin, h, w, device="meta")
    wt = torch.empty(cout, cin // groups, kernel, kernel, device="meta")
    grad = torch.empty(n, cout, p, q, device="meta")
    op, _, _ = conv_backward([grad, x, wt, None, [stride] * 2, [padding] * 2, [dilation] * 2, False,
                              [0, 0], groups, [True, False, False]], dtype)
    nominal = op.options[0] if isinstance(op, Cheapest) else op  # a grouped conv's per-group way
    assert isinstance(nominal, Derived) and len(nominal.parts) == 1  # the backward of dx alone
    return nominal.parts[0], 2 * n * p * q * cout * (cin // groups) * kernel * kernel


SWEEP = [c for c in itertools.product((1, 2, 3, 4), (1, 2, 3, 5, 7), (1, 2, 3),
                                      [(1, 1, 1), (32, 32, 32), (16, 32, 4), (12, 20, 1)],
                                      (7, 13, 56), (0, 1, 3))
         if c[5] <= (c[1] - 1) * c[2] and c[4] + 2 * c[5] > (c[1] - 1) * c[2]]


def test_the_input_gradients_flops_are_the_forwards_over_a_sweep():
    """stride 1-4, kernel 1-7, dilation 1-3, dense, grouped and depthwise, odd and even sizes,
    padding 0, 1 and 3: exact."""
    off = []
    for stride, kernel, dilation, (cin, cout, groups), size, padding in SWEEP:
        op, forward = _dx(cin, cout, groups, kernel, stride, padding, dilation, size)
        if op.flops != forward:
            off.append((stride, kernel, dilation, cin, cout, groups, size, padding, op.flops / forward))
    assert len(SWEEP) > 1000 and not off, f"{len(off)} of {len(SWEEP)} off, e.g. {off[:3]}"


@pytest.mark.parametrize("cin, cout, groups, kernel, stride, forward", [
    (32, 32, 32, 3, 2, 903_168),  # depthwise 3x3 stride 2: 802,816 before (K 2.25 -> 2)
    (32, 32, 32, 1, 2, 100_352),  # depthwise 1x1 stride 2: 4x before (K 0.25 -> 1)
    (1, 1, 1, 1, 4, 784),         # one channel, 1x1 stride 4: 16x before
])
def test_depthwise_and_one_channel_strided_input_gradients_do_the_forwards_flops(cin, cout, groups, kernel, stride, forward):
    """2 x cin x 56 x 56, 'same' padding: the forward's FLOPs, 2 · 2 · (56 / stride)^2 · Cout ·
    Cin/g · kernel^2."""
    op, reference = _dx(cin, cout, groups, kernel, stride, kernel // 2, 1, 56, n=2, width=56)
    assert reference == forward == 2 * 2 * (56 // stride) ** 2 * cout * (cin // groups) * kernel ** 2
    assert op.flops == forward


@pytest.mark.parametrize("kernel, stride, dilation", [(3, 2, 1), (7, 2, 1), (5, 3, 1), (3, 2, 2),
                                                      (1, 2, 1), (2, 4, 1), (4, 2, 1)])
def test_each_tap_lands_on_one_phase(kernel, stride, dilation):
    taps, _ = dgrad_phases(kernel, stride, 0, dilation, 28)
    assert sum(taps) == kernel and len(taps) == stride
    if dilation == 1:  # ceil or floor of kernel / stride a phase
        assert set(taps) <= {kernel // stride, -(-kernel // stride)}


def test_a_3x3_stride_2_input_gradient_is_its_four_phases():
    """A dense 64 -> 128 3x3 stride-2 conv on 2 x 56 x 59: phases of 2x2, 2x1, 1x2 and 1x1 taps,
    each over the 2 x 28 x 30 output pixels (CUTLASS's ceil(56 / 2) x ceil(59 / 2) per phase),
    run in one launch (one batched GEMM of 4 taps, scaled to the 9 the phases take); the old single GEMM was 6,608 x 64 x 293
    (K = 128 · 9 · 1,680 / 6,608 = 292.9, rounded: 0.04% more FLOPs than the forward's)."""
    op, forward = _dx(64, 128, 1, 3, 2, 1, 1, 56)
    assert isinstance(op, Slowest) and op.flops == forward
    launch, alone = op.options
    rows = 2 * 28 * 30  # the helper's input is 56 x 59: output 28 x 30
    # one launch: the four phases one batched GEMM at the most taps (4), scaled to 9 of 16
    assert launch.parts == (Gemm(m=rows, n=64, k=128 * 4, b=4, kind="linear"),)
    assert launch.scale == pytest.approx(9 / 16)
    assert [s for _, s in leaf_ops(op)] == [pytest.approx(9 / 16)]  # the nominal way, reported
    # and at least its slowest phase (2x2 taps) alone
    assert alone == Gemm(m=rows, n=64, k=128 * 4, b=1, kind="linear", shared_rhs=True)


def test_a_1x1_stride_2_input_gradient_writes_zeros_where_no_tap_lands():
    """1x1 stride 2: one phase of one tap (a GEMM over the output's pixels, K = Cout), and the
    other three in four of dx's pixels get only zeros written (CUTLASS's epilogue on a phase
    with no filter positions)."""
    op, forward = _dx(64, 128, 1, 1, 2, 0, 1, 28, n=2)
    assert isinstance(op, Derived) and op.flops == forward
    gemm, zeros = op.parts
    assert gemm == Gemm(m=2 * 14 * 16, n=64, k=128, b=1, kind="linear", shared_rhs=True)
    assert isinstance(zeros, Elementwise) and zeros.flops == 0
    dx_bytes = 2 * 64 * 28 * 31 * 4
    assert zeros.bytes == pytest.approx(dx_bytes - 2 * 64 * 14 * 16 * 4, abs=8)


@pytest.mark.parametrize("layer, shape", [
    (nn.Conv1d(8, 16, 5, stride=3, padding=2, bias=False), (2, 8, 37)),
    (nn.Conv2d(24, 24, 5, stride=2, padding=2, groups=24, bias=False), (2, 24, 29, 29)),
    (nn.Conv2d(8, 16, (3, 1), stride=(2, 1), padding=(1, 0), bias=False), (2, 8, 15, 9)),
    (nn.Conv3d(4, 8, 3, stride=2, padding=1, dilation=1, bias=False), (1, 4, 9, 10, 11)),
])
def test_a_captured_strided_conv_backward_does_the_forwards_work_twice(layer, shape):
    """Captured (convolution_backward's arguments as aten gives them), 1-, 2- and 3-d: dx and dw
    each do the forward's multiply-adds, whichever way (per group, dense, direct) it runs."""
    fwd, bwd = _captured(layer, torch.zeros(shape))
    assert bwd.op.flops == 2 * fwd.op.flops
    ways = bwd.op.options if isinstance(bwd.op, Cheapest) else (bwd.op,)
    for way in ways:  # every leaf is a GEMM or a memory-bound stream: nothing lost
        assert all(isinstance(p, (Gemm, Elementwise)) for p, _ in leaf_ops(way))


def _captured(layer, x):
    class Both(nn.Module):  # x needs a gradient: a parameter scales it first
        def __init__(self):
            super().__init__()
            self.s = nn.Parameter(torch.ones(()))
            self.conv = layer

        def forward(self, x):
            return self.conv(x * self.s)

    g = capture(Both(), (x,), mode="train")
    fwd = [n for n in g.kernels() if n.name() == "convolution"]
    bwd = [n for n in g.kernels() if n.name() == "convolution_backward"]
    assert len(fwd) == len(bwd) == 1
    return fwd[0], bwd[0]


@pytest.mark.parametrize("channels, size", [(128, 56), (256, 28), (512, 14)])
@pytest.mark.parametrize("gpu", ["h100-sxm", "a100-sxm4-80gb"])
def test_a_strided_input_gradient_takes_at_least_its_slowest_phase_alone(channels, size, gpu):
    """resnet50's 3x3 stride-2 convs at batch 1: the phases in one launch cannot end before the
    phase of most taps (2x2) would alone. Scaled to 9/16 of a 4-phase batch that fits one wave,
    the launch had come out under it (the 128-channel one on an H100, in the stream: ~17% low)."""
    from types import SimpleNamespace

    from kit.workload.kernel_times import isolated_latencies, predict_latencies

    op, _ = _dx(channels, channels, 1, 3, 2, 1, 1, size, n=1, width=size)
    # the phase of 2x2 taps: the output's pixels of rows, K = Cout · 4
    alone = Gemm(m=(size // 2) ** 2, n=channels, k=4 * channels, b=1, kind="linear", shared_rhs=True)
    both = [SimpleNamespace(op=o, kernels=1) for o in (op, alone)]
    stream = predict_latencies(both, gpu, "auto")[0]
    isolated = isolated_latencies([op, alone], gpu, "auto")[:, 0]
    assert stream[0] >= stream[1] and isolated[0] >= isolated[1]


def test_a_way_is_its_slowest_option_and_a_node_its_fastest_way():
    """A Slowest among a Derived's parts bounds that way only: Cheapest(max(a, b) + c, d) costs
    min(max(a, b) + c, d), on the roofline (time proportional to bytes)."""
    from types import SimpleNamespace

    from kit.ops import copy_of
    from kit.workload.kernel_times import isolated_latencies, predict_latencies
    from kit.workload.kernels import leaf_options, option_ways

    mb = 1 << 20
    a, b, c = copy_of(8 * mb), copy_of(32 * mb), copy_of(16 * mb)
    way = Derived("x", (Slowest("x", (a, b)), c))
    assert len(leaf_options(way)) == 2 and option_ways(way) == [0, 0]

    def ms(op):
        return float(predict_latencies([SimpleNamespace(op=op, kernels=1)], "h100-sxm", "roofline")[0][0])

    assert ms(way) == pytest.approx(ms(b) + ms(c))  # the slower bound, plus c
    for d_mb, expected in ((64, ms(b) + ms(c)), (40, ms(copy_of(40 * mb)))):
        node = Cheapest("x", (way, copy_of(d_mb * mb)))
        assert option_ways(node) == [0, 0, 1]
        assert ms(node) == pytest.approx(expected)
        assert isolated_latencies([node], "h100-sxm", "roofline")[0, 0] == pytest.approx(expected)


@pytest.mark.parametrize("channels, kernel, stride, padding, size", [(96, 3, 3, 1, 30), (128, 2, 2, 0, 56)])
@pytest.mark.parametrize("gpu", ["v100-sxm2-32gb", "a100-sxm4-80gb", "mi210"])
def test_phases_all_of_the_most_taps_are_never_over_their_batched_gemm(channels, kernel, stride, padding, size, gpu):
    """A conv whose stride phases all take the same taps (a 3x3 stride 3, a 2x2 stride 2: 9 and 4
    phases of one tap) runs its input gradient as one batched GEMM of those phases: one phase
    of them cannot take longer than all of them. Bounded by the phase alone (a b=1 GEMM, priced
    on another curve), the 96-channel one had come out 3.4x the batched GEMM on a V100 in the
    stream (27.7 us against 8.1)."""
    from types import SimpleNamespace

    from kit.workload.kernel_times import isolated_latencies, predict_latencies

    op, _ = _dx(channels, channels, 1, kernel, stride, padding, 1, size, n=1, width=size)
    phases = stride * stride
    batched = Gemm(m=(size // stride) ** 2, n=channels, k=channels, b=phases, kind="linear")
    both = [SimpleNamespace(op=o, kernels=1) for o in (op, batched)]
    stream = predict_latencies(both, gpu, "auto")[0]
    isolated = isolated_latencies([op, batched], gpu, "auto")[:, 0]
    assert stream[0] <= stream[1] * (1 + 1e-9) and isolated[0] <= isolated[1] * (1 + 1e-9)
