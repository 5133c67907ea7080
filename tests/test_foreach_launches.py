"""The kernels an optimizer step's _foreach_* ops and fused optimizers launch: torch's
multi_tensor_apply (aten/src/ATen/native/cuda/MultiTensorApply.cuh) fills a launch with at most
MTA_MAX_BLOCKS chunks of 65,536 elements and MTA_MAX_TENSORS[depth - 1] tensors."""
import math
import random

import pytest
import torch
import torch.nn as nn

from kit.workload.capture import capture_optimizer
from kit.workload.mapping_elementwise import (MTA_CHUNK_ELEMS, MTA_MAX_BLOCKS, MTA_MAX_TENSORS,
                                              MTA_MAX_TENSORS_SCALARLIST, mta_launches)


def _chunks(model) -> int:
    return sum(math.ceil(p.numel() / MTA_CHUNK_ELEMS) for p in model.parameters())


def test_a_step_over_more_chunks_than_a_launch_holds_launches_several_kernels():
    # two Linears of 4,480 and 2,240 chunks (and a bias of one each): no launch takes more than
    # 2,240 chunks, so each foreach op launches at least ceil(6,722 / 2,240) = 4 kernels; counted
    # by its 4 tensors alone it had been 1
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(16384, 17920), nn.Linear(16384, 8960))
    least = math.ceil(_chunks(model) / MTA_MAX_BLOCKS)
    for optimizer in ("adamw", "adamw-fused", "sgd"):
        nodes = [n for n in capture_optimizer(model, optimizer) if not n.free]
        # every op over the parameters (not the fused step's one-element step counts)
        big = [n for n in nodes if n.op.bytes >= sum(p.numel() for p in model.parameters())]
        assert big, optimizer
        assert all(n.kernels >= least for n in big), (optimizer, [(n.aten, n.kernels) for n in big])


def test_deeper_lists_take_fewer_tensors_a_launch():
    # small parameters, so the tensor slots set the launches: 700 of them tell the depths apart
    # (1, 2, 3 launches at 770, 448, 336 tensors; 2 with a scalar list's 672), 300 the fused
    # AdamW's depth 4 (252) from 3 (336)
    def launches(count, optimizer):
        with torch.device("meta"):
            model = nn.ParameterList([nn.Parameter(torch.empty(8)) for _ in range(count)])
        return {n.name(): n.kernels for n in capture_optimizer(model, optimizer) if not n.free}

    foreach, fused = launches(700, "adamw"), launches(300, "adamw-fused")
    want = {"_foreach_mul_": math.ceil(700 / MTA_MAX_TENSORS[0]),
            "_foreach_lerp_": math.ceil(700 / MTA_MAX_TENSORS[1]),  # exp_avg, grad
            "_foreach_addcmul_": math.ceil(700 / MTA_MAX_TENSORS[2]),  # exp_avg_sq, grad, grad
            "_foreach_sqrt": math.ceil(700 / MTA_MAX_TENSORS[1]),  # its output list too
            "_foreach_div_": math.ceil(700 / MTA_MAX_TENSORS_SCALARLIST[0]),  # bias corrections
            "_foreach_addcdiv_": math.ceil(700 / MTA_MAX_TENSORS_SCALARLIST[2])}  # step sizes
    assert {k: foreach[k] for k in want} == want
    assert len(set(want.values())) == 3  # the counts differ by depth
    assert fused["_fused_adamw_"] == math.ceil(300 / MTA_MAX_TENSORS[3]) > math.ceil(300 / MTA_MAX_TENSORS[2])


def _torch_loop(numels, depth, scalar_list=False, build="cuda13") -> int:
    """multi_tensor_apply's launch loop as torch writes it, chunk by chunk (a CUDA < 13 or ROCm
    build: the 4 KB table, 320 blocks and 110, 64, 48, 36, 30 tensors; 96 with a scalar list)."""
    tables = {"cuda13": (MTA_MAX_BLOCKS, MTA_MAX_TENSORS, MTA_MAX_TENSORS_SCALARLIST),
              "legacy": (320, (110, 64, 48, 36, 30), (96, 64, 48, 36, 30))}
    max_blocks, tensors, scalars = tables[build]
    most = (scalars if scalar_list else tensors)[depth - 1]
    blocks = held = launches = 0
    for n in numels:
        if n == 0:
            continue
        held += 1
        chunks = -(-n // MTA_CHUNK_ELEMS)
        for chunk in range(chunks):
            blocks += 1
            if (held == most and chunk == chunks - 1) or blocks == max_blocks:
                launches, blocks = launches + 1, 0
                held = 0 if chunk == chunks - 1 else 1
    return launches + (blocks != 0)


@pytest.mark.parametrize("build", ["cuda13", "legacy"])
def test_launch_count_follows_torchs_loop(build):
    rng = random.Random(3)
    for _ in range(500):
        numels = [rng.choice([0, 1, rng.randint(1, 10**6), MTA_CHUNK_ELEMS * rng.randint(1, 3000)])
                  for _ in range(rng.randint(1, 900))]
        depth, scalar_list = rng.randint(1, 5), rng.random() < 0.5
        assert mta_launches(numels, depth, scalar_list, build) == _torch_loop(numels, depth, scalar_list, build)


def test_builds_by_gpu():
    """CUDA 13 builds for compute capability 7.5 up; a Pascal or Volta GPU runs a CUDA 12 build,
    an AMD one a ROCm build: both take the 4 KB table."""
    from kit.hardware import get_gpu
    from kit.workload.kernels import mta_build

    legacy = ("p4", "p100-pcie-16gb", "v100-sxm2-32gb", "mi210", "mi300x")
    assert [mta_build(get_gpu(g)) for g in legacy] == ["legacy"] * len(legacy)
    assert [mta_build(get_gpu(g)) for g in ("t4", "a100-sxm4-80gb", "h100-sxm", "b200")] == ["cuda13"] * 4


@pytest.mark.parametrize("gpu, build", [("h100-sxm", "cuda13"), ("v100-sxm2-32gb", "legacy"),
                                        ("mi210", "legacy")])
def test_each_gpu_is_priced_at_its_builds_launches(gpu, build):
    """700 small parameters' AdamW step: a V100 or MI210 (the 4 KB table) launches 7 kernels of
    each depth-1 op where a CUDA 13 build launches 1; the graph, captured once, had given every
    GPU the CUDA 13 counts (llama3-8b: 55 launches an op where a V100 runs 384)."""
    from kit.workload.graph import OpGraph
    from kit.workload.iteration import iteration

    with torch.device("meta"):
        model = nn.ParameterList([nn.Parameter(torch.empty(8)) for _ in range(700)])
    nodes = tuple(capture_optimizer(model, "adamw"))
    it = iteration(OpGraph(nodes, "params", {"mode": "train"}), gpu, predictor="roofline")
    got = dict(zip(it.timeline.aten, it.timeline.kernels))
    depth = {"_foreach_mul_": 1, "_foreach_lerp_": 2, "_foreach_addcmul_": 3, "_foreach_sqrt": 2}
    want = {op: _torch_loop([8] * 700, d, build=build) for op, d in depth.items()}
    assert {op: got[op] for op in want} == want
    assert len(set(_torch_loop([8] * 700, d, build=b) for d in (1, 2) for b in ("cuda13", "legacy"))) == 4


def test_identical_launches_add_up():
    # ten parameters of exactly MTA_MAX_BLOCKS chunks each: every foreach op launches ten kernels,
    # each the same as the one kernel of a step over one such parameter, so in the stream (each
    # launch shedding the dispatch floor it carries, 12.7 us on an H100) the ten take ten times
    # as long as the one. Priced as one kernel of all the elements, the node had shed ten floors
    # from an isolated time that held one (llama3-8b's 55-launch _foreach_mul_: 12.82 -> 12.16 ms)
    from kit.workload.kernel_times import isolation_floor_ms, predict_latencies
    from kit.predict import get_predictor

    per = MTA_MAX_BLOCKS * MTA_CHUNK_ELEMS
    def step(count):
        with torch.device("meta"):
            model = nn.ParameterList([nn.Parameter(torch.empty(per)) for _ in range(count)])
        return [n for n in capture_optimizer(model, "adamw", "bf16") if not n.free]

    assert isolation_floor_ms(get_predictor("tile"), "h100-sxm") > 0  # the floor is shed
    one, ten = step(1), step(10)
    assert [n.kernels for n in one] == [1] * len(one) and [n.kernels for n in ten] == [10] * len(ten)
    one_ms = predict_latencies(one, "h100-sxm", "tile")[0]
    ten_ms = predict_latencies(ten, "h100-sxm", "tile")[0]
    assert ten_ms == pytest.approx(10 * one_ms, rel=1e-6), [n.name() for n in ten]
