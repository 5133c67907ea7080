"""The whole-model capture's byte counts: an out-of-place scatter in a model's
own code copies its self (its backward-formula twins on a fresh zeros tensor do not), a copy of
an expanded view reads the tensor it was expanded from, an attention mask is read, and a failure
of the model's own code says so rather than blaming the inputs."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from kit.errors import KitError
from kit.ops import Attention
from kit.workload.capture import capture
from kit.workload.capture_errors import CaptureNotAboutInputs
from kit.workload.mapping import map_op


def _nodes(graph, name: str, phase: str | None = None) -> list:
    return [n for n in graph.nodes if n.op is not None and n.aten.split(".")[1] == name
            and (phase is None or n.phase == phase)]


def nb(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


X, IDX = torch.randn(8, 1024, 64), torch.randint(0, 64, (8, 1024, 16))


class Scatter(nn.Module):
    def __init__(self, in_place=False, ckpt=False):
        super().__init__()
        self.w, self.in_place, self.ckpt = nn.Parameter(torch.ones(64)), in_place, ckpt

    def body(self, x, idx):
        h = x * self.w
        return h.scatter_(2, idx, 0.5) if self.in_place else h.scatter(2, idx, 0.5)

    def forward(self, x, idx):
        return checkpoint(self.body, x, idx, use_reentrant=False) if self.ckpt else self.body(x, idx)


def test_an_out_of_place_scatter_in_the_forward_copies_its_self():
    """x.scatter(2, idx, 0.5) on (8, 1024, 64) fp32 had been costed 2.10 MB, as the in-place
    scatter_ is: the copy of x into the output (4.19 MB read and written) was missing."""
    (node,) = _nodes(capture(Scatter(), (X, IDX), mode="inference"), "scatter")
    assert node.op.bytes == pytest.approx(2 * nb(X) + 2 * nb(IDX))  # 6.29 MB
    assert node.kernels == 2  # clone, then the in-place kernel
    (inplace,) = _nodes(capture(Scatter(in_place=True), (X, IDX), mode="inference"), "scatter_")
    assert inplace.op.bytes == pytest.approx(2 * nb(IDX)) and inplace.kernels == 1


def test_backward_scatters_copy_only_where_cuda_does():
    """Under the capture's dispatch mode autograd takes out-of-place forms for gather's and
    index's gradients (scatter_add, index_put on new_zeros), which CUDA runs in place: no copy.
    scatter's own gradient, grad.scatter(dim, idx, 0), copies grad on CUDA too, and so does
    activation checkpointing's recompute of a forward's scatter."""

    class Gather(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(64))

        def forward(self, x, idx):
            return (x * self.w).gather(2, idx), (x * self.w)[:, idx[0, :100, 0]]

    g = capture(Gather(), (X, IDX), mode="train")
    (sa,) = _nodes(g, "scatter_add", "bwd")
    assert sa.kernels == 1 and sa.op.bytes == 2 * (nb(IDX) + IDX.numel() * 4)  # index, rows
    (ip,) = _nodes(g, "index_put", "bwd")
    assert ip.kernels == 1 and ip.op.bytes == 2 * (100 * 8 + 8 * 100 * 64 * 4)

    x = X.clone().requires_grad_()
    g = capture(Scatter(), (x, IDX), mode="train")
    (bwd,) = _nodes(g, "scatter", "bwd")  # the gradient of h: grad.scatter(2, idx, 0)
    assert bwd.kernels == 2 and bwd.op.bytes == pytest.approx(2 * nb(X) + 2 * nb(IDX))

    g = capture(Scatter(ckpt=True), (X, IDX), mode="train")
    assert [n.kernels for n in _nodes(g, "scatter")] == [2, 2]  # forward, recompute


def test_map_op_prices_an_autograd_scatter_without_the_copy():
    x = torch.empty(8, 1024, 64, device="meta")
    idx = torch.empty(8, 1024, 16, dtype=torch.long, device="meta")
    out = torch.empty_like(x)
    copy, _, k1 = map_op("scatter", (x, 2, idx, 0.5), {}, out)
    free, _, k2 = map_op("scatter", (x, 2, idx, 0.5), {}, out, copies_self=False)
    assert copy.bytes - free.bytes == 2 * nb(x) and (k1, k2) == (2, 1)


class Expanded(nn.Module):
    def forward(self, x):
        return x.expand(8, 64, 32).contiguous()


def test_a_copy_of_an_expanded_view_reads_the_source_once():
    """(8, 1, 32) expanded to (8, 64, 32) and made contiguous had been costed 131 KB, an
    output-sized read and write: it reads the 1 KB source (stride 0 over the 64) and writes 66 KB."""
    x = torch.randn(8, 1, 32)
    (node,) = _nodes(capture(Expanded(), (x,), mode="inference"), "clone")
    out = 8 * 64 * 32 * 4
    assert out <= node.op.bytes <= out + 2 * nb(x)


def test_repeat_kv_reads_the_key_value_heads_once():
    """HF's repeat_kv: (b, kv, 1, s, d) expanded over n_rep and reshaped (a clone). Large K/V
    (past the 2 MiB a broadcast operand stays on chip for) are still read once, not n_rep times."""

    class RepeatKV(nn.Module):
        def forward(self, kv):
            b, h, s, d = kv.shape
            return kv[:, :, None].expand(b, h, 4, s, d).reshape(b, h * 4, s, d)

    kv = torch.randn(2, 8, 1024, 128)
    (node,) = _nodes(capture(RepeatKV(), (kv,), mode="inference"), "clone")
    assert node.op.bytes == pytest.approx(4 * nb(kv) + nb(kv), rel=0.01)  # write 4x, read 1x


def test_an_elementwise_op_of_an_expanded_view_reads_its_unique_bytes():
    """mean's gradient divides grad.expand(...) by n: a (512, 1) stride-0 read, on chip, and an
    output-sized write (it had been costed as reading a full-size input)."""
    g = torch.empty(1, 512, 1, device="meta").expand(1, 512, 1024)
    op, _, _ = map_op("div", (g, 1024), {}, torch.empty(1, 512, 1024, device="meta"))
    assert op.bytes == pytest.approx(512 * 1024 * 4)


class Sdpa(nn.Module):
    def forward(self, q, mask=None):
        if mask is not None and mask.shape[0] == 1:  # expanded over batch and heads, as HF does
            mask = mask.expand(q.shape[0], q.shape[1], *mask.shape[2:])
        return F.scaled_dot_product_attention(q, q, q, attn_mask=mask)


Q = torch.randn(2, 8, 256, 64)


@pytest.mark.parametrize("mask, read", [
    (torch.randn(2, 1, 256, 256), 2 * 256 * 256 * 4),  # broadcast over the heads: once
    (torch.randn(2, 8, 256, 256), 2 * 8 * 256 * 256 * 4),
    # torch makes a boolean mask additive in q's dtype first: the kernel reads that
    (torch.ones(256, 256, dtype=torch.bool), 256 * 256 * 4),
    (torch.randn(1, 1, 256, 256), 256 * 256 * 4),  # expanded to (2, 8, 256, 256) in the forward
], ids=["b1ss", "bhss", "bool-ss", "expanded"])
def test_an_attention_mask_is_read(mask, read):
    """The mask's bytes had been left out of the attention kernel's: a (2, 8, 256, 256) fp32
    mask is 4.2 MB, as much as q, k, v and the output together."""
    name = "_scaled_dot_product_efficient_attention"
    (base,) = _nodes(capture(Sdpa(), (Q,), mode="inference"), name)
    (masked,) = _nodes(capture(Sdpa(), (Q, mask), mode="inference"), name)
    assert masked.op.bytes - base.op.bytes == read
    assert masked.op.flops == base.op.flops


def test_a_boolean_mask_is_made_additive_first_as_torch_does():
    """torch's SDPA converts a boolean mask to an additive one in q's dtype (where(mask, 0,
    -inf), attention.cpp convert_boolean_attn_mask) before any fused kernel: one where kernel
    reading the bool mask, and the attention kernel reads the bf16 mask it wrote."""
    mask = torch.ones(2, 1, 256, 256, dtype=torch.bool)
    g = capture(Sdpa(), (Q, mask), mode="inference", dtype="bf16")
    (where,) = _nodes(g, "where")
    assert where.kernels == 1 and where.op.parts[0].dtype == "bf16"
    (attn,) = _nodes(g, "_scaled_dot_product_efficient_attention")
    assert attn.op.mask_bytes == 2 * 256 * 256 * 2  # as an additive bf16 mask's
    additive = capture(Sdpa(), (Q, torch.zeros(2, 1, 256, 256)), mode="inference", dtype="bf16")
    assert _nodes(additive, "_scaled_dot_product_efficient_attention")[0].op == attn.op
    assert not _nodes(additive, "where")


def test_an_attention_mask_is_read_in_the_backward_too():
    class Train(Sdpa):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(64, 64)

        def forward(self, q, mask=None):
            return super().forward(self.lin(q), mask)

    name = "_scaled_dot_product_efficient_attention_backward"
    (base,) = _nodes(capture(Train(), (Q,), mode="train"), name)
    (masked,) = _nodes(capture(Train(), (Q, torch.randn(2, 1, 256, 256)), mode="train"), name)
    assert masked.op.bytes > base.op.bytes + 2 * 256 * 256 * 4


def test_attention_mask_bytes_default_to_none():
    a = Attention(2, 8, 256, 256, 64, "bf16")
    assert a.mask_bytes == 0 and Attention(2, 8, 256, 256, 64, "bf16", mask_bytes=100).bytes == a.bytes + 100
    with pytest.raises(KitError):
        Attention(2, 8, 256, 256, 64, "bf16", mask_bytes=-1)


class CpuTensor(nn.Module):
    def __init__(self):
        super().__init__()
        self.e, self.lin = nn.Embedding(100, 16), nn.Linear(16, 16)

    def forward(self, x):
        return self.lin(self.e(x) + torch.ones(16))


class OnCuda(nn.Module):
    def __init__(self):
        super().__init__()
        self.e = nn.Embedding(100, 16)

    def forward(self, x):
        return self.e(x.cuda())


class NoParams(nn.Module):
    def forward(self, x):
        return (x.float() * 2).softmax(-1)


IDS = torch.zeros(2, 8, dtype=torch.long)


def test_a_cpu_tensor_made_in_the_forward_is_named_as_the_models_own():
    """It had read "Tensor on device cpu is not on the expected device meta! (inputs must match
    the model's forward)", and kit.workload.models added a note on the token ids it fed."""
    with pytest.raises(CaptureNotAboutInputs, match="makes a tensor on the CPU itself.*device=x.device"):
        capture(CpuTensor(), (IDS,), mode="inference")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-only message")
def test_a_cuda_device_asked_for_is_not_about_the_inputs():
    with pytest.raises(CaptureNotAboutInputs, match="puts a tensor on a CUDA device itself"):
        capture(OnCuda(), (IDS,), mode="inference")


def test_training_a_module_with_nothing_to_train_is_not_about_the_inputs():
    with pytest.raises(CaptureNotAboutInputs, match="no floating tensor that requires grad"):
        capture(NoParams(), (IDS,), mode="train")


def test_inputs_of_the_wrong_kind_stay_a_question_of_the_inputs():
    """Token ids fed to a float nn.Linear: the inputs are the likely cause (a plain KitError,
    which kit.workload.models follows with the inputs it fed)."""
    with pytest.raises(KitError) as err:
        capture(nn.Linear(16, 16), (torch.zeros(2, 8, 16, dtype=torch.long),), mode="inference")
    assert not isinstance(err.value, CaptureNotAboutInputs)
