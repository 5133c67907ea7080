"""Review of the H200 commits (GEMM alignment, PyTorch's generic elementwise loop): what
TensorIterator vectorizes, the ops whose inputs are not what the kernel reads (copy_,
masked_fill's value, where's CPU scalars), where a GEMM's matrices start, the compiled mode's
generated kernels and the alignment of TP-sharded GEMMs."""
import pytest
import torch

from kit.hardware import get_gpu
from kit.ops import Elementwise, Gemm
from kit.parallel import shard_graph
from kit.parallel.opgraph import _split, capture_model
from kit.workload.capture import capture
from kit.workload.fusion import apply_fusion
from kit.workload.iteration import generic_loop_ms
from kit.workload.kernels import Derived, leaf_ops
from kit.workload.mapping import vectorizable


def meta(*shape):
    return torch.empty(*shape, device="meta")


def _elementwise(graph):
    return [(n.aten, (n.op.parts[0] if isinstance(n.op, Derived) else n.op))
            for n in graph.nodes if n.op_class == "elementwise"]


def test_a_layout_every_operand_shares_is_vectorized():
    """TensorIterator merges dims in stride order: a transposed or channels-last tensor whose
    inputs share its strides is one unit-stride run, as a contiguous one is."""
    t = meta(4, 16, 8).transpose(1, 2)
    assert vectorizable([t, meta(4, 16, 8).transpose(1, 2)], meta(4, 16, 8).transpose(1, 2))
    cl = meta(2, 8, 4, 4).to(memory_format=torch.channels_last)
    assert vectorizable([cl], torch.empty_like(cl))
    assert not vectorizable([t], meta(4, 8, 16))  # a permute's copy: laid out otherwise
    assert not vectorizable([meta(4, 8, 16)], t)
    assert not vectorizable([meta(4, 8, 32)[..., ::2]], meta(4, 8, 16))  # a strided view: not dense
    assert not vectorizable([meta(4, 8, 16), torch.tensor(2.0)], meta(4, 8, 16), cpu_scalars=False)


class Ops(torch.nn.Module):
    def forward(self, x, buf):
        t = x.transpose(1, 2)
        a = t * 2.0  # out-of-place on a transposed tensor: its output takes the same layout
        b = torch.where(x > 0, x, torch.tensor(0.0))  # the CPU scalar goes to the device
        c = x.masked_fill(x > 0, torch.tensor(1.0, device=x.device))  # value read on the host
        buf.copy_(t)  # copy_ from a strided source: the generic loop
        d = torch.empty_like(x)
        d.copy_(x)  # contiguous into contiguous
        return a, b, c, d


def test_what_each_op_reads():
    graph = capture(Ops(), (torch.empty(2, 8, 16), torch.empty(2, 16, 8)), mode="inference",
                    dtype="bf16")
    got = {}
    for aten, op in _elementwise(graph):
        got.setdefault(aten, []).append(op.vectorized)
    assert got["aten.mul.Tensor"] == [True]
    assert got["aten.where.self"] == [False]
    assert got["aten.masked_fill.Tensor"] == [True]
    assert got["aten.copy_.default"] == [False, True]


class Sliced(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.empty(64, 64))

    def forward(self, x):
        return x[:, :64] @ self.w, x[:, 1:65] @ self.w  # the second starts 2 bytes off


class OddBatchStride(torch.nn.Module):
    def forward(self, x, y):  # matrices 1,025 elements apart: every other one starts off 16 bytes
        return torch.bmm(x.as_strided((4, 16, 64), (1025, 64, 1)), y)


def test_where_a_matrix_starts_limits_its_alignment():
    graph = capture(Sliced(), (torch.empty(32, 72),), mode="inference", dtype="bf16")
    assert [n.op.lead_align for n in graph.nodes if n.op_class == "gemm"] == [8, 1]
    graph = capture(OddBatchStride(), (torch.empty(5000), torch.empty(4, 64, 64)),
                    mode="inference", dtype="bf16")
    assert [n.op.lead_align for n in graph.nodes if n.op_class == "gemm"] == [1]


class Transposed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.empty(64, 64))

    def forward(self, x):
        return x.transpose(1, 2).contiguous() @ self.w  # a permute's copy on its own


def test_compiled_mode_generates_its_kernels():
    """A lone memory-bound op under torch.compile is Inductor's kernel, not PyTorch's generic
    loop: the generic-loop bound does not apply there."""
    graph = capture(Transposed(), (torch.empty(64, 64, 256),), mode="inference", dtype="bf16")
    h200 = get_gpu("h200")
    eager = apply_fusion(graph, "eager")
    assert generic_loop_ms(eager.nodes, h200).sum() > 0
    compiled = apply_fusion(graph, "compiled")
    assert generic_loop_ms(compiled.nodes, h200).sum() == 0
    assert all(op.vectorized for n in compiled.nodes for op, _ in leaf_ops(n.op)
               if isinstance(op, Elementwise))


def test_tp_pads_the_vocabulary_so_the_lm_head_is_aligned():
    """Megatron pads the vocabulary to 128 x TP: each rank's LM-head GEMMs are aligned even where
    the model's own vocabulary (101) is odd, at TP 1 too (left odd there, TP 2 had come out faster
    than half of TP 1: tests/test_multi_gpu_walkthrough.py)."""
    tiny = {"model_type": "gpt2", "n_embd": 64, "n_head": 2, "n_layer": 2, "vocab_size": 101,
            "n_positions": 64, "name": "odd-vocab-tp"}
    graph = capture_model(tiny, 1, 32, "bf16")

    def head(tp):
        src = shard_graph(graph, tp)
        return [op for blocks in src.head for b in blocks for op in b.ops if isinstance(op, Gemm)]

    on_one = head(1)
    assert len(on_one) == 3 and all(128 in (op.m, op.n, op.k) for op in on_one)
    assert {op.lead_align for op in on_one} == {8}
    on_two = head(2)
    assert len(on_two) == 3 and all(128 in (op.m, op.n, op.k) for op in on_two)
    assert {op.lead_align for op in on_two} == {8}


def test_a_tp_split_can_lower_the_alignment():
    op = Gemm(m=64, n=24, k=64, dtype="bf16", kind="linear", shared_rhs=True, align=8)
    assert _split(op, "n", 2, "n").lead_align == 4  # 12 columns a rank
    assert _split(op, "n", 3, "n").lead_align == 8
    assert _split(Gemm(m=64, n=24, k=64, dtype="bf16"), "n", 2, "n").align is None  # unknown stays so


def test_masked_fill_with_a_broadcast_mask_stays_generic():
    class M(torch.nn.Module):
        def forward(self, x):
            return x.masked_fill(torch.ones(1, 16, dtype=torch.bool, device=x.device), -1.0)

    graph = capture(M(), (torch.empty(8, 16),), mode="inference", dtype="bf16")
    assert [op.vectorized for _, op in _elementwise(graph) if op.kind == "where"] == [False]


class RotateHalf(torch.nn.Module):
    def forward(self, x):
        x1, x2 = x[..., :32], x[..., 32:]  # strided halves, as HF's rotate_half takes them
        return torch.cat((-x2, x1), dim=-1), torch.cat((x, x), dim=0)


def test_a_cat_of_strided_inputs_computes_offsets():
    """PyTorch's cat streams contiguous inputs; a strided input takes CatArrayBatchedCopy's
    strided variant (llama3-8b's rotate_half ran at ~225 G elements/s on the H200)."""
    graph = capture(RotateHalf(), (torch.empty(4, 128, 64),), mode="inference", dtype="bf16")
    cats = [op.vectorized for aten, op in _elementwise(graph) if aten == "aten.cat.default"]
    assert cats == [False, True]


def test_max_over_a_dim_is_a_reduction_not_an_elementwise_pass():
    """aten.max.dim arrives as the packet "max", as the elementwise max of two tensors does: it
    reads its whole input (64 x 4096), not just the 64 outputs."""
    import torch

    from kit.workload.capture import capture

    class M(torch.nn.Module):
        def forward(self, x, y):
            return torch.max(x, dim=-1).values, torch.max(x, y)

    g = capture(M(), (torch.zeros(64, 4096), torch.zeros(64, 4096)), mode="inference")
    red = [n for n in g.nodes if n.aten.startswith("aten.max.dim")]
    pair = [n for n in g.nodes if n.aten.startswith("aten.maximum")]
    moved = sum(p.bytes for p in red[0].op.parts) * red[0].op.scale
    assert red[0].op_class == "reduction" and moved >= 64 * 4096 * 4
    assert pair and pair[0].op_class == "elementwise"
