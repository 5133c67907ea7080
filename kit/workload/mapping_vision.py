"""aten op -> kit op for convolutional and vision models: convolutions, batch and group norm,
pooling, upsampling, im2col. kit.workload.mapping.map_op hands these ops here.

* A convolution is an implicit GEMM (cuDNN's and CUTLASS's view): M = N·output pixels,
  N = output channels, K = input channels · kernel pixels (per group). A plain 3x3 stride-1
  one may also run as Winograd F(4x4, 3x3) (`winograd`): it is the Cheapest of the two, and the
  predictor's faster one is what it costs, as cuDNN picks an algorithm.
* A grouped convolution is not costed as its per-group GEMM alone: for narrow groups that GEMM
  is mostly padding on the narrowest tile (a depthwise conv's has n = 1, k = 9 forward and m = 1
  in its weight gradient, and was predicted 10-75x its roofline, slower than the dense conv of
  the same shape). A conv of G groups may run as d super-groups for every divisor d of G (a
  block-diagonal weight, its zeros multiplied too; d = G: per group, d = 1: the dense conv)
  (grouped_ways), so it is the Cheapest of those GEMMs, the dense conv's Winograd and, for a
  depthwise conv or one of at most DIRECT_MAX_CHANNELS channels a group, a direct kernel costed
  as a stream of its bytes (`direct`). Every way open to G / p groups is open to G groups at no
  more cost (the same super-group GEMMs; a direct kernel of fewer weight bytes and FLOPs), so
  for the same channels more groups are never predicted slower than fewer. Forward, input
  gradient and weight gradient each pick their own, as cuDNN finds an algorithm per pass. The
  FLOPs reported stay the per-group GEMM's (torch's counter's).
* Batch norm, group norm, pooling, upsampling and im2col do next to no arithmetic per byte
  (batch norm: ~8 FLOPs per element against 12 bytes, far below any GPU's ridge point), so each
  is a memory-bound kernel (kit.workload.kernels.memory_bound: the learned copy of the bytes it
  moves), counted pass by pass below. Batch norm is not costed as kit.ops.LayerNorm, the
  nearest class by name: LayerNorm's model learned one thread block per row over rows of at most
  a few thousand columns (NeuSight's ln data: H <= 4,100), while batch norm reduces over N·H·W
  (10^5-10^6 elements) per channel with the whole grid; the bytes are what both share.
"""
from __future__ import annotations

from dataclasses import replace
import itertools
import math

from kit.errors import KitError
from kit.ops import Gemm, dtype_bytes
from kit.workload.kernels import Cheapest, Derived, Slowest, copy_of, memory_bound

BATCH_NORM = {"native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_functional",
              "_native_batch_norm_legit_no_training", "cudnn_batch_norm", "miopen_batch_norm",
              "batch_norm"}
BATCH_NORM_BWD = {"native_batch_norm_backward", "cudnn_batch_norm_backward",
                  "miopen_batch_norm_backward", "batch_norm_backward"}
GROUP_NORM = {"native_group_norm"}
GROUP_NORM_BWD = {"native_group_norm_backward"}
POOLING = {"max_pool2d_with_indices", "max_pool3d_with_indices", "max_pool2d", "max_pool1d",
           "avg_pool2d", "avg_pool3d", "avg_pool1d", "_adaptive_avg_pool2d", "_adaptive_avg_pool3d",
           "adaptive_avg_pool1d", "adaptive_max_pool2d", "adaptive_max_pool3d", "adaptive_max_pool1d"}
POOLING_BWD = {"max_pool2d_with_indices_backward", "max_pool3d_with_indices_backward",
               "avg_pool2d_backward", "avg_pool3d_backward", "_adaptive_avg_pool2d_backward",
               "_adaptive_avg_pool3d_backward", "adaptive_max_pool2d_backward",
               "adaptive_max_pool3d_backward"}
UPSAMPLE = {f"{p}upsample_{m}{d}" for p in ("", "_") for m in ("nearest", "nearest_exact", "linear",
                                                            "bilinear", "bicubic", "trilinear")
            for d in ("1d", "2d", "3d", "2d_aa")}
UPSAMPLE_BWD = {name + "_backward" for name in UPSAMPLE}
IM2COL = {"im2col", "col2im"}
CONV = {"convolution", "_convolution", "cudnn_convolution", "convolution_overrideable"}
CONV_BWD = {"convolution_backward", "convolution_backward_overrideable"}
VISION_OPS = (BATCH_NORM | BATCH_NORM_BWD | GROUP_NORM | GROUP_NORM_BWD | POOLING | POOLING_BWD
              | UPSAMPLE | UPSAMPLE_BWD | IM2COL | CONV | CONV_BWD)


def _bytes(*ts) -> int:
    return sum(t.numel() * t.element_size() for t in ts)


def _is_training_bn(packet: str, args) -> bool:
    """native_batch_norm(x, w, b, mean, var, training, ...); the _legit forms say it in the name
    or at args[5]; cudnn/miopen: args[5] as well."""
    if packet == "_native_batch_norm_legit_no_training":
        return False
    if packet == "_native_batch_norm_legit" and len(args) == 6:  # no running stats: (x,w,b,train,m,eps)
        return bool(args[3])
    flag = args[5] if len(args) > 5 else True
    return bool(flag) if isinstance(flag, bool) else True


def _check_not_empty(packet: str, *ts) -> None:
    """A KitError for a convolution over a zero-size tensor (an empty batch, no channels), as a
    Linear of an empty batch is one (Gemm: "m must be a positive whole number"). Its implicit
    GEMM's sizes had been clamped to 1 instead: a conv of no output channels came out 56,448
    FLOPs (a 392 x 1 x 72 GEMM), one of an empty batch 2,304."""
    if any(t.numel() == 0 for t in ts):
        shapes = ", ".join(str(tuple(t.shape)) for t in ts)
        raise KitError(f"{packet}: a convolution of zero-size tensors ({shapes}) has nothing to "
                       "cost; give it a batch and channels of at least 1")


def map_vision(packet: str, args, ins, outs, dtype: str):
    """(kit op, op_class, kernels) for an op in VISION_OPS."""
    if packet in CONV:
        _check_not_empty(packet, args[0], args[1], outs[0])
        return conv_forward(args, outs, dtype), "gemm", 1
    if packet in CONV_BWD:
        _check_not_empty(packet, *args[:3])
        return conv_backward(args, dtype)
    x = args[0]
    if packet in BATCH_NORM:
        # training: one pass reads x for the per-channel mean and variance, a second reads x and
        # writes y (2 kernels); inference: y = x·scale + shift with the running statistics (1)
        train = _is_training_bn(packet, args)
        moved = (3 if train else 2) * _bytes(x) + _bytes(*ins[1:])
        return memory_bound("batchnorm", moved, dtype, label=packet), "batchnorm", 2 if train else 1
    if packet in BATCH_NORM_BWD:
        # dgamma/dbeta reduce over dy and x; dx reads dy and x again and writes dx (2 kernels)
        grad, inp = args[0], args[1]
        return memory_bound("batchnorm", 2 * _bytes(grad, inp) + _bytes(inp), dtype,
                            label=packet), "batchnorm", 2
    if packet in GROUP_NORM:
        # row moments over each (sample, group) read x; the affine pass reads x and writes y
        return memory_bound("groupnorm", 3 * _bytes(x) + _bytes(*ins[1:]), dtype,
                            label=packet), "groupnorm", 2
    if packet in GROUP_NORM_BWD:
        grad, inp = args[0], args[1]
        return memory_bound("groupnorm", 2 * _bytes(grad, inp) + _bytes(inp), dtype,
                            label=packet), "groupnorm", 2
    if packet in POOLING or packet in UPSAMPLE or packet in IM2COL:
        # one pass: read the input (overlapping windows hit the cache), write the output (and
        # int64 argmax indices for max pooling)
        cls = "pooling" if packet in POOLING else "upsample" if packet in UPSAMPLE else "indexing"
        return memory_bound(cls, _bytes(x, *outs), dtype, label=packet), cls, 1
    # POOLING_BWD, UPSAMPLE_BWD: read the output gradient (and the argmax indices), write the
    # input gradient; the forward input passed along is only read for its shape
    indices = [t for t in ins[1:] if not t.is_floating_point()]
    cls = "pooling" if packet in POOLING_BWD else "upsample"
    return memory_bound(cls, _bytes(x, *indices, *outs), dtype, label=packet), cls, 1


# Grouped convolutions. cuDNN and CUTLASS run one in one of a few ways (CUTLASS 2.x names them
# in conv::GroupMode): a GEMM tile within one group (kSingleGroup: the per-group implicit GEMM);
# a tile across several groups when a group has fewer channels than the tile is wide
# (kMultipleGroup: the GEMM of super-groups with a block-diagonal weight, the zeros multiplied
# too); a direct kernel for depthwise ones (kDepthwise; PyTorch's conv_depthwise2d / 3d too: a
# thread an output element, the taps read through the cache, and for the weight gradient a
# block per weight element reducing over N·H·W). And any grouped conv is the dense conv of its
# channels with a block-diagonal weight, so the dense kernels (implicit GEMM, Winograd) bound it.
# Not calibrated: the project has no timed depthwise or grouped kernels (NeuSight's conv rows
# are dense), so the direct kernel is the roofline-like stream below. PyTorch's fp32 weight-
# gradient kernel reads grad and x once per tap through L2 and may well run slower than that.
#
# Which super-groups pay off is left to the predictor: every divisor of the groups is a way (a
# ladder of the groups and of the super-groups that fill a 32-wide tile had left 16 groups of 12
# channels unable to run as 8 super-groups of 24, and predicted them 1.7x slower than 8 groups of
# 24 channels on a P100; found by an audit).
# A depthwise conv (one input channel a group, any channel multiplier), or one of at most this
# many channels a group (ResNeXt-50 32x4d's first two stages: 4 and 8), may run as a direct
# kernel: 8 channels fill a quarter of a 32-wide tile, and a 3x3 one does 2·8·9 = 144 FLOPs per
# output element against ~8 bytes in FP32 (18 FLOPs/byte), within 2x of the lowest FP32 ridge in
# the catalog, where DIRECT_FLOPS_PER_BYTE takes over. Wider groups stay GEMMs.
DIRECT_MAX_CHANNELS = 8
# A direct kernel computes on the CUDA cores in fp32 whatever the storage dtype (PyTorch's opmath
# accumulator), one load per multiply-add. It is costed as a stream of its bytes, or of its FLOPs
# at this many FLOPs a byte where those weigh more (a 7x7 depthwise conv: 12 FLOPs/byte in fp32).
# 8 is under the lowest FP32 ridge in the GPU catalog (B200 9.4, A100-SXM4 9.6 FLOPs/byte), so
# a direct kernel is not costed under its FLOP roofline on any of them (on a GPU of more FLOPs
# per byte, an L4's 101, a 7x7 one comes out up to ~3x its roofline).
DIRECT_FLOPS_PER_BYTE = 8.0


def _groups(args, at: int) -> int:
    return int(args[at]) if len(args) > at else 1


def grouped_ways(cin: int, cout: int, groups: int) -> tuple[list[int], bool]:
    """How a conv of `groups` groups over cin -> cout channels may run: the group counts of its
    GEMMs, its own first (the per-group GEMM, whose FLOPs are reported), then every other
    divisor of `groups`, largest first, down to 1 (the dense conv): d super-groups of
    groups / d groups each, with a block-diagonal weight. And whether a direct kernel applies
    (a depthwise conv, or at most DIRECT_MAX_CHANNELS channels a group in and out). A dense
    conv: ([1], False). The divisors of groups / p are divisors of groups, and a super-group
    GEMM depends only on its own count, so every way to run fewer groups of the same channels
    is a way to run more, at no more cost: more groups are never predicted slower.
    (Earlier ladders, [groups, groups / 2, groups / 4, 1] and, for narrow groups, [groups,
    the super-groups filling a 32-wide tile, 1], missed some: 16 groups of 12 channels could not
    run as the 8 super-groups of 24 that 8 groups run as, and came out 1.7x slower.)"""
    if groups <= 1:
        return [1], False
    cin_g, cout_g = cin // groups, cout // groups
    small = [d for d in range(1, math.isqrt(groups) + 1) if groups % d == 0]
    divisors = sorted({*small, *(groups // d for d in small)}, reverse=True)
    return divisors, cin_g == 1 or max(cin_g, cout_g) <= DIRECT_MAX_CHANNELS


def direct(nbytes: float, flops: float, dtype: str, label: str) -> Derived:
    """A direct (non-GEMM) grouped or depthwise convolution pass: memory-bound, costed as the
    copy of the bytes it moves (each tensor once: the taps' re-reads hit the cache), or of its
    FLOPs / DIRECT_FLOPS_PER_BYTE where that is more. Reports the copy's bytes and no FLOPs;
    the Cheapest it sits in reports the per-group GEMM's (torch's FLOP counter's) FLOPs."""
    return memory_bound("gemm", max(nbytes, flops / DIRECT_FLOPS_PER_BYTE), dtype, label)


def conv_forward(args, outs, dtype: str):
    """The kit op of a convolution's forward: its implicit GEMM, or the Cheapest of that and
    Winograd for a plain 3x3 one. A grouped conv (grouped_ways) is the Cheapest of its
    per-group GEMM (first: its FLOPs and bytes are the ones reported), the super-group GEMMs,
    the dense conv (implicit GEMM or Winograd) and a direct kernel (x, w and y once)."""
    x, y = args[0], outs[0]
    counts, has_direct = grouped_ways(x.shape[1], y.shape[1], _groups(args, 8))
    implicit = conv(args, outs, dtype)
    if len(counts) == 1:
        wino = winograd(args, outs, dtype)
        if wino is None:
            return implicit
        return Cheapest("gemm", (implicit, wino), "convolution (implicit GEMM or Winograd)")
    options = [implicit] + [conv(args, outs, dtype, as_groups=g) for g in counts[1:]]
    wino = winograd(args, outs, dtype, dense=True)
    if wino is not None:
        options.append(wino)
    if has_direct:
        options.append(direct(_bytes(x, args[1], y), implicit.flops, dtype, "direct grouped convolution"))
    return Cheapest("gemm", tuple(options), "grouped convolution (per group, super-group, dense or direct)")


def conv(args, outs, dtype: str, as_groups: int | None = None) -> Gemm:
    """Implicit-GEMM view of a convolution: M = N·out spatial, N = Cout/groups,
    K = Cin/groups · kernel, one GEMM per group. A transposed convolution is the GEMM of its
    gradient-of-input form: M = N·in spatial, N = Cout/groups · kernel, K = Cin/groups.
    as_groups: the same conv run in that many (super-)groups of block-diagonal weights (1: the
    dense conv of its channels); it must divide the conv's groups."""
    x, w = args[0], args[1]
    y = outs[0]
    transposed = bool(args[6]) if len(args) > 6 else False
    groups = as_groups or _groups(args, 8)
    kernel = math.prod(w.shape[2:])
    cin, cout = x.shape[1], y.shape[1]
    if transposed:  # weight (Cin, Cout/groups, *kernel)
        m, n, k = x.shape[0] * math.prod(x.shape[2:]), cout // groups * kernel, cin // groups
    else:  # weight (Cout, Cin/groups, *kernel)
        m, n, k = y.shape[0] * math.prod(y.shape[2:]), cout // groups, cin // groups * kernel
    return Gemm(m=max(1, m), n=max(1, n), k=max(1, k), b=groups, dtype=dtype, kind="linear",
                shared_rhs=groups == 1)


WINOGRAD_TILE = 4  # F(4x4, 3x3): cuDNN's non-fused winogradforwarddata4x4 / filter4x4 kernels


def winograd(args, outs, dtype: str, dense: bool = False) -> Derived | None:
    """Winograd F(4x4, 3x3) for a plain 3x3 stride-1 2-d convolution (None for any other):
    each 6x6 input tile gives a 4x4 output tile with 36 multiplies instead of 144 (Lavin and
    Gray, "Fast Algorithms for Convolutional Neural Networks", CVPR 2016). Four kernels: the
    data and filter transforms, 36 batched GEMMs of (N x tiles) x Cin x Cout, and the output
    transform; the transforms are memory-bound copies of what they read and write.
    dense: a grouped conv run as the dense conv of its channels (a block-diagonal weight).

    NeuSight's conv rows (all 3x3, stride 1) name Winograd kernels in 61-81% of rows per GPU."""
    x, w, y = args[0], args[1], outs[0]
    stride = list(args[3]) if len(args) > 3 else [1, 1]
    dilation = list(args[5]) if len(args) > 5 else [1, 1]
    transposed = bool(args[6]) if len(args) > 6 else False
    groups = _groups(args, 8)
    if (x.dim() != 4 or tuple(w.shape[2:]) != (3, 3) or set(stride) != {1} or set(dilation) != {1}
            or transposed or (groups != 1 and not dense)):
        return None
    n, cin, cout = x.shape[0], x.shape[1], y.shape[1]
    a = WINOGRAD_TILE + 2
    tiles = n * math.ceil(y.shape[2] / WINOGRAD_TILE) * math.ceil(y.shape[3] / WINOGRAD_TILE)
    d = dtype_bytes(dtype)
    parts = (Gemm(m=max(1, tiles), n=max(1, cout), k=max(1, cin), b=a * a, dtype=dtype),
             copy_of(_bytes(x) + a * a * tiles * cin * d, dtype),       # data transform
             copy_of(groups * _bytes(w) + a * a * cout * cin * d, dtype),  # filter transform
             copy_of(a * a * tiles * cout * d + _bytes(y), dtype))      # output transform
    return Derived("gemm", parts, 1.0, "winograd F(4x4, 3x3)")


def winograd_backward(args, mask, dtype: str, dense: bool = False) -> list | None:
    """[input gradient, weight gradient] as Winograd F(4x4, 3x3) (cuDNN's WINOGRAD_NONFUSED
    algorithms for both), for the plain 3x3 stride-1 convolutions whose forward may run so
    (winograd); None for any other. The input gradient is a 3x3 convolution of grad by the
    flipped weight: the forward's four kernels with Cin and Cout swapped, over x's tiles. The
    weight gradient transforms x and grad into the same 6x6 tiles, multiplies them in 36 batched
    GEMMs of Cout x Cin over the tiles, and transforms the 36 products back to 3x3 filters.
    Only the gradients mask asks for (None where not). dense: a grouped conv run as the dense
    conv of its channels (a block-diagonal weight), as its forward may (winograd). Without them
    a 3x3 conv's backward, two implicit GEMMs, had cost 7.5x its Winograd forward for twice the
    multiply-adds."""
    grad, x, w = args[0], args[1], args[2]
    if len(args) < 10:
        return None
    # the input gradient is the forward's Winograd of grad by the weight, into x's shape (its
    # arguments: x, w, bias, stride, padding, dilation, transposed, output padding, groups)
    dx = winograd([grad, w, None, *args[4:10]], [x], dtype, dense)
    if dx is None:  # the forward's conditions
        return None
    n, cin, cout = x.shape[0], x.shape[1], grad.shape[1]
    a, d = WINOGRAD_TILE + 2, dtype_bytes(dtype)
    wb = _groups(args, 9) * _bytes(w)  # the dense weight a block-diagonal one becomes
    out_tiles = n * math.ceil(grad.shape[2] / WINOGRAD_TILE) * math.ceil(grad.shape[3] / WINOGRAD_TILE)
    dx = replace(dx, label="winograd F(4x4, 3x3) input gradient") if mask[0] else None
    dw = None
    if mask[1]:
        dw = Derived("gemm", (Gemm(m=max(1, cout), n=max(1, cin), k=max(1, out_tiles), b=a * a, dtype=dtype),
                              copy_of(_bytes(x) + a * a * out_tiles * cin * d, dtype),   # x transform
                              copy_of(_bytes(grad) + a * a * out_tiles * cout * d, dtype),  # grad transform
                              copy_of(a * a * cout * cin * d + wb, dtype)),             # filter out
                     1.0, "winograd F(4x4, 3x3) weight gradient")
    return [dx, dw]


def _per_dim(args, at: int, dims: int, default: int) -> list[int]:
    """A convolution_backward size argument (stride, padding, dilation) as one int per spatial
    dim (an int or a one-element list stands for all of them)."""
    v = args[at] if len(args) > at and args[at] is not None else default
    v = [int(e) for e in v] if isinstance(v, (list, tuple)) else [int(v)]
    return v * dims if len(v) == 1 else v


def dgrad_phases(kernel: int, stride: int, padding: int, dilation: int, size: int) -> tuple[list[int], int]:
    """Along one spatial dim of a (non-transposed) convolution's input gradient: the filter taps
    of each phase, and the input positions of phases with none. Tap r reaches input
    o·stride − padding + r·dilation, so input i gets only the taps with
    r·dilation ≡ i + padding (mod stride): phase c of stride phases holds the taps with
    r·dilation mod stride = c (ceil or floor of kernel / stride of them at dilation 1), and
    together they hold every tap once."""
    taps = [0] * stride
    for r in range(kernel):
        taps[r * dilation % stride] += 1
    empty = sum(1 for i in range(size) if taps[(i + padding) % stride] == 0)
    return taps, empty


def _dgrad(grad, x, w, groups: int, geometry, dtype: str):
    """A convolution's input gradient as the libraries run it (CUTLASS's strided dgrad,
    ImplicitGemmConvolutionStridedDgrad, and cuDNN's): split into stride_h x stride_w phases of
    the input, each an implicit GEMM with only the filter taps landing on that phase (K =
    Cout/g · its taps), over the output's pixel count of rows (CUTLASS's ceil(H/s)·ceil(W/s)
    per phase for a 'same'-padded conv; at any padding, the rows that carry the forward's
    multiply-adds). The phases run in one launch: one batched GEMM of the most taps a phase
    takes, scaled to the phases' own taps (a 3x3 stride 2: 4 phases at K = 4·Cout/g, x 9/16);
    a phase of no taps (a 1x1 stride-2 conv's three in four) only has its zeros written. The phases' FLOPs sum to the
    forward's exactly. A stride-1 conv is one phase: M = N·pixels, K = Cout/g · kernel.
    One GEMM over the input's pixels with K = Cout/g · kernel · (output / input pixels),
    rounded, had drifted where that ratio is not whole: a depthwise 3x3 stride-2 conv's input
    gradient came out 11% low (K 2.25 -> 2: 802,816 FLOPs for 903,168 at 32 channels, 56x56),
    a depthwise 1x1 stride-2 one 4x high, a one-channel 1x1 stride-4 one 16x (12,544 FLOPs
    for 784)."""
    stride, padding, dilation = geometry
    dims = x.dim() - 2
    rows = grad.shape[0] * (math.prod(grad.shape[2:]) if dims > 0 else 1)
    cin_g, cout_g = x.shape[1] // groups, grad.shape[1] // groups
    per_dim = [dgrad_phases(w.shape[2 + i], stride[i], padding[i], dilation[i], x.shape[2 + i])
               for i in range(dims)]
    phases: dict[int, int] = {}  # taps -> phases with that many
    for combo in itertools.product(*(taps for taps, _ in per_dim)):
        phases[math.prod(combo)] = phases.get(math.prod(combo), 0) + 1
    # one launch, as CUTLASS's grid holds every phase's tiles: the phases as one batched GEMM of
    # the most taps a phase takes, scaled to their own FLOPs. As a GEMM a phase, summed, each
    # paid its own last wave: a 512-channel 3x3 stride-2 dgrad at 14 x 14 and batch 1 came out
    # 86.4 us on an H100 against 32.4 for the old single GEMM (the review's count). Scaled by
    # the share, that launch had come out under its own slowest phase priced alone where the
    # batch fits one wave (the wave's time is the most-taps phase's, not 9/16 of it): resnet50's
    # 512-channel 3x3 stride-2 input gradient at batch 1 on an H100, fp32, in the stream, 24.2 us
    # against 29.3 for its 2x2-tap phase alone (its conv backward node 33.7 -> 38.8 us)
    live = {taps: count for taps, count in phases.items() if taps > 0}
    top, count = max(live), sum(live.values())
    gemm = Gemm(m=max(1, rows), n=max(1, cin_g), k=cout_g * top, b=groups * count, dtype=dtype,
                kind="linear", shared_rhs=groups * count == 1)
    share = sum(taps * c for taps, c in live.items()) / (top * count)
    launch = gemm
    if share < 1:  # and never under its slowest phase alone (a Slowest of the two)
        # only where the share scales it down: phases all of the most taps (a 2x2 or 3x3 conv of
        # its own stride) are the batched GEMM itself, never under one of them, and bounding it by
        # the phase priced alone (a b=1 GEMM, another curve than the batched one) had only taken
        # that curve's floor: a 96-channel 3x3 stride-3 conv backward at batch 1 on a V100, 14.5
        # -> 34.0 us, a 128-channel 2x2 stride-2 one on an A100 27.2 -> 39.7
        launch = Slowest("gemm", (Derived("gemm", (gemm,), share, "phases of fewer taps"),
                                  replace(gemm, b=groups, shared_rhs=groups == 1)),
                         "phases in one launch, at least the slowest phase's time")
    parts = [launch]
    spatial = [x.shape[2 + i] for i in range(dims)]
    zero_pixels = math.prod(spatial) - math.prod(n - empty for n, (_, empty) in zip(spatial, per_dim))
    if zero_pixels:
        parts.append(copy_of(x.shape[0] * x.shape[1] * zero_pixels * dtype_bytes(dtype), dtype))
    if len(parts) == 1:
        return parts[0]
    return Derived("gemm", tuple(parts), 1.0, "input gradient, " + " x ".join(map(str, stride)) + " phases")


def _backward_gemms(grad, x, w, groups: int, transposed: bool, geometry, mask, dtype: str) -> list:
    """[input gradient, weight gradient] GEMMs, each only where mask asks (None where not).
    geometry: (stride, padding, dilation), one int per spatial dim. A transposed conv's input
    gradient is the forward conv of grad, a GEMM over x's pixels with K = Cout/g · kernel."""
    kernel = max(1, math.prod(w.shape[2:]))
    cin_g, cout_g = x.shape[1] // groups, grad.shape[1] // groups
    spatial_x = math.prod(x.shape[2:]) if x.dim() > 2 else 1
    spatial_small = spatial_x if transposed else (math.prod(grad.shape[2:]) if grad.dim() > 2 else 1)
    batch = x.shape[0]
    dx = dw = None
    if mask[0] and transposed:
        dx = Gemm(m=max(1, batch * spatial_x), n=max(1, cin_g), k=max(1, cout_g * kernel), b=groups,
                  dtype=dtype, kind="linear", shared_rhs=groups == 1)
    elif mask[0]:
        dx = _dgrad(grad, x, w, groups, geometry, dtype)
    if mask[1]:
        dw = Gemm(m=max(1, cout_g), n=max(1, cin_g * kernel), k=max(1, batch * spatial_small),
                  b=groups, dtype=dtype, kind="linear")
    return [dx, dw]


def conv_backward(args, dtype: str):
    """convolution_backward(grad, x, w, bias_sizes, stride, padding, dilation, transposed,
    output_padding, groups, output_mask): the gradient-of-input and gradient-of-weight GEMMs
    and the bias gradient (a reduction of grad over N·H·W), each only where output_mask asks
    (the first layer's input needs no gradient). Each GEMM does the forward's multiply-adds:
    N·(pixels of the smaller side)·Cin/g·Cout/g·kernel per group; a strided convolution's input
    gradient is a GEMM per stride phase of the input, each with the taps landing on it (_dgrad).

    A grouped conv (grouped_ways) picks, per gradient, the cheapest of its per-group GEMM,
    the super-group and dense GEMMs and a direct kernel (input gradient: grad and w read, dx
    written; weight gradient: grad and x read, dw written): the Cheapest of every combination,
    the per-group GEMMs first (their FLOPs and bytes are the ones reported)."""
    grad, x, w = args[0], args[1], args[2]
    groups = _groups(args, 9)
    mask = list(args[10]) if len(args) > 10 else [True, True, args[3] is not None]
    transposed = bool(args[7]) if len(args) > 7 else False
    dims = max(0, x.dim() - 2)
    geometry = (_per_dim(args, 4, dims, 1), _per_dim(args, 5, dims, 0), _per_dim(args, 6, dims, 1))
    bias = [copy_of(_bytes(grad), dtype)] if len(mask) > 2 and mask[2] else []
    own = _backward_gemms(grad, x, w, groups, transposed, geometry, mask, dtype)
    parts = [p for p in own if p is not None] + bias
    if not parts:  # nothing asked for: a launch that does nothing, costed as the smallest copy
        parts.append(copy_of(1, dtype))
    counts, has_direct = grouped_ways(x.shape[1], grad.shape[1], groups)
    if len(counts) == 1 or not any(own):
        wino = winograd_backward(args, mask, dtype) if any(own) else None
        if wino is None:
            return Derived("gemm", tuple(parts), 1.0, "convolution backward"), "gemm", len(parts)
        ways = [[g, wg] for g, wg in zip(own, wino) if g is not None]
        options = tuple(Derived("gemm", tuple(pick) + tuple(bias), 1.0, "convolution backward")
                        for pick in itertools.product(*ways))
        return Cheapest("gemm", options, "convolution backward (implicit GEMM or Winograd)"), \
            "gemm", len(parts)
    others = [_backward_gemms(grad, x, w, g, transposed, geometry, mask, dtype) for g in counts[1:]]
    wino = winograd_backward(args, mask, dtype, dense=True) or [None, None]
    ways = []  # per gradient asked for: the per-group GEMM first, then the others
    for i, gemm in enumerate(own):
        if gemm is None:
            continue
        way = [gemm] + [o[i] for o in others] + ([wino[i]] if wino[i] is not None else [])
        if has_direct:  # dx: grad, w read, dx (x's size) written; dw: grad, x read, dw written
            way.append(direct(_bytes(grad, w, x), gemm.flops, dtype,
                              ("input", "weight")[i] + " gradient, direct"))
        ways.append(way)
    options = tuple(Derived("gemm", tuple(pick) + tuple(bias), 1.0, "convolution backward")
                    for pick in itertools.product(*ways))
    label = "grouped convolution backward (per group, super-group, dense or direct)"
    return Cheapest("gemm", options, label), "gemm", len(parts)
