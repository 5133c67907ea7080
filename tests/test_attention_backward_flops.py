"""An attention backward's FLOPs are its 5 matmuls to the forward's 2 (FlashAttention-2, Dao
2023, sec. 3.2), while its time is ATTENTION_BWD_SCALE times the forward's: the graph's flops
column had carried the time's 2.8, 12% over the work (a 2 x 8 x 32 x 16 SDPA: 2.936e6 against
torch's FlopCounterMode's 2.621e6; the one-head 2 x 1 x 32 x 16 here: 0.367e6 against 0.328e6)."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

from kit.workload.capture import capture
from kit.workload.kernels import ATTENTION_BWD_SCALE, leaf_ops


class Sdpa(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(16, 48)

    def forward(self, x):
        q, k, v = self.qkv(x).view(2, 32, 3, 1, 16).permute(2, 0, 3, 1, 4)
        return F.scaled_dot_product_attention(q, k, v).sum()


def _attention(graph):
    return [n for n in graph.kernels() if n.op_class == "attention"]


def test_attention_backward_flops_are_the_work_and_its_time_scale_stays():
    x = torch.zeros(2, 32, 16)
    fwd, bwd = _attention(capture(Sdpa(), (x,), mode="train"))
    assert bwd.op.flops == pytest.approx(2.5 * fwd.op.flops, rel=1e-12)
    # the time: 2.8 x the forward's parts, as before
    assert [s for _, s in leaf_ops(bwd.op)] == [ATTENTION_BWD_SCALE]
    # torch's flop counter's formulas for SDPA (its CUDA kernels; on the CPU it decomposes)
    shape = (2, 1, 32, 16)
    assert fwd.op.flops == pytest.approx(sdpa_flop_count(shape, shape, shape), rel=1e-12)
    assert bwd.op.flops == pytest.approx(sdpa_backward_flop_count(shape, shape, shape, shape), rel=1e-12)
