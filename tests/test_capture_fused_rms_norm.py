"""nn.RMSNorm / F.rms_norm and torch.dropout are captured as the kernels CUDA runs: torch's
_fused_rms_norm (one kernel forward, _fused_rms_norm_backward backward) and native_dropout,
not the composite decompositions meta tensors take (kit.workload.gpu_kernels)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from kit.workload.capture import capture


def _ops(graph, phase=None):
    return [n.aten.split(".")[1] for n in graph.nodes
            if n.op is not None and (phase is None or n.phase == phase)]


class _Rms(nn.Module):
    def __init__(self, affine=True):
        super().__init__()
        self.lin = nn.Linear(256, 256)
        self.norm = nn.RMSNorm(256, elementwise_affine=affine)

    def forward(self, x):
        return F.rms_norm(self.norm(self.lin(x)), (256,))


def test_rms_norm_is_one_fused_kernel_in_inference():
    g = capture(_Rms(), (torch.randn(8, 64, 256),), mode="inference", dtype="bf16")
    assert _ops(g) == ["addmm", "_fused_rms_norm", "_fused_rms_norm"]
    node = [n for n in g.nodes if n.aten == "aten._fused_rms_norm.default"][0]
    assert node.module == "norm" and node.op_class == "rmsnorm" and node.kernels == 1
    assert node.op.rows == 8 * 64 and node.op.cols == 256 and node.op.dtype == "bf16"


def test_rms_norm_backward_is_the_fused_backward():
    for affine in (True, False):
        g = capture(_Rms(affine), (torch.randn(8, 64, 256),), mode="train")
        fwd, bwd = _ops(g, "fwd"), _ops(g, "bwd")
        assert not {"pow", "rsqrt", "mean"} & set(fwd + bwd)
        assert fwd.count("_fused_rms_norm") == 2
        assert bwd.count("_fused_rms_norm_backward") == 2
        paths = {n.module for n in g.nodes if n.aten == "aten._fused_rms_norm_backward.default"}
        assert "norm" in paths
    # the activations the fused kernel saves: x and rstd (fp32, one a row)
    g = capture(nn.RMSNorm(256), (torch.randn(8, 64, 256, requires_grad=True),), mode="train")
    assert g.meta["activation_bytes"] == 8 * 64 * 256 * 4 + 8 * 64 * 4


def test_torch_dropout_is_native_dropout():
    class Drop(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(64, 64)

        def forward(self, x):
            return torch.dropout(self.lin(x), 0.1, self.training)

    x = torch.randn(8, 128, 64)
    train = capture(Drop(), (x,), mode="train")
    assert "native_dropout" in _ops(train, "fwd") and "bernoulli_" not in _ops(train)
    assert "native_dropout_backward" in _ops(train, "bwd")
    assert _ops(capture(Drop(), (x,), mode="inference")) == ["addmm"]


def test_a_bf16_module_priced_in_fp32_says_so():
    import warnings

    import pytest

    from kit.workload.models import graph_of

    class Lin(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(64, 64)

        def forward(self, x):
            return self.lin(x)

    x = (torch.randn(4, 64),)
    with pytest.warns(UserWarning, match="parameters are bf16, priced in fp32"):
        graph_of(Lin().to(torch.bfloat16), None, mode="inference", inputs=x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        graph_of(Lin().to(torch.bfloat16), None, mode="inference", dtype="bf16", inputs=x)
        graph_of(Lin(), None, mode="inference", inputs=x)


def test_grouped_heads_without_enable_gqa_fail_as_torch_does():
    import pytest

    from kit.errors import KitError

    class Attn(nn.Module):
        def __init__(self, gqa):
            super().__init__()
            self.lin, self.gqa = nn.Linear(64, 64), gqa

        def forward(self, q, k):
            return F.scaled_dot_product_attention(self.lin(q), k, k, enable_gqa=self.gqa)

    q, k = torch.randn(2, 8, 16, 64), torch.randn(2, 2, 16, 64)
    with pytest.raises(RuntimeError):  # torch itself refuses it
        Attn(False)(q, k)
    with pytest.raises(KitError, match="enable_gqa=True"):
        capture(Attn(False), (q, k), mode="inference", dtype="bf16")
    g = capture(Attn(True), (q, k), mode="inference", dtype="bf16")
    assert [n.aten.split(".")[1] for n in g.nodes if n.op is not None] == [
        "addmm", "_scaled_dot_product_flash_attention"]
    # one K/V head broadcasts over the query heads, in torch and in the capture
    capture(Attn(False), (q, torch.randn(2, 1, 16, 64)), mode="inference", dtype="bf16")


def test_rms_norm_with_a_weight_of_another_dtype_runs_the_composite():
    """torch's rms_norm dispatches to _fused_rms_norm only when the weight has the input's dtype
    (else it warns "Cannot dispatch to fused implementation" and runs the composite, on a GPU
    too): an fp32 RMSNorm weight in a bf16 body, as --dtype model keeps it."""
    import warnings

    class Mixed(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(256, 256).to(torch.bfloat16)
            self.norm = nn.RMSNorm(256)  # fp32 weight

        def forward(self, x):
            return self.norm(self.lin(x))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        g = capture(Mixed(), (torch.randn(8, 64, 256),), mode="inference", dtype="model")
    assert "_fused_rms_norm" not in _ops(g) and "rsqrt" in _ops(g)
    # the same weight in the input's dtype is the fused kernel
    g = capture(Mixed().to(torch.bfloat16), (torch.randn(8, 64, 256),), mode="inference", dtype="model")
    assert _ops(g) == ["addmm", "_fused_rms_norm"]
