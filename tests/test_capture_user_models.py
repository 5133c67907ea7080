"""Users' own modules, from the capture audit: nn.MultiheadAttention (and nn.Transformer*) runs
the GPU's fused attention, activation checkpointing captures (its recompute in the backward),
the backward starts from every output that requires grad, buffers count in memory, and seq=0 is
refused."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from kit.errors import KitError
from kit.workload.capture import capture
from kit.workload.models import graph_of, memory_bytes

D, H = 256, 4


class ViaMHA(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(D, H, batch_first=True)

    def forward(self, x):
        return self.attn(x, x, x, need_weights=False)[0]


class Direct(nn.Module):  # the same layer, written with F.scaled_dot_product_attention
    def __init__(self):
        super().__init__()
        self.inp, self.out = nn.Linear(D, 3 * D), nn.Linear(D, D)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.inp(x).view(b, s, 3, H, D // H).permute(2, 0, 3, 1, 4)
        return self.out(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, s, D))


def _ops(graph):
    """The aten names of a graph's kernels, without the "aten." and ".default"."""
    return [n.aten.split(".")[1] for n in graph.nodes if n.op is not None]


@pytest.mark.parametrize("mode", ["train", "inference"])
def test_multihead_attention_runs_the_fused_kernel_as_sdpa_does(mode):
    x = torch.randn(2, 128, D)
    mha = capture(ViaMHA(), (x,), mode=mode, dtype="bf16")
    ops = _ops(mha)
    # it was the CPU's math path: fp32 bmm and softmax, and casts around them
    assert any("flash_attention" in o for o in ops), ops
    assert not any(o in ("bmm", "_safe_softmax", "_softmax") for o in ops), ops
    direct = capture(Direct(), (x,), mode=mode, dtype="bf16")
    flops = lambda g: sum(n.op.flops for n in g.nodes if n.op is not None and "attention" in n.aten)
    assert flops(mha) == pytest.approx(flops(direct))


def test_a_transformer_encoder_trains_with_fused_attention():
    layer = nn.TransformerEncoderLayer(D, H, 4 * D, batch_first=True)
    ops = _ops(capture(nn.TransformerEncoder(layer, 2, enable_nested_tensor=False),
                       (torch.randn(2, 64, D),), mode="train", dtype="bf16"))
    assert sum("flash_attention_backward" in o for o in ops) == 2, ops
    assert "bmm" not in ops


class Block(nn.Module):
    def __init__(self, reentrant=None):
        super().__init__()
        self.stem = nn.Linear(D, D)
        self.b = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))
        self.reentrant = reentrant

    def forward(self, x):
        x = self.stem(x)
        if self.reentrant is None:
            return self.b(x)
        return checkpoint(self.b, x, use_reentrant=self.reentrant)


@pytest.mark.parametrize("reentrant", [False, True])
def test_activation_checkpointing_captures_with_its_recompute(reentrant):
    x = torch.randn(4, 128, D)
    plain = capture(Block(None), (x,), mode="train")
    ckpt = capture(Block(reentrant), (x,), mode="train")  # failed: "cpu is not on ... meta"
    gemms = lambda g, phase: sum(1 for n in g.nodes if n.phase == phase and n.op_class == "gemm")
    assert gemms(ckpt, "fwd") == gemms(plain, "fwd") == 3
    # the checkpointed block runs again in the backward, named by its modules: both linears
    # (reentrant), or up to the last activation the backward needs (torch's non-reentrant
    # recompute stops early: the first linear and the gelu)
    again = [(n.aten.split(".")[1], n.module) for n in ckpt.nodes if n.phase == "bwd"
             and n.op is not None and n.aten.split(".")[1] in ("addmm", "gelu")]
    assert again == [("addmm", "b.0"), ("gelu", "b.1")] + ([("addmm", "b.2")] if reentrant else [])
    assert gemms(ckpt, "bwd") == gemms(plain, "bwd") + (2 if reentrant else 1)
    # every backward kernel is named by a module (the reentrant backward's were not)
    assert all(n.module for n in ckpt.nodes if n.phase == "bwd" and n.op is not None)
    # and its activations are not kept: less memory than the plain block's
    assert ckpt.meta["activation_bytes"] < plain.meta["activation_bytes"]


class TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(D, 8), nn.Linear(D, 1000)

    def forward(self, x):
        return self.a(x), self.b(x)


def test_the_backward_starts_from_every_output_that_requires_grad():
    x = torch.randn(2, 16, D)
    bwd = lambda g: [n.module for n in g.nodes if n.phase == "bwd" and n.op_class == "gemm"]
    both = bwd(capture(TwoHeads(), (x,), mode="train"))
    # head b (1,000 wide) had no backward: only the first output was backpropagated
    assert both.count("b") == 1 and both.count("a") == 1  # weight gradients (x needs none)

    class Summed(TwoHeads):  # the same step, written as a loss summing the two heads
        def forward(self, x):
            a, b = super().forward(x)
            return a.sum() + b.sum()

    assert sorted(bwd(capture(Summed(), (x,), mode="train"))) == sorted(both)


class WithTable(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(D, D)
        self.register_buffer("table", torch.empty(100_000, D, device="meta"))

    def forward(self, x, idx):
        return self.lin(x) + self.table[idx]

    def example_inputs(self, batch, seq):
        return torch.randn(batch, seq, D), torch.randint(0, 100_000, (batch, seq))


def test_buffers_count_in_memory():
    mem = memory_bytes(graph_of(WithTable(), 2, 16, "inference"))
    assert mem["buffers_bytes"] == 100_000 * D * 4
    assert mem["total_bytes"] == sum(v for k, v in mem.items() if k != "total_bytes")
    assert mem["total_bytes"] > mem["buffers_bytes"] > mem["weights_bytes"]


def test_seq_zero_is_refused_for_a_module_not_replaced():
    with pytest.raises(KitError, match="seq must be a positive whole number, got 0"):
        graph_of(WithTable(), 2, 0, "inference")  # ran at seq 512


class OnCuda(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(D, D)

    def forward(self, x):
        return self.lin(x) + torch.arange(x.shape[1], device="cuda").unsqueeze(-1)


def test_a_model_that_puts_tensors_on_cuda_itself_is_told_what_to_do():
    # it said "Torch not compiled with CUDA enabled (inputs must match the model's forward)"
    with pytest.raises(KitError, match=r"puts a tensor on a CUDA device itself .*device=x\.device"):
        capture(OnCuda(), (torch.randn(2, 16, D),), mode="inference")


class ReturnsLoss(nn.Module):  # HF's convention: {"loss": ..., "logits": ...}
    def __init__(self):
        super().__init__()
        self.body, self.head = nn.Linear(D, D), nn.Linear(D, 1000)

    def forward(self, x):
        logits = self.head(self.body(x))
        return {"loss": logits.float().logsumexp(-1).mean(), "logits": logits}


def test_a_model_returning_its_loss_backpropagates_from_the_loss_alone():
    """From a review: with every output as a root, the logits beside the loss took a gradient
    of their own (an extra add over the whole logits, +9% on a small LM step)."""
    x = torch.randn(2, 16, D)
    g = capture(ReturnsLoss(), (x,), mode="train")
    bwd = [n.aten.split(".")[1] for n in g.nodes if n.phase == "bwd" and n.op is not None]
    assert "add" not in bwd, bwd  # nothing sums a logits gradient into the loss's

    class LossOnly(ReturnsLoss):
        def forward(self, x):
            return super().forward(x)["loss"]

    alone = [n.aten.split(".")[1] for n in capture(LossOnly(), (x,), mode="train").nodes
             if n.phase == "bwd" and n.op is not None]
    assert bwd == alone


def test_max_batch_leaves_room_for_the_buffers():
    from kit.workload.models import max_batch

    mem = {"weights_bytes": 10, "buffers_bytes": 30, "kv_cache_bytes": 8, "activations_bytes": 2}
    assert max_batch(mem, 2, 100) == (100 - 10 - 30) // 5  # it left out the buffers: 18
