"""Grouped GEMMs (torch._grouped_mm, HF's MoE experts) and HF's value checks under the capture."""
import sys
import types

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from kit.errors import KitError
from kit.ops import Gemm
from kit.workload import hf_compat
from kit.workload.capture import DataDependentCapture, capture


class Experts(nn.Module):
    """HF's grouped_mm experts, reduced: tokens sorted by expert, one grouped GEMM up (gate and
    up fused) and one down; offs are the experts' cumulative token counts."""

    def __init__(self, experts=4, hidden=32, inter=16):
        super().__init__()
        self.gate_up = nn.Parameter(torch.zeros(experts, hidden, 2 * inter))
        self.down = nn.Parameter(torch.zeros(experts, inter, hidden))

    def forward(self, x, offs):
        h = F.grouped_mm(x, self.gate_up, offs=offs)
        gate, up = h.chunk(2, dim=-1)
        return F.grouped_mm(F.silu(gate) * up, self.down, offs=offs)


def _inputs(rows):
    return (torch.zeros(rows, 32), torch.zeros(4, dtype=torch.int32))


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
def test_a_grouped_gemm_is_one_gemm_kernel_over_the_experts_its_rows_reach(dtype):
    g = capture(Experts(), _inputs(64), mode="inference", dtype=dtype)
    gemms = [n for n in g if n.op_class == "gemm"]
    assert [n.aten for n in gemms] == ["aten._grouped_mm.default"] * 2
    assert not [n for n in g if n.op_class == "unknown"]
    up, down = (n.op for n in gemms)
    # 64 rows over 4 experts: 16 each, the expert's own weight
    assert up == Gemm(m=16, n=32, k=32, b=4, dtype=dtype, kind="bmm")
    assert down == Gemm(m=16, n=32, k=16, b=4, dtype=dtype, kind="bmm")
    assert up.flops == pytest.approx(2 * 64 * 32 * 32)
    assert all(n.kernels == 1 for n in gemms)
    # fewer rows than experts (a decode step): only as many experts as rows, one row each
    few = [n.op for n in capture(Experts(), _inputs(3), mode="inference", dtype=dtype)
           if n.op_class == "gemm"]
    assert few[0] == Gemm(m=1, n=32, k=32, b=3, dtype=dtype, kind="bmm")


def test_uneven_shares_cost_the_real_rows():
    (up, down) = [n.op for n in capture(Experts(), _inputs(50), mode="train", dtype="bf16")
                  if n.op_class == "gemm" and n.phase == "fwd"]
    # 50 rows over 4 experts: shares of 13 rounded up, the work of 50 rows
    assert up.parts == (Gemm(m=13, n=32, k=32, b=4, dtype="bf16", kind="bmm"),)
    assert up.flops == pytest.approx(2 * 50 * 32 * 32) and down.flops == pytest.approx(2 * 50 * 16 * 32)
    bwd = [n.op for n in capture(Experts(), _inputs(50), mode="train", dtype="bf16")
           if n.op_class == "gemm" and n.phase == "bwd"]
    assert sum(o.flops for o in bwd) == pytest.approx(2 * down.flops + up.flops)


def test_an_out_dtype_given_positionally_or_by_name_keeps_the_shape_and_dtype():
    class WithOut(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.zeros(4, 32, 48))

        def forward(self, x, offs):
            return F.grouped_mm(x, self.w, offs=offs, out_dtype=x.dtype) * 2

    for dtype in ("fp32", "fp16", "bf16"):
        g = capture(WithOut(), _inputs(64), mode="inference", dtype=dtype)
        (mm,) = [n for n in g if n.op_class == "gemm"]
        assert mm.op == Gemm(m=16, n=48, k=32, b=4, dtype=dtype, kind="bmm")


def test_the_grouped_gemm_backward_costs_dx_and_the_per_expert_weight_gradient():
    g = capture(Experts(), _inputs(64), mode="train", dtype="fp32")
    fwd = [n.op for n in g if n.op_class == "gemm" and n.phase == "fwd"]
    bwd = [n.op for n in g if n.op_class == "gemm" and n.phase == "bwd"]
    up, down = fwd
    # the input needs no gradient: dW for both, dx only for the down projection's input
    assert sorted(bwd, key=str) == sorted([
        Gemm(m=16, n=16, k=32, b=4, dtype="fp32", kind="bmm"),  # dx of down: (64,32) x (4,32,16)
        Gemm(m=16, n=32, k=16, b=4, dtype="fp32", kind="bmm"),  # dW of down: 64 rows cut in 4
        Gemm(m=32, n=32, k=16, b=4, dtype="fp32", kind="bmm"),  # dW of gate_up
    ], key=str)
    # each gradient product does its forward's multiply-adds
    assert sum(o.flops for o in bwd) == pytest.approx(2 * down.flops + up.flops)


def test_a_plain_batch_of_grouped_gemms_without_offsets_is_a_bmm():
    class Batch(nn.Module):
        def forward(self, a, b):
            return F.grouped_mm(a, b)

    (node,) = [n for n in capture(Batch(), (torch.zeros(3, 8, 16), torch.zeros(3, 16, 24)),
                                  mode="inference", dtype="bf16") if n.op_class == "gemm"]
    assert node.op == Gemm(m=8, n=24, k=16, b=3, dtype="bf16", kind="bmm")
    assert node.op.flops == pytest.approx(2 * 3 * 8 * 16 * 24)


def _fake_masking(monkeypatch):
    """A stand-in for transformers.masking_utils: the two checks read the tensors' values."""
    mod = types.ModuleType(hf_compat.MASKING)

    def find_packed_sequence_indices(position_ids):
        mask = (torch.diff(position_ids, dim=-1) != 1).cumsum(-1)
        return None if (mask[:, -1] == 0).all() else mask

    def fast_all(t):
        return t.sum() == t.numel()

    mod.find_packed_sequence_indices = find_packed_sequence_indices
    mod.fast_all = fast_all
    monkeypatch.setitem(sys.modules, hf_compat.MASKING, mod)
    return mod


class MaskingModel(nn.Module):
    """A decoder that asks HF's questions through the module, as HF's models call them."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 16)

    def forward(self, ids, attention_mask=None):
        masking = sys.modules[hf_compat.MASKING]
        x = torch.zeros(*ids.shape, 16, device=ids.device)
        pos = torch.arange(ids.shape[1], device=ids.device).expand(ids.shape[0], -1)
        packed = masking.find_packed_sequence_indices(pos)
        causal = attention_mask is None or bool(masking.fast_all(attention_mask))
        q = self.proj(x).unsqueeze(1)
        assert packed is None
        return F.scaled_dot_product_attention(q, q, q, is_causal=causal)


def test_hf_value_checks_are_answered_for_unpacked_unpadded_ids_and_restored(monkeypatch):
    mod = _fake_masking(monkeypatch)
    before = (mod.find_packed_sequence_indices, mod.fast_all)
    ids = torch.zeros(2, 8, dtype=torch.long)
    g = capture(MaskingModel(), {"ids": ids, "attention_mask": torch.ones(2, 8, dtype=torch.bool)},
                mode="inference")
    (att,) = [n.op for n in g if n.op_class == "attention"]
    assert att.causal  # no padding: SDPA's is_causal, as HF runs an unpadded batch
    assert (mod.find_packed_sequence_indices, mod.fast_all) == before  # HF's own functions back
    # outside a capture the checks read values, and on meta tensors they cannot
    with pytest.raises(RuntimeError, match="meta"):
        mod.fast_all(torch.ones(2, 8, dtype=torch.bool, device="meta")).item()


def test_without_the_answers_the_same_model_fails_as_data_dependent(monkeypatch):
    _fake_masking(monkeypatch)
    monkeypatch.setattr(hf_compat, "ANSWERS", {})
    with pytest.raises(DataDependentCapture, match="needs the tensor's values"):
        capture(MaskingModel(), (torch.zeros(2, 8, dtype=torch.long),), mode="inference")


def test_no_transformers_module_means_nothing_is_swapped(monkeypatch):
    monkeypatch.delitem(sys.modules, hf_compat.MASKING, raising=False)
    with hf_compat.answered():
        assert hf_compat.MASKING not in sys.modules
    g = capture(nn.Linear(4, 4), (torch.zeros(2, 4),), mode="inference")  # a capture still records
    assert [n.op for n in g if n.op_class == "gemm"] == [Gemm(m=2, n=4, k=4, b=1, kind="linear", shared_rhs=True, align=4)]


def test_grouped_gemm_with_mismatched_operands_is_one_capture_error():
    class Bad(nn.Module):
        def forward(self, a, b):
            return F.grouped_mm(a, b, offs=torch.zeros(2, dtype=torch.int32, device=a.device))

    with pytest.raises(KitError, match="_grouped_mm"):
        capture(Bad(), (torch.zeros(8, 16), torch.zeros(2, 12, 24)), mode="inference", dtype="bf16")


def test_parameters_hf_keeps_in_fp32_stay_fp32_in_a_half_precision_capture():
    class Routed(nn.Module):
        _keep_in_fp32_modules_strict = ["gate.weight"]  # as HF's DeepSeek-V3 declares
        _keep_in_fp32_modules = ["wo"]  # as HF's T5 declares: fp16 only

        def __init__(self):
            super().__init__()
            self.gate = nn.Linear(16, 4, bias=False)  # a router, as HF's: no bias
            self.wo, self.proj = nn.Linear(16, 16), nn.Linear(16, 16)

        def forward(self, x):
            # wo's input in wo's dtype, as HF's T5 casts it (torch refuses mixed-dtype GEMMs)
            return self.gate(x.float()).sum() + self.wo(x.to(self.wo.weight.dtype)).sum() + self.proj(x).sum()

    x = (torch.zeros(8, 16),)
    for dtype, wo_fp32 in (("bf16", False), ("fp16", True)):
        g = capture(Routed(), x, mode="inference", dtype=dtype)
        gemms = {n.module: n.op.dtype for n in g if n.op_class == "gemm"}
        assert gemms["gate"] == "fp32" and gemms["proj"] == dtype
        assert gemms["wo"] == ("fp32" if wo_fp32 else dtype)
        # weights: gate's 16x4 in fp32 always, wo's 16x16 (+16) in fp32 under fp16 only
        fp32 = 64 + (272 if wo_fp32 else 0)
        assert g.meta["param_bytes"] == fp32 * 4 + (64 + 272 + 272 - fp32) * 2
    full = capture(Routed(), x, mode="inference", dtype="fp32")
    assert full.meta["param_bytes"] == (64 + 272 + 272) * 4
