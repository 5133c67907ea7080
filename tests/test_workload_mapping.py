"""aten -> kit op rules checked against hand-counted bytes: broadcast operands, bool masks,
the fused dropout kernel and its backward."""
import pytest
import torch
import torch.nn as nn

from kit.ops import Elementwise
from kit.workload.capture import capture
from kit.workload.mapping import BROADCAST_STREAM_BYTES

torch.set_num_threads(1)


class _Add(nn.Module):
    def __init__(self, other_shape):
        super().__init__()
        self.other = nn.Parameter(torch.zeros(other_shape))

    def forward(self, x):
        return x + self.other


def _only(graph, name):
    ops = [n.op for n in graph.kernels() if n.name() == name]
    assert len(ops) == 1, [n.name() for n in graph.kernels()]
    return ops[0]


def test_small_broadcast_operand_is_not_a_stream():
    # a bias row stays on chip: the add moves x once and writes y (8 bytes per fp32 element)
    op = _only(capture(_Add((1280,)), (torch.zeros(4, 1024, 1280),), mode="inference"), "add")
    assert op == Elementwise("add", 4 * 1024 * 1280, "fp32", inputs=1)
    assert op.bytes == 4 * 1024 * 1280 * 8


def test_large_broadcast_operand_streams_like_a_second_input():
    # GPT-2's position embeddings (1, 1024, 1280) fp32 = 5.2 MB, broadcast over the batch
    assert 1024 * 1280 * 4 >= BROADCAST_STREAM_BYTES
    op = _only(capture(_Add((1, 1024, 1280)), (torch.zeros(4, 1024, 1280),), mode="inference"), "add")
    assert op.bytes == 4 * 1024 * 1280 * 12  # read x, read the broadcast operand, write y


def test_bool_mask_counts_a_quarter_stream():
    class Masked(nn.Module):
        def forward(self, x, keep):
            return x * keep

    x, keep = torch.zeros(64, 1024), torch.zeros(64, 1024, dtype=torch.bool)
    op = _only(capture(Masked(), (x, keep), mode="inference"), "mul")
    # read x (4 B), read the mask (1 B), write y (4 B)
    assert op.bytes == pytest.approx(64 * 1024 * 9)


def test_dropout_and_its_backward_move_nine_bytes_per_element():
    class Drop(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.zeros(256))
            self.drop = nn.Dropout(0.1)

        def forward(self, x):
            return self.drop(x * self.w)

    g = capture(Drop(), (torch.zeros(32, 256),), mode="train")
    n = 32 * 256
    fwd = [k for k in g.kernels() if k.op_class == "dropout"]
    assert len(fwd) == 1 and fwd[0].op.bytes == pytest.approx(n * 9)  # x in; y and a bool mask out
    bwd = [k for k in g.kernels() if k.name() == "native_dropout_backward"]
    assert len(bwd) == 1 and bwd[0].op.bytes == pytest.approx(n * 9)  # dy and the mask in; dx out
