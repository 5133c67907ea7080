"""More groups over the same channels are never predicted slower than fewer (an audit's finding).

A conv of G groups can always run as the conv of G / p groups does: as d super-groups (a
block-diagonal weight, zeros multiplied too) for any divisor d of G / p, which divides G as well.
kit.workload.mapping_vision.grouped_ways had listed [groups, the ladder of super-groups filling a
32-wide tile, 1] for narrow groups, so 16 groups of 12 channels could not run as the 8
super-groups of 24 that 8 groups run as: on a P100, fp32, 32x192x56x56, 3x3, 16 groups came out
2.99 ms against 1.73 ms for 8 (1.76x in fp16, 1.24x the backward; 768 channels at 14x14, 64
against 32 groups: 1.57x). No expected times here: each prediction is compared with another one.
"""
import functools
import math

import pytest
import torch
import torch.nn as nn

from kit.hardware import get_gpu
from kit.predict import get_predictor
from kit.workload.capture import capture
from kit.workload.iteration import isolated_latencies, iteration
from kit.workload.kernels import Cheapest, Derived
from kit.ops import Gemm
from kit.workload.mapping_vision import grouped_ways

torch.set_num_threads(1)
TORCH = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
TOL = 1 + 1e-9  # a deterministic predictor: the same op, the same time


def _divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


@functools.lru_cache(maxsize=None)
def _graph(c, groups, n, h, dtype, kernel=3):
    """A 1x1 conv in front (so the conv under test needs its input gradient), then the conv:
    c -> c channels, `groups` groups, stride 1, same padding."""
    model = nn.Sequential(nn.Conv2d(c, c, 1, bias=False),
                          nn.Conv2d(c, c, kernel, 1, kernel // 2, groups=groups, bias=False))
    return capture(model.to(TORCH[dtype]), (torch.zeros(n, c, h, h, dtype=TORCH[dtype]),), mode="train")


def _nodes(graph):
    """(forward, backward) nodes of the conv under test (module "1")."""
    fwd = [k for k in graph.kernels() if k.module == "1" and k.name() == "convolution"]
    bwd = [k for k in graph.kernels() if k.module == "1" and k.name() == "convolution_backward"]
    assert len(fwd) == len(bwd) == 1
    return fwd[0], bwd[0]


def _isolated_ms(c, groups, n, h, dtype, gpu):
    """(forward, backward) isolated times of the conv under test, by the tile predictor."""
    fwd, bwd = _nodes(_graph(c, groups, n, h, dtype))
    t = isolated_latencies([fwd.op, bwd.op], gpu, get_predictor("tile"))[:, 0]
    return float(t[0]), float(t[1])


def _assert_monotone(times, label):
    """times: {groups: (fwd, bwd)}; for every pair G' | G: G's time <= G''s, fwd and bwd alike."""
    for g in times:
        for fewer in times:
            if fewer < g and g % fewer == 0:
                for i, phase in enumerate(("fwd", "bwd")):
                    assert times[g][i] <= times[fewer][i] * TOL, (
                        f"{label} {phase}: {g} groups {times[g][i]:.4f} ms > {fewer} groups "
                        f"{times[fewer][i]:.4f} ms", times)


# -- the audit's examples ------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
@pytest.mark.parametrize("c, h, fewer, more", [(192, 56, 8, 16), (768, 14, 32, 64)])
def test_the_audits_examples_more_groups_are_not_slower(dtype, c, h, fewer, more):
    gpu = "p100-sxm2-16gb"
    f0, b0 = _isolated_ms(c, fewer, 32, h, dtype, gpu)
    f1, b1 = _isolated_ms(c, more, 32, h, dtype, gpu)
    assert f1 <= f0 * TOL, (f0, f1)
    assert b1 <= b0 * TOL, (b0, b1)


def test_the_audits_example_in_the_stream():
    """The whole-model path (iteration's timeline, in-stream corrections and all) agrees."""
    def in_stream(groups):
        tl = iteration(_graph(192, groups, 32, 56, "fp32"), get_gpu("p100-sxm2-16gb")).timeline
        mine = tl[tl.module == "1"]
        return mine[mine.phase == "fwd"].latency_ms.sum(), mine[mine.phase == "bwd"].latency_ms.sum()
    _assert_monotone({g: in_stream(g) for g in (4, 8, 16, 32)}, "p100 fp32 192ch in-stream")


# -- the ladder: channel counts, GPUs, dtypes, forward and backward ------------------------------
SHAPES = [  # (channels, H = W, batch, group counts: narrow and wide, powers of two and not)
    (192, 56, 32, (1, 2, 4, 8, 16, 32, 64, 192)),
    (768, 14, 32, (1, 8, 16, 32, 64, 128, 768)),
    (256, 28, 32, (1, 2, 4, 8, 16, 32, 64, 128, 256)),
    (96, 28, 32, (1, 2, 3, 4, 6, 8, 12, 24, 48, 96)),
    (384, 14, 64, (1, 3, 6, 12, 24, 48, 96, 384)),
]
GPUS = [("p100-sxm2-16gb", "fp32"), ("p100-sxm2-16gb", "fp16"), ("v100-sxm2-32gb", "fp16"),
        ("t4", "fp32"), ("a100-sxm4-80gb", "fp32"), ("a100-sxm4-80gb", "bf16"), ("h100-sxm", "bf16")]


@pytest.mark.parametrize("gpu, dtype", GPUS)
@pytest.mark.parametrize("c, h, n, group_counts", SHAPES)
def test_more_groups_of_the_same_channels_are_never_slower(gpu, dtype, c, h, n, group_counts):
    times = {g: _isolated_ms(c, g, n, h, dtype, gpu) for g in group_counts}
    _assert_monotone(times, f"{gpu} {dtype} {c}ch {h}x{h}")


# -- why: every way open to fewer groups is open to more -----------------------------------------
@pytest.mark.parametrize("c_in, c_out", [(192, 192), (768, 768), (96, 96), (128, 256), (384, 384)])
def test_the_ways_of_fewer_groups_are_ways_of_more(c_in, c_out):
    for g in _divisors(math.gcd(c_in, c_out)):
        counts, direct = grouped_ways(c_in, c_out, g)
        assert counts[0] == g and counts[-1] == 1 and len(set(counts)) == len(counts)
        assert all(g % d == 0 for d in counts)
        for fewer in _divisors(g):
            fewer_counts, fewer_direct = grouped_ways(c_in, c_out, fewer)
            assert set(fewer_counts) <= set(counts), (g, counts, fewer, fewer_counts)
            assert direct or not fewer_direct, (g, fewer)


def test_a_super_group_gemm_is_the_same_op_whatever_the_groups_it_came_from():
    """So its time is too: 8 super-groups of 24 channels, from 8 or from 16 groups of 192."""
    c, n, h = 192, 4, 14
    gemms = {}
    for g in (8, 16, 32, 64):
        fwd, bwd = _nodes(_graph(c, g, n, h, "fp32"))
        fwd_gemms = [o for o in fwd.op.options if isinstance(o, Gemm)]
        assert isinstance(fwd.op, Cheapest) and fwd_gemms[0].b == g  # the per-group GEMM first
        gemms[g] = {o.b: o for o in fwd_gemms}
        bwd_ways = {tuple(p.b for p in o.parts if isinstance(p, Gemm)): o for o in bwd.op.options
                    if isinstance(o, Derived)}
        for fewer in (8, 16, 32):
            if fewer < g:
                assert fewer in gemms[g]  # the fewer groups' own GEMM is a way to run these
                assert (fewer, fewer) in bwd_ways  # and both of its gradients
    for g, mine in gemms.items():
        for other in gemms.values():
            for b in set(mine) & set(other):
                assert mine[b] == other[b]
