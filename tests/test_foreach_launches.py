"""The kernels an optimizer step's _foreach_* ops and fused optimizers launch: torch's
multi_tensor_apply (aten/src/ATen/native/cuda/MultiTensorApply.cuh) fills a launch with at most
MTA_MAX_BLOCKS chunks of 65,536 elements and MTA_MAX_TENSORS[depth - 1] tensors."""
import math
import random

import torch
import torch.nn as nn

from kit.workload.capture import capture_optimizer
from kit.workload.kernels import leaf_ops
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
        big = [n for n in nodes if leaf_ops(n.op)[0][0].numel >= sum(p.numel() for p in model.parameters())]
        assert big, optimizer
        assert all(n.kernels >= least for n in big), (optimizer, [(n.aten, n.kernels) for n in big])


def test_deeper_lists_take_fewer_tensors_a_launch():
    # 300 small parameters: a one-list op (AdamW's weight decay, _foreach_mul_) fits them in
    # ceil(300 / MTA_MAX_TENSORS[0]) launches, the fused AdamW (parameters, gradients and two
    # moments: depth 4) needs ceil(300 / MTA_MAX_TENSORS[3])
    with torch.device("meta"):
        model = nn.ParameterList([nn.Parameter(torch.empty(8)) for _ in range(300)])
    foreach = {n.name(): n.kernels for n in capture_optimizer(model, "adamw") if not n.free}
    fused = {n.name(): n.kernels for n in capture_optimizer(model, "adamw-fused") if not n.free}
    assert foreach["_foreach_mul_"] == math.ceil(300 / MTA_MAX_TENSORS[0])
    assert foreach["_foreach_addcmul_"] == math.ceil(300 / MTA_MAX_TENSORS[2])  # exp_avg_sq, grad, grad
    assert foreach["_foreach_sqrt"] == math.ceil(300 / MTA_MAX_TENSORS[1])  # its output list too
    assert foreach["_foreach_addcdiv_"] == math.ceil(300 / MTA_MAX_TENSORS_SCALARLIST[2])  # step sizes
    assert fused["_fused_adamw_"] == math.ceil(300 / MTA_MAX_TENSORS[3])


def _torch_loop(numels, depth, scalar_list=False) -> int:
    """multi_tensor_apply's launch loop as torch writes it, chunk by chunk."""
    most = (MTA_MAX_TENSORS_SCALARLIST if scalar_list else MTA_MAX_TENSORS)[depth - 1]
    blocks = held = launches = 0
    for n in numels:
        if n == 0:
            continue
        held += 1
        chunks = -(-n // MTA_CHUNK_ELEMS)
        for chunk in range(chunks):
            blocks += 1
            if (held == most and chunk == chunks - 1) or blocks == MTA_MAX_BLOCKS:
                launches, blocks = launches + 1, 0
                held = 0 if chunk == chunks - 1 else 1
    return launches + (blocks != 0)


def test_launch_count_follows_torchs_loop():
    rng = random.Random(3)
    for _ in range(500):
        numels = [rng.choice([0, 1, rng.randint(1, 10**6), MTA_CHUNK_ELEMS * rng.randint(1, 3000)])
                  for _ in range(rng.randint(1, 900))]
        depth, scalar_list = rng.randint(1, 5), rng.random() < 0.5
        assert mta_launches(numels, depth, scalar_list) == _torch_loop(numels, depth, scalar_list)
