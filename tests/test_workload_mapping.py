"""aten -> kit op rules checked against hand-counted bytes: broadcast operands, bool masks,
the fused dropout kernel and its backward."""
import pytest
import torch
import torch.nn as nn
from aten_log import AtenLog

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
    # broadcast, so PyTorch's generic loop runs it (kit.workload.mapping.vectorizable)
    assert op == Elementwise("add", 4 * 1024 * 1280, "fp32", inputs=1, vectorized=False)
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


class _RightWeight(nn.Module):
    """x @ W on a transposed (non-contiguous) 3-d x: when W does not require grad, torch.matmul
    does not fold it into one mm but expands W over the batch and calls bmm (nn.MultiheadAttention's
    in-projection on the slow path of a frozen model)."""

    def __init__(self, k, n, frozen=True):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(k, n), requires_grad=not frozen)

    def forward(self, x):
        return x.transpose(0, 1) @ self.w


class _LeftWeight(_RightWeight):
    def forward(self, x):
        return self.w.t() @ x.transpose(1, 2)


def _gemms(graph):
    return [n.op for n in graph.kernels() if n.op_class == "gemm"]


def test_weight_expanded_over_the_batch_is_read_once():
    seq, batch, k, n = 128, 8, 512, 1536
    (op,) = _gemms(capture(_RightWeight(k, n), (torch.zeros(batch, seq, k),), mode="inference"))
    assert (op.b, op.m, op.n, op.k) == (seq, batch, n, k)
    # x read once, W read once (not once per batch entry), y written: fp32
    assert op.bytes == 4 * (seq * batch * k + k * n + seq * batch * n)
    assert op.flops == 2 * seq * batch * n * k


def test_left_operand_expanded_over_the_batch_is_read_once():
    batch, seq, k, n = 16, 256, 512, 768  # W^T (n x k) @ x^T (k x seq), per batch entry
    (op,) = _gemms(capture(_LeftWeight(k, n), (torch.zeros(batch, seq, k),), mode="inference"))
    assert op.b == batch and op.k == k and {op.m, op.n} == {n, seq}
    assert op.bytes == 4 * (batch * seq * k + k * n + batch * n * seq)
    assert op.flops == 2 * batch * seq * n * k


def test_a_weight_that_requires_grad_folds_the_matmul_into_one_mm_at_inference_too():
    """torch.matmul folds when the weight requires grad, whatever the grad mode (torch's
    should_fold), so an inference capture keeps the model's requires_grad."""
    seq, batch, k, n = 128, 8, 512, 1536
    x = torch.zeros(batch, seq, k)
    for model in (_RightWeight(k, n, frozen=False), _LeftWeight(k, n, frozen=False)):
        with torch.no_grad(), AtenLog() as log:
            model(x)
        graph = capture(model, (x,), mode="inference")
        captured = [n.name() for n in graph.kernels() if n.op_class == "gemm"]
        assert captured == [o for o in log.ops if o in ("mm", "bmm", "addmm")] == ["mm"]
        (op,) = _gemms(graph)
        assert op.b == 1 and op.m * op.n == seq * batch * n and op.k == k


def test_a_true_batched_matmul_reads_every_operand_in_full():
    class Bmm(nn.Module):
        def forward(self, a, b):
            return a @ b

    a, b = torch.zeros(12, 64, 32), torch.zeros(12, 32, 48)
    (op,) = _gemms(capture(Bmm(), (a, b), mode="inference"))
    assert op.bytes == 4 * (a.numel() + b.numel() + 12 * 64 * 48)


def test_glu_reads_both_halves_and_writes_one():
    g = capture(nn.Sequential(_Add((1024,)), nn.GLU()), (torch.zeros(64, 1024),), mode="train")
    assert not g.unknown_ops()
    (fwd,) = [k.op for k in g.kernels() if k.name() == "glu"]
    assert fwd.bytes == 4 * (64 * 1024 + 64 * 512)  # x in, y (half of x) out
    (bwd,) = [k.op for k in g.kernels() if k.name() == "glu_backward"]
    assert bwd.bytes == pytest.approx(4 * (64 * 512 + 2 * 64 * 1024))  # dy and x in; dx out


@pytest.mark.parametrize("module", [nn.PixelShuffle(2), nn.PixelUnshuffle(2), nn.ChannelShuffle(4)])
def test_layout_shuffles_are_copies(module):
    x = torch.zeros(2, 16, 32, 32)
    g = capture(module, (x,), mode="inference")
    assert not g.unknown_ops()
    (op,) = [k.op for k in g.kernels()]
    assert op.bytes == 2 * x.numel() * 4  # every element read once and written once


@pytest.mark.parametrize("gather", [
    lambda src, idx: src.index_select(0, idx),
    lambda src, idx: src[idx],
    lambda src, idx: torch.gather(src, 0, idx[:, None].expand(-1, src.shape[1])),
])
def test_a_gather_moves_the_rows_it_selects_not_its_whole_source(gather):
    class Pick(nn.Module):
        def forward(self, src, idx):
            return gather(src, idx)

    src, idx = torch.zeros(10_000, 64), torch.zeros(4, dtype=torch.long)
    (node,) = [n for n in capture(Pick(), (src, idx), mode="inference") if n.op_class == "indexing"]
    picked = 4 * 64 * 4  # four fp32 rows of 64
    # int64 indices: one per row, or one per element for gather
    index_bytes = 4 * 64 * 8 if node.aten == "aten.gather.default" else 4 * 8
    assert node.op.bytes == pytest.approx(2 * picked + index_bytes)
    assert node.op.bytes < 10_000 * 64 * 4 / 100  # a hundredth of the source, not all of it


def test_a_small_broadcast_operand_is_read_once():
    # (1, 1024, 256) bf16 = 0.5 MiB, on chip, broadcast over a batch of 8: read once, not free
    class Half(_Add):
        pass

    x = torch.zeros(8, 1024, 256, dtype=torch.bfloat16)
    op = _only(capture(Half((1, 1024, 256)), (x,), mode="inference", dtype="bf16"), "add")
    n = 8 * 1024 * 256
    assert op.bytes == pytest.approx(2 * n + 2 * n + 2 * 1024 * 256)  # x, y, the operand once


class _Cast(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


@pytest.mark.parametrize("name,fn,in_dtype,in_b,out_b", [
    # each input at its own element size, the output at its own: the kit took the first
    # input's dtype for the pass and weighed inputs against the output's, so the sizes multiplied
    ("_to_copy", lambda x: x.to(torch.bfloat16), torch.float32, 4, 2),   # was 2x
    ("_to_copy", lambda x: x.to(torch.float32), torch.bfloat16, 2, 4),   # was 0.67x
    ("lt", lambda x: x < 0.5, torch.float32, 4, 1),                      # was 4x
    ("_to_copy", lambda x: x.to(torch.bool), torch.float32, 4, 1),
])
def test_elementwise_bytes_follow_each_tensors_own_dtype(name, fn, in_dtype, in_b, out_b):
    x = torch.zeros(64, 4096, dtype=in_dtype)
    op = _only(capture(_Cast(fn), (x,), mode="inference"), name)
    assert op.bytes == pytest.approx(64 * 4096 * (in_b + out_b))


def test_mixed_dtype_multiply_reads_both_inputs_at_their_sizes():
    class Scale(nn.Module):  # an expert's bf16 output times an fp32 routing weight -> fp32
        def forward(self, x, w):
            return x * w

    x, w = torch.zeros(512, 1024, dtype=torch.bfloat16), torch.zeros(512, 1024)
    op = _only(capture(Scale(), (x, w), mode="inference"), "mul")
    assert op.bytes == pytest.approx(512 * 1024 * (2 + 4 + 4))  # was half of it


def test_a_fill_only_writes():
    class Fill(nn.Module):
        def forward(self, x):
            return x.new_zeros(1024, 1024)

    op = _only(capture(Fill(), (torch.zeros(4),), mode="inference"), "new_zeros")
    assert op.bytes == pytest.approx(1024 * 1024 * 4)


def test_embedding_bag_backward_zeroes_the_table_once_and_touches_the_looked_up_rows():
    # the dense gradient: the (rows, dim) table zeroed once, then each index's row read-modify-
    # written with its bag's gradient; it was costed at twice the table
    rows, dim, bags, pooling = 100_000, 64, 256, 4
    bag = nn.EmbeddingBag(rows, dim, mode="sum")
    idx = torch.zeros(bags * pooling, dtype=torch.int64)
    offsets = torch.arange(0, bags * pooling, pooling)
    g = capture(bag, (idx, offsets), mode="train")
    (node,) = [n for n in g.kernels() if "embedding_bag" in n.name() and n.phase == "bwd"]
    table = rows * dim * 4
    touched = 2 * bags * pooling * dim * 4
    assert table + touched <= node.op.bytes <= table + touched + 8 * 8 * bags * pooling
    assert node.op.bytes < 1.2 * table


def test_slice_backward_zeroes_the_input_grad_and_copies_the_slice():
    class Half(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.zeros(256, 1024))

        def forward(self, x):
            return (self.w * x)[:, :512]

    g = capture(Half(), (torch.zeros(256, 1024),), mode="train")
    ops = [n.op for n in g.kernels() if n.name() == "slice_backward"]
    assert ops, [n.name() for n in g.kernels()]
    assert ops[0].bytes == pytest.approx(256 * 1024 * 4 + 2 * 256 * 512 * 4)  # was 1.25x
