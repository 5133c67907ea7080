"""Capture on meta tensors: ops, shapes, phases, module paths, dependencies, hand-counted FLOPs."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from kit.errors import KitError
from kit.ops import Attention, Dropout, Gemm
from kit.workload.capture import DataDependentCapture, capture, layer_of
from kit.workload.kernels import ATTENTION_BWD_FLOPS, ATTENTION_BWD_SCALE, Derived

torch.set_num_threads(1)


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def test_inference_records_two_gemms_and_a_relu():
    g = capture(_mlp(), (torch.zeros(2, 8),), mode="inference")
    k = g.kernels()
    assert [n.op_class for n in k] == ["gemm", "elementwise", "gemm"]
    assert k[0].op == Gemm(m=2, n=16, k=8, dtype="fp32", kind="linear", shared_rhs=True, align=8)
    assert k[2].op.m == 2 and k[2].op.n == 4 and k[2].op.k == 16
    assert k[1].op.numel == 2 * 16 and k[1].op.kind == "relu"
    assert {n.phase for n in g} == {"fwd"}
    assert [n.module for n in k] == ["0", "1", "2"]
    # relu reads the first addmm's output; the second addmm reads relu's
    assert k[0].id in k[1].deps and k[1].id in k[2].deps
    assert g.meta["params"] == 8 * 16 + 16 + 16 * 4 + 4


def test_training_flops_match_hand_count():
    g = capture(_mlp(), (torch.zeros(2, 8),), mode="train")
    gemm = lambda ph: sum(n.op.flops for n in g.by_phase(ph) if n.op_class == "gemm")  # noqa: E731
    assert gemm("fwd") == 2 * (2 * 16 * 8 + 2 * 4 * 16)
    # dX of layer 2, dW of layer 2, dW of layer 1 (the input needs no gradient)
    assert gemm("bwd") == 2 * (2 * 16 * 4 + 4 * 16 * 2 + 16 * 8 * 2)
    assert g.phases() == ["fwd", "bwd"]
    bias_grads = [n for n in g.by_phase("bwd") if n.op_class == "reduction"]
    assert len(bias_grads) == 2  # one bias-gradient sum per Linear
    assert {n.module for n in g.by_phase("bwd") if not n.free} <= {"0", "1", "2"}


def test_user_module_is_left_untouched():
    m = _mlp()
    before = m[0].weight.detach().clone()
    capture(m, (torch.zeros(2, 8),), mode="train", optimizer="adamw")
    assert m[0].weight.device.type == "cpu" and torch.equal(m[0].weight, before)
    assert m[0].weight.grad is None and m.training


def test_optimizer_step_covers_every_parameter():
    g = capture(_mlp(), (torch.zeros(2, 8),), mode="train", optimizer="adamw")
    opt = [n for n in g.by_phase("opt") if not n.free]
    assert opt and all(n.name().startswith("_foreach") for n in opt)
    n_params = 8 * 16 + 16 + 16 * 4 + 4
    assert max(n.op.numel for n in opt) == n_params
    with pytest.raises(KitError, match="optimizer"):
        capture(_mlp(), (torch.zeros(2, 8),), mode="train", optimizer="lion9")


class _Attn(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(32, 96) for _ in range(2))
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        for blk in self.blocks:
            q, k, v = blk(x).view(2, 8, 3, 4, 8).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.drop(a.transpose(1, 2).reshape(2, 8, 32))
        return x


def test_sdpa_is_one_fused_attention_kernel_and_dropout_is_fused():
    g = capture(_Attn(), (torch.zeros(2, 8, 32),), mode="train")
    att = [n for n in g if n.op_class == "attention"]
    fwd = [n for n in att if n.phase == "fwd"]
    bwd = [n for n in att if n.phase == "bwd"]
    assert len(fwd) == 2 and len(bwd) == 2
    assert fwd[0].op == Attention(b=2, heads=4, seq_q=8, seq_kv=8, head_dim=8, causal=True)
    assert isinstance(bwd[0].op, Derived) and bwd[0].op.scale == ATTENTION_BWD_SCALE > 2.5
    assert bwd[0].op.flops == pytest.approx(ATTENTION_BWD_FLOPS * fwd[0].op.flops)  # its work, 5 matmuls to 2
    drops = [n for n in g if n.op_class == "dropout"]
    assert len(drops) == 2
    # the fused kernel reads x and writes y (fp32) and a one-byte mask: 9 bytes per element
    assert drops[0].op.bytes == pytest.approx(2 * 8 * 32 * 9)
    assert drops[0].op.bytes == pytest.approx(Dropout(2 * 8 * 32).bytes)
    assert [layer_of(n.module) for n in fwd] == [None, None]  # attention ran in the top module
    assert sorted({n.layer for n in g if n.op_class == "gemm"}) == [0, 1]
    inf = capture(_Attn(), (torch.zeros(2, 8, 32),), mode="inference")
    assert not [n for n in inf if n.op_class == "dropout"]


def test_sdpa_with_values_narrower_than_queries_costs_each_product_on_its_own_head_size():
    class Narrow(nn.Module):  # q/k heads of 12, values of 8 (DeepSeek's latent attention)
        def forward(self, q, k, v):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    q, k, v = torch.zeros(2, 4, 16, 12), torch.zeros(2, 4, 16, 12), torch.zeros(2, 4, 16, 8)
    (node,) = [n for n in capture(Narrow(), (q, k, v), mode="inference") if n.op_class == "attention"]
    op = node.op
    assert (op.head_dim, op.v_head_dim, op.value_dim) == (12, 8, 8)
    same = Attention(b=2, heads=4, seq_q=16, seq_kv=16, head_dim=12, causal=True)
    assert same.v_head_dim is None and same.value_dim == 12
    # scores over 12, context over 8: (12 + 8) / (12 + 12) of the square-head kernel's work
    assert op.flops == pytest.approx(same.flops * 20 / 24)
    assert op.bytes == pytest.approx(4 * 2 * 4 * 16 * (12 + 8) * 2)  # q, o and k, v in fp32
    with pytest.raises(KitError, match="v_head_dim must be a positive whole number"):
        Attention(b=1, heads=1, seq_q=1, seq_kv=1, head_dim=8, v_head_dim=0)


def test_unknown_ops_are_reported_and_costed_as_memory_bound():
    class Odd(nn.Module):
        def forward(self, x):
            return torch.digamma(x)

    g = capture(Odd(), (torch.zeros(4, 8),), mode="inference")
    assert g.unknown_ops() == {"aten.digamma.default": 1}
    node = [n for n in g if n.op_class == "unknown"][0]
    assert node.op.bytes == pytest.approx(2 * 4 * 8 * 4)  # read once, write once, fp32


def test_dtype_cast_and_tf32():
    g = capture(_mlp(), (torch.zeros(2, 8),), mode="inference", dtype="bf16")
    assert {n.op.dtype for n in g.kernels() if n.op_class == "gemm"} == {"bf16"}
    assert g.meta["param_bytes"] == 2 * g.meta["params"]
    t = capture(_mlp(), (torch.zeros(2, 8),), mode="inference", dtype="tf32")
    assert {n.op.dtype for n in t.kernels() if n.op_class == "gemm"} == {"tf32"}


def test_bad_inputs_are_kit_errors():
    with pytest.raises(KitError, match="nn.Module"):
        capture("gpt2", (torch.zeros(1),))
    with pytest.raises(KitError, match="mode"):
        capture(_mlp(), (torch.zeros(2, 8),), mode="serve")
    with pytest.raises(KitError, match="failed"):
        capture(_mlp(), (torch.zeros(2, 7),), mode="inference")  # wrong feature size
    with pytest.raises(KitError, match="dtype"):
        capture(_mlp(), (torch.zeros(2, 8),), dtype="int3")


def test_a_failed_op_is_named_with_its_module():
    with pytest.raises(KitError) as e:
        capture(_mlp(), (torch.zeros(2, 7),), mode="inference", name="mlp")
    msg = str(e.value)
    assert "capturing mlp failed in module '0' at aten." in msg and "\n" not in msg
    assert not isinstance(e.value, DataDependentCapture)


class _Routed(nn.Module):
    """Experts fed by boolean masks or torch.where: token counts that depend on the data."""

    def __init__(self, how):
        super().__init__()
        self.how = how
        self.gate, self.expert = nn.Linear(8, 2), nn.Linear(8, 8)

    def forward(self, x):
        if self.how == "item":
            return self.expert(x) * float(self.gate(x).max())
        if self.how == "equal":
            return self.expert(x) if torch.equal(x, x) else x
        pick = self.gate(x).argmax(-1) == 0
        if self.how == "mask":
            return self.expert(x[pick])
        return self.expert(x[torch.where(pick)[0]])


@pytest.mark.parametrize("how,op", [("mask", "aten.index"), ("where", "aten.nonzero"),
                                    ("item", "aten._local_scalar_dense")])
def test_data_dependent_ops_are_named_with_what_to_do(how, op):
    with pytest.raises(DataDependentCapture) as e:
        capture(_Routed(how), (torch.zeros(6, 8),), mode="inference", name="routed")
    msg = str(e.value)
    assert msg.startswith("capturing routed failed in its top-level forward: " + op)
    assert "meta tensors" in msg and "static shapes" in msg and "\n" not in msg
    # the same module with static shapes captures
    assert capture(nn.Sequential(nn.Linear(8, 2)), (torch.zeros(6, 8),), mode="inference").nodes


def test_layer_of():
    assert layer_of("transformer.h.3.attn") == 3
    assert layer_of("layers.12") == 12 and layer_of("lm_head") is None and layer_of("") is None


class _Caught(nn.Module):
    """A forward that catches one failure and then fails elsewhere."""

    def __init__(self, then):
        super().__init__()
        self.inner, self.then = nn.Linear(4, 4), then

    def forward(self, x):
        y = self.inner(x)
        try:
            y[y > 0]  # needs values: fails on meta, and the forward goes on
        except Exception:
            pass
        if self.then == "mm":
            return y @ torch.zeros(5, 3)
        return {}["missing"]


class _Twice(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g @ torch.zeros(5, 3)


def test_the_failure_named_is_the_one_that_raised():
    with pytest.raises(KitError) as e:
        capture(nn.Sequential(_Caught("mm")), (torch.zeros(2, 4),), mode="inference", name="m")
    assert str(e.value).startswith("capturing m failed in module '0' at aten.mm")
    with pytest.raises(KitError) as e:  # no op failed last: the module running is named
        capture(nn.Sequential(_Caught("key")), (torch.zeros(2, 4),), mode="inference", name="m")
    assert not isinstance(e.value, DataDependentCapture)
    assert str(e.value).startswith("capturing m failed in module '0': KeyError: 'missing'")
    with pytest.raises(DataDependentCapture, match="aten.equal.default needs the tensor's values"):
        capture(_Routed("equal"), (torch.zeros(6, 8),), mode="inference", name="routed")

    class Back(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = nn.Linear(4, 4)

        def forward(self, x):
            return _Twice.apply(self.inner(x))

    with pytest.raises(KitError, match="capturing b failed in the backward pass at aten.mm"):
        capture(Back(), (torch.zeros(2, 4),), mode="train", name="b")


def test_the_backward_of_a_copy_into_a_slice_belongs_to_its_module():
    class Assemble(nn.Module):  # HF 5's DeepSeek builds its keys this way
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(8, 6), nn.Linear(8, 2)

        def forward(self, x):
            out = x.new_empty(*x.shape[:-1], 8)
            out[..., :6].copy_(self.a(x))
            out[..., 6:].copy_(self.b(x))
            return out

    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([Assemble()])

        def forward(self, x):
            return self.layers[0](x) * 2

    g = capture(Outer(), (torch.zeros(4, 8),), mode="train")
    copies = [n for n in g if n.phase == "bwd" and n.op_class != "free" and n.module == ""]
    assert not [n for n in copies if n.aten != "aten.mul.Tensor"], [(n.aten, n.module) for n in copies]
    assert {n.layer for n in g if n.phase == "bwd" and n.aten == "aten.copy_.default"} == {0}
