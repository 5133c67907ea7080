"""Grouped and depthwise convolutions (kit.workload.mapping_vision): costed as the per-group
GEMM alone, a depthwise conv came out 10-75x its roofline and slower than the dense conv of
the same shape (an A100, fp32, 32x128x56x56, 3x3: backward 7.1 ms dense, 11.0 ms at 32 groups,
37.4 ms depthwise). Now a narrow grouped conv is the cheapest of its per-group GEMM, the
super-group and dense GEMMs and, for a depthwise conv, a direct kernel streaming its bytes.
The rooflines below are computed by hand: each tensor moved once, the FLOPs of torch's counter."""
import pytest
import torch
import torch.nn as nn

from kit.hardware import get_gpu
from kit.ops import Gemm
from kit.workload.capture import capture
from kit.workload.iteration import iteration
from kit.workload.kernels import Cheapest, Derived
from kit.workload.mapping_vision import grouped_ways
from test_workload_cnn import _reference_flops  # torch's FLOP counter, forward and backward

torch.set_num_threads(1)
BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
TORCH = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _model(c_in, c_out, kernel, groups, stride=1, transposed=False):
    """A 1x1 conv in front, so the conv under test needs its input gradient too."""
    conv = (nn.ConvTranspose2d(c_in, c_out, kernel, stride, (kernel - stride) // 2, groups=groups, bias=False)
            if transposed else nn.Conv2d(c_in, c_out, kernel, stride, kernel // 2, groups=groups, bias=False))
    return nn.Sequential(nn.Conv2d(c_in, c_in, 1, bias=False), conv)


def _graph(groups, c=128, n=32, h=56, kernel=3, stride=1, dtype="fp32"):
    model = _model(c, c, kernel, groups, stride).to(TORCH[dtype])
    return capture(model, (torch.zeros(n, c, h, h, dtype=TORCH[dtype]),), mode="train")


def _times_ms(graph, gpu):
    """(forward, backward) in-stream time of the conv under test (module "1")."""
    tl = iteration(graph, get_gpu(gpu)).timeline
    mine = tl[tl.module == "1"]
    return mine[mine.phase == "fwd"].latency_ms.sum(), mine[mine.phase == "bwd"].latency_ms.sum()


def _nodes(graph):
    fwd = [n for n in graph.kernels() if n.module == "1" and n.name() == "convolution"]
    bwd = [n for n in graph.kernels() if n.module == "1" and n.name() == "convolution_backward"]
    assert len(fwd) == len(bwd) == 1
    return fwd[0], bwd[0]


# -- time: the ladder of groups, the roofline ----------------------------------------------------
@pytest.mark.parametrize("gpu, dtype", [("a100-sxm4-80gb", "fp32"), ("a100-sxm4-80gb", "bf16"),
                                        ("h100-sxm", "fp32"), ("t4", "fp16")])
def test_more_groups_never_take_longer_and_never_longer_than_the_dense_conv(gpu, dtype):
    """3x3, 128 channels, 32x56x56 (the auditor's ladder, and the narrow groups between):
    fewer FLOPs and bytes with every doubling of the groups, so never more time."""
    ladder = [(g, *_times_ms(_graph(g, dtype=dtype), gpu)) for g in (1, 8, 16, 32, 64, 128)]
    for (g0, f0, b0), (g1, f1, b1) in zip(ladder, ladder[1:]):
        assert f1 <= f0 * (1 + 1e-9) and b1 <= b0 * (1 + 1e-9), (gpu, dtype, g0, g1, ladder)
    dense_fwd, dense_bwd = ladder[0][1:]
    for g, f, b in ladder[1:]:
        assert f <= dense_fwd * (1 + 1e-9) and b <= dense_bwd * (1 + 1e-9), (g, ladder)
    # the auditor's A100 numbers: depthwise backward 37.4 ms, 5x the dense conv's 7.1 ms (two
    # implicit GEMMs then; 2.0 ms now that each gradient may run as Winograd)
    if (gpu, dtype) == ("a100-sxm4-80gb", "fp32"):
        assert ladder[-1][2] < dense_bwd / 10


def _roofline_ms(gpu, dtype, n, c, h_out, h_in, kernel, flop_peak=None):
    """One depthwise pass: max(FLOPs / peak, bytes / DRAM bandwidth), each tensor moved once
    (input, output, weight: the forward; grad, weight, dx or grad, x, dw: each gradient)."""
    g = get_gpu(gpu)
    flops = 2 * n * c * h_out * h_out * kernel * kernel
    moved = BYTES[dtype] * (n * c * h_in * h_in + n * c * h_out * h_out + c * kernel * kernel)
    peak = flop_peak or g.peak_flops_per_s(dtype)
    return max(flops / peak, moved / g.mem_bw_bytes_per_s) * 1e3


@pytest.mark.parametrize("gpu", ["a100-sxm4-80gb", "h100-sxm", "v100-sxm2-32gb", "t4", "mi300x"])
@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
@pytest.mark.parametrize("n, c, h, stride", [(32, 128, 56, 1), (64, 144, 112, 2)])
def test_a_depthwise_conv_is_near_its_roofline_and_never_under_it(gpu, dtype, n, c, h, stride):
    fwd, bwd = _times_ms(_graph(c, c=c, n=n, h=h, stride=stride, dtype=dtype), gpu)
    roof = _roofline_ms(gpu, dtype, n, c, h // stride, h, 3)
    launch_ms = 2e-3  # the shortest kernel in the stream (kit.workload.iteration.KERNEL_MIN_US)
    assert roof * (1 - 1e-6) <= fwd <= 2 * roof + launch_ms, (fwd, roof)
    # the backward: the input gradient and the weight gradient, each a pass over as many bytes
    assert 2 * roof * (1 - 1e-6) <= bwd <= 2 * (2 * roof + launch_ms), (bwd, roof)
    assert 1.5 <= bwd / fwd <= 3.0


@pytest.mark.parametrize("gpu", ["a100-sxm4-80gb", "b200"])
def test_a_7x7_depthwise_conv_is_not_costed_under_its_fp32_flops(gpu):
    """ConvNeXt's 7x7 depthwise conv does 12 FLOPs per byte in fp32, above the FP32 ridge of
    these two (9.4-9.6 FLOPs/byte): the direct kernel computes on the CUDA cores, so its FLOPs
    at the FP32 peak bound it, in fp32 and in bf16 (computed in fp32 registers) alike."""
    n, c, h = 32, 384, 28
    fp32_peak = get_gpu(gpu).peak_flops_per_s("fp32")
    for dtype in ("fp32", "bf16"):
        fwd, bwd = _times_ms(_graph(c, c=c, n=n, h=h, kernel=7, dtype=dtype), gpu)
        roof = _roofline_ms(gpu, dtype, n, c, h, h, 7, flop_peak=fp32_peak)
        assert roof * (1 - 1e-6) <= fwd <= 2 * roof, (dtype, fwd, roof)
        assert 2 * roof * (1 - 1e-6) <= bwd <= 4 * roof, (dtype, bwd, roof)


def test_a_depthwise_conv_in_bf16_is_about_half_its_fp32_time():
    """Memory-bound: half the bytes, about half the time (the per-group GEMM put bf16 on tensor
    cores and fp32 on padded SIMT tiles: a MobileNetV2 came out 9.4x faster in bf16)."""
    fp32 = _times_ms(_graph(128, dtype="fp32"), "a100-sxm4-80gb")
    bf16 = _times_ms(_graph(128, dtype="bf16"), "a100-sxm4-80gb")
    for t32, t16 in zip(fp32, bf16):
        assert 1.5 <= t32 / t16 <= 2.5, (fp32, bf16)


# -- what is reported stays: FLOPs, the dense conv -----------------------------------------------
@pytest.mark.parametrize("c_in, c_out, kernel, groups, stride, transposed", [
    (32, 32, 3, 32, 1, False),    # depthwise
    (32, 32, 3, 32, 2, False),    # depthwise, strided
    (32, 64, 3, 32, 1, False),    # depthwise with a channel multiplier of 2
    (32, 32, 5, 8, 1, False),     # 4 channels a group
    (64, 64, 3, 4, 1, False),     # 16 channels a group: super-groups and the dense conv, no direct
    (32, 32, 4, 32, 2, True),     # transposed depthwise
])
def test_flops_stay_torchs_and_every_way_computes_the_same_conv(c_in, c_out, kernel, groups, stride,
                                                                transposed):
    shape = (2, c_in, 16, 16)
    model = _model(c_in, c_out, kernel, groups, stride, transposed)
    ref = _reference_flops(_model(c_in, c_out, kernel, groups, stride, transposed).to("meta")[1], shape)
    fwd, bwd = _nodes(capture(model, (torch.zeros(shape),), mode="train"))
    assert fwd.op.flops == ref["convolution"]
    # the backward does the forward's multiply-adds twice (dx and dw). torch's counter is no
    # reference here: its weight-gradient formula leaves out the groups (groups x too many).
    # A strided conv's dx is its stride phases' GEMMs (test_strided_dgrad.py): exact too.
    assert bwd.op.flops == 2 * ref["convolution"]
    assert ref["convolution_backward"] == pytest.approx(ref["convolution"] * (1 + groups), rel=0.06)
    assert bwd.kernels == 2
    assert isinstance(fwd.op, Cheapest) and isinstance(bwd.op, Cheapest)
    nominal = fwd.op.options[0]
    assert isinstance(nominal, Gemm) and nominal.b == groups  # reported: the per-group GEMM
    gemms = [o for o in fwd.op.options if isinstance(o, Gemm)]
    # a super-group or dense GEMM multiplies the block-diagonal weight's zeros too: b' groups
    # of it do groups / b' times the per-group FLOPs
    assert all(g.flops * g.b == nominal.flops * groups for g in gemms[1:]), gemms
    assert any(g.b == 1 for g in gemms)  # the dense conv bounds it
    direct = [o for o in fwd.op.options if isinstance(o, Derived) and "direct" in o.label]
    counts, has_direct = grouped_ways(c_in, c_out, groups)
    assert bool(direct) == has_direct == (groups != 4)


def test_a_depthwise_convs_direct_kernel_moves_each_tensor_once():
    n, c, h = 2, 32, 16
    fwd, bwd = _nodes(capture(_model(c, c, 3, c), (torch.zeros(n, c, h, h),), mode="train"))
    x = y = n * c * h * h * 4
    w = c * 9 * 4
    direct = [o for o in fwd.op.options if isinstance(o, Derived) and "direct" in o.label]
    assert len(direct) == 1 and direct[0].bytes == pytest.approx(x + w + y, abs=8)
    assert direct[0].flops == 0  # a stream; the node reports the per-group GEMM's FLOPs
    # the backward's all-direct way: dx (grad, w; dx) and dw (grad, x; dw), as two kernels
    streams = [o for o in bwd.op.options
               if all(isinstance(p, Derived) and "direct" in p.label for p in o.parts)]
    assert len(streams) == 1 and len(streams[0].parts) == 2
    assert streams[0].bytes == pytest.approx(2 * (x + w + y), abs=16)


def test_the_dense_conv_keeps_its_gemms_and_bounds_a_wide_grouped_conv():
    """A dense 3x3 conv is its implicit GEMM or Winograd, its backward the two GEMMs (first:
    reported) or Winograd's; at 32+ channels a group the per-group GEMM comes first (reported)
    and the dense conv bounds it."""
    n, h = 2, 16
    fwd, bwd = _nodes(capture(_model(64, 128, 3, 1), (torch.zeros(n, 64, h, h),), mode="train"))
    assert isinstance(fwd.op, Cheapest) and len(fwd.op.options) == 2
    assert fwd.op.options[0] == Gemm(m=n * h * h, n=128, k=64 * 9, b=1, kind="linear", shared_rhs=True)
    assert isinstance(fwd.op.options[1], Derived) and "winograd" in fwd.op.options[1].label
    assert isinstance(bwd.op, Cheapest) and bwd.op.options[0].parts == (
        Gemm(m=n * h * h, n=64, k=128 * 9, b=1, kind="linear", shared_rhs=True),
        Gemm(m=128, n=64 * 9, k=n * h * h, b=1, kind="linear"))
    assert len(bwd.op.options) == 4  # each gradient as its GEMM or as Winograd
    fwd, bwd = _nodes(capture(_model(64, 128, 3, 2), (torch.zeros(n, 64, h, h),), mode="train"))
    assert isinstance(fwd.op, Cheapest)
    assert fwd.op.options[0] == Gemm(m=n * h * h, n=64, k=32 * 9, b=2, kind="linear", shared_rhs=False)
    assert fwd.op.options[1] == Gemm(m=n * h * h, n=128, k=64 * 9, b=1, kind="linear", shared_rhs=True)
    assert fwd.op.flops == fwd.op.options[0].flops  # the per-group GEMM's FLOPs are reported
    assert isinstance(bwd.op, Cheapest) and [p.b for p in bwd.op.options[0].parts] == [2, 2]
    assert grouped_ways(64, 128, 2) == ([2, 1], False)
    # its own groups, then every coarser way as super-groups (a divisor of the groups), down to dense
    assert grouped_ways(128, 128, 32) == ([32, 16, 8, 4, 2, 1], True)
    assert grouped_ways(16, 16, 16) == ([16, 8, 4, 2, 1], True)


def test_a_wide_grouped_convs_weight_gradient_is_never_slower_than_the_dense_ones():
    """8 groups of 32 channels: the per-group weight gradient (a b = 8 GEMM of 32 x 32 outputs
    over N·H·W) had come out 1.4x slower than the dense conv's, which does 8x its FLOPs."""
    from kit.predict import get_predictor
    from kit.workload.iteration import isolated_latencies

    n, c, h = 32, 256, 28
    _, grouped = _nodes(capture(_model(c, c, 1, 8), (torch.zeros(n, c, h, h),), mode="train"))
    _, dense = _nodes(capture(_model(c, c, 1, 1), (torch.zeros(n, c, h, h),), mode="train"))
    tile = get_predictor("tile")

    def ms(op):
        return isolated_latencies([op], "a100-sxm4-80gb", tile)[0, 0]

    per_group = grouped.op.options[0] if isinstance(grouped.op, Cheapest) else grouped.op
    dx, dense_dw = per_group.parts[0], dense.op.parts[1]
    assert per_group.parts[1].b == 8 and dense_dw.b == 1
    assert ms(per_group.parts[1]) > ms(dense_dw)  # the per-group weight gradient alone: slower
    assert ms(grouped.op) <= (ms(dx) + ms(dense_dw)) * (1 + 1e-9)


def test_more_groups_of_a_wide_conv_are_never_slower():
    """Half the FLOPs a group count doubles: 8 groups of 32 channels' backward had come out 12%
    slower than 4 groups of 64 (found by a review); super-groups of 2 and 4 bound it now."""
    from kit.predict import get_predictor
    from kit.workload.iteration import isolated_latencies

    assert grouped_ways(256, 256, 8) == ([8, 4, 2, 1], False)
    tile = get_predictor("tile")
    for n, c, h in ((32, 256, 28), (32, 128, 56)):
        times = []
        for groups in (2, 4, 8, 16):  # across the 32-channel boundary: narrow groups get the ladder too
            fwd, bwd = _nodes(capture(_model(c, c, 3, groups), (torch.zeros(n, c, h, h),), mode="train"))
            times.append(sum(isolated_latencies([node.op], "a100-sxm4-80gb", tile)[0, 0] for node in (fwd, bwd)))
        assert all(b <= a * (1 + 1e-9) for a, b in zip(times, times[1:])), (c, times)
